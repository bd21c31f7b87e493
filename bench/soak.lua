-- bench/soak.lua: a long run under a mixed load, looking for slow leaks
-- (issue 29 item 4; `make soak`, bench/README.md "Soak"; a 90-second run is
-- spec/99-soak_spec.lua).
--
-- `eventstore serve --no-engine` on a sqlite: file, and an `eventstore run`
-- engine on the same file, killed with -9 every SOAK_KILL_S seconds and
-- started again. One driver (this process) loops over: an HTTP append of
-- five jobs (the engine's) and two tasks (remote workers'), a claim of
-- tasks by a remote worker over HTTP and their completions, a reducer
-- state read, and draining a live SSE tail of every event; each request's
-- latency is kept. Every SOAK_SAMPLE_S seconds it samples serve's resident
-- memory (VmRSS), open descriptors (/proc/PID/fd), threads, and the
-- window's latency p50/p99, and prints one line.
--
-- The trend test: the first sample is warm-up and left out; of the rest,
-- a figure fails when its last third's mean is above its first third's by
-- more than 10% and by more than a floor (1 MiB, 2 descriptors, 1 thread,
-- 5 ms: below that, integer steps and scheduling noise). Latency counts
-- only with SOAK_LATENCY=1 (make soak sets it): beside other tests, as in
-- make test, latency follows the machine's load, not the server. At the
-- end every job and task must have exactly one result (nothing lost or
-- doubled across the kills). Exits 0 when all holds, 1 otherwise.
--
-- Environment: SOAK_SECONDS (default 3600), SOAK_SAMPLE_S (default 60, or
-- SOAK_SECONDS/18 when that is less, 10 at least), SOAK_KILL_S (default
-- 180), SOAK_PAUSE_MS (pause between loops, default 20: the load is steady,
-- not the most the machine can do), BUILD.
--
-- The engine also runs a projection (§8: jobs per session); the loop reads
-- its row over HTTP, and at the end each session's state must equal a
-- fold from scratch, across the kills (exactly once).
package.path = "spec/?.lua;" .. package.path
local eventstore = require("eventstore")
local helpers = require("helpers")
local ph = require("proc_helpers")
local hh = require("http_helpers")

local json = eventstore.json
local function env_num(name, default)
  return tonumber(os.getenv(name) or "") or default
end
local SECONDS = env_num("SOAK_SECONDS", 3600)
local SAMPLE_S = env_num("SOAK_SAMPLE_S", math.max(10, math.min(60, SECONDS // 18)))
local KILL_S = env_num("SOAK_KILL_S", 180)
local PAUSE = env_num("SOAK_PAUSE_MS", 20) / 1000
local LATENCY = os.getenv("SOAK_LATENCY") == "1"
local TOKEN = "admin-token"

local scripts = hh.scripts({
  ["handlers/job.lua"] = [[
return function(event, ctx)
  return { { type = "job.done", id = ("d-%s-%d-%d"):format(event.session, event.index, ctx.attempt),
  payload = { of = event.index } } }
end
]],
  ["projections/jobs_per_session.lua"] = [[
return { key = function(e) return e.session end, job = function(s) s.n = (s.n or 0) + 1 end }
]],
  ["reducers/jobs.lua"] = [[
return {
  init = function() return { n = 0 } end,
  job = function(state, event) state.n = state.n + 1; return state end,
}
]],
})
local work = os.tmpname()
os.remove(work)
assert(os.execute("mkdir -p " .. helpers.sh_quote(work)))
local db = "sqlite:" .. work .. "/soak.db"
local srv = hh.serve({ db = db, scripts = scripts, no_engine = true })
local engine_log = work .. "/engine.log"
local function start_engine()
  return ph.spawn({ helpers.BIN, "run", "--db", db, "--scripts", scripts, "--workers", "2", "--ttl-ms", "3000" },
    {}, engine_log)
end
local engine = start_engine()

local function proc_figures(pid)
  local status = helpers.read_file(("/proc/%d/status"):format(pid)) or ""
  local fds = 0
  local p = io.popen(("ls /proc/%d/fd 2>/dev/null"):format(pid))
  for _ in p:lines() do fds = fds + 1 end
  p:close()
  return tonumber(status:match("VmRSS:%s*(%d+)")) or 0, fds, tonumber(status:match("Threads:%s*(%d+)")) or 0
end

local function percentile(list, p)
  if #list == 0 then return 0 end
  table.sort(list)
  return list[math.max(1, math.ceil(#list * p))]
end

local lat = {}
local function timed(fn)
  local t0 = helpers.wall()
  local a, b = fn()
  lat[#lat + 1] = (helpers.wall() - t0) * 1000
  return a, b
end

local tail = assert(hh.sse(srv, "/v1/stream", { token = TOKEN, timeout = 30 }))
local samples = {}
local started = helpers.wall()
local next_sample, next_kill = started + SAMPLE_S, started + KILL_S
local k, kills, tailed, claimed = 0, 0, 0, 0
local failures = {}
print(("# soak: %d s, a sample every %d s, engine kill -9 every %d s; serve pid %d"):format(SECONDS, SAMPLE_S,
  KILL_S, srv.proc.pid))
print("#   t_s  rss_kib  fds  threads  p50_ms  p99_ms  requests")
while helpers.wall() - started < SECONDS do
  k = k + 1
  local session = ("s%02d"):format(k % 20)
  local events = {}
  for i = 1, 5 do events[i] = { type = "job", id = ("j%d-%d"):format(k, i) } end
  events[6] = { type = "task", id = ("t%d-1"):format(k) }
  events[7] = { type = "task", id = ("t%d-2"):format(k) }
  local st, body = timed(function() return hh.post(srv, TOKEN, hh.spath(session, "events"), { events = events }) end)
  if st ~= 200 and st ~= 201 then failures[#failures + 1] = ("append: %s %s"):format(st, json.encode(body)) end
  st, body = timed(function()
    return hh.post(srv, TOKEN, "/v1/claims", { holder = "remote", ttl_ms = 30000, limit = 4, types = { "task" } })
  end)
  if st == 200 and type(body) == "table" then
    for _, e in ipairs(body.events or {}) do
      local cst, cbody = timed(function()
        return hh.post(srv, TOKEN, hh.spath(e.session, "events", e.index, "complete"), {
          attempt = e.attempt,
          events = { { type = "task.done", id = ("r-%s-%d-%d"):format(e.session, e.index, e.attempt) } },
        })
      end)
      if cst ~= 200 then failures[#failures + 1] = ("complete: %s %s"):format(cst, json.encode(cbody)) end
      claimed = claimed + 1
    end
  else
    failures[#failures + 1] = ("claim: %s %s"):format(st, json.encode(body))
  end
  st, body = timed(function() return hh.get(srv, TOKEN, hh.spath(session, "state", "jobs")) end)
  if st ~= 200 then failures[#failures + 1] = ("state: %s %s"):format(st, json.encode(body)) end
  st, body = timed(function() return hh.get(srv, TOKEN, "/v1/projections") end)
  if st ~= 200 then failures[#failures + 1] = ("projections: %s %s"):format(st, json.encode(body)) end
  tailed = tailed + #hh.sse_take(tail, 200, 0.01)
  if #failures > 0 then break end
  local now = helpers.wall()
  if now >= next_kill then
    ph.signal(engine, "KILL")
    ph.wait(engine, 30)
    ph.reap(engine)
    engine = start_engine()
    kills = kills + 1
    next_kill = now + KILL_S
  end
  if now >= next_sample then
    local rss, fds, threads = proc_figures(srv.proc.pid)
    local s = { t = now - started, rss = rss, fds = fds, threads = threads, p50 = percentile(lat, 0.5),
      p99 = percentile(lat, 0.99), n = #lat }
    samples[#samples + 1] = s
    print(("  %5.0f  %7d  %3d  %7d  %6.1f  %6.1f  %8d"):format(s.t, s.rss, s.fds, s.threads, s.p50, s.p99, s.n))
    io.stdout:flush()
    lat = {}
    next_sample = now + SAMPLE_S
  end
  helpers.sleep(PAUSE)
end
tail:close()

-- The engine finishes what is pending; then nothing lost or doubled.
local store = eventstore.open(db)
local since, last = helpers.wall(), nil
while (store:pending_types().job or 0) > 0 do
  local n = store:pending_types().job
  if n ~= last then last, since = n, helpers.wall() end
  if helpers.wall() - since > 120 or ph.status(engine) then
    failures[#failures + 1] = ("the engine stopped getting on: %d jobs pending\n%s"):format(n, ph.tail(engine_log, 20))
    break
  end
  helpers.sleep(0.2)
end
-- ... and its projection catches up with the head
since = helpers.wall()
while #failures == 0 do
  local row = store:projections("jobs_per_session")[1]
  if row and row.lag == 0 and row.status == "running" and not row.building then break end
  if helpers.wall() - since > 120 or ph.status(engine) then
    failures[#failures + 1] = ("the projection did not catch up: %s\n%s"):format(json.encode(row or {}),
      ph.tail(engine_log, 20))
  end
  helpers.sleep(0.2)
end
local jobs, tasks = 0, 0
for s = 0, 19 do
  local results = {}
  -- every page of the session
  local events, after = {}, 0
  repeat
    local page = store:read(("s%02d"):format(s), { after = after, limit = 1000 })
    for _, e in ipairs(page) do events[#events + 1] = e end
    after = #page > 0 and page[#page].index or after
  until #page == 0
  for _, e in ipairs(events) do
    if e.cause then
      local key = e.cause.index
      if results[key] then failures[#failures + 1] = ("s%02d/%d has two results"):format(s, key) end
      results[key] = true
    end
  end
  local session_jobs = 0
  for _, e in ipairs(events) do
    if e.type == "job" then
      jobs = jobs + 1
      session_jobs = session_jobs + 1
      if not results[e.index] or e.status ~= "processed" then
        failures[#failures + 1] = ("job s%02d/%d is %s, with %s result"):format(s, e.index, e.status,
          results[e.index] and "a" or "no")
      end
    elseif e.type == "task" then
      tasks = tasks + 1
    end
  end
  local state = store:projection("jobs_per_session", ("s%02d"):format(s))
  if session_jobs > 0 and (not state or state.n ~= session_jobs) then
    failures[#failures + 1] = ("projection state of s%02d: %s, a fold from scratch: %d jobs"):format(s,
      json.encode(state), session_jobs)
  end
end
store:close()
ph.signal(engine, "TERM")
ph.wait(engine, 30)
ph.reap(engine)
local rc = hh.stop(srv)
if rc ~= 0 then failures[#failures + 1] = "serve exited " .. tostring(rc) end

-- The trend test.
local figures = {
  { "rss", "rss_kib", 1024 }, { "fds", "fds", 2 }, { "threads", "threads", 1 },
}
if LATENCY then
  figures[#figures + 1] = { "p50", "p50_ms", 5 }
  figures[#figures + 1] = { "p99", "p99_ms", 5 }
end
local kept = { table.unpack(samples, 2) }
local third = #kept // 3
print(("# %d loops, %d tasks claimed remotely, %d events tailed, %d engine kills; %d jobs, %d tasks stored")
  :format(k, claimed, tailed, kills, jobs, tasks))
if third < 1 then
  failures[#failures + 1] = ("%d samples after warm-up: too few for a trend (SOAK_SECONDS / SOAK_SAMPLE_S >= 4)")
      :format(#kept)
else
  for _, f in ipairs(figures) do
    local a, b = 0, 0
    for i = 1, third do a = a + kept[i][f[1]] end
    for i = #kept - third + 1, #kept do b = b + kept[i][f[1]] end
    a, b = a / third, b / third
    local up = b > a * 1.10 and b - a > f[3]
    print(("# trend %-8s first third %.1f, last third %.1f: %s"):format(f[2], a, b, up and "UP" or "flat"))
    if up then failures[#failures + 1] = f[2] .. " trends upward" end
  end
end
hh.rm(scripts)
os.execute("rm -rf " .. helpers.sh_quote(work))
if #failures > 0 then
  for i = 1, math.min(#failures, 20) do print("not ok: " .. failures[i]) end
  if #failures > 20 then print(("not ok: and %d more"):format(#failures - 20)) end
  os.exit(1)
end
print("# soak: ok")
os.exit(0)
