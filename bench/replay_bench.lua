-- replay_bench.lua: eventstore.replay over the demo app's history
-- (bench/README.md, "Replay").
--
--   lua5.4 bench/replay_bench.lua [SESSIONS]     (default 10000)
--
-- 1. Live: SESSIONS orders of the demo app (scripts/) appended to a
--    memory: store on a manual clock and dispatched by one engine worker
--    until nothing is pending (the clock moved on for the backoffs and
--    timers): the dispatch rate, handled events per second.
-- 2. Replay of the same scripts over that history: sessions and events
--    per second (every stored event of a session is replayed or compared),
--    and the process's RSS after the first tenth of the sessions and at
--    the end: memory must not grow with the number of sessions. The rate
--    against the live dispatch's is printed in wall-clock time (issue 27's
--    target) and in CPU time (less moved by other load on the machine).
-- 3. The fold: engine:state of every session with each of the demo's
--    reducers, snapshots off (each a fold from the first event), beside
--    --reducers-only against a baseline that edits one of the two reducers
--    (the common case: a change to one read model of several). The edited
--    reducer is folded on both sides and the states compared; the other,
--    byte for byte the same on both sides, is folded once (docs/replay.md):
--    three folds per session where the fold does two. The ratio is per
--    session (issue 27's 0.8x target), and per fold.
-- Handlers' ctx.log lines go to stderr: run it with 2>/dev/null.
local eventstore = require("eventstore")

local N = tonumber(arg[1] or 10000)
local SCRIPTS = "scripts"

-- lua-system's clock (busted's dependency, from make deps) when there is
-- one: date(1) costs a process start, about 15 ms on these machines.
local ok_system, system = pcall(require, "system")
local function wall()
  if ok_system and type(system) == "table" and system.gettime then return system.gettime() end
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("l"))
  p:close()
  return t
end

local function rss_kb()
  local f = io.open("/proc/self/status")
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)"))
end

local CARDS = { "tok_visa", "tok_visa", "tok_visa", "tok_flaky", "tok_declined" }
local SKUS = { "TEA-01", "MUG-02", "POT-03" }

local clock = eventstore.manual_clock(1000000)
local store = eventstore.open("memory:", { clock = clock })
-- snapshots off: the fold below folds every session from its first event
local engine = eventstore.engine({ store = store, scripts = SCRIPTS, quiet = true, snapshot_every = 0 })
for i = 1, N do
  clock:set(1000000 + i)
  engine:append(("order-%06d"):format(i), { {
    type = "order.placed",
    payload = { customer = "c" .. i, card = CARDS[i % #CARDS + 1],
      items = { { sku = SKUS[i % #SKUS + 1], qty = i % 4 + 1 } } },
  } })
end
-- The first run handles every order.placed and what follows at once; the
-- backoffs and timers are then fired by moving the clock an hour on (the
-- demo's handlers never read the clock, so firing late changes nothing).
local t0 = wall()
local live_c0 = os.clock()
local handled = engine:run({ until_idle = true }).handled
while store:stats().pending > 0 do
  clock:advance(3600 * 1000)
  handled = handled + engine:run({ until_idle = true }).handled
end
local live_s = wall() - t0
local live_cpu = os.clock() - live_c0
engine:close()
local events = #store:read_all()
print(("live dispatch: %d sessions, %d events stored, %d handled in %.2f s: %.0f handled/s"):format(N, events,
  handled, live_s, handled / live_s))

local rss_early, replayed = nil, 0
t0 = wall()
local c0 = os.clock()
local report = eventstore.replay({ store = store, scripts = SCRIPTS,
  each = function(s) replayed = replayed + 1 end,
  progress = function(done, total) if done == math.max(1, total // 10) then rss_early = rss_kb() end end })
local replay_s = wall() - t0
local replay_cpu = os.clock() - c0
local rss_end = rss_kb()
local m = report.summary
print(("replay: %d sessions (%d identical, %d diverged, %d failed) in %.2f s: %.0f sessions/s, %.0f events/s "
  .. "(%.2fx the live dispatch's handled/s)"):format(m.replayed, m.identical, m.diverged, m.failed, replay_s,
  m.replayed / replay_s, events / replay_s, (events / replay_s) / (handled / live_s)))
print(("replay CPU (every thread of the process): %.2f s, %.0f sessions per CPU second"):format(replay_cpu,
  m.replayed / replay_cpu))
-- The same ratio in CPU time, which a loaded machine moves less than the
-- wall-clock one (the live dispatch's CPU: its worker and completer threads).
print(("replay per CPU second: %.0f events, %.2fx the live dispatch's %.0f handled per CPU second (%.2f s)")
  :format(events / replay_cpu, (events / replay_cpu) / (handled / live_cpu), handled / live_cpu, live_cpu))
print(("replay RSS: %d kB after %d sessions, %d kB after %d"):format(rss_early or 0, math.max(1, N // 10),
  rss_end, N))

local REDUCERS = { "inventory", "order" }
local folder = eventstore.engine({ store = store, scripts = SCRIPTS, quiet = true, snapshot_every = 0 })
t0 = wall()
for i = 1, N do
  local name = ("order-%06d"):format(i)
  for _, r in ipairs(REDUCERS) do folder:state(name, r) end
end
local fold_s = wall() - t0
folder:close()
print(("fold: %d sessions x %d reducers (engine:state, snapshots off) in %.2f s: %.0f sessions/s, %.0f folds/s")
  :format(N, #REDUCERS, fold_s, N / fold_s, N * #REDUCERS / fold_s))

-- Reducers-only against a baseline: the scripts in another directory with
-- `edit` (paths below scripts/) edited by a comment added, so the states
-- stay the same and every session must come out identical, but the replay
-- cannot know that: an edited reducer is folded on both sides, an edited
-- upcaster makes both sides read (and fold) apart. `folds` per session.
local function reducers_only(label, edit, folds_per_session)
  local baseline = os.tmpname()
  os.remove(baseline)
  assert(os.execute("cp -r " .. SCRIPTS .. " '" .. baseline .. "'"))
  for _, path in ipairs(edit) do
    local f = assert(io.open(baseline .. "/" .. path, "a"))
    f:write("-- the baseline's edit\n")
    f:close()
  end
  local t = wall()
  local c = os.clock()
  local rep = eventstore.replay({ store = store, scripts = SCRIPTS, baseline = baseline, reducers_only = true,
    each = function() end })
  local secs, cpu = wall() - t, os.clock() - c
  os.execute("rm -rf '" .. baseline .. "'")
  local n = rep.summary.replayed
  assert(rep.summary.identical == N, "reducers-only: not every session identical")
  print(("reducers-only, %s: %d sessions in %.2f s: %.0f sessions/s (%.2fx the fold's), %.0f folds/s (%d per "
    .. "session): %.2fx the fold's folds/s; CPU %.2f s"):format(label, n, secs, n / secs, (n / secs) / (N / fold_s),
    n * folds_per_session / secs, folds_per_session, (n * folds_per_session / secs) / (N * #REDUCERS / fold_s), cpu))
end
-- The common case, a change to one read model of several (the target's
-- figure): the other reducer is folded once.
reducers_only("order reducer edited", { "reducers/order.lua" }, #REDUCERS + 1)
-- Everything changed: both sides read and folded apart.
reducers_only("every reducer and upcaster edited", { "reducers/order.lua", "reducers/inventory.lua",
  "upcasters/order.placed.lua" }, #REDUCERS * 2)
store:close()
