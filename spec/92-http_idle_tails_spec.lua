-- Idle tails cost nothing while nothing of their tenant happens (issue 24
-- item 4, docs/http-live.md "What an idle tail costs"): `eventstore serve`
-- holds 100 `/v1/stream` tails of a tenant with no events while another
-- tenant, holding many events, appends one event per request at up to
-- 1,000 events a second; the CPU time of the tails' own threads (each
-- connection runs on a thread of its own: /proc/PID/task/TID/stat utime +
-- stime, in clock ticks) must stay under 1% of a core over that window.
-- The store's one watcher of other processes' commits (the thread named
-- es-watch, started by the first wait) is measured apart: its cost is
-- one look per commit of anyone's, a cost of the appends (on PostgreSQL
-- it reads every NOTIFY, ~1.5-2% of a core at 1,000 commits a second on a
-- 2-core machine, with one tail or a hundred).
-- A tail that rescans the other tenant's rows on each commit or each poll
-- (what the server did before) takes many times that. The tails must
-- still be alive: each gets its own tenant's next event.
local socket = require("socket")
local helpers = require("helpers")
local hh = require("http_helpers")

local TAILS = 100
local PRELOAD = 20000 -- the other tenant's events before the window
local APPENDS = 2000  -- appended during the window, one event a request
local RATE = 1000     -- at most this many a second
local HZ = 100        -- clock ticks a second (USER_HZ: 100 on Linux)

-- The ids of the server's threads.
local function threads(pid)
  local p = assert(io.popen("ls /proc/" .. pid .. "/task"))
  local set = {}
  for tid in p:lines() do set[tid] = true end
  p:close()
  return set
end

-- A thread's name (/proc/PID/task/TID/comm), nil once it is gone.
local function thread_name(pid, tid)
  local text = helpers.read_file(("/proc/%d/task/%s/comm"):format(pid, tid))
  return text and text:gsub("%s+$", "")
end

-- utime + stime of the listed threads, in clock ticks (a thread gone
-- since counts nothing more).
local function ticks(pid, tids)
  local sum = 0
  for tid in pairs(tids) do
    local text = helpers.read_file(("/proc/%d/task/%s/stat"):format(pid, tid))
    if text then
      -- fields after the command name (which may hold spaces): state is
      -- field 3, utime 14, stime 15
      local rest = text:match("%) (.*)$")
      local f = {}
      for w in rest:gmatch("%S+") do f[#f + 1] = w end
      sum = sum + tonumber(f[12]) + tonumber(f[13])
    end
  end
  return sum
end

for _, template in ipairs(helpers.urls()) do
  describe("idle tails of an empty tenant on " .. template, function()
    it("cost under 1% of a core while another tenant appends, and still get their tenant's events", function()
      local srv = hh.serve_on(template, { no_engine = true,
        args = { "--max-streams", tostring(TAILS + 8), "--max-connections", tostring(2 * TAILS + 16),
          "--max-per-client", tostring(2 * TAILS + 16) } })
      local tails = {}
      local ok, err = pcall(function()
        -- the other tenant's history, which a tail of globex must not read
        local batch = {}
        for i = 1, 1000 do batch[i] = { type = "seed", payload = { i = i } } end
        for i = 1, PRELOAD // 1000 do
          local st = hh.append(srv, "acme-rw", "load-" .. i, batch)
          assert.equal(200, st)
        end
        local before = threads(srv.proc.pid)
        for i = 1, TAILS do
          local s, status, body = hh.sse(srv, "/v1/stream", { token = "globex-rw", timeout = 30 })
          assert(s, ("tail %d: %s %s"):format(i, tostring(status), tostring(body)))
          tails[i] = s
        end
        -- each tail's thread is running (its keep-alive came) before the
        -- window opens
        local mine, watcher = {}, {}
        for tid in pairs(threads(srv.proc.pid)) do
          if thread_name(srv.proc.pid, tid) == "es-watch" then
            watcher[tid] = true
          elseif not before[tid] then
            mine[tid] = true
          end
        end
        local n = 0
        for _ in pairs(mine) do n = n + 1 end
        assert.is_true(n >= TAILS, ("%d new threads for %d tails"):format(n, TAILS))

        -- under 1% of a core over the window (one tick at the least: a
        -- tick is charged to whichever thread runs when it falls)
        -- Under the sanitizers (ASan + UBSan: several times the CPU per
        -- instruction) the bound is three times as wide: the 1% is the
        -- release build's, which make test's own pass checks.
        -- On postgres twice as wide again: a tail's wait ends every second
        -- (its slice) with its tenant's read, a round trip there (under the
        -- sanitizers 45 ticks of a 14-second window, where 0 in the
        -- release build's 2 seconds).
        local san = helpers.SANITIZED and 3 or 1
        local slack = san * (template:match("^postgres") and 2 or 1)
        local function bound(seconds, share)
          if share then return math.max(1, math.floor(share * san * seconds * HZ)) end
          return math.max(1, math.floor(0.01 * slack * seconds * HZ))
        end
        -- The watcher, apart (docs/http-live.md): a look per commit, at
        -- most 4% of a core at 1,000 commits a second, twice what it takes
        -- on PostgreSQL, where it reads every NOTIFY; a watcher that read
        -- events on each commit would take many times that.
        local WATCH_SHARE = 0.04
        local watch_start = ticks(srv.proc.pid, watcher)
        local t0 = helpers.wall()
        local start = ticks(srv.proc.pid, mine)
        local done = 0
        for i = 1, APPENDS do
          local ahead = t0 + i / RATE - helpers.wall()
          if ahead > 0 then socket.sleep(ahead) end
          local st = hh.append(srv, "acme-rw", "busy", { { type = "tick", payload = { i = i } } })
          assert.equal(200, st)
          done = i
          -- far over already (the old server): stop here, the spec fails
          if i % 100 == 0 and ticks(srv.proc.pid, mine) - start > 10 * bound(APPENDS / RATE) then
            break
          end
        end
        local used = ticks(srv.proc.pid, mine) - start
        local watched = ticks(srv.proc.pid, watcher) - watch_start
        local seconds = helpers.wall() - t0
        print(("\n%s: %d tails used %d ticks in %.2f s (%d appends), bound %d; the watcher %d, bound %d"):format(
          template, TAILS, used, seconds, done, bound(seconds), watched, bound(seconds, WATCH_SHARE)))
        assert.is_true(used <= bound(seconds), ("%d idle tails used %d clock ticks in %.2f s (%d appends), over 1%% of a core (%d)")
          :format(TAILS, used, seconds, done, bound(seconds)))
        assert.is_true(watched <= bound(seconds, WATCH_SHARE),
          ("the watcher of other processes' commits used %d clock ticks in %.2f s (%d appends), over %d%% of a core (%d)")
          :format(watched, seconds, done, math.floor(WATCH_SHARE * 100), bound(seconds, WATCH_SHARE)))

        -- alive: every tail gets globex's first event
        assert.equal(200, (hh.append(srv, "globex-rw", "own", { { type = "mine", payload = { n = 1 } } })))
        for i, s in ipairs(tails) do
          local got = hh.sse_take(s, 1, 30)
          assert.equal(1, #got, "tail " .. i .. " got nothing")
          assert.equal("mine", got[1].data.type)
          assert.equal("own", got[1].data.session)
        end
      end)
      for _, s in ipairs(tails) do s:close() end
      if not ok then
        hh.stop(srv)
        error(err, 0)
      end
      hh.stop_clean(srv)
    end)
  end)
end
