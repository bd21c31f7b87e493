-- spec/support/sqlite_worker.lua: one of the worker processes of
-- spec/21-sqlite_multiprocess_spec.lua.
--
--   lua5.4 spec/support/sqlite_worker.lua DB HOLDER TTL_MS SLOW_EVERY
--
-- DB: a SQLite file, or a postgres:// URL.
--
-- Claims ready events with claim_next and completes each with one settled
-- "done" event, until nothing is pending. Every SLOW_EVERY-th claimed event
-- (0: never) is held past its TTL before completing, so the other process
-- may re-take it and this completion must come back superseded. The result
-- of an event whose payload has a `pad` carries a 600-byte `pad` too (a
-- long payload written by this process).
-- Prints one line per completion that came back "completed":
--   "completed SESSION INDEX ATTEMPT"
-- and at the end "superseded N" and "done".
local eventstore = require("eventstore")

local db, holder = arg[1], arg[2]
local ttl = math.tointeger(tonumber(arg[3])) or 30000
local slow_every = math.tointeger(tonumber(arg[4])) or 0
assert(db and holder, "usage: sqlite_worker.lua DB HOLDER TTL_MS SLOW_EVERY")

-- sync=normal: the locking between processes is the same as with the
-- default sync=full, and the spec's wall time does not depend on fsync speed.
-- A postgres:// URL (the same spec on PostgreSQL) is used as given.
local url = db:match("^postgres") and db or "sqlite:" .. db .. "?sync=normal"
local store = eventstore.open(url)
local out = io.stdout
local superseded, seen = 0, 0
local idle = 0

-- A sleep without a child process: wait for events after a position that
-- cannot exist yet, up to ms milliseconds.
local function sleep_ms(ms)
  store:wait(nil, math.maxinteger, ms)
end

while true do
  local events, retry_at = store:claim_next({ holder = holder, ttl_ms = ttl, limit = 5 })
  if #events == 0 then
    if retry_at == nil then break end -- nothing pending anywhere: all processed
    idle = idle + 1
    sleep_ms(5)
  end
  for _, e in ipairs(events) do
    seen = seen + 1
    if slow_every > 0 and seen % slow_every == 0 then sleep_ms(ttl + 50) end
    local pad = e.payload.pad and ("r"):rep(600) or nil
    local res = store:complete(e.session, e.index, e.attempt,
      { { type = "done", settled = true, payload = { by = holder, attempt = e.attempt, pad = pad } } })
    if res.outcome == "completed" then
      out:write(("completed %s %d %d\n"):format(e.session, e.index, e.attempt))
    else
      assert(res.outcome == "superseded", "unexpected outcome " .. tostring(res.outcome))
      superseded = superseded + 1
    end
  end
end
out:write(("superseded %d\nidle %d\ndone\n"):format(superseded, idle))
store:close()
