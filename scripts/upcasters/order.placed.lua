-- order.placed, revision 1 -> 2 (docs/upcasting.md).
--
-- The first release took one line per order, flat in the payload:
--   revision 1: {customer, card, sku, qty}
-- Orders grew baskets:
--   revision 2: {customer, card, items = {{sku, qty}, ...}}
-- Stored events keep the bytes they were written with; the engine hands the
-- handler and the reducers every old order as a revision-2 one, so neither
-- has to know the first shape ever existed. Events the engine writes
-- (engine:append, the binary's `append --scripts`) are stored as revision 2.
--
-- A writer that leaves the engine out (a plain `eventstore append`, an HTTP
-- append) and gives no revision stores revision 1 whatever the shape, so
-- the step leaves a payload that already has `items` as it is.
return {
  current = 2,
  [1] = function(p)
    if p.items ~= nil then return p end
    return { customer = p.customer, card = p.card, items = { { sku = p.sku, qty = p.qty } } }
  end,
}
