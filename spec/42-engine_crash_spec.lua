-- Engine under kill -9 (docs/contract.md §4: "a worker that dies or is killed loses
-- nothing"; every handler's returned events are appended exactly once).
--
-- The parent appends 300 events over a few sessions (some laned) to a
-- SQLite file, then starts a child process running the engine on that file
-- (run{until_idle = true}, two workers, real clock, ttl_ms = 500) and kills
-- it with SIGKILL at random moments, restarting it each time; a final child
-- runs until nothing is pending. Then every original event must be
-- processed, with exactly one result event whose cause is {index, attempt}
-- of the attempt that processed it, and the results of each lane must be in
-- index order. SQLite only: memory stores do not outlive their process.
local eventstore = require("eventstore")
local eh = require("engine_helpers")

local LUA = os.getenv("LUA") or "lua5.4"
local KILLS = 6
local EVENTS = 300
local q = eh.sh_quote

local helpers = require("helpers")
local sleep = helpers.sleep

-- The repository root as an absolute path (this file is ROOT/spec/...).
local function repo_root()
  local spec_dir = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]*$") or "spec"
  if spec_dir:sub(1, 1) ~= "/" then
    local p = assert(io.popen("pwd"))
    local cwd = p:read("l")
    p:close()
    spec_dir = cwd .. "/" .. spec_dir
  end
  return spec_dir .. "/.."
end

local alive = helpers.alive

-- The child: opens the engine on the sqlite file (real clock) and runs it.
-- MODE "work": one run{until_idle = true} (usually killed before it ends);
-- MODE "final": runs until no event of the file is pending (at most 40 s).
local CHILD = [==[
local root, db, scripts, mode = arg[1], arg[2], arg[3], arg[4]
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = root .. "/build/lib/?.so;" .. package.cpath
local eventstore = require("eventstore")
local engine = eventstore.engine({
  store = "sqlite:" .. db, scripts = scripts, workers = 2, ttl_ms = 500,
  max_failures = 1000, backoff_ms = 20, backoff_cap_ms = 100,
  instruction_budget = 1000000000,
})
if mode == "work" then
  engine:run({ until_idle = true })
  engine:close()
  os.exit(0)
end
local inspect = eventstore.open("sqlite:" .. db)
-- gives up only when nothing was handled for 60 s (a hang), however slowly
-- a loaded machine gets through
local least, since = math.maxinteger, os.time()
while true do
  local r = engine:run({ until_idle = true })
  local pending, dead = 0, 0
  for _, e in ipairs(inspect:read_all({ after = 0 })) do
    if e.status == "pending" then pending = pending + 1 end
    if e.status == "dead" then dead = dead + 1 end
  end
  if pending == 0 then
    print(("final: nothing pending (%d dead)"):format(dead))
    break
  end
  if pending < least then least, since = pending, os.time() end
  if os.time() - since > 60 then
    io.stderr:write(("final: still %d pending, none handled for 60 s\n"):format(pending))
    os.exit(3)
  end
  os.execute("sleep 0.05")
end
inspect:close()
engine:close()
os.exit(0)
]==]

-- The handler: some work (a few ms), then one result event carrying the
-- index and attempt it handled.
local HANDLER = [[
return function(event, ctx)
  local x = 0
  for i = 1, 2000000 + (event.index % 7) * 200000 do x = x + i end
  return { { type = "job.done", payload = { of = event.index, attempt = ctx.attempt, lane = event.lane } } }
end
]]

describe("sqlite: engine under kill -9", function()
  local base, db, script, logfile, dir

  before_each(function()
    base = os.tmpname()
    db, script, logfile = base .. ".db", base .. ".child.lua", base .. ".log"
    dir = eh.scripts_dir()
  end)

  after_each(function()
    for _, suffix in ipairs({ "", "-wal", "-shm", "-journal" }) do os.remove(db .. suffix) end
    os.remove(script)
    os.remove(logfile)
    os.remove(base)
    eh.cleanup()
  end)

  it("handles every event, and appends every handler's result exactly once", function()
    assert.is_function(eventstore.engine, "eventstore.engine does not exist")
    helpers.seed("engine crash: kill moments")
    local root = repo_root()
    eh.write_file(script, CHILD)
    eh.handler(dir, "job", HANDLER)

    local sessions = { "s1", "s2", "s3", "s4", "s5" }
    local store = eventstore.open("sqlite:" .. db)
    for k, s in ipairs(sessions) do
      local batch = {}
      for i = 1, EVENTS // #sessions do
        local lane
        if k <= 2 then lane = (i % 2 == 0) and "even" or "odd" end -- s1, s2 laned
        batch[i] = { type = "job", lane = lane, payload = { n = i } }
      end
      store:append(s, batch)
    end
    store:close()

    local started = os.time()
    local function child_cmd(mode)
      return ("%s %s %s %s %s %s"):format(LUA, q(script), q(root), q(db), q(dir), mode)
    end

    -- Start children with their pid captured: sh writes its own pid, then
    -- execs lua, so that pid is the child's.
    local kills, starts = 0, 0
    while kills < KILLS and starts < KILLS * 3 do
      starts = starts + 1
      local pidfile = base .. ".pid"
      local cmd = ("sh -c 'echo $$ >%s; exec %s' >>%s 2>&1 </dev/null &"):format(
        pidfile, child_cmd("work"):gsub("'", "'\\''"), q(logfile))
      assert(os.execute(cmd))
      local pid
      for _ = 1, 3000 do -- ends when the file is there; only a hang runs out
        local text = eh.read_file(pidfile)
        pid = math.tointeger(tonumber(text:match("^(%d+)\n")))
        if pid then break end
        sleep(0.01)
      end
      os.remove(pidfile)
      assert.is_not_nil(pid, "could not start the child")
      sleep(0.15 + math.random() * 0.35)
      if alive(pid) then
        os.execute("kill -9 " .. pid)
        kills = kills + 1
        local waited = 0
        while alive(pid) and waited < 5 do
          sleep(0.01)
          waited = waited + 0.01
        end
        assert.is_false(alive(pid), "the child survived kill -9")
      end
    end
    assert.is_true(kills >= 5, ("only %d kills: the children finished too fast\n%s"):format(kills, eh.read_file(logfile)))

    local before = eventstore.open("sqlite:" .. db)
    local handled_before = 0
    for _, e in ipairs(before:read_all({ after = 0 })) do
      if e.type == "job" and e.status == "processed" then handled_before = handled_before + 1 end
    end
    before:close()
    local final_started = os.time()

    -- the final child runs to completion
    local ok, how, code = os.execute(child_cmd("final") .. " >>" .. q(logfile) .. " 2>&1")
    assert.is_true(ok == true, ("the final child failed (%s %s):\n%s"):format(tostring(how), tostring(code), eh.read_file(logfile)))

    local check = eventstore.open("sqlite:" .. db)
    local total_jobs = 0
    for _, s in ipairs(sessions) do
      local events = check:read(s)
      local jobs, results = {}, {}
      for _, e in ipairs(events) do
        assert.equal("processed", e.status, ("%s/%d (%s) is %s: %s"):format(s, e.index, e.type, e.status, tostring(e.last_error)))
        if e.type == "job" then
          jobs[#jobs + 1] = e
        else
          assert.equal("job.done", e.type)
          assert.is_not_nil(e.cause, "a result without cause")
          local list = results[e.cause.index] or {}
          list[#list + 1] = e
          results[e.cause.index] = list
        end
      end
      assert.equal(EVENTS // #sessions, #jobs)
      total_jobs = total_jobs + #jobs
      local n_results = 0
      for _, job in ipairs(jobs) do
        local list = results[job.index]
        assert.is_not_nil(list, ("%s/%d has no result event"):format(s, job.index))
        assert.equal(1, #list, ("%s/%d has %d result events"):format(s, job.index, #list))
        local r = list[1]
        assert.equal(job.attempts, r.cause.attempt,
          ("%s/%d: result of attempt %d, but %d attempts"):format(s, job.index, r.cause.attempt, job.attempts))
        assert.equal(job.index, r.payload.of)
        assert.equal(r.cause.attempt, r.payload.attempt)
        assert.is_true(r.index > job.index)
        n_results = n_results + 1
      end
      -- no result for anything but a job
      for index, list in pairs(results) do
        local target = events[index]
        assert.equal("job", target and target.type, ("%s: a result caused by %d"):format(s, index))
        assert.equal(1, #list)
      end
      -- lanes: results in the index order of the jobs
      local last = {}
      for _, e in ipairs(events) do
        if e.type == "job.done" and e.payload.lane then
          local l = e.payload.lane
          assert.is_true((last[l] or 0) < e.payload.of, ("%s lane %s: %d handled after %d"):format(s, l, e.payload.of, last[l] or 0))
          last[l] = e.payload.of
        end
      end
    end
    assert.equal(EVENTS, total_jobs)
    check:close()
    print(("# %d kills in %d starts; %d of %d jobs handled before the final run; %d s in all, %d s final")
      :format(kills, starts, handled_before, EVENTS, os.time() - started, os.time() - final_started))
  end)
end)
