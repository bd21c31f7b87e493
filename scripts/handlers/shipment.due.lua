-- shipment.due: the pick-and-pack timer fired. Ship only an order that is
-- still paid (it could have been cancelled while the timer ran).
return function(event, ctx)
  local order = ctx.state("order")
  if order.status ~= "paid" then
    ctx.log("not shipping an order in status " .. tostring(order.status))
    return {}
  end
  -- The tracking number is derived from the session, so a retried attempt
  -- produces the same one.
  local tracking = "TRK-" .. ctx.session:upper()
  return { { type = "order.shipped", payload = { carrier = event.payload.carrier, tracking = tracking } } }
end
