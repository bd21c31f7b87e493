-- Conformance: docs/contract.md §3.1 capabilities and append_many, §3.2
-- cancel and complete{cancel}, §3.7 get_ref's lineage (parent, at), §3.9
-- archived{}. Runs once per backend URL
-- (helpers.urls()), through a tenant handle where the rule names tenants,
-- and over a shards: store of three memory: shards.
local eventstore = require("eventstore")
local helpers = require("helpers")

local expect_error = helpers.expect_error

-- A sharded store of three memory: shards a, b, c. Which shard holds a
-- session is fixed by the plan's hash (spec/34 pins these names):
-- "alpha" lives on a, "beta" and "user-42" on b.
local function sharded(clock)
  local shards = { a = "memory:", b = "memory:", c = "memory:" }
  local s = eventstore.open("shards:", { catalog = "memory:", clock = clock,
    plan = { version = 1, shards = shards } })
  return s
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    describe("capabilities", function()
      it("says what the backend and the open options give", function()
        local store = new()
        local c = store:capabilities()
        local backend = url:match("^(%a+)")
        if backend == "postgresql" then backend = "postgres" end
        assert.equal(backend, c.backend)
        assert.equal(backend ~= "memory", c.durable)
        assert.equal(backend ~= "memory", c.processes)
        assert.is_false(c.keys)
        -- sqlite: archives beside its file by default (docs/retention.md)
        assert.equal(backend == "sqlite", c.archive)
        assert.is_false(c.sharded)
        assert.is_nil(c.tenant)
      end)

      it("shows keys and archive when the store was opened with them", function()
        local dir = os.tmpname()
        os.remove(dir)
        local store = new({ keys = dir .. ".key", archive = dir .. ".archive" })
        local c = store:capabilities()
        assert.is_true(c.keys)
        assert.is_true(c.archive)
        store:close()
        os.remove(dir .. ".key")
        os.execute("rm -rf '" .. dir .. ".archive'")
      end)

      it("names the tenant on a tenant handle and nothing else changes", function()
        local store = new()
        local root = store:capabilities()
        local t = store:tenant("acme"):capabilities()
        assert.equal("acme", t.tenant)
        t.tenant = nil
        assert.same(root, t)
      end)

      it("is CLOSED on a closed store and takes no arguments", function()
        local store = new()
        helpers.expect_arg_error(store.capabilities, store, {})
        store:close()
        expect_error("CLOSED", store.capabilities, store)
      end)
    end)

    describe("append_many", function()
      it("appends to several sessions in one call, answers per batch in order", function()
        local store = new()
        store:append("b", { { type = "old", settled = true } })
        local res = store:append_many({
          { session = "a", events = { { type = "x", payload = { n = 1 } }, { type = "y", settled = true } } },
          { session = "b", events = { { type = "z", settled = true } }, opts = { expected = 1 } },
          { session = "a", events = { { type = "w" } } },
        })
        assert.equal(3, #res)
        assert.same({ 1, 2 }, helpers.pluck(res[1].events, "index"))
        assert.same({ "x", "y" }, helpers.pluck(res[1].events, "type"))
        assert.is_true(res[1].pending)
        assert.same({ 2 }, helpers.pluck(res[2].events, "index"))
        assert.is_false(res[2].pending)
        -- a later batch of the same session follows the earlier one
        assert.same({ 3 }, helpers.pluck(res[3].events, "index"))
        assert.equal(3, store:head("a"))
        assert.same({ "x", "y", "w" }, helpers.pluck(store:read("a"), "type"))
        -- positions strictly increase across the batches, in the call's order
        local all = store:read_all()
        local pos = helpers.pluck(all, "position")
        for i = 2, #pos do assert.is_true(pos[i] > pos[i - 1]) end
        assert.same({ "old", "x", "y", "z", "w" }, helpers.pluck(all, "type"))
      end)

      it("a failing batch in the middle leaves nothing written", function()
        local store = new()
        store:append("b", { { type = "b1", settled = true } })
        local batches = {
          { session = "a", events = { { type = "x", id = "a-1" } } },
          { session = "b", events = { { type = "y" } }, opts = { expected = 0 } },
          { session = "c", events = { { type = "z" } } },
        }
        local err = helpers.refused(store, "WRONG_EXPECTED_HEAD", function() return store:append_many(batches) end)
        assert.matches("batches[2] (session 'b')", tostring(err), 1, true)
        assert.equal(0, store:head("a"))
        assert.equal(0, store:head("c"))
        assert.is_nil(helpers.session_row(store, "a"))
        -- the same call with the right head commits every batch
        batches[2].opts.expected = 1
        local res = store:append_many(batches)
        assert.equal("a-1", res[1].events[1].id)
        assert.equal(1, store:head("a"))
        assert.equal(2, store:head("b"))
        assert.equal(1, store:head("c"))
      end)

      it("each batch follows append's rules: replay, fence, sealed, ids across sessions", function()
        local store = new()
        local first = store:append_many({
          { session = "a", events = { { type = "x", id = "i1" } } },
          { session = "b", events = { { type = "y", id = "i2" } } },
        })
        -- a lost-acknowledgement retry writes nothing and returns the originals
        local before = helpers.world(store)
        local again = store:append_many({
          { session = "a", events = { { type = "x", id = "i1" } }, opts = { expected = 0 } },
          { session = "b", events = { { type = "y", id = "i2" } } },
        })
        assert.equal(before, helpers.world(store))
        assert.equal(first[1].events[1].position, again[1].events[1].position)
        assert.equal(first[2].events[1].id, again[2].events[1].id)
        -- an id of another session: PARTIAL_DUPLICATE_BATCH, nothing written
        helpers.refused(store, "PARTIAL_DUPLICATE_BATCH", function()
          return store:append_many({
            { session = "c", events = { { type = "z" } } },
            { session = "d", events = { { type = "y", id = "i2" } } },
          })
        end)
        -- the same new id in two batches: the second sees the first's
        helpers.refused(store, "PARTIAL_DUPLICATE_BATCH", function()
          return store:append_many({
            { session = "c", events = { { type = "z", id = "n1" } } },
            { session = "d", events = { { type = "z", id = "n1" } } },
          })
        end)
        local tok = store:fence("f")
        store:fence("f")
        helpers.refused(store, "STALE_FENCE", function()
          return store:append_many({
            { session = "c", events = { { type = "z" } } },
            { session = "f", events = { { type = "z" } }, opts = { fence = tok } },
          })
        end)
        store:seal("s", { reason = "closed" })
        local err = helpers.refused(store, "SEALED", function()
          return store:append_many({
            { session = "c", events = { { type = "z" } } },
            { session = "s", events = { { type = "z" } } },
          })
        end)
        assert.matches("batches[2] (session 's')", tostring(err), 1, true)
        -- an empty batch writes nothing, and answers pending
        local res = store:append_many({ { session = "a", events = {} }, { session = "nobody", events = {} } })
        assert.same({}, res[1].events)
        assert.is_true(res[1].pending)
        assert.is_false(res[2].pending)
        assert.is_nil(helpers.session_row(store, "nobody"))
        assert.same({}, store:append_many({}))
      end)

      it("refuses bad batches before writing anything", function()
        local store = new()
        local function bad(batches, code)
          if code then
            helpers.refused(store, code, function() return store:append_many(batches) end)
          else
            local before = helpers.world(store)
            helpers.expect_arg_error(store.append_many, store, batches)
            assert.equal(before, helpers.world(store))
          end
        end
        -- one batch without its enclosing list
        bad({ session = "a", events = { { type = "x" } } })
        bad({ { session = "a", events = { { type = "x" } } }, "nope" })
        bad({ { session = 1, events = { { type = "x" } } } })
        bad({ { session = "a" } })
        bad({ { session = "a", events = { { type = "x" } }, opts = { expected = "1" } } })
        bad({ { session = "a", events = { { type = "x" } } }, { session = "", events = { { type = "x" } } } },
          "INVALID_ARGUMENT")
        bad({ { session = "a", events = { { type = "x" } }, opts = { expected = -1 } } }, "INVALID_ARGUMENT")
        bad({ { session = "a", events = { { type = "x" } } }, { session = "b", events = { { type = "" } } } },
          "INVALID_ARGUMENT")
        local err = helpers.expect_error("INVALID_ARGUMENT", store.append_many, store,
          { { session = "a", events = { { type = "x" } } }, { session = "b", events = { { type = "" } } } })
        assert.matches("batches[2]", tostring(err), 1, true)
        assert.equal(0, store:head("a"))
        -- what is wrong inside a batch's events names the batch too, whether
        -- the conversion finds it (an error object or an argument error) or
        -- the store does
        local ok_batch = { session = "a", events = { { type = "x" } } }
        local function names_batch2(events, code)
          local e = code and helpers.refused(store, code, function()
            return store:append_many({ ok_batch, { session = "b", events = events } })
          end) or helpers.expect_arg_error(store.append_many, store, { ok_batch, { session = "b", events = events } })
          assert.matches("batches[2]: events[1]", tostring(e), 1, true)
        end
        names_batch2({ { type = "x", revision = 0 } }, "INVALID_ARGUMENT")
        names_batch2({ { type = "x", payload = { f = print } } }, "INVALID_ARGUMENT")
        names_batch2({ { type = "x", meta = { big = ("m"):rep(9000) } } }, "TOO_LARGE")
        names_batch2({ { type = 5 } })
        names_batch2({ { type = "x", meta = 5 } })
        -- an append's own messages are as before: no batch to name
        local e = helpers.expect_error("INVALID_ARGUMENT", store.append, store, "a", { { type = "x", revision = 0 } })
        assert.matches("^INVALID_ARGUMENT: events%[1%]%.revision", tostring(e))
      end)

      it("answers with each batch's ids under {answer = \"ids\"}, the stored events' own", function()
        local store = new()
        store:append("b", { { type = "old" } })
        local res = store:append_many({
          { session = "a", events = { { type = "x", id = "given-a" }, { type = "y", settled = true } } },
          { session = "b", events = { { type = "z" } }, opts = { expected = 1 } },
          { session = "c", events = {} },
        }, { answer = "ids" })
        assert.equal(3, #res)
        local a, b = store:read("a"), store:read("b")
        assert.same({ ids = { "given-a", a[2].id }, pending = true }, res[1])
        assert.same({ ids = { b[2].id }, pending = true }, res[2])
        assert.same({ ids = {}, pending = false }, res[3])
        -- a replay answers with the ids stored first and writes nothing
        local again = store:append_many({ { session = "a", events = { { type = "x", id = "given-a" } } } },
          { answer = "ids" })
        assert.same({ "given-a" }, again[1].ids)
        assert.equal(2, store:head("a"))
        -- "events" is the default answer, and nil options are none
        assert.equal("given-a", store:append_many({ { session = "a", events = { { type = "x", id = "given-a" } } } },
          { answer = "events" })[1].events[1].id)
        assert.equal("given-a", store:append_many({ { session = "a", events = { { type = "x", id = "given-a" } } } },
          nil)[1].events[1].id)
        -- a tenant's ids are the ones its reads give
        local ok, t = pcall(store.tenant, store, "acme")
        if ok then
          local tres = t:append_many({ { session = "s", events = { { type = "t" }, { type = "t", id = "mine" } } } },
            { answer = "ids" })
          assert.same({ t:read("s")[1].id, "mine" }, tres[1].ids)
        end
      end)

      it("refuses bad options before writing anything, a second list of batches among them", function()
        local store = new()
        local one = { { session = "a", events = { { type = "x" } } } }
        local err = helpers.expect_error("INVALID_ARGUMENT", store.append_many, store, one, { answer = "rows" })
        assert.truthy(tostring(err.message):find("opts.answer", 1, true), err.message)
        for _, opts in ipairs({ { answer = 5 }, { { session = "b", events = { { type = "y" } } } },
          { answer = "ids", expected = 1 }, "ids", { ["answer\0x"] = "ids" } }) do
          local before = helpers.world(store)
          helpers.expect_arg_error(store.append_many, store, one, opts)
          assert.equal(before, helpers.world(store))
        end
        helpers.expect_arg_error(store.append_many, store, one, nil, {})
        assert.equal(0, store:head("a"))
        assert.equal(0, store:head("b"))
      end)

      it("through a tenant: names are the tenant's, the root sees them behind its prefix", function()
        local store = new()
        local t = store:tenant("acme")
        local res = t:append_many({
          { session = "a", events = { { type = "x", id = "e1" } } },
          { session = "b", events = { { type = "y" } } },
        })
        assert.equal("a", res[1].events[1].session)
        assert.equal("e1", res[1].events[1].id)
        assert.is_nil(res[2].events[1].id:find("\31", 1, true))
        assert.equal(1, store:head("acme\31a"))
        assert.equal(0, store:head("a"))
        -- another tenant's same names and ids are its own
        local o = store:tenant("other"):append_many({ { session = "a", events = { { type = "x", id = "e1" } } } })
        assert.equal(1, o[1].events[1].index)
        helpers.refused(store, "WRONG_EXPECTED_HEAD", function()
          return t:append_many({
            { session = "c", events = { { type = "x" } } },
            { session = "a", events = { { type = "x" } }, opts = { expected = 0 } },
          })
        end)
      end)
    end)

    describe("cancel", function()
      it("makes a pending event (a timer not yet due) processed without handling, showing the reason", function()
        local store, clock = new()
        store:append("s", { { type = "order" }, { type = "remind", not_before = helpers.T0 + 60000 } })
        local e = store:cancel("s", 2, { reason = "paid" })
        assert.equal("processed", e.status)
        assert.equal("paid", e.cancelled)
        assert.is_nil(e.last_error)
        assert.equal(helpers.T0, e.processed_at)
        assert.same(e, helpers.event(store, "s", 2))
        -- never handed out, even once due
        clock:advance(120000)
        local c = helpers.claim(store, "s", { limit = 10 })
        assert.same({ 1 }, helpers.pluck(c.events, "index"))
        assert.equal(1, helpers.session_row(store, "s").pending)
        -- the default reason
        store:append("t", { { type = "x" } })
        assert.equal("cancelled", store:cancel("t", 1).cancelled)
        assert.is_false(select(2, store:append("t", {})))
      end)

      it("a cancelled event is a no-op to cancel again; processed, dead and live-claimed ones are refused naming their state", function()
        local store, clock = new()
        store:append("s", { { type = "a" }, { type = "b" }, { type = "c" }, { type = "d" }, { type = "e", settled = true } })
        store:cancel("s", 1, { reason = "first" })
        local before = helpers.world(store)
        assert.equal("first", store:cancel("s", 1, { reason = "second" }).cancelled)
        assert.equal(before, helpers.world(store))
        -- live claim on 2
        local c = helpers.claim(store, "s", { limit = 1 })
        assert.equal(2, c.events[1].index)
        local err = helpers.refused(store, "INVALID_ARGUMENT", function() return store:cancel("s", 2) end)
        assert.matches("claimed", tostring(err), 1, true)
        -- once the claim expired nobody holds it: cancellable, and the late attempt is superseded
        clock:advance(1000)
        assert.equal("cancelled", store:cancel("s", 2).cancelled)
        assert.equal("superseded", store:complete("s", 2, c.events[1].attempt, {}).outcome)
        -- processed
        err = helpers.refused(store, "INVALID_ARGUMENT", function() return store:cancel("s", 5) end)
        assert.matches("processed", tostring(err), 1, true)
        -- dead
        local d = helpers.claim(store, "s", { limit = 1 })
        store:fail("s", d.events[1].index, d.events[1].attempt, { error = "boom", max_failures = 1 })
        err = helpers.refused(store, "INVALID_ARGUMENT", function() return store:cancel("s", d.events[1].index) end)
        assert.matches("dead letter", tostring(err), 1, true)
        helpers.refused(store, "NO_SUCH_EVENT", function() return store:cancel("s", 99) end)
        helpers.refused(store, "INVALID_ARGUMENT", function() return store:cancel("s", 0) end)
        helpers.expect_arg_error(store.cancel, store, "s", "1")
      end)

      it("cancelling the head of a lane lets the next event of the lane go", function()
        local store = new()
        store:append("s", { { type = "a", lane = "L" }, { type = "b", lane = "L" }, { type = "c", lane = "L" } })
        -- cancelling one behind the head does not unblock the lane
        store:cancel("s", 2)
        local c = helpers.claim(store, "s", { limit = 10 })
        assert.same({ 1 }, helpers.pluck(c.events, "index"))
        store:complete("s", 1, c.events[1].attempt, {})
        c = helpers.claim(store, "s", { limit = 10 })
        assert.same({ 3 }, helpers.pluck(c.events, "index"))
        local store2 = new()
        store2:append("s", { { type = "a", lane = "L" }, { type = "b", lane = "L" } })
        store2:cancel("s", 1)
        c = helpers.claim(store2, "s", { limit = 10 })
        assert.same({ 2 }, helpers.pluck(c.events, "index"))
      end)

      it("complete{cancel}: cancels with the completion; indexes no longer cancellable come back in not_cancelled", function()
        for _, tenant in ipairs({ false, true }) do
          local root = new()
          local store = tenant and root:tenant("acme") or root
          store:append("s", { { type = "pay" }, { type = "remind", not_before = helpers.T0 + 60000 },
            { type = "audit", not_before = helpers.T0 + 60000 }, { type = "done", settled = true } })
          local c = helpers.claim(store, "s", { limit = 1 })
          local r = store:complete("s", 1, c.events[1].attempt, { { type = "receipt", settled = true } },
            { cancel = { 2, { index = 3, reason = "paid" }, 4, 9, 1 } })
          assert.equal("completed", r.outcome)
          assert.equal(1, #r.events)
          assert.same({ 4, 9, 1 }, r.not_cancelled)
          local ev = store:read("s")
          assert.equal("cancelled", ev[2].cancelled)
          assert.equal("paid", ev[3].cancelled)
          assert.is_nil(ev[4].cancelled)
          assert.equal(0, helpers.session_row(store, "s").pending)
          -- a superseded completion cancels nothing
          store:append("s", { { type = "again" }, { type = "t2", not_before = helpers.T0 + 60000 } })
          local c2 = helpers.claim(store, "s", { limit = 1 })
          local r2 = store:complete("s", c2.events[1].index, c2.events[1].attempt + 1, {}, { cancel = { 7 } })
          assert.equal("superseded", r2.outcome)
          assert.equal("pending", helpers.event(store, "s", 7).status)
          -- a refused completion (a sealed session with events) cancels nothing either
          store:seal("s")
          helpers.refused(root, "SEALED", function()
            return store:complete("s", c2.events[1].index, c2.events[1].attempt, { { type = "x" } }, { cancel = { 7 } })
          end)
          helpers.expect_arg_error(store.complete, store, "s", 6, 1, {}, { cancel = { "x" } })
          helpers.expect_arg_error(store.complete, store, "s", 6, 1, {}, { cancel = 7 })
        end
      end)

      it("through a tenant: its own sessions only", function()
        local store = new()
        local t = store:tenant("acme")
        t:append("s", { { type = "x" } })
        store:append("s", { { type = "x" } })
        local e = t:cancel("s", 1, { reason = "r" })
        assert.equal("s", e.session)
        assert.equal("r", helpers.event(store, "acme\31s", 1).cancelled)
        assert.equal("pending", helpers.event(store, "s", 1).status)
      end)
    end)

    describe("archived", function()
      it("lists the sessions that have segments, in byte order, paged by cursor", function()
        local dir = os.tmpname()
        os.remove(dir)
        local store = new({ archive = dir })
        local names = { "b", "a", "é", "B", "c" }
        for _, n in ipairs(names) do
          store:append(n, { { type = "x", settled = true }, { type = "y", settled = true }, { type = "z", settled = true } })
        end
        store:archive("b", { through = 2 })
        store:archive("a", { through = 1 })
        store:archive("a", { through = 3 })
        store:archive("é", { through = 1 })
        store:archive("B", { through = 3 })
        store:append("live", { { type = "x" } })
        local all = store:archived()
        assert.same({ { session = "B", archived_through = 3 }, { session = "a", archived_through = 3 },
          { session = "b", archived_through = 2 }, { session = "é", archived_through = 1 } }, all.sessions)
        assert.is_nil(all.cursor)
        local p1 = store:archived({ limit = 2 })
        assert.same({ "B", "a" }, helpers.pluck(p1.sessions, "session"))
        assert.equal("a", p1.cursor)
        local p2 = store:archived({ after = p1.cursor, limit = 2 })
        assert.same({ "b", "é" }, helpers.pluck(p2.sessions, "session"))
        assert.is_nil(p2.cursor)
        assert.same({}, store:archived({ after = "é" }).sessions)
        -- a deleted session leaves the list
        store:delete("b")
        assert.same({ "B", "a", "é" }, helpers.pluck(store:archived().sessions, "session"))
        helpers.expect_error("INVALID_ARGUMENT", store.archived, store, { limit = 0 })
        helpers.expect_arg_error(store.archived, store, { limit = "x" })
        -- a tenant sees its own, unprefixed
        local t = store:tenant("acme")
        t:append("s", { { type = "x", settled = true } })
        t:archive("s", { through = 1 })
        assert.same({ { session = "s", archived_through = 1 } }, t:archived().sessions)
        assert.same({ "B", "a", "acme\31s", "é" }, helpers.pluck(store:archived().sessions, "session"))
        assert.same({}, store:tenant("other"):archived().sessions)
        store:close()
        os.execute("rm -rf '" .. dir .. "'")
      end)
    end)

    describe("get_ref lineage", function()
      it("gives parent and at of a forked session, nil for one that was not forked", function()
        local store = new()
        store:append("a", { { type = "x", settled = true }, { type = "y", settled = true } })
        store:fork("a", 1, "b")
        store:put_ref("main", "a")
        local put = store:put_ref("try", "b")
        assert.equal("a", put.parent)
        assert.equal(1, put.at)
        local r = store:get_ref("try")
        assert.equal("b", r.session)
        assert.equal("a", r.parent)
        assert.equal(1, r.at)
        local m = store:get_ref("main")
        assert.is_nil(m.parent)
        assert.is_nil(m.at)
        -- a ref to a session with no events yet, then deleted lineage
        store:put_ref("empty", "nobody")
        assert.is_nil(store:get_ref("empty").parent)
        local listed = {}
        for _, ref in ipairs(store:list_refs()) do listed[ref.name] = ref.parent or false end
        assert.same({ main = false, try = "a", empty = false }, listed)
        -- promote moves a ref: the answer shows the lineage of its new session
        local p = store:promote("try", "main")
        assert.equal("a", p.parent)
        assert.equal(1, store:get_ref("main").at)
        -- deleting the fork drops its refs; a new session of that name has no lineage
        store:delete("b")
        assert.is_nil(store:get_ref("try"))
        store:append("b", { { type = "z", settled = true } })
        assert.is_nil(store:put_ref("try", "b").parent)
      end)

      it("strips the tenant's prefix from parent", function()
        local store = new()
        local t = store:tenant("acme")
        t:append("a", { { type = "x", settled = true } })
        t:fork("a", 1, "b")
        t:put_ref("r", "b")
        local r = t:get_ref("r")
        assert.equal("a", r.parent)
        assert.equal(1, r.at)
        assert.equal("acme\31a", store:get_ref("acme\31r").parent)
      end)
    end)
  end)
end

describe("shards:", function()
  after_each(helpers.cleanup)

  it("capabilities: backend shards, sharded, durable only if every shard is", function()
    local s = sharded(helpers.manual_clock(helpers.T0))
    local c = s:capabilities()
    assert.equal("shards", c.backend)
    assert.is_true(c.sharded)
    assert.is_false(c.durable)
    assert.is_false(c.processes)
    assert.equal("t", s:tenant("t"):capabilities().tenant)
    s:close()
  end)

  it("append_many: sessions of one shard commit together, of two shards INVALID_ARGUMENT naming them", function()
    local s = sharded(helpers.manual_clock(helpers.T0))
    -- beta and user-42 both live on shard b
    local res = s:append_many({
      { session = "beta", events = { { type = "x" } } },
      { session = "user-42", events = { { type = "y" } } },
    })
    assert.equal(1, res[1].events[1].index)
    assert.equal(1, s:head("user-42"))
    local before = helpers.world(s)
    local err = helpers.expect_error("INVALID_ARGUMENT", s.append_many, s, {
      { session = "beta", events = { { type = "x" } } },
      { session = "alpha", events = { { type = "y" } } },
    })
    assert.matches("'beta' and 'alpha'", tostring(err), 1, true)
    assert.equal(before, helpers.world(s))
    -- a failing batch on the one shard leaves nothing written there either
    helpers.refused(s, "WRONG_EXPECTED_HEAD", function()
      return s:append_many({
        { session = "beta", events = { { type = "x" } } },
        { session = "user-42", events = { { type = "y" } }, opts = { expected = 0 } },
      })
    end)
    local t = s:tenant("acme")
    assert.equal(1, t:append_many({ { session = "alpha", events = { { type = "x" } } } })[1].events[1].index)
    s:close()
  end)

  it("cancel and complete{cancel} route to the session's shard", function()
    local s = sharded(helpers.manual_clock(helpers.T0))
    s:append("beta", { { type = "x" }, { type = "y" }, { type = "z" } })
    assert.equal("why", s:cancel("beta", 1, { reason = "why" }).cancelled)
    assert.equal("why", s:read("beta")[1].cancelled)
    local c = s:claim("beta", { holder = "w", ttl_ms = 1000, limit = 1 })
    local r = s:complete("beta", 2, c.events[1].attempt, {}, { cancel = { 3 } })
    assert.same({}, r.not_cancelled)
    assert.equal("cancelled", s:read("beta")[3].cancelled)
    s:close()
  end)

  it("archived merges the shards' lists", function()
    -- a sharded store takes no archive option: each sqlite: shard archives beside its file
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p '" .. dir .. "'")
    local s = eventstore.open("shards:", { catalog = "memory:", clock = helpers.manual_clock(helpers.T0),
      plan = { version = 1, shards = { a = "sqlite:" .. dir .. "/a.db", b = "sqlite:" .. dir .. "/b.db",
        c = "sqlite:" .. dir .. "/c.db" } } })
    for _, n in ipairs({ "alpha", "beta", "user-42" }) do
      s:append(n, { { type = "x", settled = true } })
      s:archive(n, { through = 1 })
    end
    assert.same({ "alpha", "beta", "user-42" }, helpers.pluck(s:archived().sessions, "session"))
    local p1 = s:archived({ limit = 2 })
    assert.same({ "alpha", "beta" }, helpers.pluck(p1.sessions, "session"))
    assert.equal("beta", p1.cursor)
    assert.same({ "user-42" }, helpers.pluck(s:archived({ after = "beta" }).sessions, "session"))
    s:close()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("get_ref reads the lineage from the shard of the session it names", function()
    local s = sharded(helpers.manual_clock(helpers.T0))
    s:append("alpha", { { type = "x", settled = true }, { type = "x", settled = true } })
    s:fork("alpha", 2, "beta") -- alpha on a, beta on b
    s:put_ref("r", "beta")
    local r = s:get_ref("r")
    assert.equal("alpha", r.parent)
    assert.equal(2, r.at)
    assert.equal(2, r.head)
    s:close()
  end)
end)
