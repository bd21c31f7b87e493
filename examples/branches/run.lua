-- examples/branches/run.lua: an agent tries two plans on branches of one
-- conversation and keeps the better one.
--
-- A conversation is a session ("conv-1"); a ref ("main") names the session
-- the application treats as the conversation. At a chosen message the
-- conversation is forked twice, each branch commits to another plan, the
-- engine's handlers play each plan out, the reducer states of the branches
-- are compared, and the winner is promoted onto "main" with a
-- compare-and-set. The loser is sealed.
--
-- Run from the repository root after `make`:
--   LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/lib/?.so;;' lua5.4 examples/branches/run.lua
local eventstore = require("eventstore")

local here = arg and arg[0] and arg[0]:match("^(.*)/") or "."
local tmp = os.tmpname()
local path = tmp .. ".db"
-- A manual clock and counter ids: no time or id the store records depends
-- on when the example runs (both can be shared by the engine's threads,
-- unlike Lua functions).
local store <close> = eventstore.open("sqlite:" .. path, {
  clock = eventstore.manual_clock(1767225600000), -- 2026-01-01T00:00:00Z, standing still
  ids = eventstore.counter_ids("evt-"),           -- evt-000000000001, evt-000000000002, ...
})
local engine = eventstore.engine { store = store, scripts = here .. "/scripts" }

local CONV = "conv-1"

-- Calls fn(...), which must fail with an eventstore error; returns that error.
local function refused(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected the call to fail")
  assert(eventstore.is_error(err), tostring(err))
  return err
end

local function run_engine()
  io.stdout:flush() -- so the handlers' stderr lines come after what we printed so far
  local r = engine:run { until_idle = true }
  io.stderr:flush()
  assert(r.failed == 0 and r.dead == 0, "a handler failed")
  return r.handled
end

-- One line per event of a session after index `after`.
local function show(session, after, indent)
  for _, e in ipairs(store:read(session, { after = after })) do
    local p, what = e.payload, ""
    if e.type == "user.message" or e.type == "assistant.message" then
      what = p.text
    elseif e.type == "plan.chosen" then
      what = "strategy " .. p.strategy
    elseif e.type == "option.found" then
      what = ("%s %s %s -> %s, %d EUR"):format(p.mode, p.service, p.departs, p.arrives, p.price_eur)
    elseif e.type == "outcome.scored" then
      what = ("score %d"):format(p.score)
    elseif e.type == "trip.booked" then
      what = p.ref
    end
    local from = e.origin and (" (copy of %s #%d, %s)"):format(e.origin.session, e.origin.index, e.status) or ""
    print(("%s#%d %-17s %s%s"):format(indent or "   ", e.index, e.type, what, from))
  end
end

local function ref_text(name)
  local r = store:get_ref(name)
  return r and ("%s -> %s (head %d)"):format(r.name, r.session, r.head) or (name .. " absent")
end

print(("conversation %q on SQLite, ref \"main\" names the conversation"):format(CONV))

-- 1. The conversation so far: the engine answers each user message.
print()
print("1. the user asks; the engine's user.message handler answers")
store:put_ref("main", CONV)
engine:append(CONV, { { type = "user.message", payload = {
  text = "Get me from Lisbon to Porto on Friday, under 60 EUR, there by 13:00.",
  budget_eur = 60, arrive_by = "13:00" } } })
run_engine()
show(CONV, 0)
print("   " .. ref_text("main"))

-- 2. Fork at the agent's answer: two branches, each with #1..#2 copied
--    (fresh ids, origin = where they came from, processed); conv-1 unchanged.
local AT = store:head(CONV)
print()
print(("2. fork %s at #%d twice, one branch per plan"):format(CONV, AT))
local BRANCHES = {
  { name = "try-a", session = CONV .. "/try-a", ref = "try/a", strategy = "train" },
  { name = "try-b", session = CONV .. "/try-b", ref = "try/b", strategy = "bus" },
}
for _, b in ipairs(BRANCHES) do
  local l = store:fork(CONV, AT, b.session)
  print(("   fork(%q, %d, %q) -> parent %s at #%d, head %d"):format(CONV, AT, b.session, l.parent, l.at,
    store:head(b.session)))
end
print(("   %s holds copies of #1..#%d (with origin; all processed, so never dispatched again):")
  :format(BRANCHES[1].session, AT))
show(BRANCHES[1].session, 0, "     ")
local function ids(session)
  local list = {}
  for i, e in ipairs(store:read(session)) do list[i] = e.id end
  return table.concat(list, ", ")
end
print("   event ids (the copies get fresh ones):")
for _, session in ipairs({ CONV, BRANCHES[1].session, BRANCHES[2].session }) do
  print(("     %-13s %s"):format(session, ids(session)))
end
print(("   %s itself still has head %d"):format(CONV, store:head(CONV)))

-- 3. Each branch commits to its plan; the engine plays both out: the
--    plan.chosen handler picks the tool call from the payload's strategy,
--    option.found scores the result against the transcript's constraints.
print()
print("3. each branch gets its plan; the engine runs the handlers on both branches")
for _, b in ipairs(BRANCHES) do
  engine:append(b.session, { { type = "plan.chosen", payload = { strategy = b.strategy } } })
end
local handled = run_engine()
for _, b in ipairs(BRANCHES) do
  print(("   %s:"):format(b.session))
  show(b.session, AT, "     ")
end
print(("   (the engine handled %d events; %s got none of them: head %d)"):format(handled, CONV, store:head(CONV)))

-- 4. Compare the branches by their reducer state.
print()
print("4. compare the branches' transcript states (engine:state)")
local winner, loser
for _, b in ipairs(BRANCHES) do
  b.state = engine:state(b.session, "transcript")
  print(("   %s (%s): score %d: %s; %d messages"):format(b.name, b.state.strategy, b.state.score,
    b.state.verdict, #b.state.messages))
  if not winner or b.state.score > winner.state.score then winner = b end
end
for _, b in ipairs(BRANCHES) do if b ~= winner then loser = b end end
print(("   winner: %s (%s, score %d)"):format(winner.ref, winner.session, winner.state.score))

-- 5. Promote: move "main" to the winner, only if it still names conv-1.
print()
print("5. promote the winner onto main")
for _, b in ipairs(BRANCHES) do
  store:put_ref(b.ref, b.session)
  print("   put_ref: " .. ref_text(b.ref))
end
local moved = store:promote(winner.ref, "main", { expect = CONV })
print(("   promote(%q, \"main\", {expect = %q}) -> main names %s"):format(winner.ref, CONV, moved.session))
-- A second promote still expecting conv-1 (say, another agent that read
-- main before the first promote) is refused, and moves nothing.
local err = refused(store.promote, store, loser.ref, "main", { expect = CONV })
print(("   promote(%q, \"main\", {expect = %q}) again -> %s: expected %s, actual %s"):format(loser.ref, CONV,
  err.code, tostring(err.expected), tostring(err.actual)))
print("   nothing moved: " .. ref_text("main"))

-- 6. Where the branches came from.
print()
print("6. lineage")
local l = store:lineage(winner.session)
print(("   lineage(%q): parent %s at #%d"):format(winner.session, l.parent, l.at))
local kids = {}
for _, c in ipairs(store:children(CONV)) do kids[#kids + 1] = ("%s (at #%d)"):format(c.session, c.at) end
print(("   children(%q): %s"):format(CONV, table.concat(kids, ", ")))
print(("   lineage(%q): %s"):format(CONV, tostring(store:lineage(CONV))))

-- 7. Seal the losing branch: it stays readable, it takes no more events.
print()
print("7. seal the losing branch")
store:seal(loser.session, { reason = "lost to " .. winner.ref })
for _, row in ipairs(store:sessions { prefix = CONV .. "/" }.sessions) do
  print(("   %s: %d events, %s"):format(row.session, row.events,
    row.sealed and ("sealed (" .. row.seal_reason .. ")") or "open"))
end
err = refused(store.append, store, loser.session, { { type = "user.message", payload = { text = "hello?" } } })
print(("   append to %s -> refused, %s"):format(loser.session, tostring(err)))

-- 8. The application follows main: the conversation goes on on the winner.
print()
print("8. the user answers; the app appends to the session main names")
local session = store:get_ref("main").session
engine:append(session, { { type = "user.message", payload = { text = "Great, book it." } } })
run_engine()
show(session, store:head(session) - 3)
print(("   %s: booked %s; %s"):format(session, engine:state(session, "transcript").booked, ref_text("main")))

engine:close()
store:close()
for _, p in ipairs({ tmp, path, path .. "-wal", path .. "-shm", path .. "-journal" }) do os.remove(p) end
