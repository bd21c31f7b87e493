-- bench/wait_latency.lua: how soon store:wait in one process sees an append
-- made by another process (docs/sqlite.md "Several processes" promises
-- about 100 ms). A figure, not a test: spec/21 checks only that the wait
-- wakes (a load-sensitive latency cannot be a pass/fail assertion).
--
--   lua5.4 bench/wait_latency.lua DIR [ROUNDS]
local eventstore = require("eventstore")

local dir, rounds = assert(arg[1], "usage: wait_latency.lua DIR [ROUNDS]"), math.tointeger(tonumber(arg[2] or "")) or 9
local LUA = os.getenv("LUA") or "lua5.4"
local db = dir .. "/wait_latency.db"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local store = eventstore.open("sqlite:" .. db)
local latencies = {}
for round = 1, rounds do
  local session = "ping-" .. round
  local p = assert(io.popen(("%s spec/support/sqlite_append_later.lua %s %s 150 2>&1"):format(LUA, q(db), session), "r"))
  local got = store:wait(session, 0, 60000)
  local seen_at = store:now() -- the clock created_at is taken from
  local out = p:read("a")
  p:close()
  assert(#got == 1, "wait returned no event: " .. out)
  latencies[#latencies + 1] = seen_at - got[1].created_at
end
store:close()
for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. suffix) end
table.sort(latencies)
print(("wait across processes (sqlite): median %d ms, worst %d ms over %d rounds (%s)"):format(
  latencies[(#latencies + 1) // 2], latencies[#latencies], #latencies, table.concat(latencies, " ")))
