-- SQLite against hostile files and faults (docs/sqlite.md "Files that are not
-- eventstore databases"; docs/cli.md; issue 8,
-- items 3 and 5). Each test is a regression test of something a reviewer saw
-- break:
--
--   - a failed open rewrote another application's SQLite file (our
--     user_version, application_id, WAL mode, four tables), and a file with
--     only a `users` table was opened and stamped as ours;
--   - `--db 'sqlite:x.db?mode=ro'` made the CLI look for a file named
--     "x.db?mode=ro";
-- SQLite only: these are files and file systems.
local eventstore = require("eventstore")
local helpers = require("helpers")
local sh_quote = helpers.sh_quote

local ROOT = assert(io.popen("pwd")):read("l")
local BUILD = os.getenv("BUILD") or "build"
local BIN = (BUILD:sub(1, 1) == "/" and "" or ROOT .. "/") .. BUILD .. "/bin/eventstore"

-- ---- small tools --------------------------------------------------------------

-- Runs a shell command; true when it exited 0.
local function sh(cmd)
  local ok = os.execute(cmd)
  return ok == true
end

-- Runs a shell command and returns its stdout (without a final newline).
local function capture(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  p:close()
  return (out:gsub("\n$", ""))
end

local function mkdtemp()
  return capture("mktemp -d")
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function write_file(path, bytes)
  local f = assert(io.open(path, "wb"))
  assert(f:write(bytes))
  f:close()
end

-- The names in a directory, sorted, one string (to see files appear).
local function listing(dir)
  return capture("ls -A " .. sh_quote(dir) .. " | sort")
end

-- The first argument whose pattern (plain text) is missing from text, or nil.
local function missing(text, ...)
  for _, want in ipairs({ ... }) do
    if not text:find(want, 1, true) then return want end
  end
  return nil
end

local function assert_mentions(text, ...)
  local m = missing(text, ...)
  assert(m == nil, ("expected %q in: %s"):format(tostring(m), text))
end

-- Runs the eventstore binary (bounded); returns exit code, stdout, stderr.
local function run_cli(dir, args)
  local parts = { "cd", sh_quote(dir), "&&", "timeout", "-k", "2", "30", sh_quote(BIN) }
  for _, a in ipairs(args) do parts[#parts + 1] = sh_quote(a) end
  local out, err = os.tmpname(), os.tmpname()
  local _, _, code = os.execute(table.concat(parts, " ") .. " </dev/null >" .. out .. " 2>" .. err)
  local o, e = read_file(out) or "", read_file(err) or ""
  os.remove(out)
  os.remove(err)
  return code, o, e
end

-- Mounts: every command bounded; unmount falls back to a lazy unmount so a
-- ---- 3: files that are not eventstore databases -------------------------------

describe("sqlite: a file that is not an eventstore database", function()
  local dir

  before_each(function() dir = mkdtemp() end)
  after_each(function() sh("rm -rf " .. sh_quote(dir)) end)

  -- Makes a file with the sqlite3 shell (a dependency of the tests).
  local function sqlite3(path, sql)
    assert(sh("sqlite3 " .. sh_quote(path) .. " " .. sh_quote(sql) .. " >/dev/null"),
      "the sqlite3 shell is needed (make deps installs it)")
  end

  -- Opening path (with each mode) must fail with INVALID_ARGUMENT naming the
  -- file, "not an eventstore database" and why, and leave the directory
  -- byte-for-byte as it was: the file unchanged, no -wal or -shm.
  local function refused(path, ...)
    local before, names = read_file(path), listing(dir)
    for _, query in ipairs({ "", "?mode=rw", "?mode=ro", "?sync=normal" }) do
      local err = helpers.expect_error("INVALID_ARGUMENT", eventstore.open, "sqlite:" .. path .. query)
      assert_mentions(err.message, path, "not an eventstore database", ...)
      assert.are.equal(before, read_file(path), "the file changed (open with '" .. query .. "')")
      assert.are.equal(names, listing(dir), "files appeared next to it (open with '" .. query .. "')")
    end
  end

  it("another application's file with its own sessions table: refused, untouched", function()
    local path = dir .. "/app.db"
    sqlite3(path, "CREATE TABLE sessions(id TEXT PRIMARY KEY, user_id INTEGER, expires INTEGER);"
      .. "INSERT INTO sessions VALUES ('abc', 1, 99)")
    refused(path, "application_id 0", "table sessions")
    -- and still the other application's: its row, no table of ours, no stamp
    local facts = capture("sqlite3 " .. sh_quote(path)
      .. " 'SELECT id FROM sessions; PRAGMA user_version; PRAGMA application_id; PRAGMA journal_mode'")
    assert.are.equal("abc|0|0|delete", (facts:gsub("\n", "|")))
  end)

  it("a file with only a users table: refused, not stamped", function()
    local path = dir .. "/users.db"
    sqlite3(path, "CREATE TABLE users(name TEXT)")
    refused(path, "table users")
  end)

  it("another application's application_id: refused, naming it", function()
    local path = dir .. "/geo.gpkg"
    sqlite3(path, "PRAGMA application_id = 1196444487; CREATE TABLE t(x)") -- "GPKG"
    refused(path, "application_id 0x47504B47", "GPKG")
  end)

  it("another application's WAL-mode file: refused, no -wal or -shm left", function()
    local path = dir .. "/wal.db"
    sqlite3(path, "PRAGMA journal_mode = WAL; CREATE TABLE w(x); INSERT INTO w VALUES (1)")
    refused(path, "table w")
  end)

  it("random bytes: refused as not SQLite, untouched", function()
    local path = dir .. "/random.bin"
    assert(sh("head -c 8192 /dev/urandom > " .. sh_quote(path)))
    refused(path, "not an SQLite file")
  end)

  it("a text file: refused as not SQLite, untouched", function()
    local path = dir .. "/notes.txt"
    write_file(path, "Shopping list\n- milk\n- eggs\nThis is a text file, not a database.\n"
      .. "It is longer than the 100 bytes of an SQLite header.\n")
    refused(path, "not an SQLite file")
    write_file(path, "hi\n") -- shorter than the header
    refused(path, "not an SQLite file")
  end)

  it("a zero-length file and a new path are ours to initialise", function()
    for _, path in ipairs({ dir .. "/empty.db", dir .. "/new.db" }) do
      if path:find("empty") then write_file(path, "") end
      local store = eventstore.open("sqlite:" .. path)
      store:append("s", { { type = "t", payload = 1 } })
      store:close()
      store = eventstore.open("sqlite:" .. path)
      assert.are.equal(1, store:head("s"))
      store:close()
    end
  end)

  it("an eventstore file keeps opening after another application adds a table to it", function()
    local path = dir .. "/ours.db"
    local store = eventstore.open("sqlite:" .. path)
    store:append("s", { { type = "t" } })
    store:close()
    sqlite3(path, "CREATE TABLE notes(x); INSERT INTO notes VALUES ('kept')")
    store = eventstore.open("sqlite:" .. path)
    assert.are.equal(1, store:head("s"))
    store:close()
    assert.are.equal("kept", capture("sqlite3 " .. sh_quote(path) .. " 'SELECT x FROM notes'"))
  end)
end)

-- ---- 5: URL options on the command line -----------------------------------------

describe("eventstore CLI: --db with URL options", function()
  local dir

  before_each(function()
    dir = mkdtemp()
    local store = eventstore.open("sqlite:" .. dir .. "/x.db")
    store:append("s", { { type = "a", payload = 1 }, { type = "b", payload = 2 } })
    store:close()
  end)
  after_each(function() sh("rm -rf " .. sh_quote(dir)) end)

  it("read finds the file behind ?mode=ro and ?sync=normal", function()
    for _, url in ipairs({ "sqlite:x.db?mode=ro", "sqlite:x.db?sync=normal", "sqlite:./x.db?mode=ro&readers=2" }) do
      local code, out, err = run_cli(dir, { "read", "s", "--db", url })
      assert.are.equal("", err, url)
      assert.are.equal(0, code, url)
      local n = 0
      for line in out:gmatch("[^\n]+") do
        n = n + 1
        assert.are.equal(n, eventstore.json.decode(line).index)
      end
      assert.are.equal(2, n, url)
    end
  end)

  it("a missing file is named without the options, and nothing is created", function()
    local code, out, err = run_cli(dir, { "read", "s", "--db", "sqlite:none.db?mode=ro" })
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert_mentions(err, "no database at 'none.db'", "--db sqlite:none.db?mode=ro")
    assert.are.equal("x.db", listing(dir))
  end)

  it("the options reach the store: a bad one is refused, append with ?sync=normal writes x.db", function()
    local code, _, err = run_cli(dir, { "read", "s", "--db", "sqlite:x.db?bogus=1" })
    assert.are.equal(1, code)
    assert_mentions(err, "INVALID_ARGUMENT", "bogus")
    code, _, err = run_cli(dir, { "append", "s", "c", "3", "--db", "sqlite:x.db?sync=normal" })
    assert.are.equal("", err)
    assert.are.equal(0, code)
    assert.are.equal("x.db", listing(dir))
    local store = eventstore.open("sqlite:" .. dir .. "/x.db?mode=ro")
    assert.are.equal(3, store:head("s"))
    store:close()
  end)
end)
