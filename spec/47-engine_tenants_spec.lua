-- Engine and tenants (docs/contract.md §3.11): an engine given a tenant handle
-- dispatches that tenant's events only, writes into that tenant, and folds
-- that tenant's state. Runs once per backend URL (on sqlite both engines
-- share one file through one store, as `eventstore run --tenant` would).
local helpers = require("helpers")
local eh = require("engine_helpers")

local SEP = "\31"

-- Each handled ping answers with a pong naming the session it saw.
local PING = [[
return function(event, ctx)
  return { { type = "pong", payload = { of = event.index, session = ctx.session } } }
end
]]

local COUNT = [[
return {
  init = function() return { pings = 0 } end,
  ping = function(state) state.pings = state.pings + 1 end,
}
]]

local function of_type(store, session, t)
  return eh.of_type(store:read(session), t)
end

for _, url in ipairs(helpers.urls_and_shards()) do
  describe(url, function()
    after_each(eh.cleanup)

    it("two engines with the same scripts on tenants A and B each handle only their tenant's events", function()
      local t = eh.setup(url)
      t.handler("ping", PING)
      t.reducer("count", COUNT)
      local A, B = t.store:tenant("A"), t.store:tenant("B")
      A:append("s", { { type = "ping" }, { type = "ping" } })
      B:append("s", { { type = "ping" } })
      t.store:append("s", { { type = "ping" } }) -- the root's own: neither engine's
      local ea = t.engine({ store = A, holder = "ea" })
      local eb = t.engine({ store = B, holder = "eb" })
      assert.same({ handled = 2, failed = 0, dead = 0 }, eh.run(ea))
      -- A's engine touched nothing of B's or the root's
      assert.equal("pending", B:read("s")[1].status)
      assert.equal("pending", t.store:read("s")[1].status)
      assert.same({ handled = 1, failed = 0, dead = 0 }, eh.run(eb))
      assert.equal("pending", t.store:read("s")[1].status)
      -- results were written into each tenant, named as the tenant names them
      local pa, pb = of_type(A, "s", "pong"), of_type(B, "s", "pong")
      assert.equal(2, #pa)
      assert.equal(1, #pb)
      assert.equal("s", pa[1].payload.session)
      assert.equal("s", pa[1].session)
      assert.is_nil(pa[1].id:find(SEP, 1, true))
      assert.equal("A" .. SEP, t.store:read("A" .. SEP .. "s")[3].id:sub(1, 2))
      assert.equal(1, #of_type(t.store, "s", "ping"))
      assert.equal(0, #of_type(t.store, "s", "pong"))
      -- state folds are the tenant's
      assert.same({ pings = 2 }, ea:state("s", "count"))
      assert.same({ pings = 1 }, eb:state("s", "count"))
      -- engine:append writes into the tenant
      ea:append("s2", { { type = "ping" } })
      assert.equal(1, A:head("s2"))
      assert.equal(0, B:head("s2"))
      assert.same({ handled = 1, failed = 0, dead = 0 }, eh.run(ea))
      assert.same({ handled = 0, failed = 0, dead = 0 }, eh.run(eb))
    end)

    it("run reports only its tenant's unhandled types", function()
      local t = eh.setup(url)
      t.handler("ping", PING)
      local A, B = t.store:tenant("A"), t.store:tenant("B")
      B:append("s", { { type = "orphan" } })
      A:append("s", { { type = "ping" } })
      local ea = t.engine({ store = A, holder = "ea" })
      local r = ea:run({ until_idle = true })
      assert.equal(1, r.handled)
      assert.equal(0, r.unhandled or 0)
      local eb = t.engine({ store = B, holder = "eb" })
      r = eb:run({ until_idle = true })
      assert.equal(1, r.unhandled)
      assert.truthy(tostring(r.unhandled_types):find("orphan", 1, true))
    end)

    it("failures and dead letters stay in the tenant", function()
      local t = eh.setup(url)
      t.handler("boom", "return function() error('B-only failure') end")
      local A, B = t.store:tenant("A"), t.store:tenant("B")
      B:append("s", { { type = "boom" } })
      local eb = t.engine({ store = B, holder = "eb", max_failures = 1, backoff_ms = 0 })
      local r = eh.run(eb)
      assert.equal(1, r.dead)
      assert.equal(1, #B:dead_letters())
      assert.same({}, A:dead_letters())
      assert.truthy(B:dead_letters()[1].last_error:find("B-only failure", 1, true))
    end)
  end)
end
