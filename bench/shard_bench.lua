-- shard_bench.lua: how fast set_plan moves sessions (docs/sharding.md)
-- while another process keeps appending through its own sharded handle.
-- SESSIONS sessions of EVENTS events on 2 SQLite shards; a child process
-- appends one event at a time to random sessions (it opened the catalog
-- before the move, so it holds the old plan and follows the markers);
-- then set_plan adds 2 shards (about half the sessions move). Prints the
-- sessions and events moved per second, and the child's appends per
-- second before and during the move.
--   lua5.4 bench/shard_bench.lua DIR [SESSIONS] [EVENTS]
local eventstore = require("eventstore")
local dir = assert(arg[1], "usage: lua5.4 bench/shard_bench.lua DIR [SESSIONS] [EVENTS]")
local SESSIONS = tonumber(arg[2] or "2000")
local EVENTS = tonumber(arg[3] or "10")
local LUA = os.getenv("LUA") or "lua5.4"

local wall = eventstore.open("memory:")
local function now() return wall:now() / 1000 end
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function url(name) return "sqlite:" .. dir .. "/shard_bench_" .. name .. ".db" end

local shards = { a = url("a"), b = url("b") }
local catalog = url("catalog")
local s = eventstore.open("shards:", { catalog = catalog, plan = { version = 1, shards = shards } })
local payload = { customer = "c-000123", items = { { qty = 2, sku = "SKU-42" } } }
for i = 1, SESSIONS do
  local batch = {}
  for j = 1, EVENTS do batch[j] = { type = "t", payload = payload, settled = j % 2 == 0 } end
  s:append("bench-" .. i, batch)
end

local child, acks, stop = dir .. "/shard_bench_child.lua", dir .. "/shard_bench.acks", dir .. "/shard_bench.stop"
local f = assert(io.open(child, "w"))
f:write([[
  local eventstore = require("eventstore")
  local s = eventstore.open("shards:" .. arg[1])
  local out = assert(io.open(arg[2], "w"))
  local n, sessions = 0, tonumber(arg[4])
  local clock = eventstore.open("memory:")
  while true do
    local st = io.open(arg[3], "r")
    if st then st:close() break end
    n = n + 1
    s:append("bench-" .. (n * 7919 % sessions + 1), {{type = "live", payload = n}})
    out:write(clock:now(), "\n")
    out:flush()
  end
  out:close()
]])
f:close()
os.remove(stop)
os.execute(("LUA_PATH=%s LUA_CPATH=%s %s %s %s %s %s %d &"):format(q(package.path), q(package.cpath), LUA,
  q(child), q(catalog), q(acks), q(stop), SESSIONS))

local function ack_times()
  local t = {}
  local h = io.open(acks, "r")
  if not h then return t end
  for l in h:lines() do t[#t + 1] = tonumber(l) end
  h:close()
  return t
end
repeat os.execute("sleep 0.2") until #ack_times() > 50
os.execute("sleep 2")

local t0 = now()
local grown = { a = shards.a, b = shards.b, c = url("c"), d = url("d") }
local moved = s:set_plan({ version = 2, shards = grown }).moved
local t1 = now()
os.execute("sleep 1")
io.open(stop, "w"):close()
os.execute("sleep 0.5")

local times = ack_times()
local before, during, first = 0, 0, nil
for _, ms in ipairs(times) do
  first = first or ms
  if ms < t0 * 1000 then before = before + 1
  elseif ms <= t1 * 1000 then during = during + 1 end
end
local secs = t1 - t0
print(("shard move: %d sessions of %d events on sqlite:, 2 -> 4 shards, another process appending"):format(SESSIONS, EVENTS))
print(("  moved %d sessions in %.2f s: %.0f sessions/s, %.0f events/s"):format(moved, secs, moved / secs,
  moved * EVENTS / secs))
print(("  the other process's appends/s: %.0f before the move, %.0f during it"):format(
  before / math.max(t0 - first / 1000, 0.001), during / secs))
s:close()
for _, n in ipairs({ "a", "b", "c", "d", "catalog" }) do
  for _, sfx in ipairs({ ".db", ".db-wal", ".db-shm" }) do os.remove(dir .. "/shard_bench_" .. n .. sfx) end
end
os.remove(child)
os.remove(acks)
os.remove(stop)
