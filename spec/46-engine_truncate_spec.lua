-- engine:truncate (docs/contract.md §3.9): every reducer is snapshotted at
-- `through` before the events go, so state stays readable; a fold that
-- needs a dropped event is TRUNCATED. Runs once per backend URL.
local helpers = require("helpers")
local eh = require("engine_helpers")

local expect_error = helpers.expect_error

local COUNT = [[
return {
  init = function() return { n = 0, sum = 0 } end,
  tick = function(state, event) state.n = state.n + 1; state.sum = state.sum + event.payload.v end,
}
]]

local BROKEN_AT_3 = [[
return {
  init = function() return { n = 0 } end,
  tick = function(state, event)
    if event.index == 3 then error("cannot fold 3") end
    state.n = state.n + 1
  end,
}
]]

local function ticks(engine, session, n)
  local batch = {}
  for i = 1, n do batch[i] = { type = "tick", payload = { v = i } } end
  return engine:append(session, batch) -- no handler for tick: stored processed
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    for _, every in ipairs({ 0, 100 }) do
      it("keeps every reducer readable (snapshot_every = " .. every .. ")", function()
        local t = eh.setup(url)
        t.reducer("count", COUNT)
        t.reducer("also", COUNT)
        local engine = t.engine({ snapshot_every = every })
        ticks(engine, "s", 5)
        assert.equal(4, engine:truncate("s", 3))
        expect_error("TRUNCATED", t.store.read, t.store, "s")
        assert.same({ n = 5, sum = 15 }, engine:state("s", "count"))
        assert.same({ n = 5, sum = 15 }, engine:state("s", "also"))
        assert.same({ n = 3, sum = 6 }, engine:state("s", "count", { at = 3 }))
        expect_error("TRUNCATED", engine.state, engine, "s", "count", { at = 2 })
        ticks(engine, "s", 2)
        assert.same({ n = 7, sum = 18 }, engine:state("s", "count"))
      end)
    end

    -- A truncate sent again (a retried request, a retention sweep that
    -- runs twice) must not fail for what is already gone: below
    -- first_index the engine answers as store:truncate does, first_index
    -- and nothing changed, instead of refolding at `through` (TRUNCATED).
    it("through below first_index answers first_index and changes nothing, as store:truncate", function()
      local t = eh.setup(url)
      t.reducer("count", COUNT)
      local engine = t.engine({})
      ticks(engine, "s", 5)
      assert.equal(4, engine:truncate("s", 3))
      local snapshots = t.store:snapshots("s")
      assert.equal(4, engine:truncate("s", 2))
      assert.equal(4, engine:truncate("s", 3)) -- the same call again
      assert.equal(4, t.store:truncate("s", 2)) -- what the store answers
      assert.equal(4, t.store:sessions().sessions[1].first_index)
      assert.same(snapshots, t.store:snapshots("s"))
      assert.same({ 4, 5 }, helpers.indexes(t.store:read("s", { after = 3 })))
      assert.same({ n = 5, sum = 15 }, engine:state("s", "count"))
      ticks(engine, "s", 1)
      assert.same({ n = 6, sum = 16 }, engine:state("s", "count"))
    end)

    it("a reducer edited after the truncate cannot refold: TRUNCATED, never a wrong state", function()
      local t = eh.setup(url)
      t.reducer("count", COUNT)
      local engine = t.engine({})
      ticks(engine, "s", 4)
      engine:truncate("s", 2)
      t.reducer("count", COUNT .. "\n-- edited\n")
      expect_error("TRUNCATED", engine.state, engine, "s", "count")
    end)

    it("a reducer that fails stops it before anything is dropped", function()
      local t = eh.setup(url)
      t.reducer("broken", BROKEN_AT_3)
      local engine = t.engine({})
      ticks(engine, "s", 4)
      expect_error("INVALID_ARGUMENT", engine.truncate, engine, "s", 3)
      assert.equal(4, #t.store:read("s"))
    end)

    it("pending work past the cut still folds ctx.state once the reducer's snapshot moved on", function()
      local t = eh.setup(url)
      t.reducer("count", COUNT)
      t.handler("check", [[
return function(event, ctx)
  return { { type = "seen", payload = { n = ctx.state("count").n } } }
end
]])
      local engine = t.engine({ snapshot_every = 1 })
      ticks(engine, "s", 3)
      engine:append("s", { { type = "check" } })  -- 4: pending past the cut
      ticks(engine, "s", 2)                       -- 5, 6
      engine:truncate("s", 3)
      assert.same({ n = 5, sum = 9 }, engine:state("s", "count")) -- the snapshot moves to 6
      assert.same({ handled = 1, failed = 0, dead = 0 }, eh.run(engine))
      local seen = eh.of_type(t.store:read("s", { after = 3 }), "seen")
      assert.equal(3, seen[1].payload.n)
      assert.same({ n = 3, sum = 6 }, engine:state("s", "count", { at = 3 }))
    end)

    it("a newer snapshot of another reducer version does not hide the cut's state", function()
      local t = eh.setup(url)
      t.reducer("count", COUNT)
      local old = t.engine({ snapshot_every = 1 })
      ticks(old, "s", 6)
      old:state("s", "count") -- a snapshot at 6 of this version
      t.reducer("count", COUNT .. "\n-- version 2\n")
      local new = t.engine({ snapshot_every = 100 })
      assert.equal(4, new:truncate("s", 3))
      assert.same({ n = 6, sum = 21 }, new:state("s", "count"))
    end)

    it("a refused truncate leaves no snapshot behind", function()
      local t = eh.setup(url)
      t.reducer("count", COUNT)
      t.handler("work", "return function() end")
      local engine = t.engine({ snapshot_every = 0 })
      ticks(engine, "s", 2)
      engine:append("s", { { type = "work" } })
      ticks(engine, "s", 1)
      expect_error("INVALID_ARGUMENT", engine.truncate, engine, "s", 4)
      expect_error("NO_SUCH_EVENT", engine.truncate, engine, "s", 9)
      assert.same({}, t.store:snapshots("s"))
    end)

    it("pending work in the range: the store's refusal, nothing dropped", function()
      local t = eh.setup(url)
      t.reducer("count", COUNT)
      t.handler("work", "return function() end")
      local engine = t.engine({})
      ticks(engine, "s", 2)
      engine:append("s", { { type = "work" } })
      expect_error("INVALID_ARGUMENT", engine.truncate, engine, "s", 3)
      assert.equal(3, #t.store:read("s"))
      eh.run(engine)
      assert.equal(4, engine:truncate("s", 3))
    end)
  end)
end
