-- docs/contract.md §4 ctx.cancel(index, reason): a handler cancels a pending
-- event of its session (a reminder timer its event made pointless), applied
-- with its completion (§3.2 complete{cancel}). Runs once per backend URL
-- (helpers.urls()), and through a tenant handle.
local helpers = require("helpers")
local eh = require("engine_helpers")

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    local function setup(tenant)
      local t = eh.setup(url)
      if tenant then t.store = t.store:tenant("acme") end
      t.handler("order.placed", [[
return function(event, ctx)
  return { { type = "remind", delay_ms = 60000 }, { type = "audit", delay_ms = 60000 } }
end
]])
      t.handler("paid", [[
return function(event, ctx)
  ctx.cancel(2, "paid")
  ctx.cancel(3)
  ctx.cancel(1)   -- processed already: not cancelled, and the completion still happens
  ctx.cancel(99)  -- no such event: the same
  return { { type = "receipt" } }
end
]])
      t.handler("remind", [[return function() return { { type = "reminded" } } end]])
      t.handler("audit", [[return function() return { { type = "audited" } } end]])
      t.handler("receipt", [[return function() end]])
      return t
    end

    for _, tenant in ipairs({ false, true }) do
      it("ctx.cancel cancels timers with the completion" .. (tenant and " (tenant handle)" or ""), function()
        local t = setup(tenant)
        local engine = t.engine({ store = t.store })
        engine:append("o", { { type = "order.placed" } })
        assert.same({ handled = 1, failed = 0, dead = 0 }, eh.run(engine))
        engine:append("o", { { type = "paid" } })
        assert.same({ handled = 2, failed = 0, dead = 0 }, eh.run(engine)) -- paid, receipt
        local ev = t.store:read("o")
        assert.equal("paid", ev[2].cancelled)
        assert.equal("cancelled", ev[3].cancelled)
        assert.equal("processed", ev[2].status)
        assert.is_nil(ev[1].cancelled)
        -- once due, the cancelled timers are never handled
        t.clock:advance(120000)
        assert.same({ handled = 0, failed = 0, dead = 0 }, eh.run(engine))
        for _, e in ipairs(t.store:read("o")) do
          assert.is_true(e.type ~= "reminded" and e.type ~= "audited", e.type)
        end
      end)
    end

    it("without the cancel, the timer fires (the spec above can fail)", function()
      local t = setup(false)
      t.handler("paid", [[return function(event, ctx) return nil end]])
      local engine = t.engine()
      engine:append("o", { { type = "order.placed" }, { type = "paid" } })
      eh.run(engine)
      t.clock:advance(120000)
      assert.same({ handled = 2, failed = 0, dead = 0 }, eh.run(engine))
      assert.is_nil(t.store:read("o")[3].cancelled)
    end)

    it("a handler that fails cancels nothing", function()
      local t = setup(false)
      t.handler("paid", [[return function(event, ctx) ctx.cancel(2) error("no") end]])
      local engine = t.engine({ max_failures = 1 })
      engine:append("o", { { type = "order.placed" } })
      eh.run(engine)
      engine:append("o", { { type = "paid" } })
      assert.same({ handled = 0, failed = 0, dead = 1 }, eh.run(engine))
      assert.equal("pending", t.store:read("o")[2].status)
      assert.is_nil(t.store:read("o")[2].cancelled)
    end)

    it("ctx.cancel refuses a bad index", function()
      local t = setup(false)
      t.handler("paid", [[return function(event, ctx) ctx.cancel("two") end]])
      local engine = t.engine({ max_failures = 1 })
      engine:append("o", { { type = "paid" } })
      assert.same({ handled = 0, failed = 0, dead = 1 }, eh.run(engine))
      assert.matches("cancel", t.store:read("o")[1].last_error)
    end)
  end)
end
