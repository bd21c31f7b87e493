-- engine:truncate (CONTRACT §3.9): every reducer is snapshotted at
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
