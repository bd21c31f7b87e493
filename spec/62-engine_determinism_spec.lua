-- Deterministic scripts: docs/contract.md §4 and docs/replay.md. Inside a
-- handler math.random and ctx.random draw from a generator seeded by the
-- event's id and attempt, os.time() is ctx.now() // 1000 and os.clock()
-- ctx.now() / 1000 on the store's clock: the same events give the same
-- results in two live runs. Runs once per backend URL (helpers.urls()).
local helpers = require("helpers")
local eh = require("engine_helpers")

-- Everything a handler can draw from the machine, returned as one event.
local ROLL = [[
return function(event, ctx)
  local draws = { math.random(1, 1000000000), ctx.random(), ctx.random(1, 6), math.random() }
  return { { type = "rolled", payload = { draws = draws, time = os.time(), clock = os.clock(),
    now = ctx.now(), attempt = ctx.attempt } } }
end
]]

-- One live run: a fresh store on a manual clock, the same inputs (same ids),
-- the engine run to idle; the payloads of the results, in order.
local function live_run(url, inputs, handler)
  local t = eh.setup(url)
  t.handler("roll", handler or ROLL)
  local engine = t.engine()
  for _, input in ipairs(inputs) do
    t.clock:set(input.at)
    engine:append(input.session, { { id = input.id, type = "roll", payload = {} } })
    eh.run(engine)
  end
  local out = {}
  for _, input in ipairs(inputs) do
    for _, e in ipairs(t.store:read(input.session)) do
      if e.type == "rolled" and e.cause.index == 1 then out[#out + 1] = e.payload end
    end
  end
  return out
end

local INPUTS = {
  { session = "dice-a", id = "0b6f2a52-0000-7000-8000-000000000001", at = helpers.T0 + 1500 },
  { session = "dice-b", id = "0b6f2a52-0000-7000-8000-000000000002", at = helpers.T0 + 2500 },
}

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    it("gives the same draws and times in two live runs of the same events", function()
      local first = live_run(url, INPUTS)
      local second = live_run(url, INPUTS)
      assert.equal(2, #first)
      assert.same(first, second)
      -- Another event (another id) draws other numbers.
      assert.are_not.same(first[1].draws, first[2].draws)
    end)

    it("reads os.time and os.clock from the store's clock", function()
      local got = live_run(url, INPUTS)
      for i, p in ipairs(got) do
        assert.equal(INPUTS[i].at, p.now)
        assert.equal(INPUTS[i].at // 1000, p.time)
        assert.equal(INPUTS[i].at / 1000, p.clock)
      end
    end)

    it("draws other numbers on a retry, the same ones on the same attempt", function()
      -- The first attempt fails with its draw in the error; the second
      -- returns its draw. Two runs agree on both; the attempts differ.
      local flaky = [[
return function(event, ctx)
  local n = math.random(1, 1000000000)
  if ctx.attempt == 1 then error("draw " .. n) end
  return { { type = "rolled", payload = { draw = n, attempt = ctx.attempt } } }
end
]]
      local function run_once()
        local t = eh.setup(url)
        t.handler("roll", flaky)
        local engine = t.engine({ backoff_ms = 10, backoff_cap_ms = 10 })
        engine:append("dice", { { id = INPUTS[1].id, type = "roll", payload = {} } })
        eh.run(engine)
        local failed = eh.event(t.store, "dice", 1)
        local first = tonumber(tostring(failed.last_error):match("draw (%d+)"))
        t.clock:advance(1000)
        eh.run(engine)
        local rolled = eh.event(t.store, "dice", 2)
        return first, rolled.payload.draw, rolled.payload.attempt
      end
      local a1, a2, attempt = run_once()
      local b1, b2 = run_once()
      assert.is_number(a1)
      assert.equal(2, attempt)
      assert.equal(a1, b1)
      assert.equal(a2, b2)
      assert.are_not.equal(a1, a2)
    end)

    it("draws from a script's own math.randomseed; the next event draws its own numbers again", function()
      -- The seed for each call is applied at its first draw: a seed the
      -- script sets first must win, and must not reach the next event.
      local seeding = [[
return function(event, ctx)
  if event.session == "dice-a" then math.randomseed(7) end
  return { { type = "rolled", payload = { draw = math.random(1, 1000000000) } } }
end
]]
      local plain = [[
return function(event, ctx)
  return { { type = "rolled", payload = { draw = math.random(1, 1000000000) } } }
end
]]
      local got = live_run(url, INPUTS, seeding)
      local unseeded = live_run(url, INPUTS, plain)
      math.randomseed(7)
      local want = math.random(1, 1000000000)
      math.randomseed()
      assert.equal(want, got[1].draw)
      assert.are_not.equal(want, unseeded[1].draw)
      assert.equal(unseeded[2].draw, got[2].draw)
    end)

    it("keeps the generator when a script replaces math.randomseed", function()
      local meddler = [[
return function(event, ctx)
  math.randomseed = function() end
  return { { type = "rolled", payload = { draw = math.random(1, 1000000000) } } }
end
]]
      local first = live_run(url, INPUTS, meddler)
      local second = live_run(url, INPUTS, meddler)
      assert.same(first, second)
      assert.are_not.equal(first[1].draw, first[2].draw)
    end)
  end)
end
