-- examples/replay/run.lua: replay a changed pricing handler over real
-- history before it goes live (docs/replay.md).
--
-- 1. History: ORDERS orders of the sample order app (scripts/) placed
--    over a simulated day on SQLite, handled by the engine on a manual
--    clock (retried payments and shipping timers fire when due).
-- 2. The change: a copy of scripts/ whose order.placed takes 10% off
--    every line of three or more of an item (a bulk discount).
-- 3. eventstore.replay of the changed scripts over that history: which
--    orders would have been priced differently, and how their state
--    changes; then the same replay of the unchanged scripts (identical).
--
--   REPLAY_DB       the SQLite file (default ./replay-example.db; reset on
--                   every run, kept so you can run `eventstore replay` on it)
--   REPLAY_SCRIPTS  where the changed scripts go (default ./scripts.bulk)
--   ORDERS          how many orders (default 300)
local eventstore = require("eventstore")
local json = eventstore.json

local path = os.getenv("REPLAY_DB") or "replay-example.db"
local changed = os.getenv("REPLAY_SCRIPTS") or "scripts.bulk"
local orders = tonumber(os.getenv("ORDERS") or "300")
for _, suffix in ipairs({ "", "-wal", "-shm", "-journal" }) do os.remove(path .. suffix) end

-- 1. History --------------------------------------------------------------
local CARDS = { "tok_visa", "tok_visa", "tok_visa", "tok_visa", "tok_flaky", "tok_declined" }
local SKUS = { "TEA-01", "MUG-02", "POT-03" }
local T0 = 1767225600000 -- 2026-01-01 00:00 UTC
local clock = eventstore.manual_clock(T0)
local store = eventstore.open("sqlite:" .. path, { clock = clock })
local engine = eventstore.engine({ store = store, scripts = "scripts", quiet = true })
local function fire_due()
  -- Run until idle, then move the clock to the next backoff or timer.
  while true do
    engine:run({ until_idle = true })
    local due
    for _, s in ipairs(store:sessions({ prefix = "order-", limit = 1000 }).sessions) do
      if s.pending > 0 then
        for _, e in ipairs(store:read(s.session)) do
          if e.status == "pending" then
            local d = math.max(e.not_before or 0, e.retry_at or 0)
            if due == nil or d < due then due = d end
          end
        end
      end
    end
    if due == nil or due > clock:now() + 60000 then return end
    clock:set(math.max(due, clock:now()))
  end
end
for i = 1, orders do
  clock:set(T0 + i * 86400000 // orders) -- spread over the day
  engine:append(("order-%04d"):format(i), { {
    type = "order.placed",
    payload = { customer = "customer-" .. i, card = CARDS[i % #CARDS + 1],
      items = { { sku = SKUS[i % #SKUS + 1], qty = i % 4 + 1 }, { sku = SKUS[(i + 1) % #SKUS + 1], qty = 1 } } },
  } })
  fire_due()
end
clock:advance(3600000)
fire_due()
engine:close()
print(("history: %d orders, %d events in %s"):format(orders, #store:read_all(), path))

-- 2. The change -------------------------------------------------------------
os.execute(("rm -rf '%s' && cp -r scripts '%s'"):format(changed, changed))
local file = changed .. "/handlers/order.placed.lua"
local f = assert(io.open(file, "rb"))
local src = f:read("a")
f:close()
local new, n = src:gsub("total = total %+ price %* item%.qty",
  "if item.qty >= 3 then price = price * 9 // 10 end -- bulk discount\n    total = total + price * item.qty")
assert(n == 1, "order.placed.lua no longer has the pricing line this example changes")
f = assert(io.open(file, "wb"))
f:write(new)
f:close()
print(("changed: %s (10%% off lines of 3 or more)"):format(file))

-- 3. Replay -------------------------------------------------------------------
local report = eventstore.replay({ store = store, scripts = changed })
local m = report.summary
print(("replay of %s: replayed %d, identical %d, diverged %d, failed %d"):format(changed, m.replayed,
  m.identical, m.diverged, m.failed))
local shown = 0
for _, s in ipairs(report.sessions) do
  if s.status == "diverged" and shown < 3 then
    shown = shown + 1
    local d = s.divergence
    print(("  %s: first divergence at #%d (%s): total_cents %s -> %s"):format(s.session, d.index,
      d.baseline.type, json.encode(d.baseline.payload.total_cents), json.encode(d.replayed.payload.total_cents)))
    for _, p in ipairs(s.states.order or {}) do
      print(("    state order %s: %s -> %s"):format(p.path, json.encode(p.baseline), json.encode(p.replayed)))
    end
  end
end
local same = eventstore.replay({ store = store, scripts = "scripts" }).summary
print(("replay of scripts (unchanged): replayed %d, identical %d"):format(same.replayed, same.identical))
store:close()
