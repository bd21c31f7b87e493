-- Writes a small store with live claims, a timer and a backoff on a manual
-- clock with counter ids, so that two runs write the same rows. Used once
-- with the build of commit 10ccffd (SQLite schema version 10, where a claim
-- rewrote due_at) to make spec/fixtures/sqlite_schema_v10.sql:
--   lua5.4 spec/support/claimed_store_writer.lua sqlite:FILE
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
-- jobs 1..4 ready, 5 a timer due at T + 30 s
store:append("jobs", {
  { type = "job", payload = { n = 1 } },
  { type = "job", payload = { n = 2 } },
  { type = "job", payload = { n = 3 } },
  { type = "job", payload = { n = 4 } },
  { type = "job", payload = { n = 5 }, not_before = T + 30000 },
})
-- jobs 1 and 2 claimed until T + 60 s
local got = store:claim("jobs", { holder = "w", ttl_ms = 60000, limit = 2 })
assert(got.outcome == "claimed" and #got.events == 2)
-- mail:1 failed once, retried at T + 10 s
store:append("mail", { { type = "mail", payload = { to = "a" } } })
local m = store:claim("mail", { holder = "w", ttl_ms = 60000 }).events[1]
store:fail("mail", 1, m.attempt, { error = "smtp down", retry_after_ms = 10000 })
store:close()
