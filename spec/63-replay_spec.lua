-- Replay: docs/contract.md §9 and docs/replay.md. History is made live by
-- an engine on a manual clock (inputs at their times, timers and retries
-- fired when due), then eventstore.replay runs scripts over it: the same
-- scripts replay identical (timers, retries after failures, lanes, results
-- that cause results); a changed handler diverges at the right index; a
-- changed reducer shows a state diff by path; a looping handler fails its
-- session and the replay goes on; the source is never written. Runs once
-- per backend URL (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local rh = require("replay_helpers")

local json = eventstore.json
local APP, ENGINE, scripts = rh.APP, rh.ENGINE, rh.scripts

local function dump(store)
  local out = {}
  for _, e in ipairs(store:read_all()) do
    out[#out + 1] = json.encode({ e.id, e.position, e.index, e.status, e.attempts, e.type })
  end
  return table.concat(out, "\n")
end

local function by_session(report)
  local t = {}
  for _, s in ipairs(report.sessions) do t[s.session] = s end
  return t
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    local function history() return rh.history(url) end

    it("replays unchanged scripts identical: timers, retries, lanes, results of results", function()
      local store, live = history()
      -- The history has what the spec claims it has.
      local o1 = store:read("order-1")
      local kinds = {}
      for _, e in ipairs(o1) do kinds[e.type] = (kinds[e.type] or 0) + 1 end
      assert.equal(1, kinds["order.reminded"])
      assert.equal(1, kinds["payment.recorded"])
      assert.equal(1, kinds["order.confirmed"])
      local before = dump(store)
      local report = eventstore.replay({ store = store, scripts = live, engine = ENGINE })
      assert.same({ replayed = 3, identical = 3, diverged = 0, failed = 0 },
        { replayed = report.summary.replayed, identical = report.summary.identical,
          diverged = report.summary.diverged, failed = report.summary.failed })
      local s = by_session(report)
      assert.equal("identical", s["order-1"].status)
      -- The payment's two failures were met again (in virtual time).
      local met = 0
      for _, e in ipairs(s["order-1"].errors) do
        if e.type == "payment.made" then met = e.failures end
      end
      assert.equal(2, met)
      assert.equal(before, dump(store))
    end)

    -- Histories made by hand (store, clock, engine of `dir`) whose replay
    -- with the same scripts must be identical: what a user relies on
    -- before trusting a report that some session diverged.
    local function by_hand(handlers)
      local store, clock = helpers.new(url)
      local dir = eh.scripts_dir()
      for event_type, src in pairs(handlers) do eh.write_file(eh.handler_path(dir, event_type), src) end
      local engine = eh.engine({ store = store, scripts = dir, quiet = true })
      return store, clock, dir, engine
    end

    -- The one session of store replays identical through dir's scripts.
    local function replays_identical(store, dir)
      local report = eventstore.replay({ store = store, scripts = dir, engine = ENGINE })
      assert.equal(1, #report.sessions)
      local s = report.sessions[1]
      assert.equal("identical", s.status, s.divergence and eventstore.json.encode(s.divergence))
    end

    -- docs/replay.md "The virtual clock": a timer due at the very
    -- millisecond an input came was ready before it (not_before <= now),
    -- so live it fired first; the replay fires it first too.
    it("replays identical a timer that fired at the very millisecond an input came", function()
      local store, clock, dir, engine = by_hand({
        a = "return function() return { { type = 'tick', delay_ms = 1000 } } end",
        tick = "return function() return { { type = 'ticked' } } end",
      })
      engine:append("s", { { type = "a" } })
      engine:run({ until_idle = true })
      clock:advance(1000)
      engine:run({ until_idle = true }) -- the timer fires at T0 + 1000
      engine:append("s", { { type = "note" } }) -- an input at the same ms
      assert.same({ "a", "tick", "ticked", "note" }, helpers.pluck(store:read("s"), "type"))
      replays_identical(store, dir)
    end)

    -- docs/replay.md "Inputs that never ran live stay unrun": appended
    -- settled, an event is a fact, not work, though its type has a handler.
    it("replays identical an input appended settled whose type has a handler", function()
      local store, _, dir, engine = by_hand({
        job = "return function() return { { type = 'done' } } end",
      })
      engine:append("s", { { type = "job", settled = true } })
      engine:append("s", { { type = "job" } })
      engine:run({ until_idle = true })
      assert.same({ "job", "job", "done" }, helpers.pluck(store:read("s"), "type"))
      replays_identical(store, dir)
    end)

    -- The same: a timer cancelled from outside (store:cancel) before it
    -- ran never ran live; the cancel is no event, and the replay cancels
    -- it again before the engine runs.
    it("replays identical an input timer cancelled with store:cancel before it ran", function()
      local store, clock, dir, engine = by_hand({
        job = "return function() return { { type = 'done' } } end",
      })
      local timer = engine:append("s", { { type = "job", delay_ms = 5000 } })[1]
      engine:run({ until_idle = true })
      store:cancel("s", timer.index, { reason = "paid" })
      clock:advance(5000)
      engine:run({ until_idle = true })
      local events = store:read("s")
      assert.same({ "job" }, helpers.pluck(events, "type"))
      assert.equal("paid", events[1].cancelled)
      replays_identical(store, dir)
    end)

    it("reports the same with the scratch engine's runs on threads as inline (docs/engine.md)", function()
      local store, live = history()
      local changed = scripts({ handlers = { ["order.priced"] = [[
return function(event, ctx)
  return { { type = "order.confirmed", payload = { total = event.payload.total * 2, at = os.time(),
    key = "confirm-" .. event.id } } }
end
]] } })
      for _, dir in ipairs({ live, changed }) do
        local threaded = {}
        for k, v in pairs(ENGINE) do threaded[k] = v end
        threaded.inline_runs = false
        local a = eventstore.replay({ store = store, scripts = dir, engine = threaded })
        local b = eventstore.replay({ store = store, scripts = dir, engine = ENGINE })
        a.summary.rate, b.summary.rate = nil, nil
        assert.same(a, b)
      end
    end)

    it("replays identical against a baseline of the same scripts", function()
      local store, live = history()
      local report = eventstore.replay({ store = store, scripts = live, baseline = scripts(), engine = ENGINE })
      assert.equal(3, report.summary.identical)
    end)

    it("shows a changed handler's first divergence at its index", function()
      local store = history()
      local new = scripts({ handlers = { ["order.placed"] = APP.handlers["order.placed"]:gsub("p.qty %* 10", "p.qty * (p.qty > 2 and 9 or 10)") } })
      local report = eventstore.replay({ store = store, scripts = new, engine = ENGINE })
      assert.same({ 2, 1, 0 }, { report.summary.identical, report.summary.diverged, report.summary.failed })
      local d = by_session(report)["order-2"]
      assert.equal("diverged", d.status)
      assert.equal(2, d.divergence.index)
      assert.equal("order.priced", d.divergence.baseline.type)
      assert.equal(30, d.divergence.baseline.payload.total)
      assert.equal(27, d.divergence.replayed.payload.total)
      assert.same({ { path = "$.total", baseline = 40, replayed = 37 } }, d.states.order)
    end)

    it("shows a changed reducer's state diff by path (against a baseline of the old scripts)", function()
      local store, live = history()
      local new = scripts({ reducers = { order = APP.reducers.order:gsub("s.confirmed %+ 1", "s.confirmed + 2") } })
      -- Without a baseline both sides fold with the reducer under test
      -- (§9): only what the handlers did shows, and they did not change.
      local report = eventstore.replay({ store = store, scripts = new, engine = ENGINE })
      assert.equal(3, report.summary.identical)
      report = eventstore.replay({ store = store, scripts = new, baseline = live, engine = ENGINE })
      assert.equal(3, report.summary.diverged)
      local d = by_session(report)["order-2"]
      assert.is_nil(d.divergence)
      assert.same({ { path = "$.confirmed", baseline = 2, replayed = 4 } }, d.states.order)
    end)

    it("with reducers_only folds the stored events with both reducers and runs no handler", function()
      local store, live = history()
      -- A handler that would fail every session if it ran.
      local new = scripts({
        reducers = { order = APP.reducers.order:gsub("s.confirmed %+ 1", "s.confirmed + 2") },
        handlers = { ["order.placed"] = "return function() error('must not run') end" },
      })
      local report = eventstore.replay({ store = store, scripts = new, baseline = live, reducers_only = true })
      assert.same({ 0, 3, 0 }, { report.summary.identical, report.summary.diverged, report.summary.failed })
      local d = by_session(report)["order-2"]
      assert.is_nil(d.divergence)
      assert.same({}, d.errors)
      assert.same({ { path = "$.confirmed", baseline = 2, replayed = 4 } }, d.states.order)
      local ok, err = pcall(eventstore.replay, { store = store, scripts = new, reducers_only = true })
      assert.is_false(ok)
      assert.truthy(eventstore.is_error(err, "INVALID_ARGUMENT"), tostring(err))
    end)

    it("with reducers_only folds a reducer unchanged on both sides once, and still fails a session on it", function()
      local store, live = history()
      local new = scripts({ reducers = { order = APP.reducers.order:gsub("s.confirmed %+ 1", "s.confirmed + 2") } })
      -- The same reducer on both sides: it counts its folds (the replay's
      -- folds run in the caller's state) and breaks on order-1's payment.
      local tally = [[
return {
  init = function() TALLY_FOLDS = (TALLY_FOLDS or 0) + 1; return { n = 0 } end,
  ["order.placed"] = function(s) s.n = s.n + 1 end,
  ["payment.recorded"] = function() error("tally broke") end,
}
]]
      for _, dir in ipairs({ live, new }) do eh.write_file(dir .. "/reducers/tally.lua", tally) end
      _G.TALLY_FOLDS = 0 -- busted gives a spec file an environment of its own
      local report = eventstore.replay({ store = store, scripts = new, baseline = live, reducers_only = true })
      local folds = _G.TALLY_FOLDS
      _G.TALLY_FOLDS = nil
      assert.equal(3, folds) -- one per session, not one per side
      assert.same({ 0, 2, 1 }, { report.summary.identical, report.summary.diverged, report.summary.failed })
      local s = by_session(report)
      assert.equal("failed", s["order-1"].status)
      assert.truthy(s["order-1"].failure:find("reducer 'tally': .*tally broke"), s["order-1"].failure)
      assert.same({ { path = "$.confirmed", baseline = 2, replayed = 4 } }, s["order-2"].states.order)
      assert.is_nil(s["order-2"].states.tally)
      -- Changed on one side, the same reducer is folded on both and diffed.
      eh.write_file(new .. "/reducers/tally.lua", tally:gsub("s.n %+ 1", "s.n + 2"))
      report = eventstore.replay({ store = store, scripts = new, baseline = live, reducers_only = true })
      assert.same({ { path = "$.n", baseline = 2, replayed = 4 } }, by_session(report)["order-2"].states.tally)
    end)

    it("fails a session whose handler loops with the budget error, and goes on", function()
      local store = history()
      local new = scripts({ handlers = { ["order.priced"] = [[
return function(event, ctx)
  if event.payload.total == 30 then while true do end end
  return { { type = "order.confirmed", payload = { total = event.payload.total, at = os.time(),
    key = "confirm-" .. event.id } } }
end
]] } })
      local o = { instruction_budget = 1000000, max_failures = 3 }
      for k, v in pairs(ENGINE) do if o[k] == nil then o[k] = v end end
      local report = eventstore.replay({ store = store, scripts = new, engine = o })
      local s = by_session(report)
      assert.equal("failed", s["order-2"].status)
      assert.truthy(s["order-2"].failure:find("instruction budget exceeded", 1, true))
      assert.equal("identical", s["order-1"].status)
      assert.equal("identical", s["order-3"].status)
      assert.equal(1, report.summary.failed)
    end)

    it("fails a session whose handler exhausts its memory budget, and goes on", function()
      local store = history()
      local new = scripts({ handlers = { ["order.priced"] = [[
return function(event, ctx)
  if event.payload.total == 30 then
    local t = {}
    for i = 1, 1e9 do t[i] = ("x"):rep(64) .. i end
  end
  return { { type = "order.confirmed", payload = { total = event.payload.total, at = os.time(),
    key = "confirm-" .. event.id } } }
end
]] } })
      local report = eventstore.replay({ store = store, scripts = new,
        engine = { memory_budget = 32 * 1024 * 1024, max_failures = 3 } })
      local s = by_session(report)
      assert.equal("failed", s["order-2"].status)
      assert.truthy(s["order-2"].failure:find("memory budget exceeded", 1, true), s["order-2"].failure)
      assert.equal("identical", s["order-1"].status)
      assert.equal("identical", s["order-3"].status)
    end)

    it("selects sessions by prefix and limit", function()
      local store, live = history()
      local report = eventstore.replay({ store = store, scripts = live, sessions = "order-", limit = 2, engine = ENGINE })
      assert.equal(2, report.summary.replayed)
      report = eventstore.replay({ store = store, scripts = live, sessions = "nobody", engine = ENGINE })
      assert.equal(0, report.summary.replayed)
    end)

    it("refuses bad options, naming them", function()
      local store, live = history()
      for _, bad in ipairs({
        { scripts = live },
        { store = store },
        { store = store, scripts = live .. "/nope" },
        { store = store, scripts = live, baseline = live .. "/nope" },
        { store = store, scripts = live, limit = 0 },
      }) do
        local ok, err = pcall(eventstore.replay, bad)
        assert.is_false(ok)
        assert.truthy(eventstore.is_error(err, "INVALID_ARGUMENT"), tostring(err))
      end
    end)
  end)
end
