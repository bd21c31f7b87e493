-- SQLite durability under kill -9 (docs/sqlite.md "Durability").
--
-- A child process (spec/support/sqlite_crash_child.lua) appends batches and
-- completes events against one sqlite file in a loop, writing what each call
-- acknowledged to a side file after the call returned. This spec kills it
-- with SIGKILL at random moments, 24 times, restarting it each time (odd
-- runs: any moment from its start, so also while it opens the file; even
-- runs: a moment after it acknowledged its first write, so inside its
-- loop however slow the disk is), then reopens the file and checks that
--   - every acknowledged batch is there, each event exactly once;
--   - no batch is partial (all of its events or none, acknowledged or not);
--   - every session's indexes are dense 1..head, positions strictly increase;
--   - every acknowledged completion left its event processed with exactly
--     one result event carrying cause {index, attempt}, and no event was
--     completed twice.
-- SQLite only: memory stores do not outlive their process.
local eventstore = require("eventstore")

local LUA = os.getenv("LUA") or "lua5.4"
local spec_dir = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local CHILD = spec_dir .. "support/sqlite_crash_child.lua"
local KILLS = 24

local helpers = require("helpers")
local sh_quote = helpers.sh_quote

local sleep = helpers.sleep

local alive = helpers.alive

local function file_size(path) return helpers.file_size(path) or 0 end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

local remove_db = helpers.remove_db

describe("sqlite: kill -9", function()
  local base, db, ackfile, logfile

  before_each(function()
    base = os.tmpname() -- reserves a unique name
    db, ackfile, logfile = base .. ".db", base .. ".ack", base .. ".log"
  end)

  after_each(function()
    remove_db(db)
    os.remove(ackfile)
    os.remove(logfile)
    os.remove(base)
  end)

  it("loses nothing acknowledged and never half a batch", function()
    helpers.seed("sqlite crash: kill moments")
    -- create the file first so every child only opens it
    eventstore.open("sqlite:" .. db):close()

    local kills = 0
    for run = 1, KILLS do
      local cmd = ("%s %s %s %s %d >>%s 2>&1 & echo $!"):format(LUA, sh_quote(CHILD), sh_quote(db),
        sh_quote(ackfile), run, sh_quote(logfile))
      local p = assert(io.popen(cmd, "r"))
      local pid = math.tointeger(tonumber(p:read("l")))
      p:close()
      assert.is_not_nil(pid, "could not start the child")
      if run % 2 == 0 then
        -- wait (up to 10 s) until this run acknowledged something
        local size0, waited = file_size(ackfile), 0
        while file_size(ackfile) == size0 and waited < 10 and alive(pid) do
          sleep(0.005)
          waited = waited + 0.005
        end
        sleep(math.random() * 0.15)
      else
        -- a random moment: from during its start-up to deep in its loop
        sleep(0.01 + math.random() * 0.25)
      end
      if not alive(pid) then
        error("the child exited on its own before being killed:\n" .. read_file(logfile))
      end
      os.execute("kill -9 " .. pid)
      kills = kills + 1
      local waited = 0
      while alive(pid) and waited < 5 do
        sleep(0.01)
        waited = waited + 0.01
      end
      assert.is_false(alive(pid), "the child survived kill -9")
    end
    assert.is_true(kills >= 20)

    -- what was acknowledged: whole lines only (a kill may cut the last one)
    local acked_batches, acked_completions = {}, {}
    for line in read_file(ackfile):gmatch("([^\n]*)\n") do
      local n, session, size = line:match("^a (%d+) (%S+) (%d+)$")
      if n then
        acked_batches[#acked_batches + 1] = { n = tonumber(n), session = session, size = tonumber(size) }
      else
        local s, index, attempt, rid = line:match("^c (%S+) (%d+) (%d+) (%S+)$")
        assert.is_not_nil(s, "unreadable acknowledgement line: " .. line)
        acked_completions[#acked_completions + 1] = {
          session = s, index = tonumber(index), attempt = tonumber(attempt), rid = rid,
        }
      end
    end
    assert.is_true(#acked_batches >= KILLS // 2,
      ("only %d batches acknowledged in %d runs"):format(#acked_batches, KILLS))

    local store = eventstore.open("sqlite:" .. db)
    local all = store:read_all({ after = 0 })
    local by_id, batches, last_position = {}, {}, 0
    for _, e in ipairs(all) do
      assert.is_nil(by_id[e.id], "event id stored twice: " .. e.id)
      by_id[e.id] = e
      assert.is_true(e.position > last_position, "positions must strictly increase")
      last_position = e.position
      local n = e.id:match("^b(%d+)%-%d+$")
      if n then
        local b = batches[n] or { count = 0, size = e.payload.size, session = e.session }
        b.count = b.count + 1
        assert.equal(b.session, e.session)
        batches[n] = b
      end
    end

    -- no batch is partial, acknowledged or not
    local stored_batches = 0
    for n, b in pairs(batches) do
      stored_batches = stored_batches + 1
      assert.equal(b.size, b.count, ("batch %s is partial: %d of %d events"):format(n, b.count, b.size))
    end
    -- every acknowledged batch is there, whole, in its session
    for _, b in ipairs(acked_batches) do
      for j = 1, b.size do
        local e = by_id[("b%d-%d"):format(b.n, j)]
        assert.is_not_nil(e, ("acknowledged event b%d-%d is missing"):format(b.n, j))
        assert.equal(b.session, e.session)
        assert.equal(j, e.payload.j)
      end
    end

    -- dense indexes per session, matching head
    local sessions = {}
    for _, e in ipairs(all) do sessions[e.session] = true end
    for session in pairs(sessions) do
      local events = store:read(session)
      for i, e in ipairs(events) do
        assert.equal(i, e.index, "indexes of " .. session .. " are not dense")
      end
      assert.equal(#events, store:head(session))
    end

    -- completions: each processed work event has exactly one result event
    -- carrying cause {index, attempt} of the attempt that completed it
    local results = {} -- "session/index" -> list of result events
    for _, e in ipairs(all) do
      if e.type == "done" then
        assert.is_not_nil(e.cause, "a result event without cause")
        local key = e.session .. "/" .. e.cause.index
        results[key] = results[key] or {}
        table.insert(results[key], e)
      end
    end
    for _, e in ipairs(all) do
      if e.type == "work" then
        local r = results[e.session .. "/" .. e.index]
        if e.status == "processed" then
          assert.is_not_nil(r, "processed without a result event: " .. e.id)
          assert.equal(1, #r, "completed more than once: " .. e.id)
          assert.equal(e.attempts, r[1].cause.attempt)
        else
          assert.is_nil(r, "a result event for an unprocessed event: " .. e.id)
        end
      end
    end
    for _, c in ipairs(acked_completions) do
      local e = store:read(c.session, { after = c.index - 1, limit = 1 })[1]
      assert.is_not_nil(e, "a completed event vanished")
      assert.equal("processed", e.status)
      local r = by_id[c.rid]
      assert.is_not_nil(r, "acknowledged result event missing: " .. c.rid)
      assert.same({ index = c.index, attempt = c.attempt }, r.cause)
    end
    store:close()
    print(("# %d kills; %d batches acknowledged, %d stored; %d completions acknowledged; %d events"):format(
      kills, #acked_batches, stored_batches, #acked_completions, #all))
  end)
end)
