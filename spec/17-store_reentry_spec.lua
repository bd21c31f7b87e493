-- Regression specs (issue 7, memory safety): Lua code that runs while the
-- binding is in the middle of a call (subscribers, presence subscribers, a
-- clock function, metamethods of argument tables) and cancels
-- subscriptions, closes the store or calls it again; results that fail to
-- convert; a failed open. Each case here was a use-after-free, a NULL
-- dereference, a hang or a leak in core/module/store_handle.c; under
-- `make check-sanitize` (leak detection on) the memory errors and leaks
-- fail the run. Runs once per backend URL (helpers.urls()); docs/store.md
-- ("Callbacks and closing") states the rules tested here.
local eventstore = require("eventstore")
local helpers = require("helpers")

local expect_error = helpers.expect_error
local pluck = helpers.pluck

local collected = helpers.collected

local LUA = os.getenv("LUA") or "lua5.4"

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    -------------------------------------------------------------------------
    describe("cancelling a subscription", function()
      it("twice, with writes in between, is harmless and leaves the others", function()
        local store = new()
        local mine, others = {}, {}
        local unsubscribe = store:subscribe("s", function(e) mine[#mine + 1] = e end)
        store:subscribe("s", function(e) others[#others + 1] = e end)
        store:append("s", { { type = "a" } })
        unsubscribe()
        store:append("s", { { type = "b" } }) -- the ended subscription is freed here
        unsubscribe()
        store:append("s", { { type = "c" } })
        unsubscribe()
        assert.same({ "a" }, pluck(mine, "type"))
        assert.same({ "a", "b", "c" }, pluck(others, "type"))
      end)

      it("of presence, twice, with writes in between, is harmless", function()
        local store = new()
        local mine, others = {}, {}
        local unsubscribe = store:presence_subscribe("room", function(p) mine[#mine + 1] = p end)
        store:presence_subscribe("room", function(p) others[#others + 1] = p end)
        store:presence_set("room", "ann", { a = 1 }, { ttl_ms = 1000 })
        unsubscribe()
        store:presence_set("room", "ann", { a = 2 }, { ttl_ms = 1000 })
        unsubscribe()
        store:presence_set("room", "ann", { a = 3 }, { ttl_ms = 1000 })
        unsubscribe()
        assert.equal(1, #mine)
        assert.same({ 1, 2, 3 }, pluck(pluck(others, "values"), "a"))
      end)

      it("after close() is harmless, for both kinds, as often as it is called", function()
        local store = new()
        local un_all = store:subscribe(nil, function() end)
        local un_s = store:subscribe("s", function() end)
        local un_p = store:presence_subscribe("room", function() end)
        store:append("s", { { type = "a" } })
        un_s() -- one ended before close, two still live at close
        store:close()
        for _ = 1, 2 do
          un_all()
          un_s()
          un_p()
        end
        collectgarbage("collect")
        un_all()
        un_p()
        expect_error("CLOSED", function() return store:head("s") end)
      end)

      it("from inside a callback, for itself and another subscriber, stops both at once", function()
        local store = new()
        local first, second = {}, {}
        local un_first, un_second
        un_first = store:subscribe("s", function(e)
          first[#first + 1] = e
          un_first()
          un_second()
          un_first() -- twice, while the delivery loop still holds both
        end)
        un_second = store:subscribe("s", function(e) second[#second + 1] = e end)
        store:append("s", { { type = "a" }, { type = "b" } })
        -- The order among subscribers is not fixed: `second` may have run
        -- before `first` cancelled it, but never after.
        assert.same({ "a" }, pluck(first, "type"))
        assert.is_true(#second == 0 or (#second <= 2 and second[1].type == "a"))
        local seen = #second
        store:append("s", { { type = "c" } })
        assert.equal(1, #first)
        assert.equal(seen, #second)
      end)

      -- Subscribes fn and pfn and cancels both, in a frame of its own, so
      -- that no dead local of the test keeps them reachable.
      local function subscribe_and_cancel(store, weak, cancel)
        local fn, pfn = function() end, function() end
        weak[fn], weak[pfn] = true, true
        local unsubscribe = store:subscribe("s", fn)
        local punsubscribe = store:presence_subscribe("room", pfn)
        if cancel then
          unsubscribe()
          punsubscribe()
        end
      end

      it("releases the callback at once (no registry ref survives the subscription)", function()
        local store = new()
        local live = setmetatable({}, { __mode = "k" })
        subscribe_and_cancel(store, live, false)
        assert.is_false(collected(live), "a live subscription must hold its functions")
        local weak = setmetatable({}, { __mode = "k" })
        subscribe_and_cancel(store, weak, true)
        -- No call has been made since: the refs must have gone with the
        -- subscriptions, not at the next write.
        assert.is_true(collected(weak), "a subscriber is still referenced after unsubscribe")
        assert.is_false(collected(live))
      end)

      it("by closing the store releases every callback", function()
        local store = new()
        local weak = setmetatable({}, { __mode = "k" })
        subscribe_and_cancel(store, weak, false)
        store:close()
        assert.is_true(collected(weak))
      end)
    end)

    -------------------------------------------------------------------------
    describe("a subscriber that closes its store", function()
      it("lets the writing call return its committed events; nothing is delivered after", function()
        local store, _, full = new()
        local closed, late = false, 0
        local function other() if closed then late = late + 1 end end
        store:subscribe("s", other)
        store:subscribe("s", function()
          assert.is_false(closed, "called again after closing")
          closed = true
          store:close()
        end)
        store:subscribe(nil, other)
        local stored, pending = store:append("s", { { id = "e1", type = "a" }, { id = "e2", type = "b" } })
        assert.same({ "e1", "e2" }, pluck(stored, "id"))
        assert.is_true(pending)
        assert.is_true(closed)
        assert.equal(0, late)
        expect_error("CLOSED", function() return store:head("s") end)
        store:close()
        if url:match("^sqlite:") then
          local again = helpers.open_same(full, { clock = helpers.manual_clock(helpers.T0) })
          assert.same({ "e1", "e2" }, pluck(again:read("s"), "id"))
        end
      end)

      it("of all sessions, on the first event of a batch, stops the batch", function()
        local store = new()
        local got = {}
        store:subscribe(nil, function(e)
          got[#got + 1] = e
          store:close()
        end)
        local stored = store:append("s", { { type = "a" }, { type = "b" }, { type = "c" } })
        assert.equal(3, #stored)
        assert.same({ "a" }, pluck(got, "type"))
        expect_error("CLOSED", function() return store:read("s") end)
      end)

      it("through a <close> variable in the callback is the same", function()
        local store = new()
        local got = {}
        store:subscribe("s", function(e)
          got[#got + 1] = e
          local closing <close> = store
        end)
        store:append("s", { { type = "a" }, { type = "b" } })
        assert.equal(1, #got)
        expect_error("CLOSED", function() return store:head("s") end)
      end)

      it("from complete() returns the completion", function()
        local store = new()
        store:append("s", { { type = "work" } })
        local c = store:claim("s", { holder = "w", ttl_ms = 1000 })
        store:subscribe("s", function() store:close() end)
        local r = store:complete("s", 1, c.events[1].attempt, { { type = "r1" }, { type = "r2" } })
        assert.equal("completed", r.outcome)
        assert.same({ "r1", "r2" }, pluck(r.events, "type"))
        expect_error("CLOSED", function() return store:head("s") end)
      end)

      it("from a presence subscriber lets presence_set return the applied fields", function()
        local store, _, full = new()
        local closed, late = false, 0
        local function other() if closed then late = late + 1 end end
        store:presence_subscribe("room", other)
        store:presence_subscribe("room", function()
          assert.is_false(closed, "called again after closing")
          closed = true
          store:close()
        end)
        store:presence_subscribe("room", other)
        local applied = store:presence_set("room", "ann", { a = 1, b = 2 }, { ttl_ms = 1000 })
        assert.same({ a = 1, b = 2 }, applied)
        assert.is_true(closed)
        assert.equal(0, late)
        expect_error("CLOSED", function() return store:presence_read("room") end)
        if url:match("^sqlite:") then
          local again = helpers.open_same(full, { clock = helpers.manual_clock(helpers.T0) })
          assert.equal(2, #again:presence_read("room"))
        end
      end)

      it("while an event subscriber has queued work, closes cleanly from presence", function()
        local store = new()
        local events = {}
        store:subscribe("s", function(e) events[#events + 1] = e end)
        store:presence_subscribe("room", function() store:close() end)
        store:append("s", { { type = "a" } })
        store:presence_set("room", "ann", { a = 1 }, { ttl_ms = 1000 })
        assert.equal(1, #events)
        expect_error("CLOSED", function() return store:append("s", { { type = "b" } }) end)
      end)

      it("that raises after closing still raises its error from the writing call", function()
        local store = new()
        store:subscribe("s", function()
          store:close()
          error("subscriber failed", 0)
        end)
        local ok, err = pcall(store.append, store, "s", { { type = "a" } })
        assert.is_false(ok)
        assert.equal("subscriber failed", err)
        expect_error("CLOSED", function() return store:head("s") end)
      end)
    end)

    -------------------------------------------------------------------------
    describe("a subscriber that raises", function()
      it("does not stop later deliveries (the delivery state is reset)", function()
        local store = new()
        local got = {}
        local bad = true
        store:subscribe("s", function(e)
          got[#got + 1] = e.type
          if bad then
            bad = false
            error("once", 0)
          end
        end)
        local ok = pcall(store.append, store, "s", { { type = "a" } })
        assert.is_false(ok)
        store:append("s", { { type = "b" } })
        assert.same({ "a", "b" }, got)
      end)
    end)

    -------------------------------------------------------------------------
    if url:match("^sqlite:") then
      describe("a stored value that no longer decodes", function()
        -- Converting a result to Lua values raises half-way; the C result
        -- must still be freed (make check-sanitize fails on a leak).
        it("raises from every call that returns it, and the store stays usable", function()
          local store, _, full = new()
          store:append("s", { { type = "a", payload = { n = 1 } }, { type = "b", payload = { n = 2 } } })
          -- Event 2 a dead letter (so settle reaches the read-back), 1 pending.
          local c = store:claim("s", { holder = "w", ttl_ms = 10, exclude = { 1 } })
          store:fail("s", 2, c.events[1].attempt, { error = "x", max_failures = 1 })
          store:presence_set("room", "ann", { a = 1 }, { ttl_ms = 1000 })
          store:close()
          local sql = [[UPDATE events SET payload = '{"n":'; UPDATE presence SET value = '[1,';]]
          local ok = os.execute(("sqlite3 %s %s"):format(helpers.sh_quote(full:match("^sqlite:(.*)$")),
            helpers.sh_quote(sql)))
          assert.is_true(ok == true or ok == 0, "sqlite3 failed")
          local again = helpers.open_same(full, { clock = helpers.manual_clock(helpers.T0) })
          local calls = {
            { "read", function() return again:read("s") end },
            { "read_all", function() return again:read_all({}) end },
            { "read_state", function() return again:read_state("s", "r") end },
            { "claim", function() return again:claim("s", { holder = "w", ttl_ms = 10 }) end },
            { "settle", function() return again:settle("s", 2, "skip") end },
            { "presence_read", function() return again:presence_read("room") end },
          }
          for _, call in ipairs(calls) do
            local ok_call, err = pcall(call[2])
            assert.is_false(ok_call, call[1] .. " returned a value it could not decode")
            assert.is_true(eventstore.is_error(err, "INVALID_ARGUMENT"), call[1] .. ": " .. tostring(err))
            assert.is_truthy(tostring(err):find("JSON", 1, true), call[1] .. ": " .. tostring(err))
          end
          assert.equal(2, again:head("s"))
        end)
      end)
    end

    -------------------------------------------------------------------------
    describe("an argument whose metamethod closes the store", function()
      -- The binding reads its arguments (running __index) after checking
      -- the handle: it must look again before calling the core.
      local function closing_table(store, t)
        return setmetatable(t or {}, { __index = function() store:close() end })
      end

      it("makes append raise CLOSED", function()
        local store = new()
        expect_error("CLOSED", function()
          return store:append("s", { { type = "a" } }, closing_table(store))
        end)
        store:close()
      end)

      it("in an event makes append raise CLOSED", function()
        local store = new()
        expect_error("CLOSED", function()
          return store:append("s", { closing_table(store, { type = "a" }) })
        end)
      end)

      local cases = {
        { "read", function(s) return s:read("s", closing_table(s)) end },
        { "read_all", function(s) return s:read_all(closing_table(s)) end },
        { "claim", function(s) return s:claim("s", closing_table(s, { holder = "w", ttl_ms = 10 })) end },
        { "claim_next", function(s) return s:claim_next(closing_table(s, { holder = "w", ttl_ms = 10 })) end },
        { "renew", function(s)
          return s:renew("s", { holder = "w", ttl_ms = 10, claims = { closing_table(s, { 1, 1 }) } })
        end },
        { "fail", function(s) return s:fail("s", 1, 1, closing_table(s, { error = "x" })) end },
        { "complete_many", function(s)
          return s:complete_many({ { session = "s", index = 1, attempt = 1 },
            closing_table(s, { session = "s", index = 1, attempt = 1 }) })
        end },
        { "dead_letters", function(s) return s:dead_letters(closing_table(s)) end },
        { "sessions", function(s) return s:sessions(closing_table(s)) end },
        { "events_page", function(s) return s:events_page("s", closing_table(s)) end },
        { "presence_set", function(s)
          return s:presence_set("ns", "p", { a = 1 }, closing_table(s, { ttl_ms = 10 }))
        end },
      }
      it("of eventstore.engine leaves the engine a closed store, never a freed one", function()
        -- The engine takes the store from its first argument, then reads
        -- its options (running __index) before it holds a reference.
        local eh = require("engine_helpers")
        finally(eh.cleanup)
        local store = new()
        local dir = eh.scripts_dir()
        local opts = closing_table(store, { store = store, scripts = dir })
        local ok, engine = pcall(eventstore.engine, opts)
        if ok then
          expect_error("CLOSED", function() return engine:append("s", { { type = "t" } }) end)
          engine:close()
        else
          assert.is_true(eventstore.is_error(engine, "CLOSED"), tostring(engine))
        end
        expect_error("CLOSED", function() return store:head("s") end)
      end)

      for _, case in ipairs(cases) do
        it("makes " .. case[1] .. " raise CLOSED", function()
          local store = new()
          store:append("s", { { type = "a" } })
          expect_error("CLOSED", case[2], store)
        end)
      end
    end)

    -------------------------------------------------------------------------
    describe("a clock function that changes the options table", function()
      -- The clock runs inside the call, after the options were read: a
      -- string taken from the table must stay alive (it was a
      -- use-after-free, seen under `make check-sanitize`).
      local function armed_store()
        local state = { armed = false, opts = nil }
        local store = helpers.open(url, { clock = function()
          if state.armed then
            for k in pairs(state.opts) do state.opts[k] = nil end
            collectgarbage()
            collectgarbage()
          end
          return helpers.T0
        end })
        return store, state
      end

      it("promote's expect, lease's holder, claim's holder and children's after stay valid", function()
        local store, state = armed_store()
        store:put_ref("a", "s1")
        store:put_ref("b", "s2")
        store:append("s", { { type = "t" } })
        local expect = string.rep("x", 100) .. tostring(os.time())
        state.opts, state.armed = { expect = expect }, true
        local err = expect_error("REF_CONFLICT", store.promote, store, "a", "b", state.opts)
        assert.equal(expect, err.expected)
        local holder = string.rep("h", 90) .. tostring(os.clock())
        state.opts = { holder = holder, ttl_ms = 1000 }
        assert.equal(holder, store:lease("s", state.opts).holder)
        state.opts = { holder = holder, ttl_ms = 1000 }
        assert.equal(holder, store:claim("s", state.opts).events[1].claim_holder)
        state.armed = false
        store:fork("s", 0, "s/" .. string.rep("c", 80))
        local after = "s/" .. string.rep("b", 80)
        state.opts, state.armed = { after = after }, true
        assert.equal(1, #store:children("s", state.opts))
      end)
    end)

    describe("a clock function", function()
      -- Runs one call in a child process (spec/support/clock_closes_store.lua)
      -- so that a hang fails this spec instead of stalling the suite.
      local function run_child(call)
        local store, full = helpers.open(url) -- a fresh concrete URL (sqlite: a file cleanup removes)
        store:close()
        local cmd = ("timeout -k 2 30 %s spec/support/clock_closes_store.lua %s %s 2>&1")
          :format(LUA, helpers.sh_quote(full), helpers.sh_quote(call))
        local p = assert(io.popen(cmd))
        local out = p:read("a")
        local ok, how, code = p:close()
        return out, ok, how, code
      end

      for _, call in ipairs({ "append", "complete", "claim", "claim_next", "renew", "fail",
                              "put_snapshot", "presence_set", "presence_read", "now" }) do
        it("that closes its store makes " .. call .. " fail with CLOSED, writing nothing", function()
          local out, ok, how, code = run_child(call)
          assert.is_true(ok, ("child ended by %s %s (124: timed out, a hang): %s"):format(
            tostring(how), tostring(code), out))
          local want = url:match("^sqlite:") and "unchanged" or "n/a"
          assert.equal(("result=CLOSED after=CLOSED again=ok state=%s\n"):format(want), out)
        end)
      end

      -- presence_subscribe reads the clock on sqlite: and postgres: (the
      -- watch starts from now), not on memory:. It used to return a
      -- subscription on the store its clock had just closed, which nothing
      -- ever ended (LeakSanitizer found it under the API fuzzer).
      it("that closes its store makes presence_subscribe raise CLOSED, or is not read by it", function()
        local out, ok, how, code = run_child("presence_subscribe")
        assert.is_true(ok, ("child ended by %s %s (124: timed out; a leak ends it under the sanitizers): %s"):format(
          tostring(how), tostring(code), out))
        local state = url:match("^sqlite:") and "unchanged" or "n/a"
        if url:match("^memory:") then
          assert.equal("result=ok after=ok again=ok state=n/a\n", out)
        else
          assert.equal(("result=CLOSED after=CLOSED again=ok state=%s\n"):format(state), out)
        end
      end)

      it("that calls its own store is refused with a clear error; nothing is written", function()
        local store
        local reenter = false
        local clock = helpers.manual_clock(helpers.T0)
        store = helpers.open(url, {
          clock = function()
            if reenter then store:head("s") end
            return clock:now()
          end,
        })
        store:append("s", { { type = "a" } })
        local before = helpers.log_state(store)
        reenter = true
        local err = expect_error("INVALID_ARGUMENT", function()
          return store:append("s", { { type = "b" } })
        end)
        assert.is_truthy(err.message:find("clock", 1, true), err.message)
        assert.is_truthy(err.message:find("cannot be called", 1, true), err.message)
        reenter = false
        assert.equal(before, helpers.log_state(store))
        assert.equal(1, store:head("s"))
      end)
    end)
  end)
end

-- The core has threads of its own: the presence watcher reads the rows
-- another handle (another process) wrote, and reads the clock to leave out
-- expired ones. A Lua clock function must never run there (a Lua state
-- entered from two threads: ASan showed a crash in that thread while the
-- caller was inside a call); the watcher uses the time it last gave. And
-- the rows it finds reach a subscriber as one patch per write, each its
-- own participant's (they came as one patch of the first participant).
for _, url in ipairs(helpers.durable_urls()) do
  describe(url .. " a Lua clock function and the core's own threads", function()
    after_each(helpers.cleanup)

    it("delivers another handle's presence writes, one patch each, read at the time the clock last gave", function()
      local t = helpers.T0
      local ticks = 0
      local mine, concrete = helpers.open(url, { clock = function() ticks = ticks + 1; t = t + 1; return t end })
      local other = helpers.open_same(concrete, { clock = helpers.manual_clock(helpers.T0) })
      local got = {}
      mine:presence_subscribe("room", function(p) got[#got + 1] = p end)
      mine:append("s", { { type = "a" } }) -- the clock gives a time
      for i = 1, 20 do
        other:presence_set("room", "p" .. i, { n = i }, { ttl_ms = 600000 })
        -- calls of mine run its clock on this thread while the watcher reads
        for _ = 1, 5 do mine:read("s") end
      end
      helpers.wait_until(function()
        mine:read("s") -- delivers what the watcher found
        local seen = {}
        for _, p in ipairs(got) do seen[p.participant] = true end
        for i = 1, 20 do if not seen["p" .. i] then return false end end
        return true
      end, "the other handle's 20 participants to reach the subscriber", 60)
      for _, p in ipairs(got) do
        assert.equal(p.participant, "p" .. p.values.n, "a patch carries its own participant's fields")
        local fields = 0
        for _ in pairs(p.values) do fields = fields + 1 end
        assert.equal(1, fields)
      end
      assert.is_true(ticks >= 2) -- the clock ran on this thread (open, append)
    end)
  end)
end

describe("eventstore.open that fails", function()
  -- The handle exists before the open (it is created closed, liolib's
  -- pattern): a failed open must still release the clock it took, a Lua
  -- function's registry ref or a manual clock's reference (the latter
  -- leaked, as make check-sanitize's leak detection shows).
  local function failing_opens(weak)
    local fn = function() return 0 end
    weak[fn] = true
    local ok1, err1 = pcall(eventstore.open, "nope:", { clock = fn })
    local ok2, err2 = pcall(eventstore.open, "nope:", { clock = eventstore.manual_clock(5) })
    return ok1, err1, ok2, err2
  end

  it("releases the clock it was given", function()
    local weak = setmetatable({}, { __mode = "k" })
    local ok1, err1, ok2, err2 = failing_opens(weak)
    assert.is_false(ok1)
    assert.is_true(eventstore.is_error(err1, "INVALID_ARGUMENT"), tostring(err1))
    assert.is_false(ok2)
    assert.is_true(eventstore.is_error(err2, "INVALID_ARGUMENT"), tostring(err2))
    assert.is_true(collected(weak), "the clock function is still referenced after a failed open")
  end)
end)
