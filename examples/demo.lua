-- A short tour of the store on SQLite: an order flow handled by a tiny
-- worker loop built from claim_next / complete / fail. Run: make demo
local eventstore = require("eventstore")

local path = os.getenv("DEMO_DB") or "demo.db"
for _, suffix in ipairs({"", "-wal", "-shm"}) do os.remove(path .. suffix) end
local store <close> = eventstore.open("sqlite:" .. path)

-- Three orders arrive.
for i = 1, 3 do
  store:append("order-" .. i, {
    {type = "order.placed", payload = {sku = "SKU-" .. i, qty = i, price_cents = 1999}},
  })
end

-- What each event causes. The payment provider fails on its first try.
local payment_tries = {}
local handlers = {
  ["order.placed"] = function(e)
    return {{type = "stock.reserved", payload = {sku = e.payload.sku, qty = e.payload.qty}}}
  end,
  ["stock.reserved"] = function(e)
    payment_tries[e.session] = (payment_tries[e.session] or 0) + 1
    if payment_tries[e.session] == 1 then error("payment gateway timed out") end
    return {{type = "payment.captured", payload = {amount_cents = 1999 * e.payload.qty}}}
  end,
  ["payment.captured"] = function() return {{type = "order.shipped"}} end,
}

-- The worker loop: claim what is ready, run its handler, complete or fail.
local handled, failed = 0, 0
while true do
  local events = store:claim_next{holder = "demo-worker", ttl_ms = 30000, limit = 10}
  if #events == 0 then break end
  for _, e in ipairs(events) do
    local fn = handlers[e.type]
    local ok, result = pcall(fn or function() return {} end, e)
    if ok then
      store:complete(e.session, e.index, e.attempt, result or {})
      handled = handled + 1
    else
      store:fail(e.session, e.index, e.attempt, {error = tostring(result), max_failures = 3})
      failed = failed + 1
      print(string.format("  %s #%d %s failed (attempt %d): %s", e.session, e.index, e.type,
        e.attempt, result))
    end
  end
end

for i = 1, 3 do
  local session = "order-" .. i
  local line = {}
  for _, e in ipairs(store:read(session)) do line[#line + 1] = e.type end
  print(session .. ": " .. table.concat(line, " -> "))
end
print(string.format("handled %d, failed %d (and retried); every order shipped; log in %s",
  handled, failed, path))
