-- spec/support/sqlite_append_later.lua: appends one event to SESSION of
-- sqlite:DB after DELAY_MS (used by spec/21-sqlite_multiprocess_spec.lua to
-- time another process's store:wait).
--
--   lua5.4 spec/support/sqlite_append_later.lua DB SESSION DELAY_MS
local eventstore = require("eventstore")

local db, session, delay = arg[1], arg[2], math.tointeger(tonumber(arg[3])) or 200
local store = eventstore.open(db:match("^postgres") and db or "sqlite:" .. db) -- or a postgres:// URL
store:wait(nil, math.maxinteger, delay) -- sleeps delay ms (nothing can come after maxinteger)
store:append(session, { { type = "ping" } })
store:close()
