-- SQLite against hostile files and faults (docs/sqlite.md "Files that are
-- not eventstore databases", "Read-only media", "A full disk"; issue 8,
-- items 3, 5, 6 and 7). Each test is a regression test of something a
-- reviewer saw break:
--
--   - a failed open rewrote another application's SQLite file (our
--     user_version, application_id, WAL mode, four tables), and a file with
--     only a `users` table was opened and stamped as ours;
--   - `--db 'sqlite:x.db?mode=ro'` made the CLI look for a file named
--     "x.db?mode=ro";
--   - a store on read-only media could not be opened at all, not even with
--     the `?mode=ro` the error suggested;
--   - on a small disk the WAL took all the space, and after space was freed
--     only a few appends succeeded (none after reopening).
--
-- The read-only and disk-full tests need mounts: as root they use a
-- read-only bind mount and a small tmpfs in temporary directories, always
-- unmounted in a `finally`; every command is bounded by `timeout`. Not
-- root, the read-only test falls back to chmod, and the disk-full tests are
-- pending with a message (as are both when mounting is not permitted, e.g.
-- in a container without CAP_SYS_ADMIN).
-- SQLite only: these are files and file systems.
local eventstore = require("eventstore")
local helpers = require("helpers")
local sh_quote = helpers.sh_quote

local BIN = helpers.BIN

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

local read_file = helpers.read_file

local write_file = helpers.write_file

-- The names in a directory, sorted, one string (to see files appear).
local function listing(dir)
  return capture("ls -A " .. sh_quote(dir) .. " | sort")
end

local IS_ROOT = capture("id -u") == "0"

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

-- The ids of every event in the store, in position order.
local function all_ids(store)
  return helpers.pluck(store:read_all({}), "id")
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
-- busy mount point never outlives the test.
local function mount(args)
  return sh("timeout 10 mount " .. args .. " >/dev/null 2>&1")
end

local function umount(dir)
  if not sh("timeout 10 umount " .. sh_quote(dir) .. " >/dev/null 2>&1") then
    sh("timeout 10 umount -l " .. sh_quote(dir) .. " >/dev/null 2>&1")
  end
end

local function is_mounted(dir)
  return sh("mountpoint -q " .. sh_quote(dir))
end

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
    local bytes = {}
    helpers.seed("random bytes")
    for i = 1, 8192 do bytes[i] = string.char(math.random(0, 255)) end
    write_file(path, table.concat(bytes))
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

-- ---- 6: read-only media -----------------------------------------------------------

describe("sqlite: a store on read-only media", function()
  it("opens with ?mode=ro (which the plain open's error suggests), reads, refuses writes, changes nothing", function()
    local src, mnt = mkdtemp(), mkdtemp()
    local how
    finally(function()
      if is_mounted(mnt) then umount(mnt) end
      sh("chmod -R u+w " .. sh_quote(src) .. " 2>/dev/null")
      sh("rmdir " .. sh_quote(mnt) .. " 2>/dev/null")
      sh("rm -rf " .. sh_quote(src))
    end)
    local store = eventstore.open("sqlite:" .. src .. "/x.db")
    store:append("s", { { type = "a", payload = 1 }, { type = "b", payload = 2 }, { type = "c", payload = 3 } })
    store:close()
    local dir -- where the test sees the store: read-only
    if IS_ROOT then
      -- root ignores file permissions: only a read-only mount stops it
      if mount("--bind " .. sh_quote(src) .. " " .. sh_quote(mnt))
          and mount("-o remount,ro,bind " .. sh_quote(mnt)) then
        dir, how = mnt, "bind"
      end
    elseif sh("chmod 0555 " .. sh_quote(src) .. " && chmod 0444 " .. sh_quote(src .. "/x.db")) then
      dir, how = src, "chmod"
    end
    if not dir then
      pending("cannot make a read-only directory here (root without mount permission?)")
      return
    end
    assert(not sh("touch " .. sh_quote(dir .. "/probe") .. " 2>/dev/null"),
      "the directory must really be read-only for this test (" .. how .. ")")
    local names, bytes = listing(dir), read_file(dir .. "/x.db")
    local path = dir .. "/x.db"

    -- a plain open fails, naming what works
    local err = helpers.expect_error("STORAGE", eventstore.open, "sqlite:" .. path)
    local suggested = err.message:match('"(sqlite:[^"]*%?mode=ro)"')
    assert(suggested, "the error must suggest a ?mode=ro URL: " .. err.message)
    assert_mentions(err.message, path, "read-only")

    -- which works: every read
    local ro = eventstore.open(suggested)
    assert.are.same({ 1, 2, 3 }, helpers.pluck(ro:read("s"), "payload"))
    assert.are.equal(3, ro:head("s"))
    assert.are.equal(3, #ro:read_all({}))
    assert.are.equal("s", ro:sessions({}).sessions[1].session)
    assert.are.same({}, ro:wait("s", 3, 0))
    -- and refuses writes as STORAGE, changing nothing
    err = helpers.expect_error("STORAGE", ro.append, ro, "s", { { type = "d" } })
    assert_mentions(err.message, "read-only")
    assert.are.equal(3, ro:head("s"))
    ro:close()

    -- the CLI too (items 5 and 6 together: the reviewer's command line)
    local code, out, cerr = run_cli(dir, { "read", "s", "--db", "sqlite:x.db?mode=ro" })
    assert.are.equal("", cerr)
    assert.are.equal(0, code)
    assert.are.equal(3, select(2, out:gsub("\n", "")))

    assert.are.equal(names, listing(dir), "files appeared")
    assert.are.equal(bytes, read_file(path), "the file changed")

    if how == "bind" then
      -- The same file written through its writable path while a read-only
      -- handle is open: the handle reads without locks (SQLite cannot
      -- create the -shm here), so it must refuse to read rather than read
      -- pages that may be torn or stale.
      ro = eventstore.open(suggested)
      assert.are.equal(3, ro:head("s"))
      local w = eventstore.open("sqlite:" .. src .. "/x.db")
      w:append("s", { { type = "d", payload = 4 } })
      err = helpers.expect_error("STORAGE", ro.read, ro, "s")
      assert_mentions(err.message, "changed", "reopen")
      ro:close()
      -- while the writer has it open (-wal and -shm exist), mode=ro reads
      -- through them and follows new commits
      ro = eventstore.open(suggested)
      assert.are.equal(4, ro:head("s"))
      w:append("s", { { type = "e", payload = 5 } })
      assert.are.equal(5, ro:head("s"))
      ro:close()
      w:close()
    end
  end)
end)

-- ---- 7: a full disk -------------------------------------------------------------------

-- Mounts a tmpfs of size_kib at a new directory and runs fn(dir); pending
-- when not root or the mount fails; always unmounts.
local function with_tmpfs(size_kib, fn)
  if not IS_ROOT then
    pending("needs root to mount a small tmpfs (run the suite as root to test a full disk)")
    return
  end
  local dir = mkdtemp()
  finally(function()
    if is_mounted(dir) then umount(dir) end
    sh("rmdir " .. sh_quote(dir) .. " 2>/dev/null")
  end)
  if not mount(("-t tmpfs -o size=%dk tmpfs %s"):format(size_kib, sh_quote(dir))) then
    pending("cannot mount a tmpfs here (no permission to mount?)")
    return
  end
  fn(dir)
end

local function free_kib(dir)
  return math.tointeger(tonumber(capture("df -k --output=avail " .. sh_quote(dir) .. " | tail -1")))
end

-- A file of kib KiB of zeros, written from Lua (not dd: under
-- check-sanitize the ASan runtime is preloaded into every child, and dd's
-- aligned_alloc trips it).
local function fill(path, kib)
  local f = assert(io.open(path, "wb"))
  local chunk = string.rep("\0", 1024)
  for _ = 1, kib do assert(f:write(chunk)) end
  assert(f:close())
end

local PAYLOAD = { text = string.rep("x", 300) }

-- Appends one-event batches until one fails (at most `max` tries); every
-- failure must be STORAGE "disk full" and leave the log exactly as it was.
-- Returns the ids acknowledged, in order, and the first error.
local function append_until_full(store, ids, max)
  for i = 1, max do
    local ok, res = pcall(store.append, store, "s", { { type = "t", payload = PAYLOAD } })
    if not ok then
      assert(eventstore.is_error(res, "STORAGE"), "expected STORAGE, got " .. tostring(res))
      assert_mentions(res.message, "disk full")
      return res
    end
    ids[#ids + 1] = res[1].id
    assert(i < max, "the disk never filled up")
  end
end

-- While the disk is full: more calls (appends, a claim, a snapshot) each
-- either succeed or fail with STORAGE "disk full" and change nothing.
local function calls_while_full(store, ids)
  local failures = 0
  local calls = {
    function() return store:append("s", { { type = "t", payload = PAYLOAD } }) end,
    function() return store:claim("s", { holder = "h", ttl_ms = 1000, limit = 1 }) end,
    function() return store:put_snapshot("s", "r", store:head("s"), string.rep("s", 20000), "1") end,
    function() return store:append("s", { { type = "t", payload = PAYLOAD }, { type = "t", payload = PAYLOAD } }) end,
  }
  for _, call in ipairs(calls) do
    local before = helpers.log_state(store)
    local snaps = helpers.dump(store:snapshots("s"))
    local ok, res = pcall(call)
    if ok then
      -- it found room: then it must be all there (only appends add ids)
      if type(res) == "table" and res[1] and res[1].id then
        for _, e in ipairs(res) do ids[#ids + 1] = e.id end
      end
    else
      failures = failures + 1
      assert(eventstore.is_error(res, "STORAGE"), "expected STORAGE, got " .. tostring(res))
      assert_mentions(res.message, "disk full")
      assert.are.equal(before, helpers.log_state(store), "a failed call changed the log")
      assert.are.equal(snaps, helpers.dump(store:snapshots("s")), "a failed call changed the snapshots")
    end
  end
  return failures
end

describe("sqlite: a full disk", function()
  it("a small disk: STORAGE 'disk full', nothing lost or half-written; works again once space is freed, and after reopening", function()
    with_tmpfs(4096, function(dir)
      fill(dir .. "/spare", 512)     -- freed later
      fill(dir .. "/ballast", 2304)  -- leaves the store about 1.2 MiB
      local url = "sqlite:" .. dir .. "/s.db"
      local store = eventstore.open(url, { clock = eventstore.manual_clock(1000000) })
      local ids = {}
      append_until_full(store, ids, 20000)
      assert(#ids > 0, "nothing fitted at all: the test's sizes are wrong")
      assert.are.same(ids, all_ids(store), "exactly the acknowledged events are stored")
      calls_while_full(store, ids)
      assert.are.same(ids, all_ids(store))

      -- free 512 KiB: appends work again on the same handle
      os.remove(dir .. "/spare")
      for _ = 1, 100 do
        local stored = store:append("s", { { type = "t", payload = PAYLOAD } })
        ids[#ids + 1] = stored[1].id
      end
      assert.are.same(ids, all_ids(store))
      store:close()

      -- and after reopening: everything acknowledged, and appends work
      store = eventstore.open(url)
      assert.are.same(ids, all_ids(store))
      for _ = 1, 100 do
        local stored = store:append("s", { { type = "t", payload = PAYLOAD } })
        ids[#ids + 1] = stored[1].id
      end
      assert.are.same(ids, all_ids(store))
      store:close()
    end)
  end)

  it("the disk fills after the store opened: freeing 400 KiB lets 300 appends through, also after reopening", function()
    -- A tmpfs big enough that the store opens with room to spare (no
    -- low-space settings yet), then filled by someone else: the WAL, which
    -- grows by whole pages per commit, is what meets the full disk.
    with_tmpfs(72 * 1024, function(dir)
      local url = "sqlite:" .. dir .. "/s.db"
      local store = eventstore.open(url)
      local ids = { store:append("s", { { type = "t", payload = PAYLOAD } })[1].id }
      fill(dir .. "/spare", 400)
      fill(dir .. "/ballast", free_kib(dir) - 1536)
      append_until_full(store, ids, 20000)
      assert.are.same(ids, all_ids(store))
      assert(calls_while_full(store, ids) > 0, "the disk should still be full")
      assert.are.same(ids, all_ids(store))

      os.remove(dir .. "/spare")
      for _ = 1, 300 do
        ids[#ids + 1] = store:append("s", { { type = "t", payload = PAYLOAD } })[1].id
      end
      store:close()
      store = eventstore.open(url)
      assert.are.same(ids, all_ids(store))
      for _ = 1, 300 do
        ids[#ids + 1] = store:append("s", { { type = "t", payload = PAYLOAD } })[1].id
      end
      assert.are.same(ids, all_ids(store))
      store:close()
    end)
  end)
end)
