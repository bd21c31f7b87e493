-- store_bench.lua: the per-call figures of store_bench.c through the Lua
-- module (argument checking, payload encoding and decoding included), on
-- sessions of 1,000 and of BIG events held in one store.
--   lua5.4 bench/store_bench.lua [URL] [BIG]
local eventstore = require("eventstore")
local url = arg[1] or "memory:"
local big = tonumber(arg[2] or "1000000")
local durable = url:sub(1, 7) == "sqlite:"

-- Wall time in seconds: durable stores wait on fsync, which is not CPU time.
local wall = eventstore.open("memory:")
local function now() return wall:now() / 1000 end

local payload = {customer = "c-000123", items = {{qty = 2, sku = "SKU-42"}}, note = "leave at the door"}
local path
if durable then
  path = url:sub(8)
  for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end
end
local store = eventstore.open(url)

local function batch_of(n)
  local b = {}
  for i = 1, n do b[i] = {type = "order.placed", payload = payload, settled = true} end
  return b
end
local b1, b100 = batch_of(1), batch_of(100)
for _ = 1, big // 100 do store:append("big", b100) end
local small = {}
for i = 1, 100 do
  small[i] = string.format("small-%03d", i)
  for _ = 1, 10 do store:append(small[i], b100) end
end
local groups = {{names = small, size = 1000}, {names = {"big"}, size = big}}

local scale = durable and 10 or 1
local ops = {
  {"append (batch 1)", 20000 // scale, function(s, i) store:append(s, b1) end, 1},
  {"append (batch 100)", 1000 // scale, function(s, i) store:append(s, b100) end, 100},
  {"read (100 events)", 5000 // scale, function(s, i, size)
    store:read(s, {after = (i * 7919) % (size - 100), limit = 100})
  end, 1},
  {"claim+complete cycle", 5000 // scale // (durable and 10 or 1), function(s)
    store:append(s, {{type = "order.paid", payload = payload}})
    local e = store:claim(s, {holder = "bench", ttl_ms = 30000, limit = 1}).events[1]
    store:complete(s, e.index, e.attempt, {{type = "order.shipped", payload = payload, settled = true}})
  end, 1},
}

print(string.format("# store_bench.lua %s ops/s on sessions of 1,000 and of %d events in one store", url, big))
print("# (append counts events; the cycle includes appending the event it claims)")
print(string.format("%-28s %12s %12s %8s", "# what", "1k session", "1M session", "ratio"))
for _, op in ipairs(ops) do
  local name, calls, fn, per = op[1], op[2], op[3], op[4]
  local spent = {0, 0}
  for _ = 1, 3 do
    for k, g in ipairs(groups) do
      local t0 = now()
      for i = 1, calls do fn(g.names[(i - 1) % #g.names + 1], i, g.size) end
      spent[k] = spent[k] + (now() - t0)
    end
  end
  local small_rate = 3 * calls * per / math.max(spent[1], 1e-3)
  local big_rate = 3 * calls * per / math.max(spent[2], 1e-3)
  print(string.format("%-28s %12.0f %12.0f %8.2f", name, small_rate, big_rate, small_rate / big_rate))
end
store:close()
if path then for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end end
