-- upcast_bench.lua: the cost of upcasting in a fold (bench/README.md,
-- "Upcasting"; docs/upcasting.md).
--
--   lua5.4 bench/upcast_bench.lua [N]
--     N: events per session (default 100000)
--
-- Three folds of N events on memory:, snapshots off, by the same reducer
-- (it reads e.payload.items[1].qty, as fold_bench.lua's does):
--   plain    scripts without upcasters; events stored at today's shape
--   chain    scripts with scripts/upcasters/order.placed.lua (current = 3);
--            events stored at revision 1 (a flat {customer, sku, qty}),
--            each run through [1] (a basket) and [2] (the customer as a
--            table) before the reducer sees it: a 1 -> 3 chain
--   current  the same upcaster file, events stored at revision 3 (no step
--            runs: the cost of looking)
-- Rounds alternate them; each line is the median of the rounds' CPU time
-- (os.clock: the fold runs on the engine's fold thread, the caller waits
-- blocked, so the process's CPU is the fold's). The ratio is chain / plain.
local eventstore = require("eventstore")
local N = tonumber(arg[1] or 100000)
local ROUNDS = 5

local function dir_with(upcaster)
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p " .. d .. "/reducers " .. d .. "/upcasters")
  local function write(name, text)
    local f = assert(io.open(d .. "/" .. name, "w"))
    f:write(text)
    f:close()
  end
  write("reducers/total.lua", [[return {
  init = function() return {n = 0, qty = 0} end,
  ["order.placed"] = function(s, e) s.n = s.n + 1; s.qty = s.qty + e.payload.items[1].qty end,
}]])
  if upcaster then
    write("upcasters/order.placed.lua", [[return { current = 3,
  [1] = function(p) return {customer = p.customer, note = p.note, items = {{qty = p.qty, sku = p.sku}}} end,
  [2] = function(p) p.customer = {id = p.customer}; return p end }]])
  end
  return d
end

local store = eventstore.open("memory:")
local function fill(session, payload, revision)
  local batch = {}
  for i = 1, 100 do batch[i] = {type = "order.placed", payload = payload, revision = revision, settled = true} end
  for _ = 1, N // 100 do store:append(session, batch) end
end
fill("plain", {customer = {id = "c-000123"}, items = {{qty = 2, sku = "SKU-42"}}, note = "leave at the door"}, 3)
fill("old", {customer = "c-000123", qty = 2, sku = "SKU-42", note = "leave at the door"}, 1)

local plain_dir, up_dir = dir_with(false), dir_with(true)
local plain = eventstore.engine{store = store, scripts = plain_dir, snapshot_every = 0, fold_runners = 1}
local up = eventstore.engine{store = store, scripts = up_dir, snapshot_every = 0, fold_runners = 1}

local function timed(engine, session)
  local t0 = os.clock()
  local s = engine:state(session, "total")
  local dt = os.clock() - t0
  assert(s.n == N and s.qty == 2 * N, "wrong fold")
  return dt
end

local times = {plain = {}, chain = {}, current = {}}
timed(plain, "plain"); timed(up, "old"); timed(up, "plain") -- warm
for _ = 1, ROUNDS do
  times.plain[#times.plain + 1] = timed(plain, "plain")
  times.chain[#times.chain + 1] = timed(up, "old")
  times.current[#times.current + 1] = timed(up, "plain")
end

local function median(t)
  table.sort(t)
  return t[(#t + 1) // 2]
end
local function rate(t) return N / median(t) end
print(("upcast_bench: %d events per fold, memory:, snapshots off, median of %d rounds (CPU)"):format(N, ROUNDS))
print(("  plain   (no upcasters)           %10.0f events/s"):format(rate(times.plain)))
print(("  chain   (every event 1 -> 3)     %10.0f events/s  cost %.2fx plain"):format(rate(times.chain),
  median(times.chain) / median(times.plain)))
print(("  current (file, no step to run)   %10.0f events/s  cost %.2fx plain"):format(rate(times.current),
  median(times.current) / median(times.plain)))
plain:close()
up:close()
store:close()
os.execute("rm -rf " .. plain_dir .. " " .. up_dir)
