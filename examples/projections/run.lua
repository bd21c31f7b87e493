-- examples/projections/run.lua: two projections over an order app, and a
-- changed projection rebuilt blue/green while reads go on
-- (docs/projections.md).
--
--   open_orders  keyed by customer: open orders and their value
--   revenue      global: revenue per day of the shipped orders
--
-- 4,000 orders over 40 customers are stored, the engine folds them, the
-- reads answer; then revenue.lua changes (it now counts the orders of
-- each day too) and the engine builds the new generation beside the live
-- one while this program keeps reading: every read answers from the old
-- generation, whole, until the new one has caught up, then from the new.
--
-- Run from the repository root after `make`:
--   LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/lib/?.so;;' lua5.4 examples/projections/run.lua
local eventstore = require("eventstore")
local json = eventstore.json

local here = arg and arg[0] and arg[0]:match("^(.*)/") or "."
local tmp = os.tmpname()
local path = tmp .. ".db"
-- a copy of the scripts, so that the edit below leaves the example's files alone
local scripts = tmp .. ".scripts"
assert(os.execute(("cp -r '%s/scripts' '%s'"):format(here, scripts)))

local store <close> = eventstore.open("sqlite:" .. path)
local engine = eventstore.engine { store = store, scripts = scripts }

-- Orders are facts here (settled: nothing to dispatch); each goes placed,
-- then shipped (3 in 4) or cancelled.
local ORDERS, CUSTOMERS = 4000, 40
local batch = {}
for i = 1, ORDERS do
  local customer = ("cust-%02d"):format(i % CUSTOMERS)
  local total = 10 + (i * 7) % 90
  local day = ("2026-03-%02d"):format(1 + i % 5)
  local events = { { type = "order.placed", settled = true, payload = { customer = customer, total = total } } }
  if i % 4 ~= 0 then
    events[2] = { type = "order.shipped", settled = true, payload = { customer = customer, total = total, day = day } }
  elseif i % 8 == 0 then
    events[2] = { type = "order.cancelled", settled = true, payload = { customer = customer } }
  end
  batch[#batch + 1] = { session = ("order-%05d"):format(i), events = events }
  if #batch == 100 or i == ORDERS then
    store:append_many(batch) -- one commit for 100 orders
    batch = {}
  end
end

engine:run({ until_idle = true })
local function show_rows()
  for _, r in ipairs(engine:projections()) do
    print(("  %-12s generation %d  position %d  lag %d  %s"):format(r.name, r.generation, r.position, r.lag, r.status))
  end
end
print("after the first run:")
show_rows()
local s = store:projection("open_orders", "cust-04")
print(("open_orders cust-04: %d open, worth %d"):format(s.open, s.value))
local keys = store:projection_keys("open_orders", { prefix = "cust-0", limit = 3 })
print("first keys: " .. table.concat(keys.keys, ", ") .. "  (next page after " .. keys.cursor .. ")")
local revenue, info = store:projection("revenue", "")
print(("revenue 2026-03-01: %d  (generation %d)"):format(revenue["2026-03-01"], info.generation))

-- The change: revenue now keeps {total, orders} per day (a new shape, so
-- a reader must never see old and new states mixed). Slow on purpose, so
-- that the rebuild takes long enough for the reads below to watch it.
local f = assert(io.open(scripts .. "/projections/revenue.lua", "w"))
f:write([[
return {
  sessions = "order-",
  ["order.shipped"] = function(s, e)
    local x = 0
    for i = 1, 20000 do x = x + i end
    local d = s[e.payload.day] or { total = 0, orders = 0 }
    d.total, d.orders = d.total + e.payload.total, d.orders + 1
    s[e.payload.day] = d
  end,
}
]])
f:close()

print("\nrevenue.lua changed; reading while the engine rebuilds it:")
local during, first_new = 0, nil
engine:run({
  progress_ms = 20,
  progress = function()
    local state, at = store:projection("revenue", "")
    if at.generation == info.generation then
      assert(type(state["2026-03-01"]) == "number", "the old generation answers whole")
      during = during + 1
      if during == 1 then
        local r = engine:projections()
        for _, row in ipairs(r) do
          if row.name == "revenue" then
            print(("  building: new version at position %d of %d; reads answer generation %d: 2026-03-01 = %d")
              :format(row.position, row.head, at.generation, state["2026-03-01"]))
          end
        end
      end
      return
    end
    first_new = first_new or { state = state, at = at }
    engine:stop() -- swapped in: the run can end
  end,
})
print(("  %s reads answered from the old generation while the new one was built"):format(
  during > 0 and "all" or "no"))
print(("  then generation %d: 2026-03-01 = %s"):format(first_new.at.generation,
  json.encode(first_new.state["2026-03-01"])))
print("after the rebuild:")
show_rows()

engine:close()
store:close()
os.execute(("rm -rf '%s' '%s' '%s'*"):format(scripts, tmp, path))
