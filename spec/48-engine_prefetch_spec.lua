-- Prefetch and batched completions (docs/engine.md "How it works"): an
-- engine claims several ready events at once into a queue its workers share,
-- and commits completions together. What a user relies on:
--   - a slow handler never holds the events claimed with it: they are
--     released long before their claims could expire (ttl_ms / 3, at most
--     a second), as if never claimed (their attempt number is given back),
--     so another engine takes them at once, or this engine's next free
--     worker does;
--   - a stop gives the prefetched events back the same way;
--   - the events of a lane are still handled one after another, in order,
--     whatever the number of workers.
-- The crash side (a completion is acknowledged only once it is durable) is
-- spec/49-engine_ack_crash_spec.lua.
local helpers = require("helpers")
local eh = require("engine_helpers")

local FAST = [[return function(e) return {{type = "fast.done", payload = {of = e.index}}} end]]
-- A handler that returns once the file `gate` exists (the test creates it
-- when it has seen what it waits for), and fails after ~20 s without it.
local function gated(gate, why)
  return ([[return function(e)
    for _ = 1, 2000 do
      local f = io.open(%q)
      if f then f:close() return nil end
      os.execute("sleep 0.01")
    end
    error(%q)
  end]]):format(gate, "the gate never opened: " .. why)
end

local function new_gate()
  local gate = os.tmpname()
  os.remove(gate)
  return gate
end

-- One worker of a fresh engine A (on a new store at url, handlers "fast"
-- and "gated") runs `events` in session "s" until idle; the gated handler
-- waits for a gate the run's progress opens once opened(t, now) holds
-- (looked at every 10 ms). Returns t, the run's result, and whether the
-- gate was opened.
local function run_gated(url, why, events, opened)
  local t = eh.setup(url)
  local gate = new_gate()
  t.handler("gated", gated(gate, why))
  t.handler("fast", FAST)
  local a = t.engine({ holder = "A", ttl_ms = 600000, workers = 1 })
  t.store:append("s", events)
  local seen
  local r = a:run({
    until_idle = true,
    progress_ms = 10,
    progress = function(now)
      if seen or not opened(t, now) then return end
      seen = true
      eh.write_file(gate, "open")
    end,
  })
  os.remove(gate)
  return t, r, seen
end

local SLOW = [[return function(e)
  os.execute("sleep 1.5")
  return {{type = "slow.done", payload = {of = e.index}}}
end]]

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    -- A store, handlers for fast and slow, and an engine that has already
    -- handled a few fast events (so it knows its handlers are quick and
    -- claims in batches).
    local function setup(opts)
      local t = eh.setup(url)
      t.handler("fast", FAST)
      t.handler("slow", SLOW)
      local o = { holder = "A", ttl_ms = 600, workers = 1 }
      for k, v in pairs(opts or {}) do o[k] = v end
      local a = t.engine(o)
      t.store:append("warm", { { type = "fast" }, { type = "fast" }, { type = "fast" } })
      assert.are.equal(3, eh.run(a).handled)
      return t, a
    end

    local function results(store, session, type)
      return eh.of_type(store:read(session), type)
    end

    it("events claimed with a slow handler are released to another engine, as if never claimed", function()
      local t, a = setup()
      -- one append: the slow event first, the fast ones behind it in one claim
      local batch = { { type = "slow" } }
      for i = 2, 6 do batch[i] = { type = "fast" } end
      t.store:append("s", batch)
      local taken = {}
      local r = a:run({
        until_idle = true,
        progress_ms = 20,
        progress = function(now)
          -- "another engine": a plain claim under another holder name,
          -- once A runs the slow handler (A claimed by then). Claiming from
          -- the first tick, 20 ms in, B could beat a slow-starting worker
          -- of A on a loaded machine and take all six, the slow one too.
          if now.busy == 0 then return end
          for _, e in ipairs(t.store:claim_next({ holder = "B", ttl_ms = 60000, limit = 10 })) do
            taken[#taken + 1] = e
            local done = t.store:complete(e.session, e.index, e.attempt,
              { { type = "fast.done", payload = { of = e.index }, settled = true } })
            assert.are.equal("completed", done.outcome)
          end
        end,
      })
      -- B took the five fast events while A's only worker was in the slow
      -- handler; A handled the slow one (and its warm-up events before)
      assert.are.equal(5, #taken)
      assert.are.same({ handled = 1, failed = 0, dead = 0 }, eh.counts(r))
      for _, e in ipairs(taken) do
        assert.are.equal("fast", e.type)
        assert.are.equal("B", e.claim_holder)
        -- A's claim was given back whole: B's is attempt 1, not 2
        assert.are.equal(1, e.attempt)
      end
      for i = 1, 6 do
        local ev = eh.event(t.store, "s", i)
        assert.are.equal("processed", ev.status)
        assert.are.equal(1, ev.attempts)
        assert.are.equal(0, ev.failures)
      end
      assert.are.equal(5, #results(t.store, "s", "fast.done"))
      assert.are.equal(1, #results(t.store, "s", "slow.done"))
    end)

    it("with no other engine, released events are taken again by this engine once a worker is free", function()
      local t, a = setup()
      local batch = { { type = "slow" } }
      for i = 2, 6 do batch[i] = { type = "fast" } end
      t.store:append("s", batch)
      assert.are.same({ handled = 6, failed = 0, dead = 0 }, eh.run(a))
      local events = t.store:read("s")
      for i = 1, 6 do
        assert.are.equal("processed", events[i].status)
        assert.are.equal(1, events[i].attempts) -- released attempts do not count
        assert.are.equal(1, #eh.caused_by(events, i), "one result for #" .. i)
      end
    end)

    it("another worker of the engine takes the events queued behind a slow handler", function()
      local t, a = setup({ workers = 2, ttl_ms = 600000 })
      local batch = { { type = "slow" } }
      for i = 2, 21 do batch[i] = { type = "fast" } end
      t.store:append("s", batch)
      local fast_done_during_slow
      local r = a:run({
        until_idle = true,
        progress_ms = 20,
        progress = function(now)
          -- while the slow handler runs (busy), the fast ones get done
          if now.busy > 0 and #results(t.store, "s", "fast.done") == 20 then fast_done_during_slow = true end
        end,
      })
      assert.are.same({ handled = 21, failed = 0, dead = 0 }, eh.counts(r))
      assert.is_true(fast_done_during_slow, "the fast events waited for the slow handler")
      for i = 1, 21 do assert.are.equal(1, eh.event(t.store, "s", i).attempts) end
    end)

    it("a stop gives prefetched events back unclaimed, their attempts not counted", function()
      local t, a = setup()
      local batch = { { type = "slow" } }
      for i = 2, 6 do batch[i] = { type = "fast" } end
      t.store:append("s", batch)
      local r = a:run({
        until_idle = true,
        progress_ms = 20,
        progress = function(now)
          if now.busy > 0 then a:stop() end -- the slow handler runs
        end,
      })
      assert.are.equal(0, r.handled)
      assert.are.equal(1, r.failed) -- the slow attempt, interrupted
      for i = 2, 6 do
        local ev = eh.event(t.store, "s", i)
        assert.are.equal("pending", ev.status)
        assert.are.equal(0, ev.attempts)
        assert.is_nil(ev.claim_holder)
      end
      -- and a later run handles everything once
      assert.are.same({ handled = 6, failed = 0, dead = 0 }, eh.run(a))
      local events = t.store:read("s")
      for i = 1, 6 do assert.are.equal(1, #eh.caused_by(events, i)) end
    end)

    it("with one worker, the next event is claimed while a handler runs (claims ahead)", function()
      -- The engine's first claim takes one event; taking it off the queue
      -- wakes the prefetcher, which claims the next while the only worker
      -- is still in the first handler. That handler waits for a gate the
      -- test opens once it has seen the second event claimed by A; without
      -- claims ahead it never opens, and the handler gives up.
      local t, r, seen = run_gated(url, "nothing was claimed while this handler ran",
        { { type = "gated" }, { type = "fast" }, { type = "fast" } },
        function(t, now)
          if now.busy == 0 then return false end
          local second = eh.event(t.store, "s", 2)
          return second.status == "pending" and second.claim_holder == "A"
        end)
      assert.is_true(seen, "the second event was not claimed while the first handler ran")
      assert.are.same({ handled = 3, failed = 0, dead = 0 }, eh.counts(r))
      for i = 1, 3 do
        local ev = eh.event(t.store, "s", i)
        assert.are.equal("processed", ev.status)
        assert.are.equal(1, ev.attempts)
      end
      assert.are.equal(2, #results(t.store, "s", "fast.done"))
    end)

    it("a handled event's completion lands while the same worker's next handler still runs", function()
      -- The completer naps briefly after each batch instead of being woken
      -- by every hand-over (docs/engine.md "Completions"); what is handed
      -- over during a nap must still be written when the nap ends, not
      -- held until the worker is done with its next handler. The one
      -- worker runs twenty fast events, then one that waits for a gate the
      -- test opens once all twenty results are stored.
      local batch = {}
      for i = 1, 20 do batch[i] = { type = "fast" } end
      batch[21] = { type = "gated" }
      local t, r, seen = run_gated(url, "the fast events' completions did not land while this handler ran",
        batch, function(t) return #results(t.store, "s", "fast.done") == 20 end)
      assert.is_true(seen, "the fast events' results were not all stored while the gated handler ran")
      assert.are.same({ handled = 21, failed = 0, dead = 0 }, eh.counts(r))
      assert.are.equal("processed", eh.event(t.store, "s", 21).status)
    end)

    it("behind handlers slower than a claim's window nothing is claimed ahead: another engine takes the next event", function()
      -- A learns that its handlers take ~0.3 s, more than the ~20 ms one
      -- claim is meant to last. Its next claim takes the held event alone;
      -- a claim ahead would hold the fast one behind it (until released,
      -- a second later), while B, idle, can run it at once. The held
      -- handler returns once B has claimed (or B tried 25 times).
      local t = eh.setup(url)
      local gate = new_gate()
      t.handler("slowish", [[return function(e) os.execute("sleep 0.3") return nil end]])
      t.handler("held", gated(gate, "the test did not move on"))
      t.handler("fast", FAST)
      local a = t.engine({ holder = "A", ttl_ms = 600000, workers = 1 })
      t.store:append("warm", { { type = "slowish" } })
      assert.are.equal(1, eh.run(a).handled)
      t.store:append("s", { { type = "held" }, { type = "fast" } })
      local taken, tries = {}, 0
      local r = a:run({
        until_idle = true,
        progress_ms = 20,
        progress = function(now)
          if now.busy == 0 or tries >= 25 then return end
          tries = tries + 1
          for _, e in ipairs(t.store:claim_next({ holder = "B", ttl_ms = 60000, limit = 10 })) do
            taken[#taken + 1] = e
            assert.are.equal("completed", t.store:complete(e.session, e.index, e.attempt, {}).outcome)
          end
          if #taken > 0 or tries >= 25 then
            tries = 25
            eh.write_file(gate, "open")
          end
        end,
      })
      os.remove(gate)
      assert.are.equal(1, #taken, "B found nothing to claim while A ran its slow handler")
      assert.are.equal("fast", taken[1].type)
      assert.are.equal(1, taken[1].attempt)
      assert.are.same({ handled = 1, failed = 0, dead = 0 }, eh.counts(r))
    end)

    it("a claim ahead that meets an attempt after a lost one keeps only it: it runs alone", function()
      -- L's first attempt was claimed by X and never ended (the claim
      -- expires when the test moves the clock). A's first claim takes
      -- hold and three fast events; while hold runs, L's claim expires and
      -- g is appended; then the queue going down wakes the prefetcher,
      -- whose claim meets L and g. It keeps L alone and gives g back, and
      -- nothing is claimed ahead while L is queued or runs: while L runs,
      -- g is not claimed.
      local t, a = setup({ ttl_ms = 600000 })
      local gate1, gate2 = new_gate(), new_gate()
      t.handler("hold", gated(gate1, "the test did not move on"))
      t.handler("lost", gated(gate2, "the test did not see L run"))
      t.store:append("L", { { type = "lost" } })
      assert.are.equal(1, #t.store:claim_next({ holder = "X", ttl_ms = 10, limit = 1 }))
      t.store:append("s", { { type = "hold" }, { type = "fast" }, { type = "fast" }, { type = "fast" } })
      local step, samples, beside = 0, 0, false
      local r = a:run({
        until_idle = true,
        progress_ms = 10,
        progress = function(now)
          if now.busy == 0 then return end
          if step == 0 and eh.event(t.store, "s", 1).claim_holder == "A" then
            t.clock:advance(1000) -- X's claim of L expires: an attempt that never ended
            t.store:append("g", { { type = "fast" } })
            eh.write_file(gate1, "open")
            step = 1
          elseif step == 1 then
            local l = eh.event(t.store, "L", 1)
            if l.status == "pending" and l.claim_holder == "A" then -- L runs
              local g = eh.event(t.store, "g", 1)
              if g.status == "pending" and g.claim_holder == "A" then beside = true end
              samples = samples + 1
              if beside or samples >= 5 then
                eh.write_file(gate2, "open")
                step = 2
              end
            end
          end
        end,
      })
      os.remove(gate1)
      os.remove(gate2)
      assert.are.equal(2, step, "L never ran")
      assert.is_false(beside, "g was claimed while L ran")
      assert.are.same({ handled = 6, failed = 0, dead = 0 }, eh.counts(r))
      assert.are.equal(2, eh.event(t.store, "L", 1).attempts) -- X's lost one, then A's
      assert.are.equal(1, eh.event(t.store, "g", 1).attempts)
    end)

    it("an abandoned attempt after a lost one holds claims ahead off no longer, though its call never returns", function()
      -- L's first attempt was claimed by X and never ended. A runs its
      -- next attempt alone, and it blocks in one C call (a shell waiting
      -- for a gate that opens only at the end), so the watchdog abandons
      -- it past deadline_ms and starts a replacement worker. The attempt
      -- ended there (failed: L is dead at max_failures 2), and claims
      -- ahead go on: while the replacement runs s#1, s#2 is claimed ahead
      -- (s#1's handler waits for that), though L's thread is still blocked.
      local t = eh.setup(url)
      local gate_l, gate_s = new_gate(), new_gate()
      t.handler("blocked", ([[return function()
        os.execute(%q)
      end]]):format("while [ ! -e " .. helpers.sh_quote(gate_l) .. " ]; do sleep 0.01; done"))
      t.handler("gated", gated(gate_s, "nothing was claimed ahead after the abandon"))
      t.handler("fast", FAST)
      local before = helpers.threads()
      local a = t.engine({ holder = "A", ttl_ms = 600000, workers = 1, deadline_ms = 200, max_failures = 2 })
      t.store:append("L", { { type = "blocked" } })
      assert.are.equal(1, #t.store:claim_next({ holder = "X", ttl_ms = 10, limit = 1 }))
      t.clock:advance(1000) -- X's claim of L expires: an attempt that never ended
      t.store:append("s", { { type = "gated" }, { type = "fast" } })
      local seen
      local ok, r = pcall(a.run, a, {
        until_idle = true,
        progress_ms = 10,
        progress = function(now)
          if seen or now.busy == 0 or eh.event(t.store, "L", 1).status ~= "dead" then return end
          local first, second = eh.event(t.store, "s", 1), eh.event(t.store, "s", 2)
          if first.claim_holder == "A" and second.status == "pending" and second.claim_holder == "A" then
            seen = true
            eh.write_file(gate_s, "open")
          end
        end,
      })
      eh.write_file(gate_l, "open") -- L's thread comes back and frees itself
      a:close()
      helpers.wait_until(function() return helpers.threads() <= before end, "the abandoned worker's thread to end")
      os.remove(gate_l)
      os.remove(gate_s)
      assert(ok, r)
      assert.is_true(seen, "s#2 was not claimed ahead while s#1 ran after L's worker was abandoned")
      assert.are.same({ handled = 2, failed = 0, dead = 1 }, eh.counts(r))
      assert.are.equal(1, r.abandoned)
      for i = 1, 2 do assert.are.equal(1, eh.event(t.store, "s", i).attempts) end
    end)

    for _, workers in ipairs({ 1, 3 }) do
      it(("handles the events of a lane in index order with %d worker(s)"):format(workers), function()
        local t = eh.setup(url)
        t.handler("step", [[return function(e)
          return {{type = "step.done", payload = {of = e.index, lane = e.lane}}}
        end]])
        local a = t.engine({ workers = workers })
        -- two lanes and unlaned events interleaved in one session
        local batch = {}
        for i = 1, 90 do
          local lane = ({ "x", "y", false })[i % 3 + 1]
          batch[i] = { type = "step", lane = lane or nil }
        end
        t.store:append("s", batch)
        assert.are.same({ handled = 90, failed = 0, dead = 0 }, eh.run(a))
        local last = {}
        for _, e in ipairs(eh.of_type(t.store:read("s"), "step.done")) do
          local lane = e.payload.lane
          if lane then
            -- results are stored in completion order: a lane's in index order
            assert.is_true((last[lane] or 0) < e.payload.of,
              ("lane %s: #%d done after #%d"):format(lane, e.payload.of, last[lane] or 0))
            last[lane] = e.payload.of
          end
        end
        assert.are.equal(90, last.x) -- i % 3 == 0
        assert.are.equal(88, last.y) -- i % 3 == 1
      end)
    end
  end)
end

describe("sqlite: claims ahead and attempts that never ended", function()
  after_each(eh.cleanup)

  it("an attempt after a lost one still runs alone: nothing is claimed ahead beside it", function()
    -- boom kills its process a moment after it starts, long enough for a
    -- claim ahead to land (a queued claim is released only after
    -- ttl_ms / 3). Before each run after the first, a fresh fast event
    -- g<i> is appended once boom's last claim expired, so boom comes first
    -- in the queue and g<i> right behind it. From the second run on,
    -- boom's attempt comes after lost ones and runs alone: no g<i> is ever
    -- claimed while it runs (each would lose that attempt with the crash).
    local eventstore = require("eventstore")
    local dir = eh.scripts_dir()
    eh.handler(dir, "boom", [[return function() os.execute("sleep 0.2") os.exit(3) end]])
    eh.handler(dir, "fast", FAST)
    local db = os.tmpname()
    local store = eventstore.open("sqlite:" .. db)
    store:append("b", { { type = "boom" } })
    store:close()
    local script = os.tmpname()
    eh.write_file(script, ([[
local eventstore = require("eventstore")
local e = eventstore.engine{store = "sqlite:%s", scripts = %q, workers = 1, max_failures = 3,
  ttl_ms = 1000, backoff_ms = 0}
e:run{until_idle = true}
e:close()
os.exit(0)
]]):format(db, dir))
    local codes = {}
    for i = 1, 6 do
      if i > 1 then
        store = eventstore.open("sqlite:" .. db)
        store:append("g" .. i, { { type = "fast" } })
        store:close()
      end
      local _, _, code = os.execute("lua5.4 " .. eh.sh_quote(script) .. " 2>/dev/null")
      codes[i] = code
      if code == 0 then break end
      os.execute("sleep 1.1") -- the dead run's claims expire
    end
    assert.are.same({ 3, 3, 3, 0 }, codes)
    store = eventstore.open("sqlite:" .. db)
    assert.are.equal("dead", store:read("b")[1].status)
    for i = 2, 4 do
      local ev = store:read("g" .. i)[1]
      assert.are.equal("processed", ev.status, "g" .. i .. ": " .. tostring(ev.last_error))
      assert.are.equal(1, ev.attempts, "g" .. i .. " was claimed beside boom")
    end
    store:close()
    for _, s in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. s) end
    os.remove(script)
  end)
end)

-- One lane run in turn (docs/engine.md "Claims ahead"): each event is
-- ready only once the one before it is completed, so every claim takes
-- everything ready, and a claim ahead made while that event runs would
-- find nothing. None is made: the store handle counts one claim_next per
-- event, and a few more at the start and the end (before the completer has
-- timed a batch, completions go through it, and a worker's claim may come
-- before the one it waits on is stored), not up to two per event as
-- before (203-266 calls for 200 events; 201-203 since). On memory: only,
-- where the worker writes its own awaited completion once completions are
-- known to be cheap; on the durable backends, and under the sanitizers,
-- completions stay slow enough that a worker's claim often comes first,
-- so the bound there allows a claim per event more and checks less.
describe("memory: one lane run in turn", function()
  after_each(eh.cleanup)

  it("makes no claim ahead that finds nothing for every event", function()
    local t = eh.setup("memory:")
    t.handler("job", [[return function(e) return nil end]])
    local n = 200
    local evs = {}
    for i = 1, n do evs[i] = { type = "job", lane = "L" } end
    t.store:append("s", evs)
    local a = t.engine({ holder = "A", workers = 1 })
    local calls = t.store:stats().calls
    local before = calls.claim_next and calls.claim_next.count or 0
    assert.are.same({ handled = n, failed = 0, dead = 0 }, eh.counts(eh.run(a)))
    local claims = t.store:stats().calls.claim_next.count - before
    local slack = helpers.SANITIZED and n or 10
    assert.is_true(claims <= n + slack, ("%d claim_next calls for %d events of one lane"):format(claims, n))
    for i = 1, n do assert.are.equal(1, eh.event(t.store, "s", i).attempts) end
  end)
end)
