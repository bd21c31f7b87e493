-- What a newcomer tripped over (issue 14), engine and store side: one event
-- passed without its list, a handler returning one event, and os.execute
-- in handlers (which must not swallow SIGINT as the C library's system()
-- does; the signal itself is spec/50-cli_spec.lua's). Runs once per
-- backend URL (helpers.urls()).
local helpers = require("helpers")
local eh = require("engine_helpers")

local function contains(haystack, needle)
  return type(haystack) == "string" and haystack:find(needle, 1, true) ~= nil
end

for _, url in ipairs(helpers.urls()) do
  describe(url .. " newcomer traps", function()
    after_each(eh.cleanup)

    it("store:append of one event without its list is an argument error, never an empty batch", function()
      local t = eh.setup(url)
      local msg = helpers.expect_arg_error(function() return t.store:append("s", { type = "x" }) end)
      assert.is_true(contains(msg, "not one event"), msg)
      helpers.expect_arg_error(function() return t.store:append("s", { { type = "x" }, extra = 1 }) end)
      helpers.expect_arg_error(function() return t.store:append("s", { [1] = { type = "x" }, [3] = { type = "y" } }) end)
      assert.equal(0, t.store:head("s"))
      assert.same({}, (t.store:append("s", {}))) -- a real empty batch still writes nothing
    end)

    it("a handler returning one event instead of a list fails its attempt with a clear error", function()
      local t = eh.setup(url)
      t.handler("x", "return function() return { type = 'oops' } end")
      local engine = t.engine({ max_failures = 1, backoff_ms = 0 })
      t.store:append("s", { { type = "x" } })
      local r = eh.run(engine)
      assert.same({ handled = 0, failed = 0, dead = 1 }, r)
      local ev = eh.event(t.store, "s", 1)
      assert.is_true(contains(ev.last_error, "not one event"), ev.last_error)
      assert.equal(1, t.store:head("s"))
    end)

    it("an engine claims only the types it has handlers for and reports the rest, never settling them", function()
      local t = eh.setup(url)
      t.handler("a", "return function() return {{type = 'a.done'}} end")
      local engine = t.engine({})
      t.store:append("s", { { type = "b" }, { type = "a" }, { type = "c" }, { type = "b" } })
      local r = engine:run({ until_idle = true })
      assert.same({ handled = 1, failed = 0, dead = 0 }, eh.counts(r))
      assert.equal(3, r.unhandled)
      assert.equal("b, c", r.unhandled_types)
      for _, i in ipairs({ 1, 3, 4 }) do
        local ev = eh.event(t.store, "s", i)
        assert.equal("pending", ev.status)
        assert.equal(0, ev.attempts)
      end
      assert.equal("processed", eh.event(t.store, "s", 5).status) -- a.done: written by the engine, no handler
      -- an engine that has the handler takes them
      t.handler("b", "return function() end")
      t.handler("c", "return function() end")
      local r2 = engine:run({ until_idle = true })
      assert.same({ handled = 3, failed = 0, dead = 0 }, eh.counts(r2))
      assert.equal(0, r2.unhandled)
    end)

    it("an engine on an empty scripts directory marks nothing done", function()
      local t = eh.setup(url)
      local engine = t.engine({})
      t.store:append("s", { { type = "x" }, { type = "y" } })
      local r = engine:run({ until_idle = true })
      assert.same({ handled = 0, failed = 0, dead = 0 }, eh.counts(r))
      assert.equal(2, r.unhandled)
      assert.same({ "pending", "pending" }, helpers.pluck(t.store:read("s"), "status"))
    end)

    it("os.execute in a handler returns what the standard one returns", function()
      local t = eh.setup(url)
      t.handler("x", [[
return function()
  local a, b, c = os.execute("exit 3")
  local d, e, f = os.execute("true")
  return { { type = "ran", payload = { tostring(a), b, c, tostring(d), e, f, os.execute() } } }
end]])
      local engine = t.engine({})
      t.store:append("s", { { type = "x" } })
      assert.same({ handled = 1, failed = 0, dead = 0 }, eh.run(engine))
      assert.same({ "nil", "exit", 3, "true", "exit", 0, true }, eh.event(t.store, "s", 2).payload)
    end)
  end)
end
