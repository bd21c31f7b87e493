-- message.received: a customer wrote on a ticket
-- {ticket, seq, from, text, attachment = {name, corrupt?}}.
--
-- Every message is appended with lane = its ticket id, so the engine gives
-- one ticket's messages to the workers strictly one after another, in index
-- order, while other tickets are handled in parallel. A message that keeps
-- failing is dead-lettered and blocks only its own ticket.
--
-- The desk's first-line bot answers each message in the assigned agent's
-- name and closes the ticket when the customer says thanks.
return function(event, ctx)
  local m = event.payload
  local ticket = ctx.state("desk").tickets[m.ticket]
  if ticket == nil then
    error("message for unknown ticket " .. tostring(m.ticket), 0) -- retried: the ticket may be late
  end
  if m.attachment and m.attachment.corrupt then
    -- A bug or bad input the bot cannot get past: retries will not help,
    -- so after max_failures it becomes a dead letter for a human.
    error("cannot read attachment " .. m.attachment.name, 0)
  end

  local text
  local thanks = m.text:lower():find("thank") ~= nil
  if thanks then
    text = "glad we could help, closing " .. m.ticket
  elseif m.text:lower():find("refund") then
    text = ticket.agent .. " will refund you today"
  elseif m.attachment then
    text = "thanks for " .. m.attachment.name .. ", " .. ticket.agent .. " is on it"
  else
    text = ticket.agent .. " is looking into it"
  end
  ctx.log(("%s #%d -> %s"):format(m.ticket, m.seq, text))

  local out = { { type = "reply.sent", payload = { ticket = m.ticket, seq = m.seq, agent = ticket.agent, text = text } } }
  if thanks then out[2] = { type = "ticket.closed", payload = { ticket = m.ticket } } end
  return out
end
