-- An event counts as handled only once its completion is durable
-- (docs/engine.md "How it works"): the engine commits completions in
-- batches on a completer thread, and `handled` (run's result, the progress
-- callback) counts a completion only after its commit. So a process killed
-- with SIGKILL right after reporting N handled leaves at least N events
-- processed in the file, each with exactly one result, and a later run
-- handles the rest, each once. SQLite only: memory stores do not outlive
-- their process (PostgreSQL: spec/32 and spec/33).
local eventstore = require("eventstore")
local eh = require("engine_helpers")
local helpers = require("helpers")

local LUA = os.getenv("LUA") or "lua5.4"
local EVENTS = 3000
local q = eh.sh_quote

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

-- The child: runs the engine, reporting `handled` into a file (written
-- whole, then renamed, so the parent never reads half of it) every 5 ms.
-- Its claims last 5 s, not the default 30: the later engine can take the
-- events the killed child held only once those claims expire, and waited
-- out the default ttl on every run (the keeper renews a claim every ttl/3
-- while its handler runs, so 5 s is no risk to the child itself).
local CHILD = [==[
local root, db, scripts, report, workers = arg[1], arg[2], arg[3], arg[4], tonumber(arg[5])
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = root .. "/build/lib/?.so;" .. package.cpath
local eventstore = require("eventstore")
local engine = eventstore.engine({ store = "sqlite:" .. db, scripts = scripts, workers = workers, ttl_ms = 5000 })
engine:run({
  until_idle = true,
  progress_ms = 5,
  progress = function(now)
    local f = assert(io.open(report .. ".tmp", "w"))
    f:write(tostring(now.handled), "\n")
    f:close()
    assert(os.rename(report .. ".tmp", report))
  end,
})
os.exit(0)
]==]

describe("sqlite: completions acknowledged only once durable", function()
  local base, db, script, report, dir

  before_each(function()
    base = os.tmpname()
    db, script, report = base .. ".db", base .. ".child.lua", base .. ".report"
    dir = eh.scripts_dir()
  end)

  after_each(function()
    for _, suffix in ipairs({ "", "-wal", "-shm", "-journal" }) do os.remove(db .. suffix) end
    os.remove(script)
    os.remove(report)
    os.remove(report .. ".tmp")
    os.remove(base)
    eh.cleanup()
  end)

  for _, workers in ipairs({ 1, 4 }) do
    it(("kill -9 after N handled (%d worker(s)): those N are stored, each result once"):format(workers), function()
      eh.write_file(script, CHILD)
      eh.handler(dir, "job", [[return function(e)
        return {{type = "job.done", payload = {of = e.index}}}
      end]])
      local store = eventstore.open("sqlite:" .. db)
      local batch = {}
      for i = 1, 100 do batch[i] = { type = "job", payload = { n = i } } end
      for k = 1, EVENTS // 100 do store:append("s" .. (k % 7), batch) end
      store:close()

      local pidfile = base .. ".pid"
      local cmd = ("%s %s %s %s %s %s %d"):format(LUA, q(script), q(repo_root()), q(db), q(dir), q(report), workers)
      assert(os.execute(("sh -c 'echo $$ >%s; exec %s' >/dev/null 2>&1 </dev/null &"):format(
        pidfile, cmd:gsub("'", "'\\''"))))
      local pid
      for _ = 1, 500 do
        pid = math.tointeger(tonumber(eh.read_file(pidfile):match("^(%d+)\n")))
        if pid then break end
        helpers.sleep(0.01)
      end
      os.remove(pidfile)
      assert.is_not_nil(pid, "could not start the child")
      -- kill it once it reports some hundreds handled, mid-run (the
      -- deadline only ends a hang: a loaded machine takes its time)
      local reported = 0
      local until_t = os.time() + 300
      repeat
        reported = tonumber(eh.read_file(report):match("^(%d+)")) or 0
        if reported >= 300 or not helpers.alive(pid) then break end
        helpers.sleep(0.005)
      until os.time() > until_t
      os.execute("kill -9 " .. pid)
      for _ = 1, 500 do
        if not helpers.alive(pid) then break end
        helpers.sleep(0.01)
      end
      assert.is_false(helpers.alive(pid), "the child survived kill -9")
      reported = tonumber(eh.read_file(report):match("^(%d+)")) or 0
      assert.is_true(reported >= 300, "the child reported only " .. reported .. " handled")

      -- every event it reported handled is processed, with one result
      local check = eventstore.open("sqlite:" .. db)
      local processed = 0
      local function tally()
        local jobs, results, n = {}, {}, 0
        for _, e in ipairs(check:read_all({ after = 0 })) do
          if e.type == "job" then
            jobs[#jobs + 1] = e
            if e.status == "processed" then n = n + 1 end
          else
            local key = e.session .. "/" .. e.cause.index
            assert.is_nil(results[key], key .. " has two results")
            results[key] = e
          end
        end
        for _, j in ipairs(jobs) do
          local r = results[j.session .. "/" .. j.index]
          if j.status == "processed" then
            assert.is_not_nil(r, j.session .. "/" .. j.index .. " is processed without its result")
            assert.are.equal(j.attempts, r.cause.attempt)
          else
            assert.is_nil(r, j.session .. "/" .. j.index .. " has a result but is " .. j.status)
          end
        end
        return n
      end
      processed = tally()
      assert.is_true(processed >= reported,
        ("%d reported handled, only %d processed in the file"):format(reported, processed))

      -- a later engine handles the rest, each once
      local engine = eh.engine({ store = check, scripts = dir, ttl_ms = 200 })
      local deadline = os.time() + 600 -- a hang ceiling: it ends when nothing is pending
      repeat
        engine:run({ until_idle = true })
        local pending = 0
        for _, e in ipairs(check:read_all({ after = 0 })) do
          if e.status == "pending" then pending = pending + 1 end
        end
        if pending > 0 then helpers.sleep(0.1) end
      until pending == 0 or os.time() > deadline
      assert.are.equal(EVENTS, tally())
    end)
  end
end)
