-- http_lua_api.lua: the Lua API side of bench/http_bench.sh (bench/README.md,
-- "HTTP (issue 13)"): the operations the HTTP bench sends, through
-- require("eventstore") in one thread, on a fresh store of the same kind
-- (the same URL form the server opens), each for about SECONDS seconds:
--
--   append1    store:append of 1 event with an id (as every HTTP append
--              carries), sessions rotating over 64
--   append100  store:append of 100 such events
--   read100    store:read(session, {after = R, limit = 100}) of a session
--              of 1,000 events, R random in 0..900
--   head       store:head(session)
--
--   lua5.4 bench/http_lua_api.lua URL [SECONDS]
--
-- Prints one line per operation: "LUA <op> <calls> <calls/s> <p50_ms>
-- <p99_ms>" (events/s = calls/s x the batch).
local eventstore = require("eventstore")

local url = assert(arg[1], "usage: lua5.4 bench/http_lua_api.lua URL [SECONDS]")
local seconds = tonumber(arg[2] or "5")
local store = eventstore.open(url)

-- Wall clock in ms, to the microsecond (LuaSocket's gettime; lua-socket is
-- in make deps): sqlite: appends wait on fsync, which CPU time misses.
local gettime = require("socket").gettime
local function now_ms() return gettime() * 1000 end

local payload = { customer = "c-000123", items = { { qty = 2, sku = "SKU-42" } }, note = "leave at the door" }

-- Runs fn(i) for `seconds`; returns calls, calls/s and the latency
-- percentiles of the calls (ms).
local function timed(fn)
  local lat, n = {}, 0
  local t0 = now_ms()
  local stop = t0 + seconds * 1000
  local t = t0
  while t < stop do
    n = n + 1
    fn(n)
    local t2 = now_ms()
    lat[n] = t2 - t
    t = t2
  end
  table.sort(lat)
  local function pct(p) return lat[math.max(1, math.ceil(#lat * p / 100))] end
  return n, n / ((t - t0) / 1000), pct(50), pct(99)
end

local function report(op, n, rate, p50, p99)
  print(("LUA %s %d %.1f %.3f %.3f"):format(op, n, rate, p50, p99))
end

local function batch_of(size, tag, n)
  local b = {}
  for i = 1, size do
    b[i] = { type = "order.placed", id = ("%s-%d-%d"):format(tag, n, i), payload = payload }
  end
  return b
end

report("append1", timed(function(n)
  store:append("lua1-" .. n % 64, batch_of(1, "a1", n))
end))
report("append100", timed(function(n)
  store:append("lua100-" .. n % 64, batch_of(100, "a100", n))
end))

for i = 1, 10 do store:append("read-1000", batch_of(100, "fill", i)) end
assert(store:head("read-1000") == 1000)
math.randomseed(42)
report("read100", timed(function()
  local page = store:read("read-1000", { after = math.random(0, 900), limit = 100 })
  assert(#page == 100)
end))
report("head", timed(function()
  store:head("read-1000")
end))
store:close()
