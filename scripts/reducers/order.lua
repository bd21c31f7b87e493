-- order: one order's current view, folded from its session's events.
-- Event types without a step here (stock.*, shipment.due, payment.requested)
-- are skipped.
return {
  init = function()
    return { status = "new", lines = {}, total_cents = 0, paid_cents = 0, payment_attempts = 0 }
  end,
  ["order.placed"] = function(s, e)
    s.status, s.customer = "placed", e.payload.customer
  end,
  ["order.accepted"] = function(s, e)
    s.status, s.lines, s.total_cents = "accepted", e.payload.lines, e.payload.total_cents
  end,
  ["order.rejected"] = function(s, e)
    s.status, s.reason = "rejected", e.payload.reason
  end,
  -- The payment handler writes which attempt got an answer: failed attempts
  -- leave no event, only the dispatch record (attempts, failures, last_error).
  ["payment.captured"] = function(s, e)
    s.status, s.paid_cents, s.payment_attempts = "paid", e.payload.amount_cents, e.payload.attempt
  end,
  ["payment.declined"] = function(s, e)
    s.status, s.payment_attempts = "payment_declined", e.payload.attempt
  end,
  -- where the reminder timer is, for the handler that cancels it
  ["payment.reminder"] = function(s, e)
    s.reminder = e.index
  end,
  ["order.cancelled"] = function(s, e)
    s.status, s.reason = "cancelled", e.payload.reason
  end,
  ["order.shipped"] = function(s, e)
    s.status, s.tracking = "shipped", e.payload.tracking
  end,
}
