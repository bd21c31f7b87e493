-- spec/support/sqlite_crash_child.lua: the victim of spec/20-sqlite_crash_spec.lua.
--
--   lua5.4 spec/support/sqlite_crash_child.lua DB ACKFILE RUN
--
-- Appends batches and completes ready events against sqlite:DB in a loop
-- until it is killed (kill -9, at a random moment). After each call RETURNS
-- it appends one line to ACKFILE and flushes, so ACKFILE only ever names
-- what the store acknowledged:
--   "a N SESSION SIZE"                 batch N (ids bN-1..bN-SIZE) was appended
--   "c SESSION INDEX ATTEMPT RESULTID" attempt ATTEMPT of SESSION/INDEX completed,
--                                      appending the settled event RESULTID
-- RUN makes batch numbers unique across restarts (N = RUN * 100000 + k).
local eventstore = require("eventstore")

local db, ackpath, run = arg[1], arg[2], math.tointeger(tonumber(arg[3]))
assert(db and ackpath and run, "usage: sqlite_crash_child.lua DB ACKFILE RUN")

local store = eventstore.open("sqlite:" .. db)
local ack = assert(io.open(ackpath, "a"))

local function acknowledge(line)
  ack:write(line, "\n")
  ack:flush()
end

local k = 0
while true do
  k = k + 1
  local n = run * 100000 + k
  -- mostly batches of 3; every 7th a bigger one, so a kill more often lands
  -- inside a large transaction
  local size = (k % 7 == 0) and 40 or 3
  local session = "s" .. (n % 5)
  local batch = {}
  for j = 1, size do
    batch[j] = { id = ("b%d-%d"):format(n, j), type = "work", payload = { n = n, j = j, size = size } }
  end
  store:append(session, batch)
  acknowledge(("a %d %s %d"):format(n, session, size))

  -- short claims: a claim left behind by a killed run expires quickly and
  -- the next run takes the event again (a new attempt)
  local events = store:claim_next({ holder = "crash-" .. run, ttl_ms = 150, limit = 3 })
  for _, e in ipairs(events) do
    local rid = ("r-%s-%d"):format(e.id, e.attempt)
    local res = store:complete(e.session, e.index, e.attempt,
      { { id = rid, type = "done", settled = true, payload = { of = e.id } } })
    if res.outcome == "completed" then
      acknowledge(("c %s %d %d %s"):format(e.session, e.index, e.attempt, rid))
    end
  end
end
