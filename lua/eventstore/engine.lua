-- eventstore.engine: the engine's Lua face (docs/engine.md). The engine is
-- C (core/engine/, its handle core/module/engine_handle.c); this file only
-- opens a store from a URL (and closes it with the engine).
local core = require("eventstore.core")
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
  local ok, handle = pcall(core.engine, store, opts)
  if not ok then
    if owned then store:close() end
    error(handle, 2)
  end
  return setmetatable({store = store, _handle = handle, _owned = owned}, Engine)
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

-- run{until_idle = true} -> {handled, failed, dead, abandoned}
function Engine:run(opts) return handle(self, "run"):run(opts) end

function Engine:stop() handle(self, "stop"):stop() end

-- Whether scripts/handlers/<type>.lua exists (loadable or not).
function Engine:has_handler(event_type) return handle(self, "has_handler"):has_handler(event_type) end

-- Like store:append; events of a type with no handler are stored
-- processed (they would never wait for a worker), and `delay_ms` / `at`
-- become `not_before` (a timer).
function Engine:append(session, events, opts) return handle(self, "append"):append(session, events, opts) end

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
    h:close()
    self._closed = true
    if self._owned then self.store:close() end
  end
end
Engine.__close = Engine.close
Engine.__gc = Engine.close

return new
