-- Archive segments under kill -9 (docs/contract.md §3.9, docs/retention.md
-- "Archive: crash safety").
--
-- A child process (spec/support/sqlite_archive_crash_child.lua) appends
-- settled batches, archives each session through its head and compacts its
-- segments, in a loop, writing what each call acknowledged to a side file.
-- This spec kills it with SIGKILL at random moments, 20 times, restarting
-- it each time, and after every kill reopens the store and checks that
--   - every acknowledged batch is readable, each event exactly once, no
--     batch partial, indexes dense 1..head (archived and live parts
--     together);
--   - every acknowledged archive is recorded (archived through at least
--     what was acknowledged, the rows gone from the live store);
--   - verify_archive finds no problem (orphans, from a kill between the
--     file's rename and the commit, are allowed: they are never read).
-- At the end an archive of each session removes the orphans.
-- Run on one SQLite file, and on a shards: store of three SQLite files
-- (each shard's segments in a directory of its own under the archive
-- directory, docs/sharding.md "Keys and archive"). SQLite only: memory
-- stores do not outlive their process.
local eventstore = require("eventstore")
local helpers = require("helpers")

local LUA = os.getenv("LUA") or "lua5.4"
local spec_dir = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local CHILD = spec_dir .. "support/sqlite_archive_crash_child.lua"
local KILLS = 20

local sh_quote, sleep, alive = helpers.sh_quote, helpers.sleep, helpers.alive

local function file_size(path) return helpers.file_size(path) or 0 end

local function read_file(path) return helpers.read_file(path) or "" end

-- The stores to run on: each makes its URL from a base path (and lists
-- the database files it made).
local kinds = {
  { name = "sqlite:", url = function(base) return "sqlite:" .. base .. ".db", { base .. ".db" } end },
  { name = "shards: over sqlite files", url = function(base)
      local dbs = { base .. ".catalog.db", base .. ".a.db", base .. ".b.db", base .. ".c.db" }
      local plan = { version = 1, shards = { a = "sqlite:" .. dbs[2], b = "sqlite:" .. dbs[3], c = "sqlite:" .. dbs[4] } }
      eventstore.open("shards:", { catalog = "sqlite:" .. dbs[1], plan = plan }):close()
      return "shards:sqlite:" .. dbs[1], dbs
    end },
}

for _, kind in ipairs(kinds) do
describe(kind.name .. " archive under kill -9", function()
  local base, url, dbs, dir, ackfile, logfile

  before_each(function()
    base = os.tmpname()
    dir, ackfile, logfile = base .. ".archive", base .. ".ack", base .. ".log"
    url, dbs = kind.url(base)
  end)

  after_each(function()
    for _, db in ipairs(dbs) do helpers.remove_db(db) end
    os.execute("rm -rf " .. sh_quote(dir))
    os.remove(ackfile)
    os.remove(logfile)
    os.remove(base)
  end)

  -- Checks the store against the acknowledgements so far.
  local function check(round)
    local batches, archived = {}, {}
    for line in read_file(ackfile):gmatch("([^\n]*)\n") do
      local n, session, size = line:match("^a (%d+) (%S+) (%d+)$")
      if n then
        batches[#batches + 1] = { n = n, session = session, size = tonumber(size) }
      else
        local s, through = line:match("^r (%S+) (%d+)$")
        assert.is_not_nil(s, "unreadable acknowledgement line: " .. line)
        archived[s] = math.max(archived[s] or 0, tonumber(through))
      end
    end
    local store <close> = eventstore.open(url, { archive = dir })
    local seen = {} -- id -> count
    local per_batch = {} -- n -> events seen
    for _, session in ipairs({ "s0", "s1", "s2" }) do
      local events = store:read(session)
      assert.equal(store:head(session), #events, round .. ": " .. session .. " is not dense")
      for i, e in ipairs(events) do
        assert.equal(i, e.index)
        seen[e.id] = (seen[e.id] or 0) + 1
        local n = e.id:match("^b(%d+)%-")
        per_batch[n] = (per_batch[n] or 0) + 1
        assert.equal(e.payload.n, math.tointeger(tonumber(n)))
      end
      local row = helpers.session_row(store, session)
      local through = archived[session] or 0
      local segs = store:segments(session)
      local top = #segs > 0 and segs[#segs].through or 0
      assert.is_true(top >= through, ("%s: %s archived through %d, acknowledged %d"):format(round, session, top, through))
      if row then assert.equal(#events, row.events) end
      -- the live rows start after the archived part
      for _, e in ipairs(store:read_all({})) do
        if e.session == session then assert.is_true(e.index > top) end
      end
    end
    for id, count in pairs(seen) do assert.equal(1, count, "event " .. id .. " read twice") end
    for _, b in ipairs(batches) do
      assert.equal(b.size, per_batch[b.n], round .. ": acknowledged batch " .. b.n .. " is not whole")
    end
    for n, count in pairs(per_batch) do
      local size = count -- a batch nobody acknowledged must still be whole
      assert.is_true(size == 7 or size == 100, round .. ": batch " .. n .. " has " .. count .. " events")
    end
    local v = store:verify_archive()
    assert.same({}, v.problems)
    return #batches, v
  end

  it("reads every event exactly once after each kill; verify_archive finds no problem", function()
    helpers.seed("archive crash: kill moments")
    eventstore.open(url, { archive = dir }):close()
    local orphans_seen = 0
    for run = 1, KILLS do
      local cmd = ("%s %s %s %s %s %d >>%s 2>&1 & echo $!"):format(LUA, sh_quote(CHILD), sh_quote(url),
        sh_quote(dir), sh_quote(ackfile), run, sh_quote(logfile))
      local p = assert(io.popen(cmd, "r"))
      local pid = math.tointeger(tonumber(p:read("l")))
      p:close()
      assert.is_not_nil(pid, "could not start the child")
      local size0, waited = file_size(ackfile), 0
      while file_size(ackfile) == size0 and waited < 10 and alive(pid) do
        sleep(0.005)
        waited = waited + 0.005
      end
      sleep(math.random() * 0.2)
      if not alive(pid) then
        error("the child exited on its own before being killed:\n" .. read_file(logfile))
      end
      os.execute("kill -9 " .. pid)
      waited = 0
      while alive(pid) and waited < 5 do
        sleep(0.01)
        waited = waited + 0.01
      end
      assert.is_false(alive(pid), "the child survived kill -9")
      local _, v = check("after kill " .. run)
      orphans_seen = orphans_seen + #v.orphans
    end
    local acked = check("at the end")
    assert.is_true(acked >= KILLS, ("only %d batches acknowledged"):format(acked))
    -- the next archive of each session removes its orphans
    local store <close> = eventstore.open(url, { archive = dir })
    for _, session in ipairs({ "s0", "s1", "s2" }) do
      store:append(session, { { type = "t", settled = true, payload = { n = 0 } } })
      store:archive(session, { through = store:head(session) })
    end
    local v = store:verify_archive()
    assert.same({}, v.problems)
    assert.same({}, v.orphans)
    print(("\n  (%d kills, %d batches acknowledged, %d orphan sightings)"):format(KILLS, acked, orphans_seen))
  end)
end)
end
