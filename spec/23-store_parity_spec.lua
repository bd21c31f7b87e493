-- Conformance: what the seed's TypeScript store offers and ours must too
-- (issue 9, "seed parity"): injected id sources (open's `ids`,
-- eventstore.counter_ids), read_states for many sessions at once, renew
-- with an absolute expires_at, the full dispatch record on every returned
-- event (first_claimed_at, last_claimed_at, failed_at,
-- processed_by_attempt), claim limits of 0 refused, store:now(), and
-- put_snapshot beyond the head (docs/limits.md: NO_SUCH_EVENT).
--
-- That one failing member of a group commit leaves the others committed
-- needs several threads on one handle: it is a C test,
-- spec/c/store_threads_test.c ("group commit").
-- Runs once per backend URL (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local T0 = helpers.T0
local expect_error = helpers.expect_error
local expect_arg_error = helpers.expect_arg_error
local indexes = helpers.indexes
local pluck = helpers.pluck

-- An id source from a list: returns ids[1], ids[2], ... then fails.
local function list_ids(ids)
  local i = 0
  local src = { calls = 0 }
  src.fn = function()
    i = i + 1
    src.calls = i
    return ids[i] or error("list_ids: out of ids")
  end
  return src
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup) -- closes engines, then helpers.cleanup()

    local function new(opts)
      return helpers.new(url, opts)
    end

    local claim, claimed = helpers.claim, helpers.claimed

    local event = helpers.event

    local world, refused = helpers.world, helpers.refused

    -------------------------------------------------------------------------
    describe("open{ids = fn}: where generated ids come from", function()
      it("append takes generated ids from fn, in batch order; given ids are kept", function()
        local src = list_ids({ "id-1", "id-2", "id-3", "id-4" })
        local store = new({ ids = src.fn })
        local got = store:append("s", { { type = "a" }, { type = "b" } })
        assert.same({ "id-1", "id-2" }, pluck(got, "id"))
        local mixed = store:append("s", { { type = "c", id = "mine" }, { type = "d" } })
        assert.same({ "mine", "id-3" }, pluck(mixed, "id"))
        assert.same({ "id-1", "id-2", "mine", "id-3" }, pluck(store:read("s"), "id"))
      end)

      it("complete's returned events and fork's copies take their ids from fn", function()
        local src = list_ids({ "e1", "r1", "f1", "f2" })
        local store = new({ ids = src.fn })
        store:append("s", { { type = "a" } })
        local e = claimed(store, "s")[1]
        local r = store:complete("s", 1, e.attempt, { { type = "result" } })
        assert.same({ "r1" }, pluck(r.events, "id"))
        store:fork("s", 2, "copy")
        assert.same({ "f1", "f2" }, pluck(store:read("copy"), "id"))
      end)

      it("fixes ids: two stores fed the same ids hold the same log", function()
        local function run()
          local store = new({ ids = eventstore.counter_ids("evt-") })
          store:append("s", { { type = "a" }, { type = "b" } })
          local e = claimed(store, "s", { limit = 1 })[1]
          store:complete("s", 1, e.attempt, { { type = "r" } })
          store:fork("s", 3, "f")
          local out = {}
          for _, ev in ipairs(store:read_all({})) do out[#out + 1] = ev.session .. "/" .. ev.index .. "=" .. ev.id end
          return out
        end
        local a, b = run(), run()
        assert.same(a, b)
        assert.same({ "s/1=evt-000000000001", "s/2=evt-000000000002", "s/3=evt-000000000003",
          "f/1=evt-000000000004", "f/2=evt-000000000005", "f/3=evt-000000000006" }, a)
      end)

      it("an id already stored (another session's): INVALID_ARGUMENT, nothing written", function()
        local src = list_ids({ "x1", "x2", "x1", "x3" })
        local store = new({ ids = src.fn })
        store:append("other", { { type = "a" } }) -- x1
        store:append("s", { { type = "a" } })     -- x2
        refused(store, "INVALID_ARGUMENT", function() return store:append("s", { { type = "b" } }) end)
        assert.equal(1, store:head("s"))
        -- the source moved on: the next call takes x3
        assert.equal("x3", store:append("s", { { type = "b" } })[1].id)
      end)

      it("a duplicate in the middle of a batch: INVALID_ARGUMENT, not even the batch's first event written", function()
        local src = list_ids({ "d1", "d2", "d1" })
        local store = new({ ids = src.fn })
        store:append("s", { { type = "a" } }) -- d1
        refused(store, "INVALID_ARGUMENT", function()
          return store:append("t", { { type = "x" }, { type = "y" } }) -- d2, then d1 again
        end)
        assert.equal(0, store:head("t"))
        assert.same({}, store:read("t"))
      end)

      it("an id repeated within one batch: INVALID_ARGUMENT, nothing written", function()
        local store = new({ ids = function() return "same" end })
        refused(store, "INVALID_ARGUMENT", function()
          return store:append("s", { { type = "x" }, { type = "y" } })
        end)
        assert.equal(0, store:head("s"))
        assert.equal("same", store:append("s", { { type = "x" } })[1].id)
      end)

      it("an id that is not a name (empty, too long, invalid UTF-8, NUL, not a string): INVALID_ARGUMENT, nothing written", function()
        local bad = { "", ("x"):rep(256), "bad\xff", "nul\0id", 42, true, {} }
        for _, b in ipairs(bad) do
          local store = new({ ids = function() return b end })
          store:append("s", { { type = "a", id = "given" } })
          refused(store, "INVALID_ARGUMENT", function() return store:append("s", { { type = "b" } }) end)
          assert.equal(1, store:head("s"))
        end
      end)

      it("an id source that raises fails the call, nothing written", function()
        local store = new({ ids = function() error("no more ids") end })
        local before = world(store)
        assert.has_error(function() store:append("s", { { type = "a" } }) end)
        assert.equal(before, world(store))
        assert.equal("given", store:append("s", { { type = "a", id = "given" } })[1].id)
      end)

      it("a duplicate from the source refuses a complete (the event stays claimed) and a fork (no lineage)", function()
        local src = list_ids({ "a1", "a1", "b1", "a1" })
        local store = new({ ids = src.fn })
        store:append("s", { { type = "a" } }) -- a1
        local e = claimed(store, "s")[1]
        refused(store, "INVALID_ARGUMENT", function() return store:complete("s", 1, e.attempt, { { type = "r" } }) end)
        local row = event(store, "s", 1)
        assert.equal("pending", row.status)
        assert.equal("w1", row.claim_holder)
        assert.equal("b1", store:complete("s", 1, e.attempt, { { type = "r" } }).events[1].id)
        refused(store, "INVALID_ARGUMENT", function() return store:fork("s", 2, "f") end)
        assert.is_nil(store:lineage("f"))
        assert.equal(0, store:head("f"))
      end)

      it("ids must be a function or an eventstore.counter_ids: anything else is an argument error", function()
        expect_arg_error(function() return eventstore.open("memory:", { ids = "evt-" }) end)
        expect_arg_error(function() return eventstore.open("memory:", { ids = 5 }) end)
        expect_arg_error(function() return eventstore.open("memory:", { ids = {} }) end)
      end)

      it("an engine refuses a store whose id source is a Lua function (worker threads cannot call it)", function()
        local store = new({ ids = function() return "x" end })
        local dir = eh.scripts_dir()
        expect_arg_error(function() return eventstore.engine({ store = store, scripts = dir }) end)
        local ok_store = new({ ids = eventstore.counter_ids("e-") })
        local engine = eventstore.engine({ store = ok_store, scripts = dir })
        engine:close()
      end)
    end)

    -------------------------------------------------------------------------
    describe("eventstore.counter_ids", function()
      it("counts from start, zero-padded to 12 digits after the prefix", function()
        local c = eventstore.counter_ids("evt-")
        assert.equal("evt-000000000001", c())
        assert.equal("evt-000000000002", c())
        local d = eventstore.counter_ids()
        assert.equal("000000000001", d())
        local e = eventstore.counter_ids("x/", 42)
        assert.equal("x/000000000042", e())
        assert.equal("x/000000000043", e())
      end)

      it("is deterministic: two counters with the same arguments give the same ids", function()
        local a, b = eventstore.counter_ids("p-", 7), eventstore.counter_ids("p-", 7)
        for _ = 1, 50 do assert.equal(a(), b()) end
      end)

      it("as a store's ids: the store takes the counter's next ids, and the counter moves on", function()
        local c = eventstore.counter_ids("c-")
        local store = new({ ids = c })
        assert.same({ "c-000000000001", "c-000000000002" }, pluck(store:append("s", { { type = "a" }, { type = "b" } }), "id"))
        assert.equal("c-000000000003", c())
        assert.equal("c-000000000004", store:append("s", { { type = "c" } })[1].id)
      end)

      if url:match("^sqlite") then
        it("a counter restarting at 1 on a file that already holds its ids collides: INVALID_ARGUMENT, nothing written", function()
          local store, clock, full = new({ ids = eventstore.counter_ids("k-") })
          store:append("s", { { type = "a" } })
          store:close()
          local again = helpers.open_same(full, { clock = clock, ids = eventstore.counter_ids("k-") })
          refused(again, "INVALID_ARGUMENT", function() return again:append("s", { { type = "b" } }) end)
          assert.equal(1, again:head("s"))
          assert.equal("k-000000000002", again:append("s", { { type = "b" } })[1].id)
        end)
      end

      it("argument rules", function()
        expect_error("INVALID_ARGUMENT", function() return eventstore.counter_ids("a\0b") end)
        expect_error("INVALID_ARGUMENT", function() return eventstore.counter_ids("p", -1) end)
        expect_arg_error(function() return eventstore.counter_ids("p", 1.5) end)
        expect_arg_error(function() return eventstore.counter_ids({}) end)
      end)
    end)

    -------------------------------------------------------------------------
    describe("read_states", function()
      local function setup()
        local store = new()
        store:append("a", { { type = "t1" }, { type = "t2" }, { type = "t3" } })
        store:append("b", { { type = "t1" }, { type = "t2" } })
        store:append("c", { { type = "t1" } })
        store:put_snapshot("a", "r", 2, "a@2", "v1")
        store:put_snapshot("c", "r", 1, "c@1", "v2")
        store:put_snapshot("b", "other", 2, "b-other", "v")
        return store
      end

      it("answers for each listed session: its newest snapshot and the events after it", function()
        local store = setup()
        local got = store:read_states({ "a", "b", "c" }, "r")
        assert.same({ index = 2, state = "a@2", version = "v1" }, got.a.snapshot)
        assert.same({ 3 }, indexes(got.a.events))
        assert.is_nil(got.b.snapshot) -- another reducer's snapshot is not this one's
        assert.same({ 1, 2 }, indexes(got.b.events))
        assert.same({ index = 1, state = "c@1", version = "v2" }, got.c.snapshot)
        assert.same({}, got.c.events)
      end)

      it("answers exactly what read_state answers, session by session", function()
        local store = setup()
        local got = store:read_states({ "c", "a", "b" }, "r")
        for _, s in ipairs({ "a", "b", "c" }) do
          assert.equal(helpers.dump(store:read_state(s, "r")), helpers.dump(got[s]))
        end
      end)

      it("unknown sessions get no snapshot and empty events; an empty list an empty table", function()
        local store = setup()
        local got = store:read_states({ "nobody", "a" }, "r")
        assert.is_nil(got.nobody.snapshot)
        assert.same({}, got.nobody.events)
        assert.equal("a@2", got.a.snapshot.state)
        assert.same({}, store:read_states({}, "r"))
      end)

      it("reads many sessions at once (1,000)", function()
        local store = new()
        local names = {}
        for i = 1, 1000 do
          local s = ("s%04d"):format(i)
          names[i] = s
          if i % 10 == 0 then store:append(s, { { type = "t" }, { type = "u" } }) end
        end
        store:put_snapshot("s0010", "r", 1, "x", "v")
        local got = store:read_states(names, "r")
        local n = 0
        for _ in pairs(got) do n = n + 1 end
        assert.equal(1000, n)
        assert.same({ 2 }, indexes(got.s0010.events))
        assert.same({ 1, 2 }, indexes(got.s0020.events))
        assert.same({}, got.s0011.events)
      end)

      it("more than 10,000 sessions: TOO_LARGE", function()
        local store = new()
        local names = {}
        for i = 1, 10001 do names[i] = "s" .. i end
        expect_error("TOO_LARGE", function() return store:read_states(names, "r") end)
      end)

      it("argument rules", function()
        local store = setup()
        expect_arg_error(function() return store:read_states("a", "r") end)
        expect_arg_error(function() return store:read_states({ "a" }) end)
        expect_arg_error(function() return store:read_states({ "a", 5 }, "r") end)
        expect_arg_error(function() return store:read_states({ "a", {} }, "r") end)
        expect_error("INVALID_ARGUMENT", function() return store:read_states({ "" }, "r") end)
      end)
    end)

    -------------------------------------------------------------------------
    describe("renew with expires_at", function()
      it("extends the listed claims to the absolute time given", function()
        local store, clock = new()
        store:append("s", { { type = "a" }, { type = "b" } })
        local c = claimed(store, "s", { ttl_ms = 100 })
        clock:advance(50)
        local r = store:renew("s", { holder = "w1", claims = { { index = 1, attempt = 1 }, { index = 2, attempt = 1 } },
          expires_at = T0 + 5000 })
        assert.same({ 1, 2 }, helpers.sorted(r.renewed))
        assert.same({}, r.superseded or {})
        assert.equal(T0 + 5000, event(store, "s", 1).claim_expires_at)
        assert.equal(T0 + 5000, event(store, "s", 2).claim_expires_at)
        clock:set(T0 + 4999)
        assert.equal("busy", claim(store, "s", { holder = "w2" }).outcome)
        clock:set(T0 + 5000)
        assert.same({ 1, 2 }, indexes(claimed(store, "s", { holder = "w2" })))
        assert.equal(#c, 2)
      end)

      it("needs ttl_ms or expires_at", function()
        local store = new()
        store:append("s", { { type = "a" } })
        claimed(store, "s")
        expect_arg_error(function()
          return store:renew("s", { holder = "w1", claims = { { index = 1, attempt = 1 } } })
        end)
        expect_error("INVALID_ARGUMENT", function()
          return store:renew("s", { holder = "w1", claims = { { index = 1, attempt = 1 } }, expires_at = -1 })
        end)
      end)
    end)

    -------------------------------------------------------------------------
    describe("the dispatch record of returned events", function()
      it("first_claimed_at stays, last_claimed_at moves with every claim, failed_at is the latest failure", function()
        local store, clock = new()
        store:append("s", { { type = "a" } })
        local e1 = claimed(store, "s")[1]
        assert.equal(T0, e1.first_claimed_at)
        assert.equal(T0, e1.last_claimed_at)
        assert.is_nil(e1.failed_at)
        clock:set(T0 + 1000) -- the claim expired: another worker re-takes it
        local e2 = claimed(store, "s", { holder = "w2" })[1]
        assert.equal(2, e2.attempt)
        assert.equal(T0, e2.first_claimed_at)
        assert.equal(T0 + 1000, e2.last_claimed_at)
        clock:set(T0 + 1500)
        store:fail("s", 1, 2, { error = "boom", max_failures = 5 })
        local row = event(store, "s", 1)
        assert.equal(T0 + 1500, row.failed_at)
        assert.equal(T0, row.first_claimed_at)
        assert.equal(T0 + 1000, row.last_claimed_at)
        assert.is_nil(row.processed_by_attempt)
        clock:set(T0 + 1600)
        local e3 = claimed(store, "s")[1]
        assert.equal(T0 + 1600, e3.last_claimed_at)
        clock:set(T0 + 1700)
        store:fail("s", 1, 3, { error = "again", max_failures = 5 })
        assert.equal(T0 + 1700, event(store, "s", 1).failed_at)
      end)

      it("processed_by_attempt is the attempt whose complete processed the event", function()
        local store, clock = new()
        store:append("s", { { type = "a" } })
        claimed(store, "s")
        clock:set(T0 + 1000)
        local e2 = claimed(store, "s", { holder = "w2" })[1]
        assert.is_nil(e2.processed_by_attempt)
        local r = store:complete("s", 1, 2, { { type = "r" } })
        local row = event(store, "s", 1)
        assert.equal("processed", row.status)
        assert.equal(2, row.processed_by_attempt)
        assert.equal(2, row.attempts)
        -- the appended result is itself pending and unclaimed
        assert.is_nil(r.events[1].processed_by_attempt)
        assert.is_nil(r.events[1].first_claimed_at)
        assert.is_nil(r.events[1].last_claimed_at)
        -- read_all and events_page show the same record
        assert.equal(2, store:read_all({})[1].processed_by_attempt)
        assert.equal(2, store:events_page("s", {}).events[1].processed_by_attempt)
      end)

      it("processed_by_attempt is nil for pending, dead, settled (on append or by settle) events", function()
        local store = new()
        store:append("s", { { type = "pending" }, { type = "given", settled = true }, { type = "doomed" } })
        local c = claimed(store, "s", { exclude = { 1 } })
        assert.same({ 3 }, indexes(c))
        store:fail("s", 3, c[1].attempt, { error = "fatal", max_failures = 1 })
        local rows = store:read("s")
        assert.is_nil(rows[1].processed_by_attempt)
        assert.is_nil(rows[1].first_claimed_at)
        assert.is_nil(rows[2].processed_by_attempt)
        assert.is_nil(rows[2].first_claimed_at)
        assert.equal("dead", rows[3].status)
        assert.is_nil(rows[3].processed_by_attempt)
        assert.equal(T0, rows[3].failed_at)
        assert.equal(T0, store:dead_letters({})[1].first_claimed_at)
        store:settle("s", 3, "won't fix")
        local settled = event(store, "s", 3)
        assert.equal("processed", settled.status)
        assert.is_nil(settled.processed_by_attempt)
      end)

      it("claim_next returns the record too", function()
        local store, clock = new()
        store:append("s", { { type = "a" } })
        store:claim_next({ holder = "w", ttl_ms = 100 })
        clock:set(T0 + 100)
        local e = store:claim_next({ holder = "w", ttl_ms = 100 })[1]
        assert.equal(T0, e.first_claimed_at)
        assert.equal(T0 + 100, e.last_claimed_at)
        assert.equal(2, e.attempt)
      end)
    end)

    -------------------------------------------------------------------------
    describe("claim limits", function()
      it("claim{limit = 0} and claim_next{limit = 0} are INVALID_ARGUMENT and claim nothing", function()
        local store = new()
        store:append("s", { { type = "a" }, { type = "b" } })
        refused(store, "INVALID_ARGUMENT", function() return store:claim("s", { holder = "w", ttl_ms = 100, limit = 0 }) end)
        refused(store, "INVALID_ARGUMENT", function() return store:claim_next({ holder = "w", ttl_ms = 100, limit = 0 }) end)
        for _, e in ipairs(store:read("s")) do assert.equal(0, e.attempts) end
        assert.same({ 1 }, indexes(claimed(store, "s", { limit = 1 })))
      end)
    end)

    -------------------------------------------------------------------------
    describe("store:now()", function()
      it("follows the manual clock", function()
        local store, clock = new()
        assert.equal(T0, store:now())
        clock:advance(25)
        assert.equal(T0 + 25, store:now())
        clock:set(42)
        assert.equal(42, store:now())
        assert.equal("integer", math.type(store:now()))
      end)

      it("follows a clock function", function()
        local t = 777
        local store = new({ clock = function() return t end })
        assert.equal(777, store:now())
        t = 778
        assert.equal(778, store:now())
      end)

      it("is the time the store stamps on writes", function()
        local store, clock = new()
        clock:set(T0 + 123)
        local now = store:now()
        assert.equal(now, store:append("s", { { type = "a" } })[1].created_at)
      end)
    end)

    -------------------------------------------------------------------------
    describe("put_snapshot beyond the head (docs/limits.md)", function()
      it("is NO_SUCH_EVENT and stores nothing; 0..head is accepted", function()
        local store = new()
        store:append("s", { { type = "a" }, { type = "b" } })
        store:put_snapshot("s", "r", 1, "one", "v")
        local before = helpers.dump(store:snapshots("s"))
        expect_error("NO_SUCH_EVENT", function() return store:put_snapshot("s", "r", 3, "three", "v") end)
        expect_error("NO_SUCH_EVENT", function() return store:put_snapshot("s", "other", 3, "x", "v") end)
        expect_error("NO_SUCH_EVENT", function() return store:put_snapshot("s", "r", math.maxinteger, "x", "v") end)
        expect_error("NO_SUCH_EVENT", function() return store:put_snapshot("nobody", "r", 1, "x", "v") end)
        assert.equal(before, helpers.dump(store:snapshots("s")))
        assert.same({}, store:snapshots("nobody"))
        assert.equal("one", store:read_state("s", "r").snapshot.state)
        assert.is_true(store:put_snapshot("s", "r", 2, "two", "v"))
        assert.is_true(store:put_snapshot("s", "zero", 0, "z", "v"))
      end)
    end)
  end)
end
