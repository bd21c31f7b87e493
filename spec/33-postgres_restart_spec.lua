-- The PostgreSQL server restarted and stopped mid-run (issue 11 item 4,
-- docs/contract.md §5, docs/postgres.md "What a server restart (or a dropped
-- connection) does", docs/engine.md "When the store fails").
--
-- - An `eventstore run --until-idle` engine works through 4,000 events
--   while the server is restarted (`pg_ctl restart -m fast`) and then
--   stopped for about two seconds and started again; a child process
--   appends batches with fixed ids all along, sending a batch that failed
--   with STORAGE again with the same ids. The engine rides both outages
--   out (one log line when the store begins failing, one when it answers
--   again, not one per try) and exits 0; every event is processed, each
--   result appended once; every acknowledged batch is stored once, whole.
--   Direct calls while the server is down fail with STORAGE at once (no
--   hang), write nothing, and the same handle works again afterwards.
-- - `run --until-done` asleep until a timer when the server stops rides
--   that out too (its own store calls, docs/cli.md "run") and exits 0.
-- - A completion that fails because the server went down (the handler
--   itself stops it) is retried with the same ids: its result is stored
--   once, by that attempt.
-- - An until_idle run against a server that stays down ends with STORAGE
--   after outage_ms, not before and not never.
-- Needs a cluster this run may restart: ES_PG_URL and ES_PG_DIR (make test
-- starts one through spec/support/pg_cluster.sh run); pending without.
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")
local ph = require("proc_helpers")

local PG, PG_DIR = os.getenv("ES_PG_URL"), os.getenv("ES_PG_DIR")
if not PG or PG == "" or not PG_DIR or PG_DIR == "" then
  describe("postgres: a server restart mid-run", function()
    pending("ES_PG_URL and ES_PG_DIR are not set: run through spec/support/pg_cluster.sh run (make test does)")
  end)
  return
end

local LUA = os.getenv("LUA") or "lua5.4"
local spec_dir = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local APPENDER = spec_dir .. "support/pg_restart_appender.lua"
local CLUSTER = spec_dir .. "support/pg_cluster.sh"
local q = helpers.sh_quote

local function cluster(action)
  local ok = os.execute(("sh %s %s %s"):format(q(CLUSTER), action, q(PG_DIR)))
  assert(ok, "pg_cluster.sh " .. action .. " failed")
end

-- The server must be up for the next test (and the next spec file),
-- whatever this one did.
local function ensure_up()
  os.execute(("sh %s start-server %s >/dev/null 2>&1"):format(q(CLUSTER), q(PG_DIR)))
end

local JOBS, PER_SESSION = 4000, 100

local HANDLER = [[
return function(event, ctx)
  return { { type = "job.done", payload = { of = event.index, attempt = ctx.attempt } } }
end
]]

-- The first test's handler: the last GATED_SESSIONS sessions' jobs wait
-- until the spec opens the gate (a file), after the server's stop and
-- start: the engine cannot have finished before the stop, however the
-- machine's load shares the cores between it and the spec (under load it
-- once did every job before the spec could stop the server).
local GATED_SESSIONS = 10
local GATED_HANDLER = [[
return function(event, ctx)
  if event.payload.gate then
    while true do
      local f = io.open(%q)
      if f then f:close() break end
      os.execute("sleep 0.05")
    end
  end
  return { { type = "job.done", payload = { of = event.index, attempt = ctx.attempt } } }
end
]]

local function pending_jobs(store)
  return store:pending_types().job or 0
end

-- Every job of sessions 1..n processed with exactly one result, from the
-- attempt that processed it. Returns how many jobs.
local function check_jobs(store, prefix, n)
  local total = 0
  for s = 1, n do
    local session = ("%s%03d"):format(prefix, s)
    local results = {}
    local events = store:read(session)
    for _, e in ipairs(events) do
      if e.type == "job.done" then
        assert.is_nil(results[e.cause.index], ("%s/%d has two results"):format(session, e.cause.index))
        results[e.cause.index] = e
      end
    end
    for _, e in ipairs(events) do
      if e.type == "job" then
        total = total + 1
        local key = session .. "/" .. e.index
        assert.equal("processed", e.status, key .. " is " .. e.status .. ": " .. tostring(e.last_error))
        local r = results[e.index]
        assert.is_not_nil(r, key .. " has no result")
        assert.same({ index = e.index, attempt = e.attempts }, r.cause)
        assert.equal(e.attempts, r.payload.attempt)
      end
    end
  end
  return total
end

-- fn() must fail with STORAGE, within `seconds`: a hang ceiling (a call on
-- a stopped server fails in milliseconds; one that waited for the server to
-- come back would take the whole outage and more).
local function fails_storage(what, seconds, fn)
  local t0 = helpers.wall()
  local ok, err = pcall(fn)
  local took = helpers.wall() - t0
  assert.is_false(ok, what .. " succeeded while the server was down")
  assert.is_true(eventstore.is_error(err, "STORAGE"), what .. ": " .. tostring(err))
  assert.is_true(took < seconds, ("%s took %.1f s to fail"):format(what, took))
  return err
end

describe("postgres: a server restart mid-run", function()
  local procs, files, url, dir

  before_each(function()
    procs, files = {}, {}
    url = helpers.pg_fresh_url(PG)
    dir = eh.scripts_dir()
  end)

  after_each(function()
    ensure_up()
    for _, p in ipairs(procs) do ph.reap(p) end
    for _, f in ipairs(files) do os.remove(f) end
    eh.cleanup()
    helpers.cleanup()
  end)

  it("the engine rides out a restart and a stop; nothing lost or doubled; calls meanwhile fail with STORAGE and write nothing", function()
    local started = helpers.wall()
    local base = os.tmpname()
    local engine_log, appender_log, stop_file = base .. ".engine", base .. ".appender", base .. ".stop"
    local gate = base .. ".gate"
    files = { base, engine_log, appender_log, stop_file, gate }
    eh.handler(dir, "job", GATED_HANDLER:format(gate))
    local store = helpers.open_same(url)
    local sessions = JOBS // PER_SESSION
    for s = 1, sessions do
      local batch = {}
      for i = 1, PER_SESSION do
        batch[i] = { type = "job", payload = { i = i, gate = s > sessions - GATED_SESSIONS or nil } }
      end
      store:append(("rs-%03d"):format(s), batch)
    end

    local engine = ph.spawn({ helpers.BIN, "run", "--db", url, "--scripts", dir, "--workers", "2", "--ttl-ms", "3000", "--until-idle" },
      {}, engine_log)
    local appender = ph.spawn({ LUA, APPENDER, url, "notes", "20", "10", stop_file }, {}, appender_log)
    procs = { engine, appender }
    local function logs()
      return ("--- engine (exit %s):\n%s\n--- appender (exit %s):\n%s"):format(tostring(ph.status(engine)),
        ph.tail(engine_log, 20), tostring(ph.status(appender)), ph.tail(appender_log, 10))
    end
    local function processed() return JOBS - pending_jobs(store) end
    -- Waits until n jobs are processed; fails only when none was for
    -- STALL_S (a hang), however slowly a loaded machine gets there.
    local STALL_S = 120
    local function wait_processed(n)
      local last, since = processed(), helpers.wall()
      while last < n do
        assert.is_nil(ph.status(engine), "the engine ended early:\n" .. logs())
        assert.is_true(helpers.wall() - since < STALL_S, "the engine does not get on:\n" .. logs())
        helpers.sleep(0.05)
        local now = processed()
        if now ~= last then last, since = now, helpers.wall() end
      end
    end

    -- 1. A restart (fast: every connection is terminated, transactions in
    -- flight are rolled back).
    wait_processed(JOBS // 8)
    cluster("restart")
    local after_restart = processed()

    -- 2. The engine goes on after it; then the server stops for a while
    -- (soon: under load the engine once did every job before the stop).
    wait_processed(math.min(after_restart + 50, JOBS - GATED_SESSIONS * PER_SESSION))
    local during = processed()
    cluster("stop-server")
    local down_at = helpers.wall()
    -- Direct calls fail at once with STORAGE; the append writes nothing.
    local lost = { { type = "note", id = "down-1" }, { type = "note", id = "down-2" } }
    fails_storage("append", 30, function() store:append("down", lost) end)
    fails_storage("read", 30, function() store:read("rs-001") end)
    fails_storage("claim_next", 30, function() store:claim_next({ holder = "spec", ttl_ms = 1000 }) end)
    fails_storage("complete", 30, function() store:complete("rs-001", 1, 1, {}) end)
    helpers.sleep(math.max(0, 2 - (helpers.wall() - down_at)))
    cluster("start-server")

    -- 3. The same handle works again; the failed append wrote nothing,
    -- and sent again (same ids) it is stored once.
    assert.same({}, store:read("down"))
    local stored = store:append("down", lost)
    assert.equal(2, #stored)
    assert.same({ "down-1", "down-2" }, helpers.pluck(store:read("down"), "id"))

    -- 4. The gate opens; the engine finishes on its own (until idle) and exits 0.
    assert.is_nil(ph.status(engine), "the engine ended before the gate opened:\n" .. logs())
    helpers.write_file(gate, "open\n")
    local rc = ph.wait(engine, 900) -- a hang ceiling: it ends when idle
    assert.equal(0, rc, "the engine did not finish cleanly:\n" .. logs())
    helpers.write_file(stop_file, "stop\n")
    assert.equal(0, ph.wait(appender, 60), "the appender failed:\n" .. logs())
    assert.equal(0, pending_jobs(store))
    assert.is_true(during < JOBS, "everything was done before the stop: the test proves nothing")

    -- Nothing lost or doubled.
    assert.equal(JOBS, check_jobs(store, "rs-", JOBS // PER_SESSION))
    local log = helpers.read_file(engine_log)
    local summary = log:match("handled (%d+), failed (%d+), dead (%d+), pending %d+")
    assert.is_not_nil(summary, "no summary:\n" .. log)
    local _, failed, dead = log:match("handled (%d+), failed (%d+), dead (%d+)")
    assert.equal("0", failed, log)
    assert.equal("0", dead, log)
    -- The outages are logged once each, not once per try.
    local began, back = 0, 0
    for _ in log:gmatch("retrying with backoff until the store answers") do began = began + 1 end
    for _ in log:gmatch("the store answers again") do back = back + 1 end
    -- (None at all when every worker sat in a gated handler through both
    -- outages: a loaded machine can get the engine there before the spec
    -- restarts the server; the run still had its connections cut.)
    assert.is_true(began <= 3, ("%d outage lines:\n%s"):format(began, log))
    assert.is_true(back <= began and (back >= 1 or began == 0), ("%d recovery lines for %d outages:\n%s"):format(back, began, log))

    -- Every batch the appender was told about is stored once, whole, in
    -- order; none it was not told about.
    local out = helpers.read_file(appender_log)
    local acked, storage_errors = 0, 0
    for k, n in out:gmatch("acked (%d+) (%d+)") do
      acked = acked + 1
      assert.equal(acked, tonumber(k))
      assert.equal(10, tonumber(n))
    end
    for _ in out:gmatch("\nstorage ") do storage_errors = storage_errors + 1 end
    local notes = store:read("notes")
    assert.equal(acked * 10, #notes, "batches stored: " .. #notes / 10 .. ", acknowledged: " .. acked)
    for j, e in ipairs(notes) do
      local k, i = (j - 1) // 10 + 1, (j - 1) % 10 + 1
      assert.equal(("b%d-%d"):format(k, i), e.id)
    end
    assert.is_true(storage_errors >= 1, "the appender never saw the server down:\n" .. out)
    print(("# jobs done before the restart ~%d, before the stop %d; appender: %d batches, %d STORAGE errors retried; %d outage(s) logged; %.1f s")
      :format(JOBS // 8, during, acked, storage_errors, began, helpers.wall() - started))
  end)

  it("run --until-done asleep until a timer rides a server stop out (its own store calls retry as the engine's do)", function()
    -- The job's result is a timer due 8 s later: the run goes idle and
    -- sleeps on the store until then. The server stops for 2 s while it
    -- sleeps. Without the outage handling of run's own calls (the wait, the
    -- clock, the look for the next timer, the summary's count) it ended
    -- with exit 1 there; with it, it logs the outage once, fires the timer
    -- once the server is back and exits 0.
    eh.handler(dir, "job", [[
return function(event, ctx)
  return { { type = "tick", id = "tick-1", delay_ms = 8000 } }
end
]])
    eh.handler(dir, "tick", "return function() end\n")
    local store = helpers.open_same(url)
    store:append("t", { { type = "job" } })
    local base = os.tmpname()
    local log_file = base .. ".run"
    files = { base, log_file }
    local run = ph.spawn({ helpers.BIN, "run", "--db", url, "--scripts", dir, "--until-done" }, {}, log_file)
    procs = { run }
    local function log() return ("exit %s:\n%s"):format(tostring(ph.status(run)), ph.tail(log_file, 20)) end
    -- The job is done and the timer stored: the run is asleep until it.
    local deadline = helpers.wall() + 60 -- a hang ceiling
    while #store:read("t") < 2 or store:read("t")[1].status ~= "processed" do
      assert.is_nil(ph.status(run), "the run ended early: " .. log())
      assert.is_true(helpers.wall() < deadline, "the job was not done: " .. log())
      helpers.sleep(0.05)
    end
    local tick = store:read("t")[2]
    assert.equal("pending", tick.status)
    assert.is_true(tick.not_before - store:now() > 4000, "the timer is nearly due: the stop would miss the sleep")
    cluster("stop-server")
    helpers.sleep(2)
    cluster("start-server")
    assert.equal(0, ph.wait(run, 120), "the run did not ride the stop out: " .. log())
    local out = helpers.read_file(log_file)
    assert.truthy(out:find("retrying with backoff until the store answers", 1, true), out)
    assert.truthy(out:find("the store answers again", 1, true), out)
    assert.truthy(out:find("handled 2, failed 0, dead 0, pending 0", 1, true), out)
    assert.equal("processed", store:read("t")[2].status)
  end)

  it("a completion that fails because the server went away is retried with the same ids: one result", function()
    -- The handler stops the server, and starts it again a second later in
    -- the background: its completion meets a server that is down.
    eh.handler(dir, "job", ([[
return function(event, ctx)
  os.execute("sh %s stop-server %s >/dev/null 2>&1; (sleep 1; sh %s start-server %s >/dev/null 2>&1) &")
  return { { type = "job.done", id = "result-of-" .. event.index, payload = { attempt = ctx.attempt } } }
end
]]):format(q(CLUSTER), q(PG_DIR), q(CLUSTER), q(PG_DIR)))
    local store = helpers.open_same(url)
    store:append("c", { { type = "job" } })
    local engine = eh.engine({ store = url, scripts = dir, ttl_ms = 8000 })
    local r = engine:run({ until_idle = true })
    assert.equal(1, r.handled)
    assert.equal(0, r.failed)
    local events = store:read("c")
    assert.equal(2, #events)
    assert.equal("processed", events[1].status)
    assert.equal(1, events[1].attempts)
    assert.equal("result-of-1", events[2].id)
    assert.same({ index = 1, attempt = 1 }, events[2].cause)
  end)

  it("an until_idle run against a server that stays down ends with STORAGE after outage_ms", function()
    eh.handler(dir, "job", HANDLER)
    local store = helpers.open_same(url)
    store:append("u", { { type = "job" } })
    local engine = eh.engine({ store = url, scripts = dir, outage_ms = 1500 })
    assert.equal(1, engine:run({ until_idle = true }).handled) -- the store answered this engine
    cluster("stop-server")
    local t0 = helpers.wall()
    local ok, err = pcall(engine.run, engine, { until_idle = true })
    local took = helpers.wall() - t0
    cluster("start-server")
    assert.is_false(ok, "the run succeeded with the server down")
    assert.is_true(eventstore.is_error(err, "STORAGE"), tostring(err))
    assert.truthy(tostring(err):find("outage_ms", 1, true), tostring(err))
    assert.is_true(took >= 1.4, ("gave up after %.2f s, before outage_ms"):format(took))
    assert.is_true(took < 30, ("gave up after %.1f s"):format(took)) -- a hang ceiling (20 x outage_ms)
    -- and once the server is back, the same engine runs again
    store:append("u", { { type = "job" } })
    assert.equal(1, engine:run({ until_idle = true }).handled)
  end)
end)
