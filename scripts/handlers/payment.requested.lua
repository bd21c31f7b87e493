-- payment.requested: charge the order's total through the payment gateway.
--
-- The gateway here is a stand-in that behaves like real ones do, and
-- deterministically so the demo's output is reproducible:
--   card "tok_declined"  the bank says no: an outcome (payment.declined);
--   card "tok_flaky"     the gateway times out on the first attempt: we raise,
--                        the engine records the failure and retries the event
--                        with backoff; the second attempt goes through;
--   any other card       captured.
-- A handler runs at least once per event, so a real gateway call would pass
-- event.id as its idempotency key: a retry after a lost answer cannot charge
-- twice.
return function(event, ctx)
  -- The amount comes from the order as folded so far (order.accepted), not
  -- from this event: one source of truth for the total.
  local order = ctx.state("order")
  if order.status ~= "accepted" then
    return {} -- cancelled or already paid meanwhile: nothing to charge
  end
  local card = event.payload.card
  if card == "tok_flaky" and ctx.attempt == 1 then
    error("payment gateway timed out", 0)
  end
  if card == "tok_declined" then
    return { { type = "payment.declined", payload = { reason = "card declined", attempt = ctx.attempt } } }
  end
  ctx.log(("captured %d cents on attempt %d"):format(order.total_cents, ctx.attempt))
  return { {
    type = "payment.captured",
    payload = { amount_cents = order.total_cents, attempt = ctx.attempt, charge = "ch_" .. event.id },
  } }
end
