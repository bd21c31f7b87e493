-- Engine: docs/contract.md §4 reducers and snapshots -- engine:state folds, {at},
-- NOT_FOUND / NO_SUCH_EVENT, the instruction budget in a reducer,
-- ctx.state in a handler, snapshot_every, snapshots as a pure cache,
-- reducer versions (editing never serves stale state), exact round-trip of
-- reducer state through a snapshot, unserialisable state. Runs once per
-- backend URL (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local T0 = helpers.T0
local counts = eh.counts
local event = eh.event
local expect_error = helpers.expect_error
local dump = helpers.dump

-- Folds: counts, a list of the types seen, sums payload.v; "a" changes the
-- state in place and returns nothing, "b" returns a new state table; other
-- types are skipped.
local COUNTER = [[
return {
  init = function() return { n = 0, sum = 0, types = {} } end,
  a = function(state, event)
    state.n = state.n + 1
    state.sum = state.sum + (event.payload and event.payload.v or 0)
    state.types[#state.types + 1] = event.type .. "@" .. event.index
  end,
  b = function(state, event)
    local types = state.types
    types[#types + 1] = event.type .. "@" .. event.index
    return { n = state.n + 10, sum = state.sum + (event.payload and event.payload.v or 0), types = types }
  end,
}
]]

-- An order-sensitive fold with integers and floats, for cache comparisons.
local SEQ = [[
return {
  init = function() return { sum = 0, f = 0.0, seq = {}, last = "none" } end,
  x = function(state, event)
    state.sum = state.sum + event.payload.v
    state.f = state.f + event.payload.w
    state.seq[#state.seq + 1] = event.index
    state.last = event.type
  end,
  y = function(state, event)
    state.sum = state.sum * 2 - event.payload.v
    state.last = event.type
    return state
  end,
}
]]

local function contains(haystack, needle)
  return type(haystack) == "string" and haystack:find(needle, 1, true) ~= nil
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    local function setup() return eh.setup(url) end
    local run = eh.run

    -- n events alternating x / y with integer v and float w.
    local function seq_events(from, to)
      local batch = {}
      for i = from, to do
        local ty = (i % 4 == 0) and "y" or "x"
        batch[#batch + 1] = { type = ty, payload = { v = (i * 7) % 11, w = i / 8 } }
      end
      return batch
    end

    local function snapshot_of(store, session, reducer)
      for _, s in ipairs(store:snapshots(session)) do
        if s.reducer == reducer then return s end
      end
      return nil
    end

    -------------------------------------------------------------------------
    describe("reducers", function()
      it("engine:state folds the session: steps in place or returning the new state; other types skipped", function()
        local t = setup()
        t.reducer("counter", COUNTER)
        local engine = t.engine()
        engine:append("s", {
          { type = "a", payload = { v = 1 } },
          { type = "a", payload = { v = 2 } },
          { type = "b", payload = { v = 4 } },
          { type = "c", payload = { v = 1000 } }, -- no step: skipped
          { type = "a", payload = { v = 8 } },
        })
        local st = engine:state("s", "counter")
        assert.same({ n = 13, sum = 15, types = { "a@1", "a@2", "b@3", "a@5" } }, st)
        assert.equal("integer", math.type(st.n))
        assert.equal("integer", math.type(st.sum))
      end)

      it("folds every event of the session whatever its dispatch status", function()
        local t = setup()
        t.reducer("counter", COUNTER)
        t.handler("a", "return function(event, ctx) error('no') end\n")
        local engine = t.engine({ max_failures = 1 })
        t.store:append("s", { { type = "a", payload = { v = 1 } } })   -- will be dead
        t.store:append("s", { { type = "a", payload = { v = 2 }, settled = true } })
        t.store:append("s", { { type = "a", payload = { v = 4 } } })   -- will be dead too
        run(engine)
        t.store:append("s", { { type = "a", payload = { v = 8 }, lane = "L" } }) -- pending
        local st = engine:state("s", "counter")
        assert.equal(4, st.n)
        assert.equal(15, st.sum)
      end)

      it("{at = index} gives the state as of that index", function()
        local t = setup()
        t.reducer("counter", COUNTER)
        local engine = t.engine()
        engine:append("s", {
          { type = "a", payload = { v = 1 } },
          { type = "a", payload = { v = 2 } },
          { type = "b", payload = { v = 4 } },
          { type = "a", payload = { v = 8 } },
        })
        assert.same({ n = 1, sum = 1, types = { "a@1" } }, engine:state("s", "counter", { at = 1 }))
        assert.same({ n = 2, sum = 3, types = { "a@1", "a@2" } }, engine:state("s", "counter", { at = 2 }))
        assert.same({ n = 12, sum = 7, types = { "a@1", "a@2", "b@3" } }, engine:state("s", "counter", { at = 3 }))
        assert.same({ n = 13, sum = 15, types = { "a@1", "a@2", "b@3", "a@4" } }, engine:state("s", "counter", { at = 4 }))
        assert.same(engine:state("s", "counter"), engine:state("s", "counter", { at = 4 }))
      end)

      it("an unknown reducer is NOT_FOUND; at beyond the head is NO_SUCH_EVENT", function()
        local t = setup()
        t.reducer("counter", COUNTER)
        local engine = t.engine()
        engine:append("s", { { type = "a" }, { type = "a" } })
        expect_error("NOT_FOUND", function() engine:state("s", "no_such_reducer") end)
        expect_error("NO_SUCH_EVENT", function() engine:state("s", "counter", { at = 3 }) end)
        expect_error("NO_SUCH_EVENT", function() engine:state("s", "counter", { at = 100 }) end)
        expect_error("NO_SUCH_EVENT", function() engine:state("empty", "counter", { at = 1 }) end)
        -- the engine still works after those errors
        assert.equal(2, engine:state("s", "counter").n)
      end)

      -- A negative `at` names no index. math.mininteger is the store's
      -- "no value" inside; taken as "at the head" it answered a state
      -- for an index nobody asked about.
      it("a negative at is INVALID_ARGUMENT, math.mininteger included (never the head's state)", function()
        local t = setup()
        t.reducer("counter", COUNTER)
        local engine = t.engine()
        engine:append("s", { { type = "a" }, { type = "a" } })
        expect_error("INVALID_ARGUMENT", function() engine:state("s", "counter", { at = math.mininteger }) end)
        expect_error("INVALID_ARGUMENT", function() engine:state("s", "counter", { at = -1 }) end)
        assert.equal(0, engine:state("s", "counter", { at = 0 }).n)
        assert.equal(2, engine:state("s", "counter").n)
      end)

      it("each call returns its own state (changing a result changes no later result)", function()
        local t = setup()
        t.reducer("counter", COUNTER)
        local engine = t.engine({ snapshot_every = 1 })
        engine:append("s", { { type = "a", payload = { v = 1 } }, { type = "a", payload = { v = 2 } } })
        local st = engine:state("s", "counter")
        st.n = 999
        st.types[1] = "tampered"
        assert.same({ n = 2, sum = 3, types = { "a@1", "a@2" } }, engine:state("s", "counter"))
      end)

      it("each engine uses its own scripts directory (engines opened and closed one after another)", function()
        local t = setup()
        t.store:append("s", { { type = "a" } })
        for i = 1, 6 do
          local dir = eh.scripts_dir()
          eh.reducer(dir, "r", ([[
return { init = function() return { engine = %d, n = 0 } end,
         a = function(state) state.n = state.n + 1 end }
]]):format(i))
          local engine = eh.engine({ store = t.store, scripts = dir, snapshot_every = 0 })
          assert.same({ engine = i, n = 1 }, engine:state("s", "r"), "engine " .. i)
          engine:close()
        end
      end)

      it("a reducer edited right after a fold is used by the next fold (no wait)", function()
        local t = setup()
        t.reducer("r", "return { init = function() return { v = 1 } end }\n")
        local engine = t.engine({ snapshot_every = 0 })
        t.store:append("s", { { type = "a" } })
        assert.same({ v = 1 }, engine:state("s", "r"))
        t.reducer("r", "return { init = function() return { v = 2 } end }\n")
        assert.same({ v = 2 }, engine:state("s", "r"))
      end)

      it("a reducer over the instruction budget raises an error naming the budget; the engine goes on", function()
        local t = setup()
        t.reducer("spin", [[
return {
  init = function() return {} end,
  a = function(state, event) while true do end end,
}
]])
        t.reducer("counter", COUNTER)
        local engine = t.engine({ instruction_budget = 100000 })
        engine:append("s", { { type = "a" }, { type = "a" } })
        local ok, err = pcall(engine.state, engine, "s", "spin")
        assert.is_false(ok, "a reducer in an endless loop must fail")
        assert.is_true(eh.error_text(err):lower():find("instruction.budget") ~= nil,
          "the error must name the instruction budget: " .. eh.error_text(err))
        assert.equal(2, engine:state("s", "counter").n)
      end)

      it("ctx.state(reducer) in a handler is the session's state before the handled event", function()
        local t = setup()
        -- counts every type it knows, results included, so a state folded
        -- past the handled event would show
        t.reducer("tally", [[
return {
  init = function() return { n = 0 } end,
  tick = function(state) state.n = state.n + 1 end,
  probe = function(state) state.n = state.n + 1 end,
  ["probe.result"] = function(state) state.n = state.n + 1 end,
}
]])
        t.handler("probe", [[
return function(event, ctx)
  local st = ctx.state("tally")
  return { { type = "probe.result", payload = { index = event.index, before = st.n } } }
end
]])
        local engine = t.engine()
        t.store:append("s", { { type = "tick" }, { type = "tick" }, { type = "probe", lane = "L" },
          { type = "tick" }, { type = "probe", lane = "L" } })
        assert.same({ handled = 2, failed = 0, dead = 0 }, run(engine))
        local results = eh.of_type(t.store:read("s"), "probe.result")
        assert.equal(2, #results)
        local before = {}
        for _, r in ipairs(results) do before[r.payload.index] = r.payload.before end
        assert.equal(2, before[3])
        assert.equal(4, before[5])
      end)
    end)

    -------------------------------------------------------------------------
    describe("snapshots", function()
      it("snapshot_every = 10: folding 25 events leaves a snapshot, folding more moves it on", function()
        local t = setup()
        t.reducer("seq", SEQ)
        local engine = t.engine({ snapshot_every = 10 })
        engine:append("s", seq_events(1, 25))
        engine:state("s", "seq")
        local snap = snapshot_of(t.store, "s", "seq")
        assert.is_not_nil(snap, "no snapshot of reducer seq after folding 25 events with snapshot_every = 10")
        assert.is_true(snap.index >= 10 and snap.index <= 25, "snapshot index " .. tostring(snap.index))
        assert.is_string(snap.version)
        assert.is_true(#snap.version > 0)
        local rs = t.store:read_state("s", "seq")
        assert.is_not_nil(rs.snapshot)
        assert.equal(snap.index, rs.snapshot.index)
        assert.equal(snap.version, rs.snapshot.version)

        engine:append("s", seq_events(26, 45))
        engine:state("s", "seq")
        local snap2 = snapshot_of(t.store, "s", "seq")
        assert.is_true(snap2.index >= 30 and snap2.index <= 45, "snapshot index after 45 events: " .. tostring(snap2.index))
        assert.equal(snap.version, snap2.version)
      end)

      it("snapshot_every = 0 writes no snapshot", function()
        local t = setup()
        t.reducer("seq", SEQ)
        local engine = t.engine({ snapshot_every = 0 })
        engine:append("s", seq_events(1, 40))
        engine:state("s", "seq")
        engine:state("s", "seq", { at = 30 })
        assert.same({}, t.store:snapshots("s"))
      end)

      it("are a pure cache: every result equals the one of an engine without snapshots", function()
        local t_on, t_off = setup(), setup()
        t_on.reducer("seq", SEQ)
        t_off.reducer("seq", SEQ)
        local on = t_on.engine({ snapshot_every = 10 })
        local off = t_off.engine({ snapshot_every = 0 })
        local function append(from, to)
          on:append("s", seq_events(from, to))
          off:append("s", seq_events(from, to))
        end
        local function same(opts, label)
          local a = on:state("s", "seq", opts)
          local b = off:state("s", "seq", opts)
          assert.equal(dump(b), dump(a), label)
        end
        append(1, 7)
        same(nil, "7")
        append(8, 15)
        same(nil, "15")
        same({ at = 3 }, "at 3")
        append(16, 25)
        same(nil, "25")
        same({ at = 12 }, "at 12") -- before the newest snapshot
        same({ at = 20 }, "at 20")
        append(26, 45)
        same(nil, "45")
        for at = 1, 45 do same({ at = at }, "at " .. at) end
        same(nil, "45 again")
        assert.is_not_nil(snapshot_of(t_on.store, "s", "seq"), "the engine with snapshot_every = 10 wrote none")

        -- a fresh engine on the store with snapshots folds from them, same results
        local on2 = t_on.engine({ snapshot_every = 10 })
        for _, at in ipairs({ 5, 19, 20, 21, 30, 44, 45 }) do
          assert.equal(dump(off:state("s", "seq", { at = at })), dump(on2:state("s", "seq", { at = at })), "fresh engine at " .. at)
        end
      end)

      it("editing the reducer never serves stale state and replaces the snapshot's version", function()
        local t = setup()
        t.reducer("total", [[
return { init = function() return { total = 0 } end,
         x = function(state, event) state.total = state.total + event.payload.v end }
]])
        local engine = t.engine({ snapshot_every = 10 })
        local batch, sum = {}, 0
        for i = 1, 25 do
          batch[i] = { type = "x", payload = { v = i } }
          sum = sum + i
        end
        engine:append("s", batch)
        assert.same({ total = sum }, engine:state("s", "total"))
        local old = snapshot_of(t.store, "s", "total")
        assert.is_not_nil(old, "no snapshot after folding 25 events with snapshot_every = 10")

        t.reducer("total", [[
-- version 2: a hundred times the sum
return { init = function() return { total = 0 } end,
         x = function(state, event) state.total = state.total + 100 * event.payload.v end }
]])
        assert.same({ total = 100 * sum }, engine:state("s", "total"))
        local new = snapshot_of(t.store, "s", "total")
        assert.is_not_nil(new)
        assert.are_not.equal(old.version, new.version)
        assert.is_true(new.index >= old.index)
        local rs = t.store:read_state("s", "total")
        assert.equal(new.version, rs.snapshot.version)

        assert.same({ total = 100 * 15 }, engine:state("s", "total", { at = 5 }))
        assert.same({ total = 100 * 210 }, engine:state("s", "total", { at = 20 }))
        -- another engine with the new file agrees
        local fresh = t.engine({ snapshot_every = 10 })
        assert.same({ total = 100 * sum }, fresh:state("s", "total"))
      end)

      it("an edited reducer is not served stale by an engine that used the old version through ctx.state", function()
        local t = setup()
        t.reducer("total", [[
return { init = function() return { total = 0 } end,
         x = function(state, event) state.total = state.total + event.payload.v end }
]])
        t.handler("ask", [[
return function(event, ctx)
  return { { type = "answer", payload = { total = ctx.state("total").total } } }
end
]])
        local engine = t.engine({ snapshot_every = 2 })
        t.store:append("s", { { type = "x", payload = { v = 1 } }, { type = "x", payload = { v = 2 } },
          { type = "x", payload = { v = 3 } }, { type = "ask", lane = "q" } })
        run(engine)
        assert.equal(6, event(t.store, "s", 5).payload.total)
        t.reducer("total", [[
return { init = function() return { total = 0 } end,
         x = function(state, event) state.total = state.total - event.payload.v end }
]])
        t.store:append("s", { { type = "ask", lane = "q" } }) -- index 6
        run(engine)
        assert.equal(-6, event(t.store, "s", 7).payload.total)
        assert.same({ total = -6 }, engine:state("s", "total"))
      end)

      it("round-trips reducer state exactly through a snapshot", function()
        local t = setup()
        local exotic = [[
return {
  init = function() return { count = 0 } end,
  put = function(state, event)
    state.count = state.count + 1
    state.int = 42
    state.float = 42.0
    state.big = 9007199254740993
    state.min = math.mininteger
    state.max = math.maxinteger
    state.tenth = 0.1
    state.huge = 1e300
    state.tiny = 5e-324
    state.neg = -1.5
    state.t, state.f = true, false
    state.bin = "\0\255"
    local bytes = {}
    for b = 0, 255 do bytes[#bytes + 1] = string.char(b) end
    state.all_bytes = table.concat(bytes)
    state.empty_string = ""
    state.empty = {}
    state.ints = { [1] = "a", [2] = "b", [10] = "c", [-5] = "neg", [0] = "zero" }
    state.keys = { [1] = "integer one", ["1"] = "string one" }
    state.mixed = { 10, 20, 30, name = "m" }
    state.nested = { a = { b = { c = { 1, 2.5, "x", { deep = true } } } } }
    state.last = event.index
  end,
}
]]
        t.reducer("exotic", exotic)
        local engine = t.engine({ snapshot_every = 2 })
        engine:append("s", { { type = "put" }, { type = "put" }, { type = "put" }, { type = "put" } })
        local first = engine:state("s", "exotic")
        local rs = t.store:read_state("s", "exotic")
        assert.is_not_nil(rs.snapshot, "no snapshot after folding 4 events with snapshot_every = 2")
        local at = rs.snapshot.index

        -- the expected state, computed here
        local expected = load(exotic)().init()
        local step = load(exotic)().put
        for i = 1, 4 do step(expected, { index = i, type = "put" }) end
        assert.equal(dump(expected), dump(first))

        -- a fresh engine starts from the snapshot
        local engine2 = t.engine({ snapshot_every = 2 })
        local restored = engine2:state("s", "exotic")
        assert.equal(dump(expected), dump(restored))
        local restored_at = engine2:state("s", "exotic", { at = at })
        local expected_at = load(exotic)().init()
        for i = 1, at do step(expected_at, { index = i, type = "put" }) end
        assert.equal(dump(expected_at), dump(restored_at))

        for _, st in ipairs({ restored, restored_at }) do
          assert.equal("integer", math.type(st.int))
          assert.equal("float", math.type(st.float))
          assert.equal(42.0, st.float)
          assert.equal("integer", math.type(st.big))
          assert.equal(9007199254740993, st.big)
          assert.equal(math.mininteger, st.min)
          assert.equal(math.maxinteger, st.max)
          assert.equal("float", math.type(st.tenth))
          assert.equal(0.1, st.tenth)
          assert.equal(1e300, st.huge)
          assert.equal(5e-324, st.tiny)
          assert.is_true(st.t)
          assert.is_false(st.f)
          assert.equal("\0\255", st.bin)
          assert.equal(256, #st.all_bytes)
          assert.equal("", st.empty_string)
          assert.is_table(st.empty)
          assert.is_nil(next(st.empty))
          assert.equal("c", st.ints[10])
          assert.equal("neg", st.ints[-5])
          assert.equal("zero", st.ints[0])
          assert.equal("integer one", st.keys[1])
          assert.equal("string one", st.keys["1"])
          assert.same({ 10, 20, 30, name = "m" }, st.mixed)
          assert.equal("float", math.type(st.nested.a.b.c[2]))
          assert.equal("integer", math.type(st.nested.a.b.c[1]))
          assert.is_true(st.nested.a.b.c[4].deep)
          assert.equal("integer", math.type(st.count))
        end
        assert.equal(4, restored.count)
      end)

      it("a state that cannot be serialised raises INVALID_ARGUMENT naming the reducer and the key", function()
        local t = setup()
        t.reducer("badstate", [[
return {
  init = function() return {} end,
  put = function(state, event) state.callback_fn = function() end end,
}
]])
        t.reducer("badnested", [[
return {
  init = function() return { outer = {} } end,
  put = function(state, event) state.outer.inner_fn = function() end end,
}
]])
        t.reducer("cyclic", [[
return {
  init = function() return {} end,
  put = function(state, event) state.myself = state end,
}
]])
        local engine = t.engine({ snapshot_every = 2 })
        engine:append("s", { { type = "put" }, { type = "put" }, { type = "put" }, { type = "put" } })
        local err = expect_error("INVALID_ARGUMENT", function() engine:state("s", "badstate") end)
        assert.is_true(contains(err.message, "badstate"), "must name the reducer: " .. err.message)
        assert.is_true(contains(err.message, "callback_fn"), "must name the key: " .. err.message)
        err = expect_error("INVALID_ARGUMENT", function() engine:state("s", "badnested") end)
        assert.is_true(contains(err.message, "badnested"), "must name the reducer: " .. err.message)
        assert.is_true(contains(err.message, "inner_fn"), "must name the key: " .. err.message)
        err = expect_error("INVALID_ARGUMENT", function() engine:state("s", "cyclic") end)
        assert.is_true(contains(err.message, "cyclic"), "must name the reducer: " .. err.message)
        assert.is_nil(snapshot_of(t.store, "s", "badstate"))
        assert.is_nil(snapshot_of(t.store, "s", "badnested"))
        assert.is_nil(snapshot_of(t.store, "s", "cyclic"))
      end)
    end)
  end)
end
