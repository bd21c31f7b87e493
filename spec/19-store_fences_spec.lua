-- Conformance: CONTRACT §3.8 (fences, leases, seals), with the decisions
-- of docs where the contract is silent: a fence token never issued is as
-- stale as an old one; a fence < 1 is INVALID_ARGUMENT; a full idempotent
-- replay is answered before the fence and seal checks; `held` answers
-- carry no token; release answers whether it ended the lease; a lease is
-- live while now < expires_at; sealing twice keeps the first reason; a
-- fork into a sealed session is SEALED when it would copy events.
-- Runs once per backend URL (helpers.urls()).
local helpers = require("helpers")

local T0 = helpers.T0
local expect_error = helpers.expect_error
local expect_arg_error = helpers.expect_arg_error
local indexes = helpers.indexes
local pluck = helpers.pluck

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    local function claim(store, session, opts)
      opts = opts or {}
      opts.holder = opts.holder or "w1"
      if opts.expires_at == nil then opts.ttl_ms = opts.ttl_ms or 1000 end
      return store:claim(session, opts)
    end

    local function claimed(store, session, opts)
      local r = claim(store, session, opts)
      assert.equal("claimed", r.outcome)
      return r.events
    end

    local function session_row(store, name)
      for _, s in ipairs(store:sessions({ limit = 1000 }).sessions) do
        if s.session == name then return s end
      end
      return nil
    end

    local function event(store, session, index)
      return store:read(session, { after = index - 1, limit = 1 })[1]
    end

    -- The whole store as text (log with dispatch records, session rows).
    local function world(store)
      return helpers.dump({ log = store:read_all({}), sessions = store:sessions({ limit = 1000 }) })
    end

    local function refused(store, code, fn)
      local before = world(store)
      local err = expect_error(code, fn)
      assert.equal(before, world(store))
      return err
    end

    -------------------------------------------------------------------------
    describe("§3.8 fence tokens", function()
      it("starts at 1 and grows by one per call, per session", function()
        local store = new()
        store:append("s", { { type = "a" } })
        assert.equal(1, store:fence("s"))
        assert.equal(2, store:fence("s"))
        assert.equal(3, store:fence("s", {}))
        assert.equal(1, store:fence("t"))
        assert.equal(4, store:fence("s"))
        assert.equal("integer", math.type(store:fence("t")))
        assert.equal(4, session_row(store, "s").fence)
        assert.equal(2, session_row(store, "t").fence)
      end)

      it("fencing writes no event", function()
        local store = new()
        store:append("s", { { type = "a" } })
        local log = helpers.dump(store:read_all({}))
        store:fence("s")
        store:fence("s")
        assert.equal(log, helpers.dump(store:read_all({})))
        assert.equal(1, store:head("s"))
      end)

      it("a session without events can be fenced: it is listed with events = 0", function()
        local store = new()
        assert.equal(1, store:fence("fresh"))
        assert.equal(0, store:head("fresh"))
        assert.same({}, store:read("fresh"))
        local row = session_row(store, "fresh")
        assert.is_not_nil(row, "a fenced session is listed by sessions{}")
        assert.equal(0, row.events)
        assert.equal(0, row.pending)
        assert.equal(1, row.fence)
        assert.is_false(row.sealed)
        -- and the owner then writes the first event with its token
        assert.equal(1, store:append("fresh", { { type = "first" } }, { fence = 1 })[1].index)
      end)

      it("if_token: a compare-and-set on the current token (0 = never fenced)", function()
        local store = new()
        assert.equal(1, store:fence("s", { if_token = 0 }))
        assert.equal(2, store:fence("s", { if_token = 1 }))
        assert.equal(3, store:fence("s", { if_token = 2 }))
      end)

      it("if_token not current: STALE_FENCE and nothing changes", function()
        local store = new()
        store:append("s", { { type = "a" } })
        store:fence("s")
        store:fence("s") -- current: 2
        for _, t in ipairs({ 0, 1, 3, 99 }) do
          refused(store, "STALE_FENCE", function() return store:fence("s", { if_token = t }) end)
        end
        assert.equal(2, session_row(store, "s").fence)
        assert.equal(3, store:fence("s", { if_token = 2 }))
        -- a never-fenced session is at 0: any other if_token is stale
        refused(store, "STALE_FENCE", function() return store:fence("n", { if_token = 1 }) end)
        assert.is_nil(session_row(store, "n"))
        assert.equal(1, store:fence("n"))
      end)

      it("argument rules: if_token must be an integer >= 0", function()
        local store = new()
        refused(store, "INVALID_ARGUMENT", function() return store:fence("s", { if_token = -1 }) end)
        expect_arg_error(function() return store:fence("s", { if_token = 1.5 }) end)
        expect_arg_error(function() return store:fence("s", { if_token = "1" }) end)
        expect_arg_error(function() return store:fence("s", 1) end)
        expect_arg_error(function() return store:fence(nil) end)
        expect_error("INVALID_ARGUMENT", function() return store:fence("") end)
        assert.equal(1, store:fence("s"))
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.8 fenced writes", function()
      it("append with the current token goes through", function()
        local store = new()
        local t = store:fence("s")
        local got = store:append("s", { { type = "a" }, { type = "b" } }, { fence = t })
        assert.same({ 1, 2 }, indexes(got))
        t = store:fence("s")
        assert.equal(3, store:append("s", { { type = "c" } }, { fence = t, expected = 2 })[1].index)
      end)

      it("append with an older token: STALE_FENCE, nothing written", function()
        local store = new()
        store:append("s", { { type = "a" } })
        local old = store:fence("s")
        store:fence("s")
        refused(store, "STALE_FENCE", function() return store:append("s", { { type = "b" } }, { fence = old }) end)
        assert.equal(1, store:head("s"))
      end)

      it("append with a token never issued (above the current one, or on a never-fenced session): STALE_FENCE", function()
        local store = new()
        store:append("s", { { type = "a" } })
        local t = store:fence("s")
        refused(store, "STALE_FENCE", function() return store:append("s", { { type = "b" } }, { fence = t + 1 }) end)
        refused(store, "STALE_FENCE", function() return store:append("s", { { type = "b" } }, { fence = math.maxinteger }) end)
        refused(store, "STALE_FENCE", function() return store:append("never", { { type = "b" } }, { fence = 1 }) end)
        assert.equal(0, store:head("never"))
        assert.is_nil(session_row(store, "never"))
      end)

      it("fence < 1 is INVALID_ARGUMENT (append and complete); not an integer an argument error", function()
        local store = new()
        store:append("s", { { type = "a" } })
        store:fence("s")
        local e = claimed(store, "s")[1]
        for _, f in ipairs({ 0, -1 }) do
          refused(store, "INVALID_ARGUMENT", function() return store:append("s", { { type = "b" } }, { fence = f }) end)
          refused(store, "INVALID_ARGUMENT", function() return store:complete("s", 1, e.attempt, {}, { fence = f }) end)
        end
        expect_arg_error(function() return store:append("s", { { type = "b" } }, { fence = "1" }) end)
        expect_arg_error(function() return store:append("s", { { type = "b" } }, { fence = 1.5 }) end)
        expect_arg_error(function() return store:complete("s", 1, e.attempt, {}, { fence = "1" }) end)
        assert.equal(1, store:head("s"))
      end)

      it("writes without a fence are not fenced (opt-in per writer)", function()
        local store = new()
        store:fence("s")
        store:fence("s")
        assert.equal(1, store:append("s", { { type = "a" } })[1].index)
        local e = claimed(store, "s")[1]
        assert.equal("completed", store:complete("s", 1, e.attempt, { { type = "r" } }).outcome)
        assert.equal(2, store:head("s"))
      end)

      it("complete with the current token goes through", function()
        local store = new()
        store:append("s", { { type = "a" } })
        local t = store:fence("s")
        local e = claimed(store, "s")[1]
        local r = store:complete("s", 1, e.attempt, { { type = "r" } }, { fence = t })
        assert.equal("completed", r.outcome)
        assert.same({ index = 1, attempt = 1 }, r.events[1].cause)
        assert.equal("processed", event(store, "s", 1).status)
      end)

      it("complete with a stale or never-issued token: STALE_FENCE, the event stays claimed, nothing appended", function()
        local store = new()
        store:append("s", { { type = "a" } })
        local old = store:fence("s")
        local e = claimed(store, "s")[1]
        local cur = store:fence("s")
        for _, f in ipairs({ old, cur + 1 }) do
          refused(store, "STALE_FENCE", function()
            return store:complete("s", 1, e.attempt, { { type = "r" } }, { fence = f })
          end)
          refused(store, "STALE_FENCE", function() return store:complete("s", 1, e.attempt, {}, { fence = f }) end)
        end
        local row = event(store, "s", 1)
        assert.equal("pending", row.status)
        assert.equal("w1", row.claim_holder)
        assert.equal(1, store:head("s"))
        -- the owner of the current token can still complete that attempt
        assert.equal("completed", store:complete("s", 1, e.attempt, {}, { fence = cur }).outcome)
      end)

      it("a full idempotent replay of an append answers with the originals even with a stale token", function()
        local store = new()
        local t = store:fence("s")
        local first = store:append("s", { { id = "x1", type = "a" }, { id = "x2", type = "b" } }, { fence = t })
        store:fence("s")
        local again = store:append("s", { { id = "x1", type = "a" }, { id = "x2", type = "b" } }, { fence = t })
        assert.same(pluck(first, "id"), pluck(again, "id"))
        assert.same(pluck(first, "position"), pluck(again, "position"))
        assert.equal(2, store:head("s"))
        -- but a batch with a new id is refused
        expect_error("STALE_FENCE", function()
          return store:append("s", { { id = "x3", type = "c" } }, { fence = t })
        end)
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.8 leases", function()
      it("acquire: {outcome = 'acquired', holder, token, expires_at = now + ttl_ms}; the token is a fence token", function()
        local store = new()
        store:append("s", { { type = "a" } })
        store:fence("s") -- 1
        local l = store:lease("s", { holder = "A", ttl_ms = 500 })
        assert.same({ outcome = "acquired", holder = "A", token = 2, expires_at = T0 + 500 }, l)
        -- the token fences appends: the previous token is now stale
        expect_error("STALE_FENCE", function() return store:append("s", { { type = "b" } }, { fence = 1 }) end)
        assert.equal(2, store:append("s", { { type = "b" } }, { fence = l.token })[1].index)
        assert.equal(3, store:fence("s"))
      end)

      it("a session without events can be leased; sessions{} shows the lease", function()
        local store = new()
        local l = store:lease("conv", { holder = "agent-1", ttl_ms = 1000 })
        assert.equal("acquired", l.outcome)
        assert.equal(1, l.token)
        local row = session_row(store, "conv")
        assert.is_not_nil(row)
        assert.equal(0, row.events)
        assert.same({ holder = "agent-1", token = 1, expires_at = T0 + 1000 }, row.lease)
        assert.equal(1, row.fence)
        assert.equal(1, store:append("conv", { { type = "hello" } }, { fence = l.token })[1].index)
      end)

      it("held: another holder gets {outcome = 'held', holder, expires_at} and changes nothing", function()
        local store, clock = new()
        local l = store:lease("s", { holder = "A", ttl_ms = 1000 })
        clock:advance(999)
        local before = world(store)
        local h = store:lease("s", { holder = "B", ttl_ms = 5000 })
        assert.same({ outcome = "held", holder = "A", expires_at = T0 + 1000 }, h)
        assert.is_nil(h.token)
        assert.equal(before, world(store))
        -- A's token is still current
        assert.equal(1, store:append("s", { { type = "a" } }, { fence = l.token })[1].index)
      end)

      it("the same holder re-acquiring a live lease renews it and keeps its token", function()
        local store, clock = new()
        local l = store:lease("s", { holder = "A", ttl_ms = 1000 })
        clock:advance(600)
        local r = store:lease("s", { holder = "A", ttl_ms = 1000 })
        assert.same({ outcome = "acquired", holder = "A", token = l.token, expires_at = T0 + 1600 }, r)
        clock:advance(600) -- T0 + 1200: past the first expiry, within the renewed one
        assert.equal("held", store:lease("s", { holder = "B", ttl_ms = 1000 }).outcome)
        assert.equal(1, store:append("s", { { type = "a" } }, { fence = l.token })[1].index)
      end)

      it("is live while now < expires_at: at expires_at another holder takes it with a new token", function()
        local store, clock = new()
        local a = store:lease("s", { holder = "A", ttl_ms = 1000 })
        clock:set(T0 + 999)
        assert.equal("held", store:lease("s", { holder = "B", ttl_ms = 1000 }).outcome)
        clock:set(T0 + 1000)
        local b = store:lease("s", { holder = "B", ttl_ms = 1000 })
        assert.equal("acquired", b.outcome)
        assert.equal("B", b.holder)
        assert.equal(a.token + 1, b.token)
        assert.equal(T0 + 2000, b.expires_at)
        assert.equal("held", store:lease("s", { holder = "A", ttl_ms = 1000 }).outcome)
      end)

      it("takeover: the old holder's fenced append and complete fail with STALE_FENCE, nothing written", function()
        local store, clock = new()
        local a = store:lease("s", { holder = "A", ttl_ms = 1000 })
        store:append("s", { { type = "job" } }, { fence = a.token })
        local e = claimed(store, "s", { holder = "A", ttl_ms = 60000 })[1]
        clock:advance(1000)
        local b = store:lease("s", { holder = "B", ttl_ms = 1000 })
        assert.equal("acquired", b.outcome)
        refused(store, "STALE_FENCE", function() return store:append("s", { { type = "late" } }, { fence = a.token }) end)
        refused(store, "STALE_FENCE", function()
          return store:complete("s", 1, e.attempt, { { type = "late-result" } }, { fence = a.token })
        end)
        refused(store, "STALE_FENCE", function() return store:complete("s", 1, e.attempt, {}, { fence = a.token }) end)
        assert.equal(1, store:head("s"))
        assert.equal(2, store:append("s", { { type = "b" } }, { fence = b.token })[1].index)
      end)

      it("the same holder after expiry takes a new token (its old token is stale)", function()
        local store, clock = new()
        local a1 = store:lease("s", { holder = "A", ttl_ms = 100 })
        clock:advance(100)
        local a2 = store:lease("s", { holder = "A", ttl_ms = 100 })
        assert.equal("acquired", a2.outcome)
        assert.equal(a1.token + 1, a2.token)
        expect_error("STALE_FENCE", function() return store:append("s", { { type = "x" } }, { fence = a1.token }) end)
        assert.equal(1, store:append("s", { { type = "x" } }, { fence = a2.token })[1].index)
      end)

      it("a renewal after a fence() takes a new token", function()
        local store = new()
        local a = store:lease("s", { holder = "A", ttl_ms = 1000 })
        local f = store:fence("s")
        local r = store:lease("s", { holder = "A", ttl_ms = 1000 })
        assert.equal("acquired", r.outcome)
        assert.is_true(r.token > f)
        expect_error("STALE_FENCE", function() return store:append("s", { { type = "x" } }, { fence = a.token }) end)
        expect_error("STALE_FENCE", function() return store:append("s", { { type = "x" } }, { fence = f }) end)
        assert.equal(1, store:append("s", { { type = "x" } }, { fence = r.token })[1].index)
      end)

      it("release with the right holder and token ends it (true): another holder acquires at once", function()
        local store = new()
        local a = store:lease("s", { holder = "A", ttl_ms = 100000 })
        assert.is_true(store:release("s", { holder = "A", token = a.token }))
        assert.is_nil(session_row(store, "s").lease)
        local b = store:lease("s", { holder = "B", ttl_ms = 1000 })
        assert.equal("acquired", b.outcome)
        assert.equal(a.token + 1, b.token)
        -- releasing again is no longer A's lease
        assert.is_false(store:release("s", { holder = "A", token = a.token }))
        assert.equal("held", store:lease("s", { holder = "A", ttl_ms = 1000 }).outcome)
      end)

      it("release with a wrong holder or token answers false and the lease stays", function()
        local store = new()
        local a = store:lease("s", { holder = "A", ttl_ms = 100000 })
        local before = world(store)
        assert.is_false(store:release("s", { holder = "B", token = a.token }))
        assert.is_false(store:release("s", { holder = "A", token = a.token + 1 }))
        assert.is_false(store:release("s", { holder = "A", token = a.token - 1 }))
        assert.is_false(store:release("nobody", { holder = "A", token = 1 }))
        assert.equal(before, world(store))
        local h = store:lease("s", { holder = "B", ttl_ms = 1000 })
        assert.equal("held", h.outcome)
        assert.equal("A", h.holder)
        assert.is_nil(session_row(store, "nobody"))
      end)

      it("argument rules: holder and ttl_ms are required, ttl_ms > 0", function()
        local store = new()
        refused(store, "INVALID_ARGUMENT", function() return store:lease("s", { holder = "A", ttl_ms = 0 }) end)
        refused(store, "INVALID_ARGUMENT", function() return store:lease("s", { holder = "A", ttl_ms = -5 }) end)
        refused(store, "INVALID_ARGUMENT", function() return store:lease("s", { holder = "", ttl_ms = 5 }) end)
        expect_arg_error(function() return store:lease("s", { ttl_ms = 5 }) end)
        expect_arg_error(function() return store:lease("s", { holder = "A" }) end)
        expect_arg_error(function() return store:lease("s", { holder = "A", ttl_ms = 1.5 }) end)
        expect_arg_error(function() return store:lease("s") end)
        expect_arg_error(function() return store:release("s", { holder = "A" }) end)
        expect_arg_error(function() return store:release("s", { token = 1 }) end)
        expect_arg_error(function() return store:release("s") end)
        assert.same({}, store:sessions({}).sessions)
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.8 seals", function()
      -- s: 1 done, 2 claimed (attempt 1 by w1), 3 and 4 pending; sealed.
      local function sealed_store()
        local store, clock = new()
        store:append("s", { { type = "done", settled = true }, { type = "a" }, { type = "b" }, { type = "c" } })
        local e = claimed(store, "s", { limit = 1 })[1]
        assert.equal(2, e.index)
        clock:set(T0 + 50)
        store:seal("s", { reason = "conversation closed" })
        return store, clock, e
      end

      it("appends are SEALED, nothing written (with or without fence, expected)", function()
        local store = sealed_store()
        local t = store:fence("s")
        refused(store, "SEALED", function() return store:append("s", { { type = "x" } }) end)
        refused(store, "SEALED", function() return store:append("s", { { type = "x", settled = true } }) end)
        refused(store, "SEALED", function() return store:append("s", { { type = "x" } }, { fence = t }) end)
        refused(store, "SEALED", function() return store:append("s", { { type = "x" } }, { expected = 4 }) end)
        assert.equal(4, store:head("s"))
        -- an empty batch writes nothing and is no error
        assert.same({}, store:append("s", {}))
      end)

      it("a complete with events is SEALED: the event stays claimed, nothing appended", function()
        local store, _, e = sealed_store()
        refused(store, "SEALED", function() return store:complete("s", 2, e.attempt, { { type = "result" } }) end)
        local row = event(store, "s", 2)
        assert.equal("pending", row.status)
        assert.equal("w1", row.claim_holder)
        assert.equal(4, store:head("s"))
      end)

      it("claims, fails and completes without events still work: pending work drains", function()
        local store, clock, e = sealed_store()
        assert.equal("completed", store:complete("s", 2, e.attempt, {}).outcome)
        local c = claimed(store, "s")
        assert.same({ 3, 4 }, indexes(c))
        assert.equal("failed", store:fail("s", 3, c[1].attempt, { error = "boom", max_failures = 5 }).outcome)
        assert.equal("completed", store:complete("s", 4, c[2].attempt, {}).outcome)
        clock:advance(1)
        local again = claimed(store, "s")
        assert.same({ 3 }, indexes(again))
        assert.equal("dead_lettered", store:fail("s", 3, again[1].attempt, { error = "x", max_failures = 1 }).outcome)
        store:revive("s", 3)
        local last = claimed(store, "s")
        assert.equal("completed", store:complete("s", 3, last[1].attempt, {}).outcome)
        assert.equal("settled", claim(store, "s").outcome)
        assert.equal(4, store:head("s"))
        assert.equal(0, session_row(store, "s").pending)
      end)

      it("claim_next and renew still work on a sealed session", function()
        local store, _, e = sealed_store()
        local r = store:renew("s", { holder = "w1", claims = { { index = 2, attempt = e.attempt } }, ttl_ms = 5000 })
        assert.same({ 2 }, r.renewed)
        local got = store:claim_next({ holder = "w2", ttl_ms = 1000, limit = 10 })
        assert.same({ 3, 4 }, helpers.sorted(indexes(got)))
      end)

      it("a repeated complete of an already completed attempt returns its events after the seal", function()
        local store, clock = new()
        store:append("s", { { type = "a" } })
        local e = claimed(store, "s")[1]
        local first = store:complete("s", 1, e.attempt, { { id = "r1", type = "result" } })
        store:seal("s")
        clock:advance(5)
        local again = store:complete("s", 1, e.attempt, { { id = "r1", type = "result" } })
        assert.equal("completed", again.outcome)
        assert.same(pluck(first.events, "position"), pluck(again.events, "position"))
        assert.equal(2, store:head("s"))
      end)

      it("a full idempotent replay of an append still answers with the originals", function()
        local store = new()
        local first = store:append("s", { { id = "k1", type = "a" } })
        store:seal("s")
        local again = store:append("s", { { id = "k1", type = "a" } })
        assert.same(pluck(first, "position"), pluck(again, "position"))
        expect_error("SEALED", function() return store:append("s", { { id = "k2", type = "a" } }) end)
      end)

      it("sealing twice is a no-op: the first seal's time and reason stay", function()
        local store, clock = sealed_store()
        local before = world(store)
        clock:advance(100)
        assert.is_nil(store:seal("s", { reason = "another reason" }))
        store:seal("s")
        assert.equal(before, world(store))
        local row = session_row(store, "s")
        assert.equal("conversation closed", row.seal_reason)
        assert.equal(T0 + 50, row.sealed_at)
      end)

      it("sessions{} rows show sealed (true / false), sealed_at and seal_reason", function()
        local store = sealed_store()
        store:append("open", { { type = "a" } })
        store:seal("quiet")
        local s, open, quiet = session_row(store, "s"), session_row(store, "open"), session_row(store, "quiet")
        assert.is_true(s.sealed)
        assert.equal(T0 + 50, s.sealed_at)
        assert.equal("conversation closed", s.seal_reason)
        assert.equal(4, s.events)
        assert.is_false(open.sealed)
        assert.is_nil(open.sealed_at)
        assert.is_nil(open.seal_reason)
        assert.is_true(quiet.sealed)
        assert.is_nil(quiet.seal_reason)
        assert.equal(0, quiet.events)
      end)

      it("a session without events can be sealed: it never takes one", function()
        local store = new()
        store:seal("empty", { reason = "never used" })
        refused(store, "SEALED", function() return store:append("empty", { { type = "a" } }) end)
        assert.equal(0, store:head("empty"))
        assert.is_true(session_row(store, "empty").sealed)
      end)

      it("a seal reason is free text: kept as readable UTF-8", function()
        local store = new()
        store:seal("s", { reason = "bad\0byte \xff end" })
        local reason = session_row(store, "s").seal_reason
        assert.is_string(reason)
        assert.is_nil(reason:find("\0", 1, true))
        assert.truthy(reason:find("end", 1, true))
        assert.truthy(utf8.len(reason))
      end)

      it("a fork into a sealed session at > 0 is SEALED and changes nothing; at 0 it is allowed", function()
        local store = new()
        store:append("src", { { type = "a" }, { type = "b" } })
        store:seal("dst")
        local before = world(store)
        expect_error("SEALED", function() return store:fork("src", 2, "dst") end)
        expect_error("SEALED", function() return store:fork("src", 1, "dst") end)
        assert.equal(before, world(store))
        assert.is_nil(store:lineage("dst"))
        assert.equal(0, store:head("dst"))
        store:seal("dst0")
        local r = store:fork("src", 0, "dst0")
        assert.equal("src", r.parent)
        assert.is_true(session_row(store, "dst0").sealed)
      end)

      it("a sealed source can still be forked; the fork is open", function()
        local store = new()
        store:append("src", { { type = "a" }, { type = "b" } })
        store:seal("src")
        store:fork("src", 2, "dst")
        assert.equal(3, store:append("dst", { { type = "c" } })[1].index)
        assert.is_false(session_row(store, "dst").sealed)
      end)

      it("argument rules", function()
        local store = new()
        expect_arg_error(function() return store:seal(nil) end)
        expect_arg_error(function() return store:seal("s", "reason") end)
        expect_error("INVALID_ARGUMENT", function() return store:seal("") end)
        assert.same({}, store:sessions({}).sessions)
      end)
    end)
  end)
end
