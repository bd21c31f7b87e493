-- payment.captured: paid orders go to the warehouse. Picking and packing
-- takes a while, so instead of blocking a worker we set a timer: the
-- shipment.due event is appended now but not handled before delay_ms has
-- passed (its not_before). Real shops wait hours; the demo waits 300 ms.
local PICK_AND_PACK_MS = 300

return function(event, ctx)
  -- Paid: the reminder timer order.placed set must never fire. The cancel
  -- is applied with this handler's completion, in the same step.
  local order = ctx.state("order")
  if order.reminder then ctx.cancel(order.reminder, "paid") end
  return { { type = "shipment.due", payload = { carrier = "tortoise-post" }, delay_ms = PICK_AND_PACK_MS } }
end
