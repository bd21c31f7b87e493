-- payment.reminder: a timer order.placed sets; it fires only if no payment
-- answer came first (payment.captured and payment.declined cancel it with
-- ctx.cancel). Still unpaid: remind the customer.
return function(event, ctx)
  local order = ctx.state("order")
  if order.status ~= "accepted" then return nil end
  return { { type = "customer.reminded", payload = { customer = event.payload.customer } } }
end
