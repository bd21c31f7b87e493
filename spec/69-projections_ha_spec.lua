-- spec/69: projections across engines (docs/contract.md §8): two engine
-- processes on one store (a SQLite file; a PostgreSQL schema) run each
-- projection on exactly one of them (a lease in the projection's record);
-- killing that one hands the projection to the other within about the
-- lease's TTL, with states still exact; an edit while they run keeps the
-- old generation answering until the new one has caught up, then swaps:
-- never a half-built state.
local helpers = require("helpers")
local eh = require("engine_helpers")
local ph = require("proc_helpers")

local LUA = os.getenv("LUA") or "lua5.4"
local TTL_MS = 600

local function repo_root()
  local p = assert(io.popen("pwd"))
  local cwd = p:read("l")
  p:close()
  return cwd
end

-- A child: an engine named HOLDER that runs until it is killed.
local CHILD = [==[
local root, url, scripts, holder, ttl = arg[1], arg[2], arg[3], arg[4], tonumber(arg[5])
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = root .. "/build/lib/?.so;" .. package.cpath
local eventstore = require("eventstore")
local engine = eventstore.engine({ store = url, scripts = scripts, holder = holder, ttl_ms = ttl })
engine:run({})
]==]

local COUNT = [[
return { key = function(e) return e.session end,
         ["tick"] = function(s, e) s.n = (s.n or 0) + 1; s.sum = (s.sum or 0) + e.payload.v end }
]]

-- The edit: ten times the count, and slow, so that the build takes a
-- while and the readers look at it meanwhile.
local COUNT_V2 = [[
return { key = function(e) return e.session end,
         ["tick"] = function(s, e)
           local x = 0
           for i = 1, 200000 do x = x + i end
           s.n = (s.n or 0) + 10; s.sum = (s.sum or 0) + e.payload.v end }
]]

for _, template in ipairs(helpers.durable_urls()) do
  describe("projections with two engines on " .. template, function()
    local base, script, logfile, dir, procs
    before_each(function()
      base = os.tmpname()
      script, logfile = base .. ".child.lua", base .. ".log"
      dir = eh.scripts_dir()
      procs = {}
    end)
    after_each(function()
      for _, p in ipairs(procs) do ph.reap(p) end
      os.remove(script)
      os.remove(logfile)
      os.remove(base)
      eh.cleanup()
    end)

    it("run each projection once, hand it over when its engine dies, and swap an edit in whole", function()
      local store, _, url = helpers.new(template)
      assert(os.execute("mkdir -p " .. eh.sh_quote(dir .. "/projections")))
      eh.write_script(dir .. "/projections/count.lua", COUNT)
      eh.write_file(script, CHILD)
      local v = 0
      local function ticks(n)
        local batches = {}
        for i = 1, n do
          v = v + 1
          batches[i] = { session = "s" .. (v % 5), events = { { type = "tick", settled = true, payload = { v = v } } } }
        end
        store:append_many(batches)
      end
      local function caught_up()
        local rec = store:projections("count")[1]
        return rec and rec.generation > 0 and not rec.building and rec.position == v and rec
      end
      local function exact(times)
        local want = {}
        for _, e in ipairs(store:read_all({ after = 0, limit = v + 10 })) do
          local s = want[e.session] or { n = 0, sum = 0 }
          s.n, s.sum = s.n + times, s.sum + e.payload.v
          want[e.session] = s
        end
        for session, s in pairs(want) do assert.same(s, (store:projection("count", session)), session) end
      end

      ticks(200)
      local root = repo_root()
      local by = {}
      for _, h in ipairs({ "A", "B" }) do
        by[h] = ph.spawn({ LUA, script, root, url, dir, h, tostring(TTL_MS) }, nil, logfile)
        procs[#procs + 1] = by[h]
      end
      local rec = helpers.wait_until(caught_up, "the projection to catch up")
      local holder = rec.holder
      assert.is_truthy(by[holder], "held by one of the two engines: " .. tostring(holder))
      -- exactly one runs it: more events, the same holder folds them all
      for _ = 1, 5 do
        ticks(20)
        rec = helpers.wait_until(caught_up, "the projection to catch up")
        assert.equal(holder, rec.holder)
      end
      exact(1)

      -- its engine dies: the other takes over after the lease ran out
      local other = holder == "A" and "B" or "A"
      ph.signal(by[holder], "KILL")
      assert.is_truthy(ph.wait(by[holder], 10))
      local killed_at = helpers.wall()
      ticks(50)
      rec = helpers.wait_until(function()
        local r = caught_up()
        return r and r.holder == other and r
      end, "the other engine to take the projection over")
      local took = helpers.wall() - killed_at
      -- the TTL and the standby's look every TTL/3, with room for a loaded machine
      assert.is_true(took < TTL_MS / 1000 * 10, ("took %.2f s to hand over"):format(took))
      exact(1)

      -- an edit while it runs: the old generation answers until the new one is whole
      local old = rec
      eh.write_script(dir .. "/projections/count.lua", COUNT_V2)
      local saw_building, reads = false, 0
      helpers.wait_until(function()
        local r = store:projections("count")[1]
        if r.building then saw_building = true end
        local state, info = store:projection("count", "s1")
        reads = reads + 1
        if info.version == old.version then
          assert.equal(old.generation, info.generation)
          return false
        end
        -- swapped: whole, never half built (ten per event of s1)
        local n = 0
        for _, e in ipairs(store:read_all({ after = 0, limit = v + 10 })) do
          if e.session == "s1" then n = n + 10 end
        end
        assert.equal(n, state.n)
        return true
      end, "the edited projection to be swapped in", 300, 0.05)
      assert.is_true(saw_building, "the new generation was seen being built beside the old")
      assert.is_true(reads > 1)
      exact(10)
    end)
  end)
end
