-- payment.declined: give the reserved stock back and cancel the order.
return function(event, ctx)
  local order = ctx.state("order")
  if order.reminder then ctx.cancel(order.reminder, "order cancelled") end
  local items = {}
  for i, line in ipairs(order.lines) do items[i] = { sku = line.sku, qty = line.qty } end
  return {
    { type = "stock.released", payload = { items = items } },
    { type = "order.cancelled", payload = { reason = event.payload.reason } },
  }
end
