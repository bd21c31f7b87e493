-- Many engines on one PostgreSQL database (issue 11 item 3, docs/contract.md §5,
-- docs/postgres.md "How many engines").
--
-- Three `eventstore run` processes (two workers each, their own --holder,
-- --ttl-ms 2000) share one schema. 8,000 events are appended before they
-- start and 2,000 while they run. Mid-run one engine is killed with
-- SIGKILL while it is inside a handler (it is told to hold one: a marker
-- file makes its next handler call write "hold" to its log and sleep), so
-- it dies holding at least one claim. The others go on; when every event
-- is processed they are stopped with SIGTERM. Then:
--   - every attempt was run by exactly one engine, and the claim it ran
--     under named that engine (each handler call logs session, index,
--     attempt, the claim's holder and expiry, and the store's clock);
--   - every event is processed, with exactly one result event, caused by
--     the attempt that processed it and written by the engine that ran
--     that attempt (no result of the killed engine's lost attempts);
--   - the events the killed engine held were taken over by the others,
--     and never before the killed claim's TTL had run out.
-- Needs a PostgreSQL server: ES_PG_URL (make test starts one through
-- spec/support/pg_cluster.sh); pending without it.
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")
local ph = require("proc_helpers")

local PG = os.getenv("ES_PG_URL")
if not PG or PG == "" then
  describe("postgres: three engines on one database", function()
    pending("ES_PG_URL is not set: run through spec/support/pg_cluster.sh run (make test does)")
  end)
  return
end

local EVENTS_BEFORE, EVENTS_DURING = 8000, 2000
local PER_SESSION = 100
local TTL_MS = 2000
local HOLD_S = 5 -- the victim's held handler sleeps this long: it is killed meanwhile

-- Each handler call appends one line to the engine's claim log
-- (ES_SPEC_CLAIMS): "claim SESSION INDEX ATTEMPT HOLDER EXPIRES NOW"; the
-- victim (ES_SPEC_HOLD set) first looks for the marker file, and when it
-- is there logs "hold ..." and sleeps, so it is killed inside a handler.
local HANDLER = [[
local log_path = os.getenv("ES_SPEC_CLAIMS")
local hold_path = os.getenv("ES_SPEC_HOLD")
return function(event, ctx)
  local now = ctx.now()
  local line = ("claim %s %d %d %s %d %d\n"):format(event.session, event.index, ctx.attempt,
    event.claim_holder, event.claim_expires_at, now)
  local hold = false
  if hold_path then
    local marker = io.open(hold_path, "r")
    if marker then
      marker:close()
      os.remove(hold_path) -- one worker holds; the other goes on
      hold = true
    end
  end
  local f = assert(io.open(log_path, "a"))
  f:write(line)
  if hold then f:write(("hold %s %d %d\n"):format(event.session, event.index, ctx.attempt)) end
  f:close()
  if hold then os.execute("sleep " .. ]] .. HOLD_S .. [[) end
  return { { type = "job.done", payload = { of = event.index, attempt = ctx.attempt, by = event.claim_holder } } }
end
]]

local function session_name(n) return ("pe-%03d"):format(n) end

local function append_sessions(store, from, to)
  for s = from, to do
    local batch = {}
    for i = 1, PER_SESSION do batch[i] = { type = "job", payload = { i = i } } end
    store:append(session_name(s), batch)
  end
end

-- The claim log of one engine: {claims = {key -> {holder, expires, now}},
-- holds = {key}, lines = n}; key "session/index/attempt".
local function read_claims(path)
  local out = { claims = {}, holds = {}, lines = 0, dup = nil }
  for line in (helpers.read_file(path) or ""):gmatch("[^\n]+") do
    local session, index, attempt, holder, expires, now =
      line:match("^claim (%S+) (%d+) (%d+) (%S+) (%d+) (%d+)$")
    if session then
      local key = session .. "/" .. index .. "/" .. attempt
      if out.claims[key] then out.dup = key end
      out.claims[key] = { holder = holder, expires = tonumber(expires), now = tonumber(now) }
      out.lines = out.lines + 1
    else
      local hs, hi, ha = line:match("^hold (%S+) (%d+) (%d+)$")
      assert(hs, "a line the handler did not write: " .. line)
      out.holds[#out.holds + 1] = hs .. "/" .. hi .. "/" .. ha
    end
  end
  return out
end

local function count_lines(path)
  local n = 0
  for _ in (helpers.read_file(path) or ""):gmatch("\nclaim ") do n = n + 1 end
  return n
end

local function pending_jobs(store)
  return store:pending_types().job or 0
end

describe("postgres: three engines on one database", function()
  local procs, files, url, dir

  before_each(function()
    procs, files = {}, {}
    url = helpers.pg_fresh_url(PG)
    dir = eh.scripts_dir()
  end)

  after_each(function()
    for _, p in ipairs(procs) do ph.reap(p) end
    for _, f in ipairs(files) do os.remove(f) end
    eh.cleanup()
    helpers.cleanup()
  end)

  it("10,000 events, one engine killed -9 mid-run: each attempt run by one engine, each result appended once, the dead engine's claims taken over after their TTL", function()
    local started = helpers.wall()
    eh.handler(dir, "job", HANDLER)
    local store = helpers.open_same(url)
    local sessions_before = EVENTS_BEFORE // PER_SESSION
    local sessions_all = (EVENTS_BEFORE + EVENTS_DURING) // PER_SESSION
    append_sessions(store, 1, sessions_before)

    local base = os.tmpname()
    files[#files + 1] = base
    local engines = {}
    for k, holder in ipairs({ "e1", "e2", "e3" }) do
      local e = { holder = holder, claims = base .. "." .. holder .. ".claims", log = base .. "." .. holder .. ".log" }
      files[#files + 1] = e.claims
      files[#files + 1] = e.log
      local env = { ES_SPEC_CLAIMS = e.claims }
      if k == 1 then
        e.hold = base .. ".hold"
        files[#files + 1] = e.hold
        env.ES_SPEC_HOLD = e.hold
      end
      e.proc = ph.spawn({ helpers.BIN, "run", "--db", url, "--scripts", dir, "--workers", "2",
        "--holder", holder, "--ttl-ms", tostring(TTL_MS) }, env, e.log)
      procs[#procs + 1] = e.proc
      engines[k] = e
    end
    local victim = engines[1]

    -- The waits below end when what they wait for happened; they fail only
    -- when nothing moved for STALL_S (a hang), however slowly a loaded
    -- machine gets there: a total deadline would fail a slow run.
    local STALL_S = 120
    local function stall_guard(progress)
      local last, since = progress(), helpers.wall()
      return function()
        local now = progress()
        if now ~= last then last, since = now, helpers.wall() end
        return helpers.wall() - since < STALL_S
      end
    end

    local function logs()
      local parts = {}
      for _, e in ipairs(engines) do
        parts[#parts + 1] = ("--- %s (exit %s):\n%s"):format(e.holder, tostring(ph.status(e.proc)), ph.tail(e.log, 15))
      end
      return table.concat(parts, "\n")
    end

    -- The rest of the events while the engines run: half now, half after
    -- the kill.
    local half = sessions_before + (sessions_all - sessions_before) // 2
    append_sessions(store, sessions_before + 1, half)

    -- Mid-run (the victim has run about a third of its share), tell it to
    -- hold a handler, and kill it once it does.
    local moving = stall_guard(function() return count_lines(victim.claims) end)
    while count_lines(victim.claims) < (EVENTS_BEFORE + EVENTS_DURING) // 10 do
      assert.is_nil(ph.status(victim.proc), "the victim ended before the kill:\n" .. logs())
      assert.is_true(moving(), "the victim does not get on:\n" .. logs())
      helpers.sleep(0.05)
    end
    helpers.write_file(victim.hold, "hold\n")
    moving = stall_guard(function() return count_lines(victim.claims) end)
    while #read_claims(victim.claims).holds == 0 do
      assert.is_nil(ph.status(victim.proc), "the victim ended before the kill:\n" .. logs())
      assert.is_true(moving(), "the victim never held a handler:\n" .. logs())
      helpers.sleep(0.02)
    end
    local killed_at = store:now() -- just before: every claim it held expires after this
    ph.signal(victim.proc, "KILL")
    assert.equal(137, ph.wait(victim.proc, 60), "kill -9 did not end the victim")
    append_sessions(store, half + 1, sessions_all)

    -- The survivors finish everything, the dead engine's claims included.
    local left = pending_jobs(store)
    moving = stall_guard(function() return left end)
    while left > 0 do
      for k = 2, 3 do
        assert.is_nil(ph.status(engines[k].proc), engines[k].holder .. " ended:\n" .. logs())
      end
      assert.is_true(moving(), ("%d jobs still pending, none done for %d s:\n%s"):format(left, STALL_S, logs()))
      helpers.sleep(0.1)
      left = pending_jobs(store)
    end
    local run_s = helpers.wall() - started
    for k = 2, 3 do ph.signal(engines[k].proc, "TERM") end
    for k = 2, 3 do
      assert.equal(0, ph.wait(engines[k].proc, 120), engines[k].holder .. " did not stop cleanly on SIGTERM:\n" .. logs())
    end

    -- Who ran which attempt: each attempt in exactly one engine's log,
    -- under a claim naming that engine.
    local by_attempt = {} -- key -> {engine, claim}
    for _, e in ipairs(engines) do
      local c = read_claims(e.claims)
      assert.is_nil(c.dup, ("%s ran attempt %s twice"):format(e.holder, tostring(c.dup)))
      e.ran = c.lines
      for key, claim in pairs(c.claims) do
        local other = by_attempt[key]
        assert.is_nil(other, ("attempt %s was run by %s and by %s"):format(key, other and other.engine or "", e.holder))
        assert.equal(e.holder, claim.holder, ("%s ran attempt %s under a claim of %s"):format(e.holder, key, claim.holder))
        by_attempt[key] = { engine = e.holder, claim = claim }
      end
      e.holds = c.holds
    end
    -- (both its workers may have seen the marker before one removed it)
    assert.is_true(#victim.holds >= 1)
    for k = 2, 3 do assert.equal(0, #engines[k].holds) end

    -- Every event processed, one result each, from the attempt that
    -- processed it and the engine that ran that attempt.
    local total, taken_over = 0, 0
    for s = 1, sessions_all do
      local session = session_name(s)
      local events = store:read(session)
      local results = {}
      for _, e in ipairs(events) do
        if e.type == "job.done" then
          assert.is_not_nil(e.cause, "a result without a cause")
          assert.is_nil(results[e.cause.index], ("%s/%d has two results"):format(session, e.cause.index))
          results[e.cause.index] = e
          assert.equal("processed", e.status) -- no engine has its handler: stored settled
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
          assert.equal(e.processed_by_attempt, e.attempts)
          local ran = by_attempt[key .. "/" .. e.attempts]
          assert.is_not_nil(ran, ("%s attempt %d is in no engine's log"):format(key, e.attempts))
          assert.equal(ran.engine, r.payload.by, key .. ": the result names another engine than the one that ran it")
          -- Earlier attempts: only the victim's (lost when it died), each
          -- followed by a survivor's, after the lost claim's expiry.
          for a = 1, e.attempts - 1 do
            local lost = by_attempt[key .. "/" .. a]
            if lost then
              assert.equal("e1", lost.engine, ("%s attempt %d of %s was lost"):format(key, a, lost.engine))
              local next_one = by_attempt[key .. "/" .. (a + 1)]
              assert.is_not_nil(next_one, ("%s: attempt %d lost, attempt %d in no log"):format(key, a, a + 1))
              assert.are_not.equal("e1", next_one.engine)
              assert.is_true(next_one.claim.now >= lost.claim.expires,
                ("%s: taken over at %d, before the lost claim expired at %d"):format(key, next_one.claim.now, lost.claim.expires))
              assert.is_true(next_one.claim.now >= killed_at,
                ("%s: taken over at %d, before the kill at %d"):format(key, next_one.claim.now, killed_at))
              taken_over = taken_over + 1
            end
          end
        end
      end
      for index in pairs(results) do
        assert.equal("job", events[index] and events[index].type, ("%s: a result caused by #%d"):format(session, index))
      end
    end
    assert.equal(EVENTS_BEFORE + EVENTS_DURING, total)
    -- The held events at least were taken over.
    for _, held in ipairs(victim.holds) do
      local hs, hi, ha = held:match("^(.-)/(%d+)/(%d+)$")
      local held_event = helpers.event(store, hs, tonumber(hi))
      assert.is_true(held_event.attempts > tonumber(ha), held .. " was not taken over")
    end
    assert.is_true(taken_over >= 1)
    for k = 2, 3 do assert.is_true(engines[k].ran > 0, engines[k].holder .. " ran nothing") end
    print(("# ran: e1 %d (killed), e2 %d, e3 %d; %d attempts of the killed engine taken over; %.1f s to process, %.1f s in all")
      :format(engines[1].ran, engines[2].ran, engines[3].ran, taken_over, run_s, helpers.wall() - started))
  end)
end)
