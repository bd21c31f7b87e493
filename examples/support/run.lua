-- examples/support/run.lua: a support desk on lanes and presence.
--
-- One session per desk ("desk-eu"), one lane per ticket: a ticket's
-- messages are handled strictly in order while tickets proceed in parallel
-- on several workers, and a poison message blocks only its own ticket.
-- Agents' online/typing status lives in presence (ephemeral, with TTLs),
-- not in the log; tickets are routed to agents who are online.
--
-- Run from the repository root after `make`:
--   LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/lib/?.so;;' lua5.4 examples/support/run.lua
local eventstore = require("eventstore")
local json = eventstore.json

local here = arg and arg[0] and arg[0]:match("^(.*)/") or "."
local tmp = os.tmpname()
local path = tmp .. ".db"
local store <close> = eventstore.open("sqlite:" .. path)
local engine = eventstore.engine {
  store = store,
  scripts = here .. "/scripts",
  workers = 3,
  max_failures = 2, -- a poison message is dead-lettered on its 2nd failure
  backoff_ms = 50,  -- small, so the demo does not wait long for the retry
  backoff_cap_ms = 100,
}

local DESK = "desk-eu" -- the session, and the presence namespace
local null = json.null

-- Lua has no sleep: a wait on a session nobody writes to blocks for timeout_ms.
local function sleep(ms) store:wait("support/sleep", 0, ms) end

local function values_text(values)
  local keys = {}
  for k in pairs(values) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do
    local v = values[k]
    parts[i] = k .. "=" .. (v == null and "(deleted)" or tostring(v))
  end
  return table.concat(parts, " ")
end

-- Who is there: participant -> {field = value}, from presence_read (which
-- never returns expired rows or tombstones).
local function presence()
  local who = {}
  for _, row in ipairs(store:presence_read(DESK)) do
    who[row.participant] = who[row.participant] or {}
    who[row.participant][row.field] = row.value
  end
  return who
end

local function online_text()
  local who, names = presence(), {}
  for name in pairs(who) do names[#names + 1] = name end
  table.sort(names)
  local parts = {}
  for _, name in ipairs(names) do
    local p = who[name]
    if p.status then
      parts[#parts + 1] = name .. " " .. p.status .. (p.typing and (", typing on " .. p.typing) or "")
    end
  end
  return #parts > 0 and table.concat(parts, "; ") or "nobody"
end

-- Each agent's client numbers its presence writes: `at` orders them, so a
-- write that arrives late (an old heartbeat) can never undo a newer one.
local seq = {}
local function set(agent, values, ttl_ms)
  seq[agent] = (seq[agent] or 0) + 1
  return store:presence_set(DESK, agent, values, { ttl_ms = ttl_ms, at = seq[agent] })
end

print(("support desk %q: one lane per ticket, agents in presence"):format(DESK))

-- 1. Agents come online. Every applied write is a patch to subscribers.
print()
print("1. agents come online (presence with a 30 s TTL that heartbeats would refresh)")
local unsubscribe = store:presence_subscribe(DESK, function(patch)
  print(("   presence: %s %s"):format(patch.participant, values_text(patch.values)))
end)
set("ana", { name = "Ana", status = "online" }, 30000)
set("bo", { name = "Bo", status = "online" }, 30000)
set("cy", { name = "Cy", status = "away" }, 30000)

-- 2. Tickets arrive and are routed, round robin, to agents online right now.
local agents = {}
for name, p in pairs(presence()) do
  if p.status == "online" then agents[#agents + 1] = name end
end
table.sort(agents)
print()
print(("2. three tickets arrive, routed to the agents online: %s"):format(table.concat(agents, ", ")))
local TICKETS = {
  { id = "T-1", customer = "mia", subject = "parcel arrived broken" },
  { id = "T-2", customer = "noah", subject = "refund for order 1002" },
  { id = "T-3", customer = "olga", subject = "wrong invoice" },
}
for i, t in ipairs(TICKETS) do
  t.agent = agents[(i - 1) % #agents + 1]
  engine:append(DESK, { { type = "ticket.opened", lane = t.id,
    payload = { ticket = t.id, customer = t.customer, agent = t.agent, subject = t.subject } } })
  print(("   %s %-5s -> %-4s %s"):format(t.id, t.customer, t.agent, t.subject))
end

-- 3. Customers write. One batch, tickets interleaved: without lanes three
--    workers would happily answer message 3 before message 1.
local MESSAGES = {
  { ticket = "T-1", text = "the teapot lid is cracked" },
  { ticket = "T-2", text = "I would like a refund" },
  { ticket = "T-3", text = "the invoice has the wrong address" },
  { ticket = "T-1", text = "photo attached", attachment = { name = "lid.jpg" } },
  { ticket = "T-2", text = "it was order 1002" },
  { ticket = "T-3", text = "scan attached", attachment = { name = "scan.tiff", corrupt = true } },
  { ticket = "T-1", text = "thanks, a new one is on its way!" },
  { ticket = "T-2", text = "thank you" },
  { ticket = "T-3", text = "any news?" },
}
local batch, count = {}, {}
for i, m in ipairs(MESSAGES) do
  count[m.ticket] = (count[m.ticket] or 0) + 1
  batch[i] = { type = "message.received", lane = m.ticket,
    payload = { ticket = m.ticket, seq = count[m.ticket], text = m.text, attachment = m.attachment } }
end
engine:append(DESK, batch)
print()
print(("3. customers write %d messages, each with lane = its ticket"):format(#MESSAGES))

-- 4. Ana starts typing: a short-lived field, gone unless refreshed.
print()
print("4. ana is typing on T-1 (a 150 ms TTL)")
set("ana", { typing = "T-1" }, 150)
print("   present: " .. online_text())

-- 5. Run the engine. run{until_idle = true} returns when nothing is ready
--    now; a failed message waits out its backoff, so run again until the
--    only pending work is stuck behind a dead letter in its lane.
local totals = { handled = 0, failed = 0, dead = 0 }
local function drain()
  local function waiting()
    local dead_lanes, n = {}, 0
    for _, e in ipairs(store:read(DESK)) do -- index order: a dead letter comes before what it blocks
      if e.status == "dead" and e.lane then
        dead_lanes[e.lane] = true
      elseif e.status == "pending" and not (e.lane and dead_lanes[e.lane]) then
        n = n + 1
      end
    end
    return n
  end
  io.stdout:flush() -- so the handlers' stderr lines come after what we printed so far
  for _ = 1, 200 do -- bounded: ~10 s
    local r = engine:run { until_idle = true }
    for k in pairs(totals) do totals[k] = totals[k] + r[k] end
    if waiting() == 0 then return end
    sleep(50)
  end
  error("support: work still waiting after 10 s")
end

local all_in_order = true
local function report()
  local desk = engine:state(DESK, "desk")
  for _, t in ipairs(TICKETS) do
    local s = desk.tickets[t.id]
    local replied = {}
    for i, n in ipairs(s.replied) do replied[i] = tostring(n) end
    local in_order = true
    for i, n in ipairs(s.replied) do in_order = in_order and n == i end
    all_in_order = all_in_order and in_order
    print(("   %s: %d message(s), replies to %s (%s), %s"):format(t.id, s.received,
      #replied > 0 and table.concat(replied, ", ") or "none", in_order and "in order" or "OUT OF ORDER",
      s.status))
  end
  return desk
end

print()
print("5. the engine runs (3 workers) until only blocked work is left; the bot logs to stderr:")
drain()
io.stderr:flush()
report()

local dead = store:dead_letters { session = DESK }
for _, d in ipairs(dead) do
  print(("   dead letter: #%d %s %s message %d after %d failures: %s"):format(d.index, d.type, d.payload.ticket,
    d.payload.seq, d.failures, d.last_error:match("^[^\n]*")))
  for _, e in ipairs(store:read(DESK, { after = d.index })) do
    if e.lane == d.lane and e.status == "pending" then
      print(("   blocked behind it in lane %s: #%d message %d %q"):format(e.lane, e.index, e.payload.seq,
        e.payload.text))
    end
  end
end

-- 6. A human takes over: answers the message by hand and settles the dead
--    letter, which unblocks the lane.
print()
print("6. ana answers the unreadable message by hand and settles the dead letter")
for _, d in ipairs(dead) do
  store:append(DESK, { { type = "reply.sent", settled = true, payload = { ticket = d.payload.ticket,
    seq = d.payload.seq, agent = "ana", text = "could not open your scan, could you send a PDF?" } } })
  store:settle(DESK, d.index, "answered by hand")
end
drain()
local desk = report()

-- 7. Presence moves on without anyone writing to the log.
print()
print("7. later")
sleep(200)
print("   200 ms on, ana's typing field has expired (nobody refreshed it); present: " .. online_text())
print("   bo signs off: his fields are deleted, leaving tombstones")
set("bo", { status = null, name = null }, 60000)
-- A heartbeat bo's client wrote before signing off (at = 1) arrives late.
local applied = store:presence_set(DESK, "bo", { status = "online" }, { ttl_ms = 30000, at = 1 })
local n = 0
for _ in pairs(applied) do n = n + 1 end
print(("   a late heartbeat from bo (at = 1) arrives: %s"):format(
  n == 0 and "ignored, the tombstone is newer" or "APPLIED"))
print("   present: " .. online_text())
unsubscribe()

print()
print(("summary: %d tickets, %d messages, %d still open; %s; "
  .. "%d dead letter(s) settled by hand; engine handled %d, failed %d, dead %d")
  :format(#TICKETS, #MESSAGES, desk.open,
    all_in_order and "every ticket answered in order" or "SOME TICKET ANSWERED OUT OF ORDER",
    #dead, totals.handled, totals.failed, totals.dead))

engine:close()
store:close()
for _, p in ipairs({ tmp, path, path .. "-wal", path .. "-shm", path .. "-journal" }) do os.remove(p) end
