-- spec/support/sqlite_archive_crash_child.lua: the victim of
-- spec/27-sqlite_archive_crash_spec.lua.
--
--   lua5.4 spec/support/sqlite_archive_crash_child.lua URL ARCHIVE ACKFILE RUN
--
-- Appends settled batches, archives them and now and then compacts the
-- segments, against the store at URL (sqlite:PATH, or shards: over SQLite
-- files) with archive directory ARCHIVE, in a loop
-- until it is killed (kill -9, at a random moment). After each call
-- RETURNS it appends one line to ACKFILE and flushes:
--   "a N SESSION SIZE"     batch N (ids bN-1..bN-SIZE) was appended
--   "r SESSION THROUGH"    SESSION is archived through THROUGH
-- RUN makes batch numbers unique across restarts (N = RUN * 100000 + k).
local eventstore = require("eventstore")

local url, dir, ackpath, run = arg[1], arg[2], arg[3], math.tointeger(tonumber(arg[4]))
assert(url and dir and ackpath and run, "usage: sqlite_archive_crash_child.lua URL ARCHIVE ACKFILE RUN")

local store = eventstore.open(url, { archive = dir })
local ack = assert(io.open(ackpath, "a"))

local function acknowledge(line)
  ack:write(line, "\n")
  ack:flush()
end

local k = 0
while true do
  k = k + 1
  local n = run * 100000 + k
  local size = (k % 5 == 0) and 100 or 7
  local session = "s" .. (n % 3)
  local batch = {}
  for j = 1, size do
    batch[j] = { id = ("b%d-%d"):format(n, j), type = "t", settled = true,
                 payload = { n = n, j = j, pad = ("x"):rep(j % 50) } }
  end
  store:append(session, batch)
  acknowledge(("a %d %s %d"):format(n, session, size))
  local head = store:head(session)
  store:archive(session, { through = head }) -- nil: nothing new (idempotent)
  acknowledge(("r %s %d"):format(session, head))
  if k % 4 == 0 then store:compact_archive(session) end
end
