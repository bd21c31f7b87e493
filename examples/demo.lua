-- examples/demo.lua: what `make demo` runs.
--
-- The sample order app in scripts/ (handlers and reducers), run embedded on
-- SQLite: three orders go through placement, stock reservation, payment
-- (one card's gateway times out once and is retried with backoff, one card
-- is declined and its stock released) and a shipping timer. Then it prints
-- every order's log, its folded state and a summary.
--
--   DEMO_DB       the SQLite file (default ./demo.db; reset on every run,
--                 kept afterwards so you can look at it with the binary)
--   DEMO_SCRIPTS  the scripts directory (default ./scripts)
local eventstore = require("eventstore")

local path = os.getenv("DEMO_DB") or "demo.db"
local scripts = os.getenv("DEMO_SCRIPTS") or "scripts"
for _, suffix in ipairs({ "", "-wal", "-shm", "-journal" }) do os.remove(path .. suffix) end

local store <close> = eventstore.open("sqlite:" .. path)
local engine = eventstore.engine {
  store = store,
  scripts = scripts,
  workers = 2,
  max_failures = 3,
  -- Small backoffs so the retried payment comes back within a blink; the
  -- defaults (1 s doubling up to 60 s) suit a real gateway.
  backoff_ms = 100,
  backoff_cap_ms = 400,
}

local ORDERS = {
  { session = "order-1001", customer = "ada", card = "tok_visa",
    items = { { sku = "TEA-01", qty = 2 }, { sku = "MUG-02", qty = 1 } } },
  { session = "order-1002", customer = "grace", card = "tok_flaky", note = "the gateway times out once",
    items = { { sku = "POT-03", qty = 1 } } },
  { session = "order-1003", customer = "linus", card = "tok_declined", note = "the bank declines",
    items = { { sku = "TEA-01", qty = 5 } } },
}

-- Formatting helpers ---------------------------------------------------------

local function money(cents) return ("%d.%02d"):format(cents // 100, cents % 100) end

local function items_text(items)
  local parts = {}
  for i, item in ipairs(items) do parts[i] = ("%s x%d"):format(item.sku, item.qty) end
  return table.concat(parts, ", ")
end

-- A {sku = qty} map as "A x1, B x2" in SKU order ("none" when empty).
local function sku_map_text(map)
  local skus = {}
  for sku in pairs(map) do skus[#skus + 1] = sku end
  if #skus == 0 then return "none" end
  table.sort(skus)
  local parts = {}
  for i, sku in ipairs(skus) do parts[i] = ("%s x%d"):format(sku, map[sku]) end
  return table.concat(parts, ", ")
end

local function first_line(s) return (tostring(s):match("^[^\n]*")) end

-- The key payload bits of one event, by type.
local function describe(e)
  local p = e.payload
  if e.type == "order.placed" then
    return ("%s, card %s"):format(items_text(p.items), p.card)
  elseif e.type == "order.accepted" then
    return "total " .. money(p.total_cents)
  elseif e.type == "stock.reserved" or e.type == "stock.released" then
    return items_text(p.items)
  elseif e.type == "payment.requested" then
    local text = "card " .. p.card
    if e.failures > 0 then
      text = text .. ("; %d failed attempt(s) (%s), retried: %d attempts in all")
        :format(e.failures, first_line(e.last_error), e.attempts)
    end
    return text
  elseif e.type == "payment.captured" then
    return ("%s on attempt %d"):format(money(p.amount_cents), p.attempt)
  elseif e.type == "payment.declined" or e.type == "order.cancelled" or e.type == "order.rejected" then
    return p.reason
  elseif e.type == "shipment.due" then
    -- delay_ms counts from the clock read when the attempt completed; the
    -- commit stamps created_at a moment later, so round to 100 ms.
    local delay = (e.not_before - e.created_at + 50) // 100 * 100
    return ("timer: due %d ms after it was written"):format(delay)
  elseif e.type == "payment.reminder" then
    return e.cancelled and "timer cancelled: " .. e.cancelled or "timer: pending"
  elseif e.type == "order.shipped" then
    return ("%s, tracking %s"):format(p.carrier, p.tracking)
  end
  return ""
end

-- 1. Orders arrive ------------------------------------------------------------

print(("eventstore demo: an order flow on SQLite (%s), handlers and reducers from %s/"):format(path, scripts))
print()
print(("placing %d orders:"):format(#ORDERS))
for _, o in ipairs(ORDERS) do
  engine:append(o.session, { {
    type = "order.placed",
    payload = { customer = o.customer, card = o.card, items = o.items },
  } })
  local line = ("  %-10s  %-6s %-22s card %-12s %s"):format(o.session, o.customer, items_text(o.items), o.card,
    o.note and "(" .. o.note .. ")" or "")
  print((line:gsub("%s+$", "")))
end

-- 2. Run the engine until everything is handled ---------------------------------
--
-- run{until_idle = true} returns when no event is ready *now*; a payment
-- waiting out its backoff and the shipping timers are still pending then.
-- So: run, and while anything is pending, sleep a little and run again.

print()
print("running the engine (2 workers) until every event is handled, timers included;")
print("handlers log to stderr:")
io.stdout:flush()

local function pending()
  local n = 0
  for _, s in ipairs(store:sessions { prefix = "order-" }.sessions) do n = n + s.pending end
  return n
end

-- Lua has no sleep: a wait on a session nobody writes to blocks for timeout_ms.
local function sleep(ms) store:wait("demo/sleep", 0, ms) end

local totals = { handled = 0, failed = 0, dead = 0 }
for _ = 1, 200 do -- 200 rounds of at most 50 ms of sleep: give up after ~10 s
  local r = engine:run { until_idle = true }
  for k in pairs(totals) do totals[k] = totals[k] + r[k] end
  if pending() == 0 then break end
  sleep(50)
end
io.stderr:flush()
if pending() > 0 then
  error(("demo: %d event(s) still pending after 10 s"):format(pending()))
end

-- 3. The story: every order's log and folded state --------------------------------

local count = { shipped = 0, cancelled = 0 }
local retried, revenue = {}, 0
local warehouse = { held = {}, shipped = {}, released = {} }

for _, o in ipairs(ORDERS) do
  print()
  print(("%s (%s)"):format(o.session, o.customer))
  for _, e in ipairs(store:read(o.session)) do
    local from = e.cause and ("  <- #%d"):format(e.cause.index) or ""
    print(("  #%d %-18s %s%s"):format(e.index, e.type, describe(e), from))
    if e.type == "payment.requested" and e.failures > 0 then
      retried[#retried + 1] = ("%s: %s, %d attempts"):format(o.session, first_line(e.last_error), e.attempts)
    end
  end

  local order = engine:state(o.session, "order")
  local inventory = engine:state(o.session, "inventory")
  local line = "  => " .. order.status
  if order.paid_cents > 0 then
    line = line .. (", paid %s after %d payment attempt(s)"):format(money(order.paid_cents), order.payment_attempts)
  end
  if order.tracking then line = line .. ", tracking " .. order.tracking end
  if order.reason then line = line .. " (" .. order.reason .. ")" end
  print(line)
  print(("     inventory: held %s; shipped %s; released %s"):format(
    sku_map_text(inventory.held), sku_map_text(inventory.shipped), sku_map_text(inventory.released)))

  count[order.status] = (count[order.status] or 0) + 1
  revenue = revenue + order.paid_cents
  for kind, map in pairs(warehouse) do
    for sku, qty in pairs(inventory[kind]) do map[sku] = (map[sku] or 0) + qty end
  end
end

-- 4. Summary ------------------------------------------------------------------------

print()
print("summary")
print(("  orders:    %d placed, %d shipped, %d cancelled"):format(#ORDERS, count.shipped, count.cancelled))
print(("  payments:  %d retried (%s); %s captured"):format(#retried, table.concat(retried, "; "), money(revenue)))
print(("  warehouse: shipped %s; released %s; still held %s"):format(
  sku_map_text(warehouse.shipped), sku_map_text(warehouse.released), sku_map_text(warehouse.held)))
print(("  engine:    %d events handled, %d failed attempt(s), %d dead letter(s)"):format(
  totals.handled, totals.failed, totals.dead))
print()
print(("the log stays in %s; look at it with the binary, e.g.:"):format(path))
print(("  build/bin/eventstore read order-1002 --db sqlite:%s"):format(path))
print(("  build/bin/eventstore state order-1002 order --db sqlite:%s"):format(path))

engine:close()
