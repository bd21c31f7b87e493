-- examples/embedded/teller.lua DB_PATH SESSION: another process writing to
-- the same SQLite file: a teller booking a cash deposit. host.lua starts it
-- in the background and sees its event arrive through store:stream.
local eventstore = require("eventstore")
local path, session = arg[1], arg[2]
local store <close> = eventstore.open("sqlite:" .. path)
store:append(session, { { type = "deposited", payload = { amount = 5000, by = "teller" }, settled = true } })
