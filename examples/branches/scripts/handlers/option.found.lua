-- option.found: the agent weighs the option against what the user asked
-- for (from the transcript reducer), tells the user, and records a score:
-- 100, minus 50 over budget, minus 40 arriving late, minus a point per 10
-- minutes on the road.
local function minutes(hhmm)
  local h, m = hhmm:match("^(%d+):(%d+)$")
  return tonumber(h) * 60 + tonumber(m)
end

return function(event, ctx)
  local o = event.payload
  local want = ctx.state("transcript").constraints
  local score, notes = 100, {}
  if o.price_eur > want.budget_eur then
    score = score - 50
    notes[#notes + 1] = ("over budget by %d EUR"):format(o.price_eur - want.budget_eur)
  else
    notes[#notes + 1] = "within budget"
  end
  if minutes(o.arrives) > minutes(want.arrive_by) then
    score = score - 40
    notes[#notes + 1] = "arrives late"
  else
    notes[#notes + 1] = "arrives " .. o.arrives
  end
  local travel = minutes(o.arrives) - minutes(o.departs)
  score = score - travel // 10
  notes[#notes + 1] = ("%d min on the road"):format(travel)
  local verdict = table.concat(notes, ", ")
  return {
    { type = "assistant.message", payload = {
      text = ("%s %s at %s, arrives %s, %d EUR: %s."):format(o.mode:gsub("^%l", string.upper), o.service,
        o.departs, o.arrives, o.price_eur, verdict) } },
    { type = "outcome.scored", payload = { score = score, verdict = verdict } },
  }
end
