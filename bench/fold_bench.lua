-- fold_bench.lua: folds and engine:state() (bench/README.md, "Folds").
--
--   lua5.4 bench/fold_bench.lua [DIR [STATE_EVENTS]]
--     DIR: where the sqlite: files go (default "."); STATE_EVENTS: the
--     length of the history behind the state() figures (default 1000000).
--
-- 1. Fold throughput: a reducer that reads one payload field
--    (e.payload.items[1].qty) folds 100,000 events with snapshots off,
--    beside its same-run anchors: lua-cjson (Debian lua-cjson) decoding the
--    same payload text 100,000 times, eventstore.json.decode doing the
--    same, and the Lua VM making the event tables a step gets (event and
--    payload) from constants, the floor of any fold that hands a reducer
--    fresh tables. Rounds alternate them; each line is the median of the
--    rounds' CPU time (os.clock: the fold runs on the engine's fold thread,
--    the caller waits for it blocked, so the process's CPU is the fold's).
-- 2. state() of a STATE_EVENTS-event session (wall time per call, the
--    median of rounds of back-to-back calls): with the newest snapshot at
--    the head (0 events to fold) and 100 events behind it (100 to fold;
--    the engine measured has snapshot_every = 1000, so the calls do not
--    move the snapshot and each folds the same 100 events).
local eventstore = require("eventstore")
local json = eventstore.json
local has_cjson, cjson = pcall(require, "cjson")
local dir = arg[1] or "."
local state_events = tonumber(arg[2] or 1000000)

local scripts = os.tmpname()
os.remove(scripts)
os.execute("mkdir -p " .. scripts .. "/reducers")
local function write(name, text)
  local f = assert(io.open(scripts .. "/" .. name, "w"))
  f:write(text)
  f:close()
end
write("reducers/total.lua", [[return {
  init = function() return {n = 0, qty = 0} end,
  ["order.placed"] = function(s, e) s.n = s.n + 1; s.qty = s.qty + e.payload.items[1].qty end,
}]])

local payload = {customer = "c-000123", items = {{qty = 2, sku = "SKU-42"}}, note = "leave at the door"}
local text = json.encode(payload)

local seq = 0
local function url_for(kind)
  if kind == "memory:" then return "memory:" end
  seq = seq + 1
  local path = dir .. "/fold_bench." .. seq .. ".db"
  for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end
  return "sqlite:" .. path, path
end
local function drop(path)
  if path then for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end end
end

local function fill(store, session, n)
  local batch = {}
  for i = 1, 100 do batch[i] = {type = "order.placed", payload = payload, settled = true} end
  for _ = 1, n // 100 do store:append(session, batch) end
  if n % 100 > 0 then
    for i = n % 100 + 1, 100 do batch[i] = nil end
    store:append(session, batch)
  end
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local m = #s // 2
  return #s % 2 == 1 and s[m + 1] or (s[m] + s[m + 1]) / 2
end

local function fmt(n)
  local s = string.format("%.0f", n)
  return (s:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", ""))
end

local ROUNDS = 5
local N = 100000

-- 1. Fold throughput ---------------------------------------------------------
for _, kind in ipairs({"memory:", "sqlite:"}) do
  local url, path = url_for(kind)
  local store = eventstore.open(url)
  fill(store, "s", N)
  local engine <close> = eventstore.engine{store = store, scripts = scripts, snapshot_every = 0}
  engine:state("s", "total") -- loads the reducer, warms the fold thread
  local r_cjson, r_json, r_fold, r_floor = {}, {}, {}, {}
  -- The floor of an exact fold: what the Lua VM alone takes to make the
  -- tables a step gets (an event table of a settled event, with its
  -- payload) from constants: no parsing, no store, no strings created.
  local array = json.array
  local function build(i)
    return {id = "01J0000000000000000000000", type = "order.placed", index = i, session = "s",
      position = i, created_at = 1700000000000, status = "processed", attempts = 0, failures = 0,
      processed_at = 1700000000000,
      payload = {customer = "c-000123", items = array({{qty = 2, sku = "SKU-42"}}), note = "leave at the door"}}
  end
  for round = 1, ROUNDS do
    -- The order changes from round to round.
    local steps = {
      function()
        if not has_cjson then return end
        local decode = cjson.decode
        local t0 = os.clock()
        for _ = 1, N do decode(text) end
        r_cjson[#r_cjson + 1] = N / (os.clock() - t0)
      end,
      function()
        local decode = json.decode
        local t0 = os.clock()
        for _ = 1, N do decode(text) end
        r_json[#r_json + 1] = N / (os.clock() - t0)
      end,
      function()
        local t0 = os.clock()
        for i = 1, N do build(i) end
        r_floor[#r_floor + 1] = N / (os.clock() - t0)
      end,
      function()
        collectgarbage()
        local t0 = os.clock()
        local st = engine:state("s", "total")
        r_fold[#r_fold + 1] = N / (os.clock() - t0)
        assert(st.n == N and st.qty == 2 * N)
      end,
    }
    for i = 0, #steps - 1 do steps[(round + i) % #steps + 1]() end
  end
  local c = has_cjson and median(r_cjson) or nil
  local function row(what, v)
    print(string.format("%-66s %12s   %s", kind .. " " .. what, fmt(v),
      c and string.format("%.2f x cjson", v / c) or "(lua-cjson not installed)"))
  end
  if c then row("lua-cjson decode of the payload text (decodes/s)", c) end
  row("eventstore.json.decode of the same text (decodes/s)", median(r_json))
  row("fold 100,000 events, no snapshots (events/s)", median(r_fold))
  row("(floor: Lua makes the same event tables from constants, /s)", median(r_floor))
  engine:close()
  store:close()
  drop(path)
end

-- 2. state() of a long history ---------------------------------------------
-- Wall time of back-to-back calls: store:now() is the store's clock in ms,
-- so each round runs calls for at least 200 ms.
local function per_call_us(store, fn)
  local rounds = {}
  for _ = 1, ROUNDS do
    local calls, t0 = 0, store:now()
    local t1 = t0
    while t1 - t0 < 200 do
      for _ = 1, 50 do fn() end
      calls = calls + 50
      t1 = store:now()
    end
    rounds[#rounds + 1] = (t1 - t0) * 1000 / calls
  end
  return median(rounds)
end

for _, kind in ipairs({"memory:", "sqlite:"}) do
  local url, path = url_for(kind)
  local store = eventstore.open(url)
  fill(store, "big", state_events)
  local snap <close> = eventstore.engine{store = store, scripts = scripts, snapshot_every = 100}
  local t0 = os.clock()
  assert(snap:state("big", "total").n == state_events) -- the first snapshot, at the head
  local full = os.clock() - t0
  local lazy <close> = eventstore.engine{store = store, scripts = scripts, snapshot_every = 1000}
  local at_head = per_call_us(store, function() lazy:state("big", "total") end)
  fill(store, "big", 100)
  local behind = per_call_us(store, function() lazy:state("big", "total") end)
  assert(lazy:state("big", "total").n == state_events + 100)
  local what = string.format("%s state() of a %s-event session", kind, fmt(state_events))
  print(string.format("%-66s %9.1f us per call", what .. ", snapshot at the head", at_head))
  print(string.format("%-66s %9.1f us per call", what .. ", snapshot 100 events behind", behind))
  print(string.format("%-66s %9.0f ms (%s events/s)", "  (the first fold of that history, no snapshot)",
    full * 1000, fmt(state_events / full)))
  lazy:close()
  snap:close()
  store:close()
  drop(path)
end
os.execute("rm -rf " .. scripts)
