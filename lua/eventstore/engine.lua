-- eventstore.engine: the engine's Lua face (docs/engine.md). The engine is
-- C (core/engine/, its handle core/module/engine_handle.c); this file only
-- opens a store from a URL (and closes it with the engine).
local core = require("eventstore.core")
local retention = require("eventstore.retention")
local projections = require("eventstore.projections")

local Engine = {}
Engine.__index = Engine

local function new(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'engine' (table expected, got " .. type(opts) .. ")", 2)
  end
  local store, owned = opts.store, false
  if store == nil or type(store) == "string" then
    store = core.open(store, {clock = opts.clock, max_payload_bytes = opts.max_payload_bytes})
    owned = true
  end
  -- §3.9 retention policies: scripts/retention.lua is checked here, as
  -- every script is at open (§4), and read again at each sweep.
  local every = opts.retention_every_ms
  local ok, rules = pcall(function()
    if every ~= nil and (math.type(every) ~= "integer" or every < 1) then
      retention.invalid("bad option 'retention_every_ms' (an integer >= 1 expected, got %s)", tostring(every))
    end
    local scripts = opts.scripts or "scripts"
    -- anything but a string is the C engine's to refuse, with its message
    if type(scripts) == "string" then return retention.load(scripts) end
  end)
  local handle
  if ok then ok, handle = pcall(core.engine, store, opts) else handle = rules end
  if not ok then
    if owned then store:close() end
    error(handle, 2)
  end
  local self = setmetatable({store = store, _handle = handle, _owned = owned}, Engine)
  if rules then
    self._retention = {
      rules = rules, scripts = opts.scripts or "scripts", every = every or 60000,
      holder = (opts.holder or "engine") .. "/retention-" .. tostring(math.random(0, 1 << 40)),
    }
  end
  return self
end

-- The C handle behind self, which stays after close (a closed handle
-- raises CLOSED, docs/contract.md §2); anything but an engine is an argument error
-- naming the method, as the C handles' own checks are.
local function handle(self, method)
  if getmetatable(self) ~= Engine or self._handle == nil then
    local got = type(self) == "table" and "table" or type(self)
    error(("bad argument #1 to '%s' (eventstore engine expected, got %s)"):format(method, got), 3)
  end
  return self._handle
end

-- One sweep of the retention rules when one is due by the store's clock
-- (every retention_every_ms), under the store-wide lease that makes one
-- engine per store the sweeper. Errors are logged and counted, never
-- raised: a policy must not stop the engine's run.
function Engine:_retain_if_due()
  local r = self._retention
  if not r then return end
  local h = self._handle
  local ok, err = pcall(function()
    local now = self.store:now()
    if r.last ~= nil and now - r.last < r.every then return end
    -- Due: tried once this period, whatever comes of it (a store that
    -- refuses the lease, a read-only one, is not asked every progress tick).
    r.last = now
    local lease = self.store:lease(retention.LEASE_SESSION, { holder = r.holder, ttl_ms = math.max(3 * r.every, 1000) })
    if lease.outcome == "held" then return end -- another engine sweeps this store: look again next period
    r.token = lease.token
    -- The file is read again (edits apply at the next sweep); one that no
    -- longer loads keeps the last good rules, as a handler reload does.
    local okr, rules = pcall(retention.load, r.scripts)
    if okr and rules then r.rules = rules
    elseif not okr then io.stderr:write("eventstore: retention: ", tostring(rules), " (the last good rules apply)\n") end
    retention.apply(self.store, r.rules, {
      truncate = function(session, through) return h:truncate(session, through) end,
      on_action = function(a)
        h:_retain_count(a.error and "failed" or a.action)
        if a.error then io.stderr:write("eventstore: retention: ", retention.describe(a), "\n") end
      end,
    })
    h:_retain_count("sweeps") -- once its actions are counted: a reader seeing it sees them
  end)
  if not ok then
    h:_retain_count("failed")
    io.stderr:write("eventstore: retention: ", type(err) == "table" and tostring(err.message) or tostring(err), "\n")
  end
end

-- run{until_idle = true} -> {handled, failed, dead, abandoned}. With
-- retention rules, they are applied while it runs (from its progress
-- function, on this thread) and, with until_idle, once more before it
-- returns when they are due.
function Engine:run(opts)
  local h = handle(self, "run")
  if not self._retention then return h:run(opts) end
  if opts ~= nil and type(opts) ~= "table" then return h:run(opts) end -- its own argument error
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  local user = o.progress
  o.progress = function(st)
    self:_retain_if_due()
    if user then return user(st) end
  end
  local result = h:run(o)
  if o.until_idle then self:_retain_if_due() end
  return result
end

-- retain{dry_run} -> the actions (retention.lua's plan): the rules applied
-- once, now, whatever retention_every_ms says (eventstore retain). nil
-- when the scripts directory has no retention.lua.
function Engine:retain(opts)
  local h = handle(self, "retain")
  local r = self._retention
  if not r then return nil end
  opts = opts or {}
  local rules = retention.load(r.scripts) or r.rules
  local actions = retention.apply(self.store, rules, {
    dry_run = opts.dry_run,
    truncate = function(session, through) return h:truncate(session, through) end,
    on_action = function(a)
      if not opts.dry_run then h:_retain_count(a.error and "failed" or a.action) end
      if opts.on_action then opts.on_action(a) end
    end,
  })
  if not opts.dry_run then h:_retain_count("sweeps") end
  return actions
end

function Engine:stop() handle(self, "stop"):stop() end

-- Whether scripts/handlers/<type>.lua exists (loadable or not).
function Engine:has_handler(event_type) return handle(self, "has_handler"):has_handler(event_type) end

-- Like store:append; events of a type with no handler are stored
-- processed (they would never wait for a worker), and `delay_ms` / `at`
-- become `not_before` (a timer).
function Engine:append(session, events, opts) return handle(self, "append"):append(session, events, opts) end

-- upcast(events) -> a copy of the list of event tables, each read as
-- handlers see it (docs/upcasting.md): its upcasters applied in one of
-- the engine's states, under its budgets.
function Engine:upcast(events)
  local h = handle(self, "upcast")
  if type(events) ~= "table" then
    error("bad argument #1 to 'upcast' (table expected, got " .. type(events) .. ")", 2)
  end
  return h:upcast(events)
end

-- read(session, {after, through, limit}) -> store:read's events as
-- handlers see them (§7): upcast; the stored bytes never change.
function Engine:read(session, opts)
  local h = handle(self, "read")
  return h:upcast(self.store:read(session, opts))
end

-- lease(session, {ttl_ms = 30000}) -> as store:lease, for this engine's
-- holder: while it holds the lease its writes there carry the token
-- (docs/branches.md).
function Engine:lease(session, opts) return handle(self, "lease"):lease(session, opts) end

-- truncate(session, through) -> first_index: every reducer's state is
-- snapshotted at `through` first, so it stays readable (docs/contract.md §3.9).
function Engine:truncate(session, through) return handle(self, "truncate"):truncate(session, through) end

-- release(session) -> whether the engine's lease was ended
function Engine:release(session) return handle(self, "release"):release(session) end

-- state(session, reducer, {at = index}) -> the folded state
function Engine:state(session, reducer, opts)
  local h = handle(self, "state")
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #3 to 'state' (table expected, got " .. type(opts) .. ")", 2)
  end
  return h:state(session, reducer, opts and opts.at)
end

-- stats() -> {types = {[type] = {handled, failed, dead, runs, p50_us,
-- p99_us, max_us}}, handled, failed, dead, store = store:stats(),
-- projections = engine:projections()} (docs/stats.md)
function Engine:stats(...)
  local st = handle(self, "stats"):stats(...)
  st.projections = projections.rows(self.store)
  return st
end

-- projections() -> one row per projection (§8): name, version, position,
-- head, lag, lag_ms, status, error, generation, rebuilding, ...
-- (eventstore.projections)
function Engine:projections()
  handle(self, "projections")
  return projections.rows(self.store)
end

-- Bench only (bench/README.md "Stats cost"): stop or restart counting.
function Engine:_stats_enabled(on) return handle(self, "_stats_enabled"):_stats_enabled(on) end

-- Harmless twice. The closed handle stays, so later calls raise CLOSED;
-- refused (INVALID_ARGUMENT) from the run's own progress function, and
-- then nothing is closed.
function Engine:close()
  local h = handle(self, "close")
  if not self._closed then
    local r = self._retention
    if r and r.token then
      -- Give the sweep to another engine at once rather than at expiry.
      pcall(self.store.release, self.store, retention.LEASE_SESSION, { holder = r.holder, token = r.token })
    end
    h:close()
    self._closed = true
    if self._owned then self.store:close() end
  end
end
Engine.__close = Engine.close
Engine.__gc = Engine.close

return new
