-- store_bench.lua: the per-call figures of store_bench.c through the Lua
-- module (argument checking, payload encoding and decoding included), on
-- sessions of 1,000 and of BIG events held in one store; then claimed
-- events completed one by one beside store:complete_many; then store:fork
-- of a 100,000-event session beside copying it the way a user would
-- without fork (read it, append its events in batches of 1,000).
--   lua5.4 bench/store_bench.lua [URL] [BIG] [fork]    ("fork": only the fork figures)
--   lua5.4 bench/store_bench.lua [URL] [BIG] complete  (only complete vs complete_many)
--   lua5.4 bench/store_bench.lua memory: FILL lua ...  (only the Lua path figures: below)
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

-- The Lua path (issue 12, item 3; bench/README.md, "The Lua path"):
-- store:read of 100 events and store:append of 100 events on memory:,
-- each beside same-run anchors, in ROUNDS rounds whose order rotates:
--   C API: the same calls on a store of the same shape from C, when run
--     by build/bench/lua_path_bench (which sets the global c_anchor);
--   plain-Lua tables: the same event tables (same fields, payload tables
--     with the same shape and array marks) built by Lua table constructors
--     from strings already in hand: what the tables alone cost;
--   json.decode / json.encode + json.decode of each payload: the payload
--     codec's share (core/bridge/json_lua.c).
-- CPU time of the process (os.clock): memory: does no I/O and starts no
-- thread, and CPU time leaves out the time the shared machine's other work
-- takes the processor. "Lua / this" = the Lua call's rate / this row's.
--   lua5.4 bench/store_bench.lua memory: FILL lua [ROUNDS] [CALLS] [WAY]
-- WAY (e.g. "read-lua") runs that one way only, CALLS calls, once: a fixed
-- workload for instruction counts (valgrind --tool=callgrind).
local function bench_lua_path(fill, rounds, calls, only)
  local json = eventstore.json
  local c = rawget(_G, "c_anchor")
  local s = eventstore.open("memory:")
  local b100 = {}
  for i = 1, 100 do b100[i] = {type = "order.placed", payload = payload, settled = true} end
  for _ = 1, fill // 100 do s:append("big", b100) end
  if c then c.open(fill) end
  local text = json.encode(payload)

  -- The plain-Lua anchor builds, from strings in hand, exactly the fields a
  -- read returns for these events; checked here so that it stays honest.
  local sample = s:read("big", {limit = 100})
  local ids = {}
  for i, e in ipairs(sample) do ids[i] = e.id end
  local e1 = sample[1]
  local fields = {}
  for k in pairs(e1) do fields[#fields + 1] = k end
  table.sort(fields)
  local expect = "attempts created_at failures id index payload position processed_at session status type"
  assert(table.concat(fields, " ") == expect, "the plain-Lua anchor needs updating: fields are " .. table.concat(fields, " "))
  local ty, sess, st, at = e1.type, e1.session, e1.status, e1.created_at
  local arr = getmetatable(e1.payload.items)
  local cust, sku, note = e1.payload.customer, e1.payload.items[1].sku, e1.payload.note
  local function plain_page(after)
    local out = {}
    for i = 1, 100 do
      local k = after + i
      out[i] = {id = ids[i], type = ty, index = k, session = sess, position = k, created_at = at,
        status = st, attempts = 0, failures = 0, processed_at = at,
        payload = {customer = cust, items = setmetatable({{qty = 2, sku = sku}}, arr), note = note}}
    end
    return out
  end

  local size = fill
  local ways = {
    {"read-lua", "read: store:read (Lua)", function(n)
      for i = 1, n do s:read("big", {after = (i * 7919) % (size - 100), limit = 100}) end
    end},
    c and {"read-c", "read: es_store_read (C API)", function(n) c.read(n, size) end} or false,
    {"read-plain", "read: plain-Lua tables, same fields", function(n)
      for i = 1, n do plain_page((i * 7919) % (size - 100)) end
    end},
    {"read-decode", "read: json.decode of each payload", function(n)
      for _ = 1, n do
        local out = {}
        for k = 1, 100 do out[k] = json.decode(text) end
      end
    end},
    {"append-lua", "append: store:append (Lua)", function(n)
      for i = 1, n do s:append("a" .. i % 10, b100) end
    end},
    c and {"append-c", "append: es_store_append (C API)", function(n) c.append(n) end} or false,
    {"append-codec", "append: json.encode + json.decode", function(n)
      for _ = 1, n do
        local out = {}
        for k = 1, 100 do out[k] = json.decode(json.encode(b100[k].payload)) end
      end
    end},
  }
  local list = {}
  for _, w in ipairs(ways) do if w then list[#list + 1] = w end end
  if only then
    for _, w in ipairs(list) do if w[1] == only then w[3](calls) return end end
    error("no way named " .. only)
  end
  local spent = {}
  for round = 1, rounds do
    for k = 0, #list - 1 do
      local w = (round + k - 1) % #list + 1
      collectgarbage("collect") -- each way starts from the same heap, not the last one's garbage
      local t0 = os.clock()
      list[w][3](calls)
      spent[w] = (spent[w] or 0) + (os.clock() - t0)
    end
  end
  print(string.format("# store_bench.lua memory: the Lua path: reads of 100 events from a %d-event session, appends of 100;", fill))
  print(string.format("# %d rounds of %d calls per way, order rotating; CPU time; Lua / this = the Lua call's rate / this row's%s",
    rounds, calls, c and "" or " (no C API rows: run build/bench/lua_path_bench for them)"))
  print(string.format("%-40s %12s %12s", "# what", "events/s", "Lua / this"))
  local lua_rate = {}
  for w, way in ipairs(list) do
    local rate = rounds * calls * 100 / math.max(spent[w], 1e-6)
    local kind = way[1]:match("^(%a+)")
    if way[1]:match("%-lua$") then lua_rate[kind] = rate end
    local ratio = lua_rate[kind] and not way[1]:match("%-lua$") and string.format("%12.2f", lua_rate[kind] / rate) or ""
    print(string.format("%-40s %12.0f %s", way[2], rate, ratio))
  end
  s:close()
end

-- Completing claimed work one by one beside store:complete_many. Each
-- round and way opens a fresh store (sqlite: a new file next to URL's)
-- with CM_EVENTS pending events over 20 sessions; then loops
-- claim_next{limit = 100} until nothing is ready, completing each claimed
-- event with one result event:
--   complete: store:complete per event (one transaction, one sync each)
--   complete_many: one store:complete_many per claimed page of 100
local CM_ROUNDS = 3
local function bench_complete_many()
  local n = durable and 1000 or 10000
  local per_session = n // 20
  local page = {}
  for i = 1, per_session do page[i] = {type = "order.paid", payload = payload} end
  local result = {{type = "order.shipped", payload = payload, settled = true}}
  local ways = {
    {"complete (one by one)", function(s)
      while true do
        local got = s:claim_next({holder = "bench", ttl_ms = 60000, limit = 100})
        if #got == 0 then return end
        for _, e in ipairs(got) do s:complete(e.session, e.index, e.attempt, result) end
      end
    end},
    {"complete_many (100 a call)", function(s)
      while true do
        local got = s:claim_next({holder = "bench", ttl_ms = 60000, limit = 100})
        if #got == 0 then return end
        local list = {}
        for i, e in ipairs(got) do
          list[i] = {session = e.session, index = e.index, attempt = e.attempt, events = result}
        end
        for _, r in ipairs(s:complete_many(list)) do assert(r.outcome == "completed", r.error) end
      end
    end},
  }
  local spent = {}
  for round = 1, CM_ROUNDS do
    for k = 0, #ways - 1 do
      local w = (round + k - 1) % #ways + 1
      local u = url
      if durable then
        u = url .. ".cm" .. w
        remove_db(u:sub(8))
      end
      local s = eventstore.open(u)
      for j = 1, 20 do s:append(("job-%02d"):format(j), page) end
      local t0 = now()
      ways[w][2](s)
      spent[w] = (spent[w] or 0) + (now() - t0)
      assert(#s:claim_next({holder = "check", ttl_ms = 1000}) == 0, "all completed")
      s:close()
      if durable then remove_db(u:sub(8)) end
    end
  end
  print(string.format("# store_bench.lua %s claim_next{limit = 100} + completing %d events, %d rounds, a fresh store each",
    url, n, CM_ROUNDS))
  print("# (x: the one-by-one loop's time / this row's; wall time, claims included)")
  print(string.format("%-28s %12s %8s", "# what", "events/s", "x"))
  for w, way in ipairs(ways) do
    print(string.format("%-28s %12.0f %8.2f", way[1], n * CM_ROUNDS / spent[w], spent[1] / spent[w]))
  end
end

if arg[3] == "complete" then
  bench_complete_many()
  os.exit(0)
end

if arg[3] == "lua" then
  bench_lua_path(big > 100 and big or 100000, tonumber(arg[4] or "5"), tonumber(arg[5] or "300"), arg[6])
  return
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
bench_complete_many()
bench_fork()
