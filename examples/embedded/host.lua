-- examples/embedded/host.lua: a plain Lua 5.4 program embedding the store
-- with require("eventstore"): no engine loop, no binary. It opens a SQLite
-- file, appends and reads an account's events, handles a withdrawal request
-- by hand with claim/complete, folds the balance with engine:state (the
-- reducer in scripts/reducers/balance.lua), subscribes to new events and
-- streams an event written by another process.
--
-- Run from the repository root after `make`:
--   LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/lib/?.so;;' lua5.4 examples/embedded/host.lua
local eventstore = require("eventstore")

local here = arg and arg[0] and arg[0]:match("^(.*)/") or "."
local lua = arg and arg[-1] or "lua5.4" -- the interpreter running us, for the child process

-- A fresh SQLite file per run (memory: would do for everything but step 6,
-- which needs a second process to see the same store).
local tmp = os.tmpname()
local path = tmp .. ".db"
local store <close> = eventstore.open("sqlite:" .. path)
local ACCOUNT = "account-42"

local function money(cents) return ("%d.%02d"):format(cents // 100, cents % 100) end

-- 1. Subscribe first: fn runs after each commit, for this handle's own
--    writes before the writing call returns.
print("1. subscribe to " .. ACCOUNT)
local unsubscribe = store:subscribe(ACCOUNT, function(e)
  print(("   [subscriber] #%d %s (%s)"):format(e.index, e.type, e.status))
end)

-- 2. Append. Facts that need no handling are stored settled; the withdrawal
--    request is left pending: some worker must decide on it.
print("2. append")
local stored, pending = store:append(ACCOUNT, {
  { type = "account.opened", payload = { owner = "ada" }, settled = true },
  { type = "deposited", payload = { amount = 10000 }, settled = true },
  { id = "wd-0001", type = "withdrawal.requested", payload = { amount = 3000 } },
})
print(("   appended %d events, head %d, pending work: %s"):format(#stored, store:head(ACCOUNT), tostring(pending)))

-- An append whose acknowledgement was lost is simply sent again: with the
-- same ids it writes nothing and returns the stored events.
local again = store:append(ACCOUNT, { { id = "wd-0001", type = "withdrawal.requested", payload = { amount = 3000 } } })
print(("   retried the request with id wd-0001: still event #%d, head still %d"):format(again[1].index, store:head(ACCOUNT)))

-- 3. Read the log back.
print("3. read")
for _, e in ipairs(store:read(ACCOUNT)) do
  print(("   #%d %-22s %-8s %s"):format(e.index, e.type, e.status, eventstore.json.encode(e.payload)))
end

-- 4. Handle pending work by hand: claim, decide, complete. complete marks
--    the request processed and appends its outcome in one atomic step.
local engine = eventstore.engine { store = store, scripts = here .. "/scripts" }

local function handle_requests()
  local got = store:claim(ACCOUNT, { holder = "host", ttl_ms = 10000 })
  if got.outcome ~= "claimed" then
    print("   nothing to claim: " .. got.outcome)
    return
  end
  for _, e in ipairs(got.events) do
    -- The balance as of just before this request.
    local balance = engine:state(ACCOUNT, "balance", { at = e.index - 1 }).balance
    -- The outcome is a fact nobody needs to handle: stored settled.
    local outcome
    if balance >= e.payload.amount then
      outcome = { type = "withdrawn", payload = { amount = e.payload.amount }, settled = true }
    else
      outcome = { type = "withdrawal.refused", settled = true,
        payload = { amount = e.payload.amount, reason = "insufficient funds" } }
    end
    print(("   claimed #%d %s %s (attempt %d, balance %s) -> %s"):format(
      e.index, e.type, money(e.payload.amount), e.attempt, money(balance), outcome.type))
    local done = store:complete(ACCOUNT, e.index, e.attempt, { outcome })
    print(("   completed #%d: %s, appended #%d"):format(e.index, done.outcome, done.events[1].index))
  end
end

print("4. claim and complete by hand")
handle_requests()
print("   another request comes in: 90.00")
store:append(ACCOUNT, { { type = "withdrawal.requested", payload = { amount = 9000 } } })
handle_requests()
handle_requests()

-- 5. Fold the state with the reducer, now and as of an earlier index.
print("5. engine:state")
local now = engine:state(ACCOUNT, "balance")
local early = engine:state(ACCOUNT, "balance", { at = 2 })
print(("   balance now %s (%d deposit(s), %d withdrawal(s), %d refused); at #2 it was %s"):format(
  money(now.balance), now.deposits, now.withdrawals, now.refused, money(early.balance)))
unsubscribe()

-- 6. Stream: history first, then live events, here one written by another
--    process (teller.lua) on the same file. A subscription is in-process
--    notification, run inside calls made through this handle; stream and
--    wait block until new events come, from anyone.
print("6. stream, while another process appends")
local head = store:head(ACCOUNT)
os.execute(("%s %s/teller.lua %s %s &"):format(lua, here, path, ACCOUNT))
local seen = false
for e in store:stream(ACCOUNT, { after = head, timeout_ms = 5000 }) do
  print(("   [stream] #%d %s %s by %s"):format(e.index, e.type, money(e.payload.amount), e.payload.by))
  seen = true
  break
end
if not seen then error("no event from the teller process within 5 s") end
print(("   balance now %s"):format(money(engine:state(ACCOUNT, "balance").balance)))

engine:close()
store:close()
for _, p in ipairs({ tmp, path, path .. "-wal", path .. "-shm", path .. "-journal" }) do os.remove(p) end
print("done")
