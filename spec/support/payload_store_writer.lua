-- Writes a small store with short and long payloads (a long one is over
-- the 512 bytes that schema version 13 keeps apart from the row) in every
-- dispatch state, on a manual clock with counter ids, so that two runs
-- write the same rows. Used once with the build of commit 84609a3 (SQLite
-- schema version 12, where every payload was in its row) to make
-- spec/fixtures/sqlite_schema_v12.sql:
--   lua5.4 spec/support/payload_store_writer.lua sqlite:FILE
local eventstore = require("eventstore")
local T = 1700000000000
local n = 0
local store = eventstore.open(arg[1], {
  clock = eventstore.manual_clock(T),
  ids = function()
    n = n + 1
    return ("ev-%d"):format(n)
  end,
})
local function long(tag, bytes) return { tag = tag, text = string.rep(tag:sub(1, 1), bytes) } end
-- orders 1 short, 2 long (600 B), 3 long (5,000 B), 4 long and settled
store:append("orders", {
  { type = "order", payload = { n = 1 } },
  { type = "order", payload = long("medium", 600) },
  { type = "order", payload = long("large", 5000) },
  { type = "note", payload = long("history", 2000), settled = true },
})
-- orders 1 and 2 claimed until T + 60 s; 1 completed, 2 left claimed
local got = store:claim("orders", { holder = "w", ttl_ms = 60000, limit = 2 })
assert(got.outcome == "claimed" and #got.events == 2)
store:complete("orders", 1, got.events[1].attempt)
-- a dead letter with a long payload
store:append("dead", { { type = "job", payload = long("dead", 1500) } })
local d = store:claim("dead", { holder = "w", ttl_ms = 60000 }).events[1]
assert(store:fail("dead", 1, d.attempt, { error = "gave up", max_failures = 1 }).outcome == "dead_lettered")
store:close()
