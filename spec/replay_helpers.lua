-- spec/replay_helpers.lua: the app whose history the replay specs
-- (spec/63-replay_spec.lua, spec/64-cli_replay_spec.lua) make live and
-- replay, on top of spec/engine_helpers.lua.
local helpers = require("helpers")
local eh = require("engine_helpers")

local rh = {}

local T0 = helpers.T0

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
  -- The event's id as an idempotency key: generated, so another one in a
  -- replay, which compares ids as names (docs/replay.md).
  return { { type = "order.confirmed", payload = { total = event.payload.total, at = os.time(),
    key = "confirm-" .. event.id } } }
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

-- The engine options of the live runs and replays: the defaults (the CLI
-- replays with them).
local ENGINE = {}

-- Makes history: the inputs at their times through an engine of `dir`,
-- firing timers and retries when due (as a live clock would).
local function make_history(store, clock, dir, inputs)
  local o = { store = store, scripts = dir, quiet = true }
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

rh.APP, rh.ENGINE, rh.INPUTS = APP, ENGINE, INPUTS
rh.scripts, rh.make_history = scripts, make_history

-- A store of `url` with the app's history, and the scripts that made it.
function rh.history(url)
  local store, clock, concrete = helpers.new(url)
  local live = scripts()
  make_history(store, clock, live, INPUTS)
  return store, live, concrete
end

return rh
