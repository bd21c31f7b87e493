-- transcript: one conversation (the session), folded from its events: the
-- messages in order, what the user asked for (budget, arrival time), the
-- option the agent found and how well it fits.
return {
  init = function() return { messages = {}, constraints = {} } end,
  ["user.message"] = function(s, e)
    local p = e.payload
    s.messages[#s.messages + 1] = { role = "user", text = p.text }
    if p.budget_eur then s.constraints.budget_eur = p.budget_eur end
    if p.arrive_by then s.constraints.arrive_by = p.arrive_by end
  end,
  ["assistant.message"] = function(s, e)
    s.messages[#s.messages + 1] = { role = "assistant", text = e.payload.text }
  end,
  ["plan.chosen"] = function(s, e) s.strategy = e.payload.strategy end,
  ["option.found"] = function(s, e) s.option = e.payload end,
  ["outcome.scored"] = function(s, e)
    s.score, s.verdict = e.payload.score, e.payload.verdict
  end,
  ["trip.booked"] = function(s, e) s.booked = e.payload.ref end,
}
