-- engine_bench.lua: events/s folded through a trivial Lua reducer (payload
-- decoding included) with and without snapshots, and events/s dispatched
-- through a trivial handler with 1 and 2 workers, on memory: and sqlite:.
--   lua5.4 bench/engine_bench.lua [DIR]     (DIR: where sqlite files go)
local eventstore = require("eventstore")
local dir = arg[1] or "."

local scripts = os.tmpname()
os.remove(scripts)
os.execute("mkdir -p " .. scripts .. "/handlers " .. scripts .. "/reducers")
local function write(name, text)
  local f = assert(io.open(scripts .. "/" .. name, "w"))
  f:write(text)
  f:close()
end
write("handlers/job.lua", "return function(e) return nil end")
write("reducers/total.lua", [[return {
  init = function() return {n = 0, qty = 0} end,
  ["order.placed"] = function(s, e) s.n = s.n + 1; s.qty = s.qty + e.payload.items[1].qty end,
}]])

local payload = {customer = "c-000123", items = {{qty = 2, sku = "SKU-42"}}, note = "leave at the door"}
local seq = 0
local function url_for(kind)
  if kind == "memory:" then return "memory:" end
  seq = seq + 1
  local path = dir .. "/engine_bench." .. seq .. ".db"
  for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end
  return "sqlite:" .. path, path
end
local function drop(path)
  if path then for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end end
end

local function fill(store, session, type, n, settled)
  local batch = {}
  for i = 1, 100 do batch[i] = {type = type, payload = payload, settled = settled} end
  for _ = 1, n // 100 do store:append(session, batch) end
end

local function line(what, n, ms)
  print(string.format("%-52s %10.0f   (%d events in %d ms)", what, n / (ms / 1000), n, ms))
end

for _, kind in ipairs({"memory:", "sqlite:"}) do
  -- Folding: 100,000 events, no snapshots; then with snapshots, the read
  -- after 100 more events folds only those.
  local url, path = url_for(kind)
  local store = eventstore.open(url)
  local n = 100000
  fill(store, "s", "order.placed", n, true)
  local plain <close> = eventstore.engine{store = store, scripts = scripts, snapshot_every = 0}
  local t0 = store:now()
  local st = plain:state("s", "total")
  assert(st.n == n)
  local full_ms = math.max(store:now() - t0, 1)
  line(kind .. " fold, no snapshots (events/s)", n, full_ms)
  -- With snapshots: each state() call after 100 new events folds only
  -- those 100 (from the last snapshot), whatever the history's length.
  local snap <close> = eventstore.engine{store = store, scripts = scripts, snapshot_every = 100}
  snap:state("s", "total") -- takes the first snapshot
  local reps, spent = 20, 0
  for _ = 1, reps do
    fill(store, "s", "order.placed", 100, true)
    t0 = os.clock()
    snap:state("s", "total")
    spent = spent + (os.clock() - t0)
  end
  print(string.format("%-52s %10.2f ms per call (the full fold above: %d ms)",
    kind .. " state() of a ~100k history, 100 new events", spent / reps * 1000, full_ms))
  plain:close()
  snap:close()
  store:close()
  drop(path)

  -- Dispatch through a trivial handler.
  for _, workers in ipairs(kind == "memory:" and {1, 2} or {1, 2, 4, 8}) do
    url, path = url_for(kind)
    store = eventstore.open(url)
    -- (20,000 on sqlite: with batched claims and completions 2,000 took a
    -- fraction of a second, too short to measure)
    local count = 20000
    fill(store, "d", "job", count, false)
    local engine <close> = eventstore.engine{store = store, scripts = scripts, workers = workers}
    t0 = store:now()
    local r = engine:run{until_idle = true}
    ms = math.max(store:now() - t0, 1)
    assert(r.handled == count, "handled " .. r.handled)
    line(string.format("%s dispatch, %d worker%s (events/s)", kind, workers, workers > 1 and "s" or ""),
      count, ms)
    engine:close()
    store:close()
    drop(path)
  end
end
os.execute("rm -rf " .. scripts)
