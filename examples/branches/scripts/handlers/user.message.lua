-- user.message: the agent answers what the user wrote. A stand-in for a
-- model call, deterministic: it reacts to what the payload asks for.
return function(event, ctx)
  local p = event.payload
  if p.budget_eur then
    return { { type = "assistant.message", payload = {
      text = ("Trains or buses both go there. I'll price both against %d EUR and %s.")
        :format(p.budget_eur, p.arrive_by) } } }
  end
  local s = ctx.state("transcript")
  if p.text:lower():find("book") and s.option then
    local ref = ("%s-%s"):format(s.option.mode:upper(), s.option.departs:gsub(":", ""))
    return {
      { type = "trip.booked", payload = { ref = ref } },
      { type = "assistant.message", payload = {
        text = ("Booked: %s %s, %s -> %s, %d EUR (booking %s)."):format(s.option.mode, s.option.service,
          s.option.departs, s.option.arrives, s.option.price_eur, ref) } },
    }
  end
  return { { type = "assistant.message", payload = { text = "Could you tell me more?" } } }
end
