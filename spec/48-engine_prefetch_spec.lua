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
