-- desk: every ticket of one support desk (the session), folded from its
-- events. `replied` lists the message numbers in the order their replies
-- were written, i.e. the order the handler completed them: with a lane per
-- ticket it must be 1, 2, 3, ...
return {
  init = function() return { tickets = {}, open = 0 } end,
  ["ticket.opened"] = function(s, e)
    local p = e.payload
    s.tickets[p.ticket] = { customer = p.customer, agent = p.agent, subject = p.subject,
      status = "open", received = 0, replied = {} }
    s.open = s.open + 1
  end,
  ["message.received"] = function(s, e)
    local t = s.tickets[e.payload.ticket]
    if t then t.received = t.received + 1 end
  end,
  ["reply.sent"] = function(s, e)
    local t = s.tickets[e.payload.ticket]
    if t then t.replied[#t.replied + 1] = e.payload.seq end
  end,
  ["ticket.closed"] = function(s, e)
    local t = s.tickets[e.payload.ticket]
    if t and t.status ~= "closed" then
      t.status = "closed"
      s.open = s.open - 1
    end
  end,
}
