-- spec/support/failover.lua: one PostgreSQL failover under load, shared by
-- spec/33-postgres_failover_spec.lua (which asserts on its report) and
-- `make failover-demo` (spec/support/failover_demo.lua, which prints it).
--
-- A primary and a standby (spec/support/pg_pair.sh, sync or async); three
-- `eventstore run` engines, `eventstore serve --no-engine`, an appending
-- process (spec/support/pg_restart_appender.lua) and an HTTP client
-- (spec/support/http_failover_client.lua), all on the pair's multi-host
-- URL. Once each has made progress, the primary is killed with -9; once
-- the HTTP client has seen /healthz answer 503, the standby is promoted;
-- the run waits until every job is processed and the clients have gone on
-- after the switch, stops everything and counts, against the new primary:
--
--   report = {mode, jobs, processed, no_result, doubled (jobs with more
--   than one result), acked (appender batches acknowledged), lost (acked
--   batches missing), extra (stored batches never acknowledged: allowed,
--   an answer lost with the primary), dup_events (ids stored twice),
--   web_acked, web_lost, web_dup, web_503, health (the /healthz statuses
--   the client saw, in order), proj_keys (keys of the keyed projection),
--   proj_wrong (its keys whose state is not a fold from scratch),
--   proj_total (the global projection's count of jobs), seconds, logs
--   (what to print on failure)}
--
-- The engines also run two projections (§8; one runner each, by lease,
-- among the three engines): done_per_session (keyed: job results per
-- session) and jobs_total (one state); after the switch both must equal a
-- fold from scratch of what the new primary holds.
local eventstore = require("eventstore")
local helpers = require("helpers")
local ph = require("proc_helpers")
local hh = require("http_helpers")

local F = {}
local q = helpers.sh_quote
local LUA = os.getenv("LUA") or "lua5.4"
local support = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local PAIR = support .. "pg_pair.sh"

local PROJECTIONS = {
  done_per_session = [[
return { key = function(e) return e.session end,
         ["job.done"] = function(s) s.n = (s.n or 0) + 1 end }]],
  jobs_total = [[return { job = function(s) s.n = (s.n or 0) + 1 end }]],
}

local HANDLER = [[
return function(event, ctx)
  return { { type = "job.done", payload = { of = event.index, attempt = ctx.attempt } } }
end
]]

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  local ok = p:close()
  return ok, out
end

-- Whether PostgreSQL (and pg_basebackup) is installed.
function F.available()
  return sh("ls /usr/lib/postgresql/*/bin/pg_basebackup >/dev/null || command -v pg_basebackup")
end

-- Counts lines matching pattern in text.
local function count(text, pattern)
  local n = 0
  for _ in text:gmatch(pattern) do n = n + 1 end
  return n
end

-- Runs one failover. opts: mode ("sync" or "async"), jobs (default 2000),
-- stall_s (how long without progress is a hang; default 180).
function F.run(opts)
  local mode, jobs, stall_s = opts.mode or "sync", opts.jobs or 2000, opts.stall_s or 180
  local started = helpers.wall()
  local dir = os.tmpname()
  os.remove(dir)
  local ok, out = sh(("sh %s start %s %s"):format(q(PAIR), q(dir), mode))
  if not ok then error("pg_pair.sh start failed:\n" .. out, 2) end
  local base_url = out:match("(postgresql://%S+)")
  local url = helpers.pg_fresh_url(base_url) .. "&timeout_ms=5000"
  local procs, files, srv = {}, {}, nil
  local report = { mode = mode, jobs = jobs }
  local function finish()
    if srv then hh.stop(srv) end
    for _, p in ipairs(procs) do ph.reap(p) end
    for _, f in ipairs(files) do os.remove(f) end
    sh(("sh %s stop %s"):format(q(PAIR), q(dir)))
  end
  local okrun, err = pcall(function()
    local scripts = os.tmpname()
    os.remove(scripts)
    assert(os.execute("mkdir -p " .. q(scripts .. "/handlers")))
    helpers.write_file(scripts .. "/handlers/job.lua", HANDLER)
    files[#files + 1] = scripts .. "/handlers/job.lua"
    assert(os.execute("mkdir -p " .. q(scripts .. "/projections")))
    for name, src in pairs(PROJECTIONS) do
      helpers.write_file(scripts .. "/projections/" .. name .. ".lua", src)
      files[#files + 1] = scripts .. "/projections/" .. name .. ".lua"
    end
    local store = eventstore.open(url)
    local per = 50
    for s = 1, jobs // per do
      local batch = {}
      for i = 1, per do batch[i] = { type = "job", payload = { i = i } } end
      store:append(("j-%03d"):format(s), batch)
    end
    local logbase = os.tmpname()
    files[#files + 1] = logbase
    local stop_file = logbase .. ".stop"
    files[#files + 1] = stop_file
    local elogs, engines = {}, {}
    local alog, wlog = logbase .. ".appender", logbase .. ".web"
    files[#files + 1], files[#files + 2] = alog, wlog
    local appender = ph.spawn({ LUA, support .. "pg_restart_appender.lua", url, "notes", "5", "10", stop_file }, {}, alog)
    procs[#procs + 1] = appender
    srv = hh.serve({ db = url, scripts = scripts, no_engine = true })
    local web = ph.spawn({ LUA, support .. "http_failover_client.lua", srv.host, tostring(srv.port), "admin-token",
      "web", stop_file }, {}, wlog)
    procs[#procs + 1] = web
    -- the clients first, then the engines: the kill must find jobs
    -- pending and both clients appending
    local function text(f) return helpers.read_file(f) or "" end
    helpers.wait_until(function()
      if ph.status(appender) or ph.status(web) then error("a client ended early", 0) end
      return count(text(alog), "acked") >= 1 and count(text(wlog), "acked") >= 1
    end, "the clients' first appends", stall_s)
    for e = 1, 3 do
      elogs[e] = logbase .. ".engine" .. e
      files[#files + 1] = elogs[e]
      engines[e] = ph.spawn({ helpers.BIN, "run", "--db", url, "--scripts", scripts, "--workers", "2",
        "--ttl-ms", "5000" }, {}, elogs[e])
      procs[#procs + 1] = engines[e]
    end
    report.logs = function()
      local parts = {}
      for e = 1, #elogs do parts[#parts + 1] = ("--- engine %d:\n%s"):format(e, ph.tail(elogs[e], 8)) end
      parts[#parts + 1] = "--- appender:\n" .. ph.tail(alog, 8)
      parts[#parts + 1] = "--- http client:\n" .. ph.tail(wlog, 8)
      parts[#parts + 1] = "--- serve:\n" .. ph.tail(srv.log, 8)
      return table.concat(parts, "\n")
    end
    local function alive_all_engines()
      for _, p in ipairs(engines) do
        if ph.status(p) then error("an engine ended early", 0) end
      end
    end
    local function alive_all()
      for _, p in ipairs({ engines[1], engines[2], engines[3], appender, web, srv.proc }) do
        if ph.status(p) then error("a process ended early", 0) end
      end
    end
    local function pending()
      local okp, n = pcall(function() return store:pending_types().job or 0 end)
      return okp and n or nil
    end
    -- Waits until cond() holds; fails only when nothing moved for stall_s.
    local function wait_for(what, cond)
      local since, last = helpers.wall(), nil
      while not cond() do
        alive_all()
        local now = (pending() or -1) .. "/" .. #text(alog) .. "/" .. #text(wlog)
        if now ~= last then last, since = now, helpers.wall() end
        if helpers.wall() - since > stall_s then error("stalled waiting for " .. what, 0) end
        helpers.sleep(0.1)
      end
    end

    wait_for("progress before the kill", function()
      local p = pending()
      return p and p < jobs * 9 // 10
    end)
    report.pending_at_kill = pending()
    local okk, kout = sh(("sh %s kill-primary %s"):format(q(PAIR), q(dir)))
    if not okk then error("kill-primary failed: " .. kout, 0) end
    local killed_at = helpers.wall()
    wait_for("the HTTP client to see /healthz 503", function() return text(wlog):find("healthz 503", 1, true) end)
    local okp, pout = sh(("sh %s promote %s"):format(q(PAIR), q(dir)))
    if not okp then error("promote failed: " .. pout, 0) end
    report.switch_s = helpers.wall() - killed_at
    local acked_at_promote = count(text(wlog), "acked")
    wait_for("every job processed and the clients going on", function()
      return pending() == 0 and count(text(wlog), "acked") >= acked_at_promote + 3 and
          text(wlog):match("healthz 503.*healthz 200") ~= nil
    end)
    helpers.write_file(stop_file, "stop\n")
    report.appender_rc = ph.wait(appender, 120)
    report.web_rc = ph.wait(web, 120)
    -- the clients have stopped: the projections catch up with the head
    helpers.wait_until(function()
      alive_all_engines()
      local okp, rows = pcall(store.projections, store)
      if not okp or #rows < 2 then return false end
      for _, row in ipairs(rows) do
        if row.lag ~= 0 or row.status ~= "running" or row.building then return false end
      end
      return true
    end, "the projections to catch up", stall_s)
    for _, e in ipairs(engines) do ph.signal(e, "TERM") end
    for _, e in ipairs(engines) do ph.wait(e, 60) end

    -- Count, against the new primary.
    report.processed, report.no_result, report.doubled = 0, 0, 0
    report.proj_keys, report.proj_wrong = 0, 0
    local total = 0
    for s = 1, jobs // per do
      local session = ("j-%03d"):format(s)
      local events = store:read(session)
      local results, done = {}, 0
      for _, e in ipairs(events) do
        if e.type == "job.done" then
          results[e.cause.index] = (results[e.cause.index] or 0) + 1
          done = done + 1
        elseif e.type == "job" then
          total = total + 1
        end
      end
      local state = store:projection("done_per_session", session)
      if state then report.proj_keys = report.proj_keys + 1 end
      if not state or state.n ~= done then report.proj_wrong = report.proj_wrong + 1 end
      for _, e in ipairs(events) do
        if e.type == "job" then
          if e.status == "processed" then report.processed = report.processed + 1 end
          local n = results[e.index] or 0
          if n == 0 then report.no_result = report.no_result + 1 end
          if n > 1 then report.doubled = report.doubled + 1 end
        end
      end
    end
    local function tally(session, tag_of, acked_ks)
      local seen, dup, stored = {}, 0, {}
      for _, e in ipairs(store:read(session)) do
        if seen[e.id] then dup = dup + 1 end
        seen[e.id] = true
        stored[tag_of(e.id)] = true
      end
      local lost, extra = 0, 0
      for k in pairs(acked_ks) do
        if not stored[k] then lost = lost + 1 end
      end
      for k in pairs(stored) do
        if not acked_ks[k] then extra = extra + 1 end
      end
      return lost, extra, dup
    end
    local acked = {}
    for k in text(alog):gmatch("acked (%d+)") do acked[tonumber(k)] = true end
    report.acked = count(text(alog), "acked")
    report.lost, report.extra, report.dup_events = tally("notes", function(id) return tonumber(id:match("^b(%d+)-")) end, acked)
    local wacked = {}
    for k in text(wlog):gmatch("acked (%d+)") do wacked[tonumber(k)] = true end
    report.web_acked = count(text(wlog), "acked")
    report.web_lost, report.web_extra, report.web_dup = tally("web", function(id) return tonumber(id:match("^w(%d+)-")) end, wacked)
    report.web_503 = count(text(wlog), "\n503 ")
    report.health = {}
    for st in text(wlog):gmatch("healthz (%S+)") do report.health[#report.health + 1] = st end
    local totals = store:projection("jobs_total", "")
    report.proj_total = totals and totals.n or -1
    report.proj_total_wrong = report.proj_total ~= total
    report.web_wrong = text(wlog):find("wrong answer", 1, true) ~= nil or text(wlog):find("\nstatus ", 1, true) ~= nil
    store:close()
  end)
  report.seconds = helpers.wall() - started
  local logs = report.logs and report.logs() or ""
  report.logs = logs
  finish()
  if not okrun then error(tostring(err) .. "\n" .. logs, 2) end
  return report
end

-- One line for a person.
function F.summary(r)
  return ("%s: %d jobs, %d processed, %d without result, %d with two; appender %d batches acked, %d lost, %d dup ids, "
    .. "%d stored unacked; http %d acked, %d lost, %d dup, %d x 503; /healthz %s; projections %d keys, %d wrong, "
    .. "total %d; switch %.1f s; run %.0f s")
      :format(r.mode, r.jobs, r.processed, r.no_result, r.doubled, r.acked, r.lost, r.dup_events, r.extra,
        r.web_acked, r.web_lost, r.web_dup, r.web_503, table.concat(r.health, ">"), r.proj_keys or -1,
        r.proj_wrong or -1, r.proj_total or -1, r.switch_s or -1, r.seconds)
end

return F
