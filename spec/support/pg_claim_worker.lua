-- spec/support/pg_claim_worker.lua: one of the claiming processes of
-- spec/31-postgres_spec.lua ("claims in parallel").
--
--   lua5.4 spec/support/pg_claim_worker.lua URL HOLDER GO_FILE
--
-- Waits until GO_FILE exists (so every worker starts at once), then claims
-- with claim_next (limits 1 to 4, a long TTL: no claim expires) and
-- completes each claimed event with one settled "done" event, until a
-- claim_next finds nothing ready. Prints one line per claim:
--   "claimed SESSION INDEX ATTEMPT OUTCOME"
-- and "done" at the end.
local eventstore = require("eventstore")

local url, holder, go = arg[1], arg[2], arg[3]
assert(url and holder and go, "usage: pg_claim_worker.lua URL HOLDER GO_FILE")
local store = eventstore.open(url)
local out = io.stdout

-- A sleep without a child process: a wait for a position that cannot exist.
local function sleep_ms(ms) store:wait(nil, math.maxinteger, ms) end

for _ = 1, 1000 do
  local f = io.open(go, "r")
  if f then
    f:close()
    break
  end
  sleep_ms(10)
end

local round = 0
while true do
  round = round + 1
  local events = store:claim_next({ holder = holder, ttl_ms = 600000, limit = 1 + round % 4 })
  if #events == 0 then break end
  for _, e in ipairs(events) do
    local res = store:complete(e.session, e.index, e.attempt,
      { { type = "done", settled = true, payload = { by = holder } } })
    out:write(("claimed %s %d %d %s\n"):format(e.session, e.index, e.attempt, res.outcome))
  end
end
out:write("done\n")
store:close()
