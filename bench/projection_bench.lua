-- projection_bench.lua: a projection's catch-up beside the per-session
-- reducer fold of the same events, and its lag in a steady state
-- (bench/README.md "Projections"; docs/projections.md).
--
--   lua5.4 bench/projection_bench.lua DIR [EVENTS] [STEADY_S]
--
-- 1. EVENTS events (default 1,000,000; settled, nothing to dispatch) over
--    1,000 sessions, on memory: and on sqlite:DIR/proj.db. The fold: a
--    reducer summing a payload field, engine:state of every session with
--    snapshots off (each a fold from the first event). The catch-up: a
--    projection keyed by session doing the same sum, folded from position
--    0 by engine:run{until_idle}. Both as events per second of wall time.
-- 2. Steady state on sqlite: `eventstore run` on the file while this
--    process appends 1,000 events a second for STEADY_S seconds (default
--    20) and samples the projection's lag_ms (now - created_at of the
--    first event it has not folded) every 20 ms: its p50, p99 and max.
local eventstore = require("eventstore")

local DIR = assert(arg[1], "usage: projection_bench.lua DIR [EVENTS] [STEADY_S]")
local N = tonumber(arg[2] or 1000000)
local STEADY = tonumber(arg[3] or 20)
local SESSIONS = 1000
local BIN = (os.getenv("BUILD") or "build") .. "/bin/eventstore"

-- lua-system's clock (busted's dependency, from make deps) when there is
-- one: date(1) costs a process start (about 15 ms on these machines), and
-- the steady-state loop reads the clock several times per append, so it
-- was what held the appends to about 230 a second.
local ok_system, system = pcall(require, "system")
local function wall()
  if ok_system and type(system) == "table" and system.gettime then return system.gettime() end
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("l"))
  p:close()
  return t
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local scripts = DIR .. "/proj_scripts"
os.execute("rm -rf " .. q(scripts) .. " && mkdir -p " .. q(scripts .. "/handlers") .. " "
  .. q(scripts .. "/reducers") .. " " .. q(scripts .. "/projections"))
local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end
write(scripts .. "/reducers/sum.lua",
  "return { init = function() return { n = 0, v = 0 } end,\n"
  .. "  add = function(s, e) s.n = s.n + 1; s.v = s.v + e.payload.v end }\n")
write(scripts .. "/projections/sum.lua",
  "return { key = function(e) return e.session end,\n"
  .. "  add = function(s, e) s.n = (s.n or 0) + 1; s.v = (s.v or 0) + e.payload.v end }\n")

local function fill(store)
  local per = N // SESSIONS
  for k = 1, SESSIONS do
    local batch = {}
    for i = 1, per do batch[i] = { type = "add", payload = { v = i }, settled = true } end
    store:append(("s-%04d"):format(k), batch)
  end
  return per * SESSIONS
end

-- Rounds in alternating order (the fold first, then the catch-up first):
-- on these machines one run of either varies by up to 1.7x from one try
-- to the next (malloc's state after the fill: see bench/README.md), so a
-- figure is the median of ROUNDS same-round ratios. A round's catch-up
-- after the first is a rebuild (projection_control "rebuild": a new
-- generation folded from position 0, swapped in at the head).
local ROUNDS = tonumber(os.getenv("PROJ_BENCH_ROUNDS") or 5)

local function median(t)
  local c = table.move(t, 1, #t, 1, {})
  table.sort(c)
  return #c % 2 == 1 and c[(#c + 1) // 2] or (c[#c // 2] + c[#c // 2 + 1]) / 2
end

local function measure(url)
  local store = eventstore.open(url)
  local events = fill(store)
  local engine = eventstore.engine({ store = store, scripts = scripts, quiet = true, snapshot_every = 0 })
  local function fold()
    local t0 = wall()
    for k = 1, SESSIONS do engine:state(("s-%04d"):format(k), "sum") end
    return wall() - t0
  end
  local function catch_up(r)
    if r > 1 then store:projection_control("sum", "rebuild") end
    local t0 = wall()
    engine:run({ until_idle = true })
    local s = wall() - t0
    local row = engine:projections()[1]
    assert(row and row.lag == 0 and row.position > 0 and not row.rebuilding, "the projection did not catch up")
    local st = store:projection("sum", "s-0001")
    assert(st and st.n == events // SESSIONS, "wrong state")
    return s
  end
  local folds, catches, ratios = {}, {}, {}
  for r = 1, ROUNDS do
    local f, c
    if r % 2 == 1 then
      f = fold()
      c = catch_up(r)
    else
      c = catch_up(r)
      f = fold()
    end
    folds[r], catches[r], ratios[r] = f, c, f / c
  end
  engine:close()
  store:close()
  local per = {}
  for r = 1, ROUNDS do per[r] = ("%.2f"):format(ratios[r]) end
  print(("%-8s %d events, %d rounds: fold (engine:state of every session) median %.2f s, %.0f events/s; "
    .. "projection catch-up median %.2f s, %.0f events/s; catch-up/fold per round %s: median %.2fx")
    :format(url:match("^%a+"), events, ROUNDS, median(folds), events / median(folds), median(catches),
      events / median(catches), table.concat(per, " "), median(ratios)))
end

measure("memory:")
local db = DIR .. "/proj.db"
for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. suffix) end
measure("sqlite:" .. db)

-- 2. steady state
for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. suffix) end
local store = eventstore.open("sqlite:" .. db)
store:append("warm", { { type = "add", payload = { v = 1 }, settled = true } })
local log = DIR .. "/proj_engine.log"
local pid = io.popen(("%s run --db %s --scripts %s >%s 2>&1 & echo $!"):format(q(BIN), q("sqlite:" .. db),
  q(scripts), q(log))):read("l")
repeat
  local row = store:projections("sum")[1]
  if not row then store:wait("bench-pause", 0, 50) end
until row
local lags = {}
local start = wall()
local sent, next_sample = 0, start
while wall() - start < STEADY do
  -- 10 events every 10 ms of schedule
  local due = start + (sent + 10) / 1000
  local ahead = due - wall()
  if ahead > 0 then store:wait("bench-pause", 0, math.floor(ahead * 1000)) end
  local batch = {}
  for i = 1, 10 do batch[i] = { type = "add", payload = { v = i }, settled = true } end
  store:append(("s-%04d"):format(sent // 10 % SESSIONS + 1), batch)
  sent = sent + 10
  if wall() >= next_sample then
    local row = store:projections("sum")[1]
    lags[#lags + 1] = row.lag_ms
    next_sample = wall() + 0.02
  end
end
local elapsed = wall() - start
os.execute("kill " .. pid)
store:close()
table.sort(lags)
local function pct(p) return lags[math.max(1, math.ceil(#lags * p))] end
print(("steady   sqlite: %d appends in %.1f s (%.0f/s), %d lag samples: p50 %d ms, p99 %d ms, max %d ms")
  :format(sent, elapsed, sent / elapsed, #lags, pct(0.5), pct(0.99), lags[#lags]))
os.execute("rm -rf " .. q(scripts))
for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. suffix) end
