-- Engine and leases: docs/branches.md "The engine and leases" (issue 9 #6).
-- An engine holding a session's lease writes with its token; once another
-- holder takes the lease over, the engine's next write there fails the
-- attempt with STALE_FENCE, and the engine leaves the session's events to
-- the new holder instead of retrying against it. Runs once per backend URL.
local helpers = require("helpers")
local eh = require("engine_helpers")

local expect_error = helpers.expect_error

local PING = [[
return function(event, ctx)
  return { { type = "pong", payload = { of = event.index } } }
end
]]

local function pongs(store, session)
  return #eh.of_type(store:read(session), "pong")
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    local function setup()
      local t = eh.setup(url)
      t.handler("ping", PING)
      return t
    end

    it("an engine holding a lease completes with its token and renews it on lease()", function()
      local t = setup()
      local a = t.engine({ holder = "A", backoff_ms = 0 })
      local got = a:lease("s", { ttl_ms = 1000 })
      assert.are.equal("acquired", got.outcome)
      assert.are.equal("A", got.holder)
      assert.are.equal(1, got.token)
      -- the same holder again keeps its token
      assert.are.equal(1, a:lease("s", { ttl_ms = 1000 }).token)
      t.store:append("s", { { type = "ping" } })
      assert.are.same({ handled = 1, failed = 0, dead = 0 }, eh.run(a))
      assert.are.equal(1, pongs(t.store, "s"))
      -- its token is the current one: a fenced write with it succeeds
      t.store:append("s", { { type = "note", settled = true } }, { fence = 1 })
      local row = t.store:sessions({}).sessions[1]
      assert.are.equal("A", row.lease.holder)
      assert.are.equal(1, row.fence)
    end)

    it("a fenced-out engine fails the attempt with STALE_FENCE and leaves the session to the new holder", function()
      local t = setup()
      local a = t.engine({ holder = "A", backoff_ms = 0 })
      -- A long ttl, lapsed by the manual clock: A's keeper renews a lease
      -- every ttl/3 of real time, and a renewal before the run would tell
      -- A about B (then it never runs the event), which a loaded machine
      -- reached with ttl 1000.
      assert.are.equal(1, a:lease("s", { ttl_ms = 600000 }).token)
      -- A's lease expires (A paused) and B takes it over: a new token
      t.clock:advance(700000)
      local b_lease = t.store:lease("s", { holder = "B", ttl_ms = 600000 })
      assert.are.equal("acquired", b_lease.outcome)
      assert.are.equal(2, b_lease.token)
      t.store:append("s", { { type = "ping" } })

      -- A does not know yet: it handles the event, its completion is refused
      local r = eh.run(a)
      assert.are.same({ handled = 0, failed = 1, dead = 0 }, r)
      local ev = eh.event(t.store, "s", 1)
      assert.are.equal("pending", ev.status)
      assert.are.equal(1, ev.failures)
      assert.truthy(ev.last_error:find("STALE_FENCE", 1, true), ev.last_error)
      assert.are.equal(0, pongs(t.store, "s"))

      -- A now skips the session: its runs leave the event alone
      assert.are.same({ handled = 0, failed = 0, dead = 0 }, eh.run(a))
      assert.are.equal(1, eh.event(t.store, "s", 1).attempts)
      -- other sessions are still A's to handle
      t.store:append("other", { { type = "ping" } })
      assert.are.same({ handled = 1, failed = 0, dead = 0 }, eh.run(a))

      -- and A's own appends there carry its stale token: refused
      expect_error("STALE_FENCE", a.append, a, "s", { { type = "note" } })

      -- B's engine (same holder name as the lease) handles it with token 2
      local b = t.engine({ holder = "B", backoff_ms = 0 })
      assert.are.equal(2, b:lease("s", { ttl_ms = 600000 }).token)
      assert.are.same({ handled = 1, failed = 0, dead = 0 }, eh.run(b))
      assert.are.equal(1, pongs(t.store, "s"))
      assert.are.equal("processed", eh.event(t.store, "s", 1).status)
    end)

    it("an engine that leases the session again after the other lease ends handles it again", function()
      local t = setup()
      local a = t.engine({ holder = "A", backoff_ms = 0 })
      a:lease("s", { ttl_ms = 600000 }) -- lapsed by the clock, not renewed first (above)
      t.clock:advance(700000)
      local b = t.store:lease("s", { holder = "B", ttl_ms = 1000 })
      t.store:append("s", { { type = "ping" } })
      assert.are.equal(1, eh.run(a).failed)
      -- while B holds it, A cannot take it back
      assert.are.equal("held", a:lease("s", { ttl_ms = 1000 }).outcome)
      assert.is_true(t.store:release("s", { holder = "B", token = b.token }))
      local again = a:lease("s", { ttl_ms = 1000 })
      assert.are.equal("acquired", again.outcome)
      assert.are.equal(3, again.token)
      assert.are.equal(1, eh.run(a).handled)
      assert.are.equal(1, pongs(t.store, "s"))
    end)

    -- Regression: the completer records the fence (es_engine_fenced_out)
    -- before the failure that makes the event ready again (backoff 0), but
    -- a claim already in flight took its skip list earlier and claimed the
    -- event a second time: a second handler run and a second STALE_FENCE
    -- failure (failed = 2, attempts = 2), seen on a loaded machine. Many
    -- sessions fenced out at once and several workers claiming while the
    -- completer works make that window likely; no event may be run twice.
    it("a claim in flight while the engine is fenced out does not run the session's event again", function()
      local t = setup()
      local a = t.engine({ holder = "A", backoff_ms = 0, workers = 4 })
      local n = 24
      for i = 1, n do assert.are.equal(1, a:lease("s" .. i, { ttl_ms = 600000 }).token) end
      t.clock:advance(700000) -- A's leases lapse; the keeper would renew them only after 200 s
      for i = 1, n do
        assert.are.equal(2, t.store:lease("s" .. i, { holder = "B", ttl_ms = 6000000 }).token)
        t.store:append("s" .. i, { { type = "ping" } })
      end
      assert.are.same({ handled = 0, failed = n, dead = 0 }, eh.run(a))
      for i = 1, n do
        local ev = eh.event(t.store, "s" .. i, 1)
        assert.are.equal("pending", ev.status)
        assert.are.equal(1, ev.attempts, "s" .. i)
        assert.are.equal(1, ev.failures, "s" .. i)
      end
      assert.are.same({ handled = 0, failed = 0, dead = 0 }, eh.run(a))
    end)

    it("engine:release ends the engine's lease; without a lease its writes are unfenced", function()
      local t = setup()
      local a = t.engine({ holder = "A" })
      assert.is_false(a:release("s"))
      a:lease("s", { ttl_ms = 1000 })
      assert.is_true(a:release("s"))
      assert.is_nil(t.store:sessions({}).sessions[1].lease)
      t.store:fence("s") -- someone fences: A holds no lease, so it is not fenced
      a:append("s", { { type = "note" } })
      assert.are.equal(1, t.store:head("s"))
    end)

    it("a completion on a sealed session fails the attempt with SEALED", function()
      local t = setup()
      local a = t.engine({ holder = "A", backoff_ms = 0, max_failures = 1 })
      t.store:append("s", { { type = "ping" } })
      t.store:seal("s", { reason = "closed by support" })
      assert.are.same({ handled = 0, failed = 0, dead = 1 }, eh.run(a))
      local ev = eh.event(t.store, "s", 1)
      assert.are.equal("dead", ev.status)
      assert.truthy(ev.last_error:find("SEALED", 1, true), ev.last_error)
    end)
  end)
end
