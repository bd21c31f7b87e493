-- Keyed: each customer's open orders (placed, not yet shipped or
-- cancelled) and what they are worth. One state per customer.

-- Shipped or cancelled: the order is no longer open.
local function closed(s, e)
  local total = s.orders[e.session]
  if total then
    s.open, s.value, s.orders[e.session] = s.open - 1, s.value - total, nil
  end
end

return {
  init = function(customer) return { open = 0, value = 0, orders = {} } end,
  key = function(event) return event.payload.customer end,
  sessions = "order-",
  ["order.placed"] = function(s, e)
    s.open = s.open + 1
    s.value = s.value + e.payload.total
    s.orders[e.session] = e.payload.total
  end,
  ["order.shipped"] = closed,
  ["order.cancelled"] = closed,
}
