-- Conformance: docs/contract.md §3.5 (watching: subscribe, wait, stream). Runs
-- once per backend URL (helpers.urls()). The only tests here that block do
-- so for a short real time (timeouts of at most 250 ms).
local eventstore = require("eventstore")
local helpers = require("helpers")

local indexes = helpers.indexes
local pluck = helpers.pluck

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    local function collect_into(list)
      return function(e) list[#list + 1] = e end
    end

    -------------------------------------------------------------------------
    describe("subscribe", function()
      it("calls fn for every new event of the session before the append returns", function()
        local store = new()
        local got = {}
        local unsubscribe = store:subscribe("s", collect_into(got))
        assert.equal("function", type(unsubscribe))
        store:append("s", { { type = "a", payload = { n = 1 } }, { type = "b" } })
        assert.same({ 1, 2 }, indexes(got))
        assert.same({ "a", "b" }, pluck(got, "type"))
        assert.same({ n = 1 }, got[1].payload)
        assert.equal("s", got[1].session)
        assert.equal("integer", math.type(got[1].position))
        store:append("s", { { type = "c" } })
        assert.same({ 1, 2, 3 }, indexes(got))
      end)

      it("only sees its own session", function()
        local store = new()
        local got = {}
        store:subscribe("s", collect_into(got))
        store:append("other", { { type = "x" } })
        store:append("s", { { type = "y" } })
        store:append("other", { { type = "z" } })
        assert.same({ "y" }, pluck(got, "type"))
      end)

      it("with nil sees every session, in position order", function()
        local store = new()
        local got = {}
        store:subscribe(nil, collect_into(got))
        store:append("a", { { type = "a1" } })
        store:append("b", { { type = "b1" }, { type = "b2" } })
        store:append("a", { { type = "a2" } })
        assert.same({ "a1", "b1", "b2", "a2" }, pluck(got, "type"))
        for i = 2, #got do assert.is_true(got[i].position > got[i - 1].position) end
      end)

      it("does not replay history: only events committed after subscribing", function()
        local store = new()
        store:append("s", { { type = "old" } })
        local got = {}
        store:subscribe("s", collect_into(got))
        assert.same({}, got)
        store:append("s", { { type = "new" } })
        assert.same({ "new" }, pluck(got, "type"))
      end)

      it("never calls fn twice: an idempotent replay notifies nobody", function()
        local store = new()
        local got = {}
        store:subscribe("s", collect_into(got))
        store:append("s", { { id = "A", type = "t" }, { id = "B", type = "t" } })
        store:append("s", { { id = "A", type = "t" }, { id = "B", type = "t" } })
        store:append("s", { { id = "B", type = "t" } })
        assert.same({ "A", "B" }, pluck(got, "id"))
      end)

      it("a failed append notifies nobody", function()
        local store = new()
        local got = {}
        store:subscribe(nil, collect_into(got))
        assert.is_false((pcall(store.append, store, "s", { { type = "ok" }, { type = "bad", payload = function() end } })))
        assert.is_false((pcall(store.append, store, "s", { { type = "ok" } }, { expected = 5 })))
        assert.same({}, got)
      end)

      it("a complete() that appends notifies, with the cause", function()
        local store = new()
        store:append("s", { { type = "work" } })
        local got = {}
        store:subscribe("s", collect_into(got))
        local c = store:claim("s", { holder = "w", ttl_ms = 1000 })
        assert.same({}, got) -- claims are not new events
        store:complete("s", 1, c.events[1].attempt, { { id = "r1", type = "reply" } })
        assert.same({ "reply" }, pluck(got, "type"))
        assert.same({ index = 1, attempt = 1 }, got[1].cause)
        store:complete("s", 1, c.events[1].attempt, { { id = "r1", type = "reply" } }) -- idempotent repeat
        assert.equal(1, #got)
      end)

      it("notifies settled events too", function()
        local store = new()
        local got = {}
        store:subscribe("s", collect_into(got))
        store:append("s", { { type = "note", settled = true } })
        assert.same({ "note" }, pluck(got, "type"))
        assert.equal("processed", got[1].status)
      end)

      it("unsubscribe stops the calls", function()
        local store = new()
        local got = {}
        local unsubscribe = store:subscribe("s", collect_into(got))
        store:append("s", { { type = "a" } })
        unsubscribe()
        store:append("s", { { type = "b" } })
        assert.same({ "a" }, pluck(got, "type"))
      end)

      it("calls every subscriber, and unsubscribing one leaves the others", function()
        local store = new()
        local one, two, all = {}, {}, {}
        local un1 = store:subscribe("s", collect_into(one))
        store:subscribe("s", collect_into(two))
        store:subscribe(nil, collect_into(all))
        store:append("s", { { type = "a" } })
        un1()
        store:append("s", { { type = "b" } })
        assert.same({ "a" }, pluck(one, "type"))
        assert.same({ "a", "b" }, pluck(two, "type"))
        assert.same({ "a", "b" }, pluck(all, "type"))
      end)
    end)

    -------------------------------------------------------------------------
    describe("wait", function()
      it("returns events that already exist after `after` at once", function()
        local store = new()
        store:append("s", { { type = "a" }, { type = "b" }, { type = "c" } })
        -- a wait that blocked would return at its timeout (120 s): the
        -- ceiling only catches that, it is no latency figure
        local start = helpers.wall()
        local got = store:wait("s", 1, 120000)
        assert.is_true(helpers.wall() - start < 60, "wait blocked although events existed")
        assert.same({ 2, 3 }, indexes(got))
        assert.same({ "b", "c" }, pluck(got, "type"))
        assert.same({ 1, 2, 3 }, indexes(store:wait("s", 0, 120000)))
      end)

      it("returns {} after the timeout when nothing comes", function()
        local store = new()
        store:append("s", { { type = "a" } })
        local start = helpers.wall()
        local got = store:wait("s", 1, 60)
        local elapsed = helpers.wall() - start
        assert.same({}, got)
        -- only a hang fails this (100 times the timeout)
        assert.is_true(elapsed < 6, "wait(60 ms) took " .. elapsed .. " s")
        assert.same({}, store:wait("nobody", 0, 20))
      end)

      it("with nil, after is a position across all sessions", function()
        local store = new()
        store:append("a", { { type = "a1" } })
        store:append("b", { { type = "b1" } })
        store:append("a", { { type = "a2" } })
        local all = store:read_all({})
        local got = store:wait(nil, all[1].position, 1000)
        assert.same({ "b1", "a2" }, pluck(got, "type"))
        assert.same({ "a1", "b1", "a2" }, pluck(store:wait(nil, 0, 1000), "type"))
        assert.same({}, store:wait(nil, all[3].position, 30))
      end)

      it("returns full stored events", function()
        local store = new()
        store:append("s", { { id = "x", type = "a", payload = { k = 1 } } })
        local e = store:wait("s", 0, 1000)[1]
        assert.equal(helpers.dump(store:read("s")[1]), helpers.dump(e))
      end)

      if url:match("^sqlite:") then
        it("a second handle on the same file sees the first handle's appends", function()
          local store, clock, full = new()
          local other = helpers.open_same(full, { clock = clock })
          store:append("s", { { type = "a" }, { type = "b" } })
          assert.same({ 1, 2 }, indexes(other:wait("s", 0, 250)))
          assert.same({ "a", "b" }, pluck(other:wait(nil, 0, 250), "type"))
          other:append("s", { { type = "c" } })
          assert.same({ 3 }, indexes(store:wait("s", 2, 250)))
          assert.equal(3, store:head("s"))
        end)
      else
        -- Not applicable: a memory: store lives in its handle; a second
        -- eventstore.open("memory:") is a different, empty store, so
        -- cross-handle visibility is only meaningful for file backends.
      end
    end)

    -------------------------------------------------------------------------
    describe("stream", function()
      it("yields the history and ends after timeout_ms without new events", function()
        local store = new()
        store:append("s", { { type = "a" }, { type = "b" }, { type = "c" } })
        store:append("other", { { type = "x" } })
        local got = {}
        for e in store:stream("s", { timeout_ms = 50 }) do got[#got + 1] = e end
        assert.same({ 1, 2, 3 }, indexes(got))
        assert.same({ "a", "b", "c" }, pluck(got, "type"))
        assert.same({ "s", "s", "s" }, pluck(got, "session"))
      end)

      it("starts after `after`", function()
        local store = new()
        store:append("s", { { type = "a" }, { type = "b" }, { type = "c" } })
        local got = {}
        for e in store:stream("s", { after = 1, timeout_ms = 50 }) do got[#got + 1] = e.index end
        assert.same({ 2, 3 }, got)
      end)

      it("ends without yielding for an empty session", function()
        local store = new()
        local n = 0
        for _ in store:stream("s", { timeout_ms = 30 }) do n = n + 1 end
        assert.equal(0, n)
      end)

      it("yields live events appended while it runs: no gaps, no duplicates", function()
        local store = new()
        store:append("s", { { type = "a" }, { type = "b" } })
        local got = {}
        for e in store:stream("s", { timeout_ms = 50 }) do
          got[#got + 1] = e.index
          if e.index == 1 then
            store:append("s", { { type = "c" } })           -- before history is done
          elseif e.index == 3 then
            store:append("s", { { type = "d" }, { type = "e" } }) -- after history, live
          elseif e.index == 5 then
            store:append("other", { { type = "noise" } })
          end
          if #got > 20 then break end
        end
        assert.same({ 1, 2, 3, 4, 5 }, got)
      end)

      it("yields events appended by complete()", function()
        local store = new()
        store:append("s", { { type = "work" } })
        local got = {}
        for e in store:stream("s", { timeout_ms = 50 }) do
          got[#got + 1] = e.type
          if e.index == 1 then
            local c = store:claim("s", { holder = "w", ttl_ms = 1000 })
            store:complete("s", 1, c.events[1].attempt, { { type = "reply" } })
          end
          if #got > 10 then break end
        end
        assert.same({ "work", "reply" }, got)
      end)

      if url:match("^sqlite:") then
        it("sees live appends made through another handle on the same file", function()
          local store, clock, full = new()
          local other = helpers.open_same(full, { clock = clock })
          store:append("s", { { type = "a" } })
          local got = {}
          for e in store:stream("s", { timeout_ms = 250 }) do
            got[#got + 1] = e.index
            if e.index == 1 then other:append("s", { { type = "b" } }) end
            if #got > 10 then break end
          end
          assert.same({ 1, 2 }, got)
        end)
      else
        -- Not applicable to memory: (one store per handle), see wait above.
      end
    end)
  end)
end
