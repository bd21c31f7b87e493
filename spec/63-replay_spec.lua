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

local T0 = helpers.T0
local json = eventstore.json

-- The app: an order is priced (a random discount code drawn from the
-- deterministic generator), the price is confirmed (a result of a result),
-- a reminder fires 5 s later (a timer); a payment handler fails twice
-- before it succeeds (retries in virtual time); orders of one customer
-- share a lane.
local APP = {
  handlers = {
    ["order.placed"] = [[
return function(event, ctx)
  local p = event.payload
  return {
    { type = "order.priced", payload = { total = p.qty * 10, code = math.random(1, 1000000) }, lane = event.lane },
    { type = "order.reminder", payload = { order = p.order }, delay_ms = 5000 },
  }
end
]],
    ["order.priced"] = [[
return function(event, ctx)
  return { { type = "order.confirmed", payload = { total = event.payload.total, at = os.time() } } }
end
]],
    ["order.reminder"] = [[
return function(event, ctx)
  return { { type = "order.reminded", payload = { at = ctx.now() } } }
end
]],
    ["payment.made"] = [[
return function(event, ctx)
  if ctx.attempt <= 2 then error("payment gateway down") end
  return { { type = "payment.recorded", payload = { attempt = ctx.attempt, at = ctx.now() } } }
end
]],
  },
  reducers = {
    order = [[
return {
  init = function() return { total = 0, confirmed = 0 } end,
  ["order.priced"] = function(s, e) s.total = s.total + e.payload.total end,
  ["order.confirmed"] = function(s, e) s.confirmed = s.confirmed + 1 end,
}
]],
  },
}

-- A scripts directory with APP's scripts, `changes` replacing some
-- ({handlers = {[type] = src}, reducers = {[name] = src}}).
local function scripts(changes)
  local dir = eh.scripts_dir()
  for kind, files in pairs(APP) do
    for name, src in pairs(files) do
      local changed = changes and changes[kind] and changes[kind][name]
      eh.write_file(dir .. "/" .. kind .. "/" .. name .. ".lua", changed or src)
    end
  end
  return dir
end

local ENGINE = { backoff_ms = 100, backoff_cap_ms = 1000, max_failures = 5 }

-- Makes history: the inputs at their times through an engine of `dir`,
-- firing timers and retries when due (as a live clock would).
local function make_history(store, clock, dir, inputs)
  local o = { store = store, scripts = dir }
  for k, v in pairs(ENGINE) do o[k] = v end
  local engine = eh.engine(o)
  local function fire_until(t)
    while true do
      local due
      for _, e in ipairs(store:read_all()) do
        if e.status == "pending" then
          local d = math.max(e.not_before or 0, e.retry_at or 0)
          if due == nil or d < due then due = d end
        end
      end
      if due == nil or (t and due >= t) then return end
      clock:set(math.max(due, clock:now()))
      engine:run({ until_idle = true })
    end
  end
  for _, input in ipairs(inputs) do
    fire_until(input.at)
    clock:set(input.at)
    engine:append(input.session, { { type = input.type, payload = input.payload, lane = input.lane } })
    engine:run({ until_idle = true })
  end
  fire_until(nil)
  engine:close()
end

local INPUTS = {
  { session = "order-1", type = "order.placed", payload = { order = 1, qty = 1 }, lane = "alice", at = T0 + 1000 },
  { session = "order-2", type = "order.placed", payload = { order = 2, qty = 3 }, lane = "bob", at = T0 + 1500 },
  { session = "order-1", type = "payment.made", payload = { order = 1 }, at = T0 + 2000 },
  { session = "order-3", type = "order.placed", payload = { order = 3, qty = 2 }, lane = "alice", at = T0 + 2500 },
  { session = "order-2", type = "order.placed", payload = { order = 2, qty = 1 }, lane = "bob", at = T0 + 9000 },
}

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

    local function history()
      local store, clock = helpers.new(url)
      local live = scripts()
      make_history(store, clock, live, INPUTS)
      return store, live
    end

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

    it("fails a session whose handler loops with the budget error, and goes on", function()
      local store = history()
      local new = scripts({ handlers = { ["order.priced"] = [[
return function(event, ctx)
  if event.payload.total == 30 then while true do end end
  return { { type = "order.confirmed", payload = { total = event.payload.total, at = os.time() } } }
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
