-- Engine budgets that hold (docs/contract.md §4, docs/engine.md "Budgets"): every
-- way a handler or reducer was seen to escape its instruction or memory
-- budget, the watchdog for code no hook reaches, stop interrupting running
-- handlers, attempts that never ended counting toward max_failures, true
-- causes on failures, setup traps, and the one timer rule. Runs once per
-- backend URL (helpers.urls()).
local helpers = require("helpers")
local eh = require("engine_helpers")

local expect_error = helpers.expect_error

local function contains(haystack, needle)
  return type(haystack) == "string" and haystack:find(needle, 1, true) ~= nil
end

-- The only limit on elapsed time these tests assert: a ceiling that catches
-- a hang (a budget, a stop or a deadline not enforced runs on for ever),
-- far above what each takes (milliseconds to a second), so that a loaded
-- machine never fails them. What proves the budget is the error it names.
local HANG_MS = 60000

-- milliseconds (luasystem's clock, as helpers.wall: no process started)
local function wall()
  return math.floor(helpers.wall() * 1000)
end

local threads = helpers.threads

-- Closes engine, then waits until the process is back to `before` threads
-- (counted before the engine was made): an abandoned worker's thread
-- (detached, still in its C call) ends when that call returns and frees
-- its state. Waiting for it keeps its CPU out of the next test; it was a
-- fixed 3 s sleep, more than the thread needs on an idle machine and less
-- than on a loaded one. The deadline only catches a thread that never ends.
local function close_and_wait_threads(engine, before)
  engine:close()
  helpers.wait_until(function() return threads() <= before end, "the abandoned worker's thread to end", 120)
end

-- Handlers that try to escape the instruction budget, each a whole file.
local ESCAPES = {
  ["pcall in a loop"] = "return function() while true do pcall(function() while true do end end) end end",
  ["xpcall with a handler"] = [[
return function()
  while true do xpcall(function() while true do end end, function(m) return m end) end
end]],
  ["coroutine.wrap"] = [[
return function()
  while true do pcall(coroutine.wrap(function() while true do end end)) end
end]],
  ["debug.sethook() first"] = "return function() pcall(debug.sethook) while true do end end",
  ["a coroutine created at load time"] = [[
local co = coroutine.wrap(function() while true do end end)
return function() while true do pcall(co) end end]],
  ["a __close handler"] = [[
return function()
  while true do
    pcall(function()
      local guard <close> = setmetatable({}, {__close = function() while true do end end})
      while true do end
    end)
  end
end]],
  ["a returned event whose __index loops"] = [[
return function()
  return { setmetatable({}, {__index = function() while true do end end}) }
end]],
}

for _, url in ipairs(helpers.urls()) do
  describe(url .. " engine budgets", function()
    after_each(eh.cleanup)

    local function setup() return eh.setup(url) end

    -- Runs one event of type `t` to its dead letter (max_failures 1) and
    -- returns the stored event and the run's counts.
    local function run_one(t, opts)
      local o = { max_failures = 1, backoff_ms = 0, instruction_budget = 1000000 }
      for k, v in pairs(opts or {}) do o[k] = v end
      local engine = t.engine(o)
      t.store:append("s", { { type = "x" } })
      local started = wall()
      local r = engine:run({ until_idle = true })
      return eh.event(t.store, "s", 1), r, wall() - started
    end

    for name, source in pairs(ESCAPES) do
      it("a handler cannot escape the instruction budget through " .. name, function()
        local t = setup()
        t.handler("x", source)
        local ev, r, ms = run_one(t)
        assert.equal("dead", ev.status)
        assert.is_true(contains(ev.last_error, "instruction budget exceeded (1000000 instructions)"), ev.last_error)
        assert.equal(1, r.dead)
        assert.is_true(ms < HANG_MS, "took " .. ms .. " ms")
      end)
    end

    -- A script's top level runs when the engine opens (§4), budgeted too.
    local TOP_LOOP = "while true do end\nreturn function() end"

    it("a loop at the top level of a script is stopped by the budget: eventstore.engine refuses it", function()
      local t = setup()
      t.handler("x", TOP_LOOP)
      local err = helpers.expect_error("INVALID_ARGUMENT", t.engine, { instruction_budget = 1000000 })
      assert.is_true(contains(err.message, "handlers/x.lua: instruction budget exceeded (1000000 instructions)"),
        err.message)
    end)

    it("with no instruction budget, a loop at the top level of a script is stopped at its deadline", function()
      local t = setup()
      t.handler("x", TOP_LOOP)
      local err = helpers.expect_error("INVALID_ARGUMENT", t.engine, { instruction_budget = 0, deadline_ms = 200 })
      assert.is_true(contains(err.message, "handlers/x.lua: deadline exceeded (200 ms)"), err.message)
    end)

    it("a loop at the top level of a handler added after the start fails its attempt on the budget", function()
      local t = setup()
      local engine = t.engine({ max_failures = 1, backoff_ms = 0, instruction_budget = 1000000 })
      t.handler("x", TOP_LOOP)
      t.store:append("s", { { type = "x" } })
      local r = engine:run({ until_idle = true })
      local ev = eh.event(t.store, "s", 1)
      assert.equal("dead", ev.status)
      assert.is_true(contains(ev.last_error, "instruction budget exceeded (1000000 instructions)"), ev.last_error)
      assert.equal(1, r.dead)
    end)

    it("engine scripts load text chunks only (no bytecode: Lua has no verifier)", function()
      local t = setup()
      t.handler("x", [[
local bin = string.dump(function() return 1 end)
return function()
  local f, err = load(bin)
  local path = os.tmpname()
  local out = io.open(path, "wb"); out:write(bin); out:close()
  local g, err2 = loadfile(path)
  local ok3, err3 = pcall(dofile, path)
  os.remove(path)
  local h = load("return 2")
  local json = require("eventstore").json -- Lua modules still load (as text)
  return {{type = "r", payload = {tostring(f), err, tostring(g), err2, ok3, tostring(err3), h(), json.encode({1})}}}
end]])
      local engine = t.engine({})
      t.store:append("s", { { type = "x" } })
      assert.same({ handled = 1, failed = 0, dead = 0 }, eh.run(engine))
      local p = eh.event(t.store, "s", 2).payload
      assert.equal("nil", p[1])
      assert.is_true(contains(p[2], "binary chunk"), p[2])
      assert.equal("nil", p[3])
      assert.is_true(contains(p[4], "binary chunk"), p[4])
      assert.is_false(p[5])
      assert.is_true(contains(p[6], "binary chunk"), p[6])
      assert.equal(2, p[7])
      assert.equal("[1]", p[8])
    end)

    -- Payloads far larger encoded than in memory: refused at the size
    -- limit while encoding (TOO_LARGE), never built in full first.
    local HUGE_PAYLOADS = {
      ["a DAG of 40 levels"] = "local t = {} for _ = 1, 40 do t = {a = t, b = t} end return t",
      ["400 references to one 8 MiB string"] =
        "local s = string.rep('x', 8 * 1024 * 1024) local p = {} for i = 1, 400 do p[i] = s end return p",
    }
    for name, make in pairs(HUGE_PAYLOADS) do
      it("a returned payload of " .. name .. " is refused while encoding, promptly", function()
        local t = setup()
        t.handler("x", ("local function make() %s end\n"):format(make)
          .. "return function() return { { type = 'y', payload = make() } } end")
        local ev, _, ms = run_one(t)
        assert.equal("dead", ev.status)
        assert.is_true(contains(ev.last_error, "TOO_LARGE"), ev.last_error)
        assert.is_true(contains(ev.last_error, "over the limit of 1048576 bytes"), ev.last_error)
        assert.is_true(ms < HANG_MS, "took " .. ms .. " ms")
      end)
    end

    it("a memory budget exceeded inside pcall still fails the attempt, naming the budget", function()
      local t = setup()
      t.handler("x", [[
return function()
  local keep = {}
  while true do pcall(function() while true do keep[#keep + 1] = string.rep("y", 65536) end end) end
end]])
      local ev = run_one(t, { memory_budget = 16 * 1024 * 1024 })
      assert.equal("dead", ev.status)
      assert.is_true(contains(ev.last_error, "memory budget exceeded (16777216 bytes)"), ev.last_error)
    end)

    it("a handler that went over the memory budget only until a collection freed it fails with its own error", function()
      local t = setup()
      t.handler("x", [[
local base = string.rep("z", 65536)
return function()
  collectgarbage("stop")
  -- each string is made by the VM's concatenation, an allocation Lua
  -- answers a refusal of with an emergency collection (a lauxlib buffer,
  -- as string.rep's, is not: docs/engine.md)
  for _ = 1, 400 do local garbage = base .. tostring(_) end
  error("my own error")
end]])
      local ev = run_one(t, { memory_budget = 8 * 1024 * 1024 })
      assert.equal("dead", ev.status)
      assert.is_true(contains(ev.last_error, "my own error"), ev.last_error)
      assert.is_false(contains(ev.last_error, "memory budget"), ev.last_error)
    end)

    it("collectgarbage('stop') in one handler does not fail the events after it", function()
      local t = setup()
      t.handler("stopper", "return function() collectgarbage('stop') end")
      t.handler("work", [[
return function()
  local t = {}
  for i = 1, 2000 do t[i] = string.rep("w", 512) .. i end
end]])
      local engine = t.engine({ memory_budget = 4 * 1024 * 1024, max_failures = 1, backoff_ms = 0 })
      local batch = { { type = "stopper" } }
      for i = 2, 31 do batch[i] = { type = "work" } end
      t.store:append("s", batch)
      local r = engine:run({ until_idle = true })
      assert.same({ handled = 31, failed = 0, dead = 0 }, eh.counts(r))
    end)

    it("a __gc finalizer that loops (hooks are off there) is abandoned by the watchdog; dispatch goes on", function()
      local t = setup()
      -- Bounded (a few seconds of CPU, by a count: os.clock in engine
      -- scripts is the store's clock, §4, which stands still here) so the
      -- abandoned thread ends within this test run.
      t.handler("x", [[
return function()
  setmetatable({}, {__gc = function() local n = 0 while n < 400000000 do n = n + 1 end end})
  collectgarbage()
end]])
      t.handler("ok", "return function() return {{type = 'done'}} end")
      local engine = t.engine({ max_failures = 1, backoff_ms = 0 })
      t.store:append("s", { { type = "x" } })
      t.store:append("t", { { type = "ok" } })
      local r = engine:run({ until_idle = true })
      local ev = eh.event(t.store, "s", 1)
      assert.equal("dead", ev.status)
      assert.is_true(contains(ev.last_error, "stuck"), ev.last_error)
      assert.equal(1, r.abandoned)
      assert.equal("done", eh.event(t.store, "t", 2).type)
    end)

    -- ('a'):rep(140):find('.-.-.-.-b') backtracks for ~2.7 s on this kind
    -- of machine (2026-12; it grows as n^4): the watchdog abandons a call
    -- that burns a second of CPU without a hook, so a faster machine still
    -- leaves a margin (rep(118), 1.2 s here, left 0.2 s).
    it("a pathological string.find (C code, no hook) is abandoned; the run goes on", function()
      local t = setup()
      t.handler("x", "return function() return ('a'):rep(140):find('.-.-.-.-b') end")
      t.handler("ok", "return function() return {{type = 'done'}} end")
      local before = threads()
      local engine = t.engine({ max_failures = 1, backoff_ms = 0, workers = 1 })
      t.store:append("s", { { type = "x" } })
      t.store:append("t", { { type = "ok" } })
      local r = engine:run({ until_idle = true })
      assert.equal("dead", eh.event(t.store, "s", 1).status)
      assert.equal(1, r.abandoned)
      assert.equal("done", eh.event(t.store, "t", 2).type)
      close_and_wait_threads(engine, before)
    end)

    it("a call blocked past deadline_ms is failed as over its deadline and its worker replaced", function()
      local t = setup()
      t.handler("x", "return function() os.execute('sleep 2') end")
      t.handler("ok", "return function() return {{type = 'done'}} end")
      local before = threads()
      local engine = t.engine({ max_failures = 1, backoff_ms = 0, deadline_ms = 200 })
      t.store:append("s", { { type = "x" } })
      t.store:append("t", { { type = "ok" } })
      local r = engine:run({ until_idle = true })
      local ev = eh.event(t.store, "s", 1)
      assert.equal("dead", ev.status)
      assert.is_true(contains(ev.last_error, "deadline exceeded (200 ms)"), ev.last_error)
      assert.equal(1, r.abandoned)
      assert.equal("done", eh.event(t.store, "t", 2).type)
      close_and_wait_threads(engine, before)
    end)

    it("engine:stop() interrupts a handler that catches every error; its attempt is retried later", function()
      local t = setup()
      t.handler("x", "return function() while true do pcall(function() while true do end end) end end")
      local engine = t.engine({ instruction_budget = 0, max_failures = 5, backoff_ms = 0 })
      t.store:append("s", { { type = "x" } })
      local asked
      local started = wall()
      local r = engine:run({ progress_ms = 50, progress = function(st)
        if st.busy > 0 and not asked then asked = true; engine:stop() end
      end })
      local ms = wall() - started
      assert.is_true(ms < HANG_MS, "took " .. ms .. " ms")
      local ev = eh.event(t.store, "s", 1)
      assert.equal("pending", ev.status)
      assert.is_true(contains(ev.last_error, "interrupted: the engine is stopping"), ev.last_error)
      assert.equal(1, r.failed)
    end)

    it("a reducer that catches its budget error still fails the fold, naming the budget and the reducer", function()
      local t = setup()
      t.reducer("r", [[
return { a = function(s) while true do pcall(function() while true do end end) end end }]])
      local engine = t.engine({ instruction_budget = 1000000 })
      t.store:append("s", { { type = "a" } })
      local err = expect_error("INVALID_ARGUMENT", function() engine:state("s", "r") end)
      assert.is_true(contains(err.message, "reducer 'r'"), err.message)
      assert.is_true(contains(err.message, "instruction budget exceeded"), err.message)
      -- the engine goes on
      t.reducer("r", "return { a = function(s) s.n = (s.n or 0) + 1 end }")
      assert.same({ n = 1 }, engine:state("s", "r"))
    end)

    it("a reducer stuck in C code makes engine:state fail promptly; the next fold works", function()
      local t = setup()
      t.reducer("r", "return { a = function(s) ('a'):rep(140):find('.-.-.-.-b') end }")
      t.reducer("ok", "return { a = function(s) s.n = 1 end }")
      local before = threads()
      local engine = t.engine({ deadline_ms = 300 })
      t.store:append("s", { { type = "a" } })
      local started = wall()
      local err = expect_error("INVALID_ARGUMENT", function() engine:state("s", "r") end)
      assert.is_true(wall() - started < HANG_MS)
      assert.is_true(contains(err.message, "reducer 'r'"), err.message)
      assert.same({ n = 1 }, engine:state("s", "ok"))
      close_and_wait_threads(engine, before)
    end)

    it("engine:state runs no reducer code in the caller's Lua state", function()
      local t = setup()
      t.reducer("r", "return { a = function(s) s.seen = rawget(_G, 'HOST_ONLY') ~= nil end }")
      local engine = t.engine({})
      t.store:append("s", { { type = "a" } })
      HOST_ONLY = true
      local state = engine:state("s", "r")
      HOST_ONLY = nil
      assert.same({ seen = false }, state)
    end)

    describe("setup traps", function()
      it("a scripts directory that does not exist is an error at eventstore.engine", function()
        local t = setup()
        local err = expect_error("INVALID_ARGUMENT", function() t.engine({ scripts = t.dir .. "/scirpts" }) end)
        assert.is_true(contains(err.message, "scirpts"), err.message)
      end)

      it("a holder over 255 bytes is refused at eventstore.engine", function()
        local t = setup()
        expect_error("INVALID_ARGUMENT", function() t.engine({ holder = ("h"):rep(300) }) end)
        expect_error("INVALID_ARGUMENT", function() t.engine({ holder = "a\0b" }) end)
      end)

      it("names with a NUL byte are refused by state, append and ctx.state, never cut", function()
        local t = setup()
        t.reducer("r", "return { a = function(s) s.n = 1 end }")
        t.handler("x", "return function(e, ctx) ctx.state('r\\0evil') end")
        local engine = t.engine({ max_failures = 1, backoff_ms = 0 })
        t.store:append("s", { { type = "a" } })
        expect_error("INVALID_ARGUMENT", function() engine:state("s\0evil", "r") end)
        expect_error("INVALID_ARGUMENT", function() engine:state("s", "r\0evil") end)
        expect_error("INVALID_ARGUMENT", function() engine:append("s\0evil", { { type = "a" } }) end)
        t.store:append("h", { { type = "x" } })
        engine:run({ until_idle = true })
        local ev = eh.event(t.store, "h", 1)
        assert.is_true(contains(ev.last_error, "NUL"), ev.last_error)
      end)

      it("out-of-range options are INVALID_ARGUMENT naming the option", function()
        local t = setup()
        for _, case in ipairs({
          { workers = 0 }, { workers = 257 }, { ttl_ms = math.maxinteger }, { ttl_ms = 0 },
          { max_failures = 0 }, { backoff_ms = -1 }, { deadline_ms = 0 }, { memory_budget = -5 },
          { snapshot_every = math.mininteger }, { instruction_budget = math.maxinteger },
        }) do
          local name = next(case)
          local err = expect_error("INVALID_ARGUMENT", function() t.engine(case) end)
          assert.is_true(contains(err.message, name), err.message)
        end
      end)
    end)

    describe("one timer rule", function()
      it("engine:append refuses a negative delay_ms, a string, a float, both at and delay_ms", function()
        local t = setup()
        t.handler("tick", "return function() end")
        local engine = t.engine({})
        for _, bad in ipairs({ { delay_ms = -500 }, { delay_ms = "123" }, { delay_ms = 1.5 },
                               { at = -1 }, { at = 5, delay_ms = 5 }, { delay_ms = math.maxinteger } }) do
          bad.type = "tick"
          local ok = pcall(engine.append, engine, "s", { bad })
          assert.is_false(ok, "accepted " .. tostring(bad.delay_ms) .. "/" .. tostring(bad.at))
        end
        assert.equal(0, t.store:head("s"))
      end)

      it("a handler returning an event with a negative delay_ms fails its attempt", function()
        local t = setup()
        t.handler("x", "return function() return {{type = 'later', delay_ms = -500}} end")
        local ev = run_one(t)
        assert.equal("dead", ev.status)
        assert.is_true(contains(ev.last_error, "delay_ms"), ev.last_error)
      end)
    end)
  end)
end

describe("engine: a store it cannot write", function()
  after_each(eh.cleanup)

  it("run{until_idle} fails at once with the storage error instead of spinning", function()
    local eventstore = require("eventstore")
    local db = os.tmpname()
    local rw = eventstore.open("sqlite:" .. db)
    rw:append("s", { { type = "x" } })
    rw:close()
    local dir = eh.scripts_dir()
    eh.handler(dir, "x", "return function() end")
    local ro = eventstore.open("sqlite:" .. db .. "?mode=ro")
    local engine = eh.engine({ store = ro, scripts = dir })
    local started = wall()
    local ok, err = pcall(engine.run, engine, { until_idle = true })
    assert.is_false(ok)
    assert.is_true(eventstore.is_error(err, "STORAGE"), tostring(err))
    assert.is_true(wall() - started < HANG_MS)
    engine:close()
    ro:close()
    for _, s in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. s) end
  end)
end)

-- os.exit in a handler ends the process: only a durable store sees the
-- next run, so this is sqlite: only. Each run is a child process.
describe("engine: attempts that never ended", function()
  after_each(eh.cleanup)

  it("an os.exit handler is dead-lettered after max_failures runs", function()
    local dir = eh.scripts_dir()
    eh.handler(dir, "boom", "return function() os.exit(3) end")
    local db = os.tmpname()
    local eventstore = require("eventstore")
    local store = eventstore.open("sqlite:" .. db)
    store:append("s", { { type = "boom" } })
    store:close()
    local child = ([[
local eventstore = require("eventstore")
local e = eventstore.engine{store = "sqlite:%s", scripts = %q, max_failures = 3, ttl_ms = 1000, backoff_ms = 0}
e:run{until_idle = true}
e:close()
os.exit(0)
]]):format(db, dir)
    local script = os.tmpname()
    eh.write_file(script, child)
    -- The children's claims last 1 s: a 100 ms one could end under a
    -- sanitizer before its worker ran the handler, and the run then took
    -- a second attempt (a CI run read {3, 3, 0, 0}). The next child starts
    -- once the dead run's claim has ended as the store sees it.
    local function claim_ended()
      local s = eventstore.open("sqlite:" .. db)
      local ev = s:read("s")[1]
      local ended = ev.claim_expires_at == nil or ev.claim_expires_at <= s:now()
      s:close()
      return ended
    end
    local codes = {}
    for i = 1, 4 do
      local _, _, code = os.execute("lua5.4 " .. eh.sh_quote(script) .. " 2>/dev/null")
      codes[i] = code
      local waited = 0
      while not claim_ended() and waited < 600 do -- a 60 s ceiling: only a hang runs out
        os.execute("sleep 0.1")
        waited = waited + 1
      end
    end
    assert.same({ 3, 3, 3, 0 }, codes)
    store = eventstore.open("sqlite:" .. db)
    local ev = store:read("s")[1]
    store:close()
    assert.equal("dead", ev.status)
    assert.equal(4, ev.attempts)
    assert.is_true(contains(ev.last_error, "3 earlier attempts never finished"), ev.last_error)
    for _, s in ipairs({ "", "-wal", "-shm" }) do os.remove(db .. s) end
    os.remove(script)
  end)
end)

