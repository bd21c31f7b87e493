-- Global (no key function: one state, key ""): revenue per day from the
-- orders that shipped.
return {
  sessions = "order-",
  ["order.shipped"] = function(s, e)
    s[e.payload.day] = (s[e.payload.day] or 0) + e.payload.total
  end,
}
