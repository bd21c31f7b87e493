-- order.placed: a customer placed an order {customer, card, items = {{sku, qty}}}.
-- Prices come from our own catalog, never from the client. A known order is
-- accepted (priced), its stock reserved, and a payment requested, with a
-- reminder timer for a payment that never comes (payment.captured and
-- payment.declined cancel it); the four events are appended together,
-- exactly once, when this handler completes.
local REMIND_AFTER_MS = 24 * 3600 * 1000 -- a day; every demo payment is answered first

local CATALOG = { -- sku -> price in cents
  ["TEA-01"] = 850,  -- loose-leaf tea, 100 g
  ["MUG-02"] = 1200, -- stoneware mug
  ["POT-03"] = 3400, -- cast-iron teapot
}

return function(event, ctx)
  local order = event.payload
  local lines, total = {}, 0
  for _, item in ipairs(order.items) do
    local price = CATALOG[item.sku]
    if price == nil or math.type(item.qty) ~= "integer" or item.qty < 1 then
      -- Bad input is an outcome, not an error: retrying would not fix it.
      return { { type = "order.rejected", payload = { reason = "invalid item " .. tostring(item.sku) } } }
    end
    lines[#lines + 1] = { sku = item.sku, qty = item.qty, price_cents = price }
    total = total + price * item.qty
  end
  ctx.log(("accepted: %d line(s), %d cents"):format(#lines, total))
  local reserve = {}
  for i, line in ipairs(lines) do reserve[i] = { sku = line.sku, qty = line.qty } end
  return {
    { type = "order.accepted", payload = { lines = lines, total_cents = total } },
    { type = "stock.reserved", payload = { items = reserve } },
    { type = "payment.requested", payload = { card = order.card } },
    { type = "payment.reminder", payload = { customer = order.customer }, delay_ms = REMIND_AFTER_MS },
  }
end
