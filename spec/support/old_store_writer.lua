-- Writes a small store of every kind of event row (pending, settled in a lane,
-- completed with a result that carries a cause) on a manual clock with
-- counter ids, so that two runs write the same rows. Used once with the
-- build of commit 31a4d76 (before revision and meta) to make the fixtures
-- spec/fixtures/sqlite_schema_v7.sql and postgres_schema_v2.sql:
--   lua5.4 spec/support/old_store_writer.lua URL
local eventstore = require("eventstore")
local n = 0
local store = eventstore.open(arg[1], {
  clock = eventstore.manual_clock(1700000000000),
  ids = function()
    n = n + 1
    return ("ev-%d"):format(n)
  end,
})
store:append("order-1", {
  { type = "order.placed", payload = { qty = 2, sku = "A-1" } },
  { type = "order.note", payload = "hello", settled = true, lane = "notes" },
})
store:append("order-2", { { id = "given-id", type = "order.placed", payload = { qty = 1, price = 0.5 } } })
local got = store:claim("order-2", { holder = "w", ttl_ms = 60000 }).events
store:complete("order-2", 1, got[1].attempt, { { type = "order.confirmed", payload = { ok = true } } })
store:close()
