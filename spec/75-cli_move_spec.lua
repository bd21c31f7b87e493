-- eventstore export, import, copy and backup (docs/moving.md, docs/cli.md):
-- the commands' files and exit codes, an import killed with -9 halfway and
-- rerun, copy --follow under a writer losing nothing, a verified backup.
local eventstore = require("eventstore")
local helpers = require("helpers")
local ch = require("cli_helpers")
local ph = require("proc_helpers")

local q = helpers.sh_quote

local scratch = ch.scratch()
local procs, workdir, cleanup = scratch.procs, scratch.workdir, scratch.cleanup

-- A source store at dir/src.db with n events over a few sessions, some of
-- them dispatched, one dead, one fenced, a snapshot and a ref.
local function seed(dir, n)
  local s <close> = eventstore.open("sqlite:" .. dir .. "/src.db")
  local batches = {}
  for i = 1, n do
    local b = batches[i % 7] or {}
    batches[i % 7] = b
    b[#b + 1] = { type = "t", payload = { i = i, text = ("x"):rep(50) } }
    if #b == 500 or n - i < 7 then
      s:append("s" .. (i % 7), b)
      batches[i % 7] = {}
    end
  end
  local c = s:claim("s1", { holder = "h", ttl_ms = 1000, limit = 1 })
  s:fail("s1", c.events[1].index, c.events[1].attempt, { error = "boom", max_failures = 1 })
  s:fence("s2")
  s:put_snapshot("s3", "r", 1, "state", "v1")
  s:put_ref("main", "s3")
end

-- Archived sessions beside the seed (§3.9; sqlite:PATH keeps its segments
-- in PATH.archive): a1 in two segments, a2 archived whole.
local function archive_some(dir)
  local s <close> = eventstore.open("sqlite:" .. dir .. "/src.db")
  local settled = {}
  for i = 1, 300 do settled[i] = { type = "t", payload = { i = i }, settled = true } end
  s:append("a1", settled)
  s:append("a2", { settled[1], settled[2] })
  s:archive("a1", { through = 100 })
  s:archive("a1", { through = 250 })
  s:archive("a2", { through = 2 })
end

local function export_text(dir, url)
  return ch.ok(ch.run(dir, { "export", "--db", url }))
end

describe("eventstore export / import", function()
  after_each(cleanup)

  it("round-trips a store through a file, refuses a non-empty store and a newer format (exit 1)", function()
    local dir = workdir()
    seed(dir, 50)
    assert.equal("", ch.ok(ch.run(dir, { "export", "--db", "sqlite:src.db", "--out", "x.ndjson" })))
    local text = helpers.read_file(dir .. "/x.ndjson")
    local lines = ch.lines(text)
    assert.same({ eventstore_export = 2, backend = "sqlite", position = 50 }, eventstore.json.decode(lines[1]))
    assert.truthy(lines[#lines]:match('^{"end":'))

    local r = eventstore.json.decode(ch.ok(ch.run(dir, { "import", "--db", "sqlite:dst.db", "--in", "x.ndjson" })))
    assert.same({ imported = true, sessions = 7, events = 50, position = 50 }, r)
    assert.equal(text, export_text(dir, "sqlite:dst.db"))
    -- rerun after it finished: exit 0, nothing changes
    r = eventstore.json.decode(ch.ok(ch.run(dir, { "import", "--db", "sqlite:dst.db" }, text)))
    assert.is_false(r.imported)
    assert.equal(text, export_text(dir, "sqlite:dst.db"))

    ch.ok(ch.run(dir, { "append", "other", "--db", "sqlite:other.db" }, '{"type":"t","payload":1}\n'))
    local err = ch.fails_one_line(ch.run(dir, { "import", "--db", "sqlite:other.db", "--in", "x.ndjson" }), 1,
      "INVALID_ARGUMENT: import: the target store is not empty")
    assert.truthy(err:find("nothing written", 1, true))
    local newer = text:gsub('"eventstore_export":2', '"eventstore_export":9', 1)
    ch.fails_one_line(ch.run(dir, { "import", "--db", "sqlite:new.db" }, newer), 1,
      "INVALID_ARGUMENT: import: the export is format version 9, newer")
    ch.fails_one_line(ch.run(dir, { "import", "--db", "sqlite:cut.db" }, text:sub(1, #text // 2)), 1,
      "INVALID_ARGUMENT: import:")
    local s <close> = eventstore.open("sqlite:" .. dir .. "/cut.db")
    assert.equal(0, #s:sessions({}).sessions)
    -- an input that is no export at all is refused before the target is
    -- opened: no file is left behind (docs/cli.md "A failed command writes nothing")
    ch.fails_one_line(ch.run(dir, { "import", "--db", "sqlite:empty.db" }, ""), 1, "import: the stream is empty")
    ch.fails_one_line(ch.run(dir, { "import", "--db", "sqlite:junk.db" }, "garbage\n"), 1,
      "import: line 1: not an eventstore export")
    ch.fails_one_line(ch.run(dir, { "import", "--db", "sqlite:nofile.db", "--in", "nowhere.ndjson" }), 1,
      "cannot read --in nowhere.ndjson")
    for _, name in ipairs({ "empty.db", "junk.db", "nofile.db" }) do
      assert.is_nil(io.open(dir .. "/" .. name), name .. " was made")
    end
  end)

  it("an import killed with -9 halfway and rerun ends with the same store, archived segments too", function()
    local dir = workdir()
    seed(dir, 3000)
    archive_some(dir)
    ch.ok(ch.run(dir, { "export", "--db", "sqlite:src.db", "--out", "x.ndjson" }))
    assert.truthy(helpers.read_file(dir .. "/x.ndjson"):find('"archived_event"', 1, true))
    local gate = dir .. "/gate"
    local p = ph.spawn({ "sh", "-c", "cd " .. q(dir) .. " && exec " .. q(ch.BIN)
      .. " import --db sqlite:dst.db --in x.ndjson" }, { ES_TEST_IMPORT_GATE = gate }, dir .. "/import.log")
    procs[#procs + 1] = p
    -- the import has written every row and not committed: kill it there
    helpers.wait_until(function() return helpers.read_file(gate .. ".paused") ~= nil end,
      "the import to reach its commit", 120, 0.02)
    ph.signal(p, "KILL")
    assert.equal(137, ph.wait(p, 30))
    -- the killed import wrote its segment files before the commit that
    -- never came: orphans, which nothing reads
    local vr = ch.run(dir, { "verify-archive", "--db", "sqlite:dst.db" })
    assert.equal(0, vr.code, vr.err)
    assert.same({ checked = 0, problems = 0, orphans = 3 }, eventstore.json.decode(vr.out))
    local _, notes = vr.err:gsub("eventstore: note: orphan ", "")
    assert.equal(3, notes, vr.err)
    local r = eventstore.json.decode(ch.ok(ch.run(dir, { "import", "--db", "sqlite:dst.db", "--in", "x.ndjson" })))
    assert.is_true(r.imported)
    assert.equal(helpers.read_file(dir .. "/x.ndjson"), export_text(dir, "sqlite:dst.db"))
    -- the rerun swept them as it wrote the sessions' segments again
    assert.same({ checked = 3, problems = 0, orphans = 0 },
      eventstore.json.decode(ch.ok(ch.run(dir, { "verify-archive", "--db", "sqlite:dst.db" }))))
    -- the same segments (a file's name holds a random nonce: not compared)
    local function segments(session, db)
      local out = {}
      for _, l in ipairs(ch.lines(ch.ok(ch.run(dir, { "segments", session, "--db", db })))) do
        local g = eventstore.json.decode(l)
        g.file = nil
        out[#out + 1] = g
      end
      return out
    end
    assert.equal(2, #segments("a1", "sqlite:src.db"))
    for _, session in ipairs({ "a1", "a2" }) do
      assert.same(segments(session, "sqlite:src.db"), segments(session, "sqlite:dst.db"))
    end
  end)
end)

describe("eventstore copy --follow", function()
  after_each(cleanup)

  it("copies everything a writer appends while it follows, and the last pass brings dispatch up to date", function()
    local dir = workdir()
    seed(dir, 100)
    local copy = ph.spawn({ "sh", "-c", "cd " .. q(dir) .. " && exec " .. q(ch.BIN)
      .. " copy --from sqlite:src.db --to sqlite:dst.db --follow" }, {}, dir .. "/copy.log")
    procs[#procs + 1] = copy
    -- the first pass is in once dst.db holds the seed's sessions
    helpers.wait_until(function()
      if not helpers.read_file(dir .. "/dst.db") then return false end
      local ok, n = pcall(function()
        local d <close> = eventstore.open("sqlite:" .. dir .. "/dst.db?mode=ro")
        return #d:read_all({ after = 0, limit = 1000 })
      end)
      return ok and n == 100
    end, "the first pass of copy", 120, 0.05)

    local writer = dir .. "/writer.lua"
    helpers.write_file(writer, [[
local eventstore = require("eventstore")
local s <close> = eventstore.open("sqlite:" .. arg[1] .. "/src.db")
for i = 1, 2000 do
  s:append("w" .. (i % 13), { { type = "w", payload = i } })
  if i % 500 == 0 then
    local c = s:claim("w" .. (i % 13), { holder = "h", ttl_ms = 1000, limit = 1 })
    if c.outcome == "claimed" then s:complete(c.events[1].session, c.events[1].index, c.events[1].attempt, {}) end
  end
  -- archiving while the copy follows: a segment of events it copied as
  -- rows, then one more of a session that gets no append after it
  if i == 1000 then
    local settled = {}
    for k = 1, 50 do settled[k] = { type = "z", payload = k, settled = true } end
    s:append("z", settled)
    s:archive("z", { through = 20 })
  elseif i == 1500 then
    s:archive("z", { through = 40 })
  end
end
-- a dispatch change with no append after it: only the last pass sees it
local c = s:claim("w0", { holder = "h", ttl_ms = 1000, limit = 1 })
s:fail("w0", c.events[1].index, c.events[1].attempt, { error = "late", max_failures = 1 })
]])
    local w = ph.spawn({ "lua5.4", writer, dir }, { LUA_PATH = os.getenv("LUA_PATH") or "",
      LUA_CPATH = os.getenv("LUA_CPATH") or "" }, dir .. "/writer.log")
    procs[#procs + 1] = w
    assert.equal(0, ph.wait(w, 300), ph.tail(dir .. "/writer.log", 20))
    -- the follower catches up with the last append, then is stopped
    helpers.wait_until(function()
      local ok, n = pcall(function()
        local d <close> = eventstore.open("sqlite:" .. dir .. "/dst.db?mode=ro")
        return d:stats().events
      end)
      return ok and n == 2150
    end, "copy --follow to catch up", 120, 0.05)
    ph.signal(copy, "TERM")
    assert.equal(0, ph.wait(copy, 60), ph.tail(dir .. "/copy.log", 20))
    local last = ch.lines(helpers.read_file(dir .. "/copy.log"))
    assert.same({ copied = true, events = 2150, position = 2150 }, eventstore.json.decode(last[#last]))
    assert.equal(export_text(dir, "sqlite:src.db"), export_text(dir, "sqlite:dst.db"))
  end)
end)

describe("eventstore backup", function()
  after_each(cleanup)

  it("makes a new, checked copy of a sqlite: store and refuses what it cannot back up", function()
    local dir = workdir()
    seed(dir, 200)
    local r = eventstore.json.decode(ch.ok(ch.run(dir, { "backup", "--db", "sqlite:src.db", "--to", "b.db" })))
    assert.same({ backup = "b.db", integrity = "ok", sessions = 7, events = 200 }, r)
    assert.equal(export_text(dir, "sqlite:src.db"), export_text(dir, "sqlite:b.db"))
    ch.fails_one_line(ch.run(dir, { "backup", "--db", "sqlite:src.db", "--to", "b.db" }), 1,
      "INVALID_ARGUMENT: backup: b.db already exists")
    ch.fails_one_line(ch.run(dir, { "backup", "--db", "memory:", "--to", "m.db" }), 1, "backup copies a sqlite: store")
    assert.is_nil(helpers.read_file(dir .. "/m.db"))
  end)
end)
