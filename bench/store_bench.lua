-- store_bench.lua: the per-call figures of store_bench.c through the Lua
-- module (argument checking, payload encoding and decoding included), on
-- sessions of 1,000 and of BIG events held in one store; then store:fork
-- of a 100,000-event session beside copying it the way a user would
-- without fork (read it, append its events in batches of 1,000).
--   lua5.4 bench/store_bench.lua [URL] [BIG] [fork]    ("fork": only the fork figures)
local eventstore = require("eventstore")
local url = arg[1] or "memory:"
local big = tonumber(arg[2] or "1000000")
local only_fork = arg[3] == "fork"
local durable = url:sub(1, 7) == "sqlite:"

-- Wall time in seconds: durable stores wait on fsync, which is not CPU time.
local wall = eventstore.open("memory:")
local function now() return wall:now() / 1000 end

local payload = {customer = "c-000123", items = {{qty = 2, sku = "SKU-42"}}, note = "leave at the door"}

local function remove_db(p) for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(p .. s) end end

-- Fork vs copying by hand. Each round opens a fresh store (sqlite: a new
-- file next to URL's) and fills "src" with FORK_EVENTS settled events (not
-- timed); then times, in an order that rotates from round to round:
--   append: FORK_EVENTS prebuilt events in batches of 1,000 into a new session
--   read+append: store:read "src" 1,000 at a time and append each page
--     (type, payload, lane; settled) into a new session: a copy without fork
--   fork: store:fork("src", FORK_EVENTS, new session)
local FORK_EVENTS, FORK_BATCH, FORK_ROUNDS = 100000, 1000, 3
local function bench_fork()
  local batch = {}
  for i = 1, FORK_BATCH do batch[i] = {type = "order.placed", payload = payload, settled = true} end
  local ways = {
    {"append (batch 1000)", function(s, to)
      for _ = 1, FORK_EVENTS // FORK_BATCH do s:append(to, batch) end
    end},
    {"read+append (batch 1000)", function(s, to)
      local after = 0
      while after < FORK_EVENTS do
        local page = s:read("src", {after = after, limit = FORK_BATCH})
        local copy = {}
        for i, e in ipairs(page) do copy[i] = {type = e.type, payload = e.payload, lane = e.lane, settled = true} end
        s:append(to, copy)
        after = page[#page].index
      end
    end},
    {"fork", function(s, to) s:fork("src", FORK_EVENTS, to) end},
  }
  local spent = {}
  for round = 1, FORK_ROUNDS do
    local u = url
    if durable then
      u = url .. "." .. round
      remove_db(u:sub(8))
    end
    local s = eventstore.open(u)
    for _ = 1, FORK_EVENTS // FORK_BATCH do s:append("src", batch) end
    for k = 0, #ways - 1 do
      local w = (round + k - 1) % #ways + 1
      local to = "copy-" .. w
      local t0 = now()
      ways[w][2](s, to)
      spent[w] = (spent[w] or 0) + (now() - t0)
      assert(s:head(to) == FORK_EVENTS, to)
    end
    s:close()
    if durable then remove_db(u:sub(8)) end
  end
  local fork_s = spent[#ways]
  print(string.format("# store_bench.lua %s fork: copying a %d-event session, %d rounds, a fresh store each",
    url, FORK_EVENTS, FORK_ROUNDS))
  print("# (fork x: this row's time / the fork's time, i.e. how many times faster the fork is)")
  print(string.format("%-28s %12s %12s %8s", "# what", "events/s", "ms per copy", "fork x"))
  for w, way in ipairs(ways) do
    local line = string.format("%-28s %12.0f %12.1f", way[1], FORK_EVENTS * FORK_ROUNDS / spent[w],
      spent[w] * 1000 / FORK_ROUNDS)
    if w < #ways then line = line .. string.format(" %8.2f", spent[w] / fork_s) end
    print(line)
  end
end

if only_fork then
  bench_fork()
  os.exit(0)
end
local path
if durable then
  path = url:sub(8)
  remove_db(path)
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
if path then remove_db(path) end
bench_fork()
