-- store_bench.lua: the same per-call figures as store_bench.c, through the
-- Lua module (argument checking, payload encoding and decoding included).
--   lua5.4 bench/store_bench.lua [URL] [BIG]
local eventstore = require("eventstore")
local url = arg[1] or "memory:"
local big = tonumber(arg[2] or "1000000")
local durable = url:sub(1, 7) == "sqlite:"
-- Wall time in seconds: durable stores wait on fsync, which is not CPU time.
local wall = eventstore.open("memory:")
local now = function() return wall:now() / 1000 end

local payload = {customer = "c-000123", items = {{qty = 2, sku = "SKU-42"}}, note = "leave at the door"}
local seq = 0
local function fresh()
  if not durable then return eventstore.open(url) end
  seq = seq + 1
  local path = url:sub(8) .. ".lua." .. seq
  for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end
  return eventstore.open("sqlite:" .. path), path
end
local function drop(store, path)
  store:close()
  if path then for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end end
end

local function batch_of(n, settled)
  local b = {}
  for i = 1, n do b[i] = {type = "order.placed", payload = payload, settled = settled} end
  return b
end

local function fill(store, session, n, batch)
  local b = batch_of(batch, true)
  local done = 0
  while done < n do
    if n - done < batch then b = batch_of(n - done, true) end
    store:append(session, b)
    done = done + #b
  end
end

local function report(what, size, ops, secs)
  print(string.format("%-34s %8d %12.0f", what, size, ops / secs))
end

local function timed(fn) local t0 = now(); local ops = fn(); return ops, now() - t0 end

local function figures(store, size, scale, acc)
  local function add(k, ops, secs)
    acc[k] = acc[k] or {0, 0}
    acc[k][1], acc[k][2] = acc[k][1] + ops, acc[k][2] + secs
  end
  add("append (batch 1)", timed(function()
    local b = batch_of(1, true)
    for _ = 1, 100 * scale do store:append("s", b) end
    return 100 * scale
  end))
  add("append (batch 100)", timed(function()
    local b = batch_of(100, true)
    for _ = 1, 10 * scale do store:append("s", b) end
    return 1000 * scale
  end))
  add("read (100 events)", timed(function()
    for i = 1, 200 * scale do store:read("s", {after = (i * 7919) % (size - 100), limit = 100}) end
    return 200 * scale
  end))
  add("claim+complete cycle", timed(function()
    local ev = {{type = "order.paid", payload = payload}}
    local res = {{type = "order.shipped", payload = payload, settled = true}}
    for _ = 1, 100 * scale do
      store:append("s", ev)
      local got = store:claim("s", {holder = "bench", ttl_ms = 30000, limit = 1})
      local e = got.events[1]
      store:complete("s", e.index, e.attempt, res)
    end
    return 100 * scale
  end))
end

print(string.format("# store_bench.lua %s (ops/s; append counts events; cycle includes one append)", url))
local acc = {}
for _ = 1, 5 do
  local store, path = fresh()
  fill(store, "s", 1000, 100)
  figures(store, 1000, durable and 0.2 or 1, acc)
  drop(store, path)
end
local order = {"append (batch 1)", "append (batch 100)", "read (100 events)", "claim+complete cycle"}
for _, k in ipairs(order) do report(k, 1000, acc[k][1], acc[k][2]) end

local store, path = fresh()
fill(store, "s", big, 100)
acc = {}
figures(store, big, durable and 1 or 5, acc)
for _, k in ipairs(order) do report(k, big, acc[k][1], acc[k][2]) end
drop(store, path)
