-- plan.chosen: a branch of the conversation commits to one strategy
-- (payload.strategy) and the agent "calls a tool": a fixed timetable, so
-- the example prints the same thing every run.
local TIMETABLE = {
  train = { mode = "train", service = "Alfa Pendular 121", departs = "10:09", arrives = "12:58", price_eur = 72 },
  bus = { mode = "bus", service = "Rede Expressos 3010", departs = "08:30", arrives = "12:10", price_eur = 22 },
}

return function(event, ctx)
  local option = TIMETABLE[event.payload.strategy]
  if not option then error("unknown strategy " .. tostring(event.payload.strategy), 0) end
  ctx.log(("%s: %s %s -> %s, %d EUR"):format(event.payload.strategy, option.service, option.departs,
    option.arrives, option.price_eur))
  return { { type = "option.found", payload = option } }
end
