-- eventstore.engine: the engine's Lua face (docs/engine.md). Dispatch and
-- the reducer fold are C (core/lua/engine_handle.c); this file holds what is
-- simplest in Lua: opening a store from a URL, and append's rules for
-- events without a handler and for timers.
local core = require("eventstore.core")

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

-- run{until_idle = true} -> {handled, failed, dead}
function Engine:run(opts)
  return self._handle:run(opts)
end

function Engine:stop()
  self._handle:stop()
end

-- Like store:append; events of a type with no handler are stored
-- processed (they would never wait for a worker), and `delay_ms` / `at`
-- become `not_before` (a timer).
function Engine:append(session, events, opts)
  if type(events) ~= "table" then
    error("bad argument #2 to 'append' (table expected, got " .. type(events) .. ")", 2)
  end
  local now
  local out = {}
  local has = {} -- one look at the scripts directory per type and call
  for i, e in ipairs(events) do
    if type(e) ~= "table" then
      error("bad argument #2 to 'append' (events[" .. i .. "] must be a table)", 2)
    end
    local copy = {}
    for k, v in pairs(e) do copy[k] = v end
    if copy.delay_ms ~= nil or copy.at ~= nil then
      if math.type(copy.delay_ms or 0) ~= "integer" or math.type(copy.at or 0) ~= "integer" then
        error("bad argument #2 to 'append' (events[" .. i .. "].delay_ms and at must be integers)", 2)
      end
      if copy.delay_ms ~= nil and copy.at ~= nil then
        error("bad argument #2 to 'append' (events[" .. i .. "] has both at and delay_ms)", 2)
      end
      now = now or self.store:now()
      copy.not_before = copy.at or (now + copy.delay_ms)
      copy.delay_ms, copy.at = nil, nil
    end
    if type(copy.type) == "string" and not copy.settled then
      if has[copy.type] == nil then has[copy.type] = self._handle:has_handler(copy.type) end
      if not has[copy.type] then copy.settled = true end
    end
    out[i] = copy
  end
  return self.store:append(session, out, opts)
end

-- state(session, reducer, {at = index}) -> the folded state
function Engine:state(session, reducer, opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #3 to 'state' (table expected, got " .. type(opts) .. ")", 2)
  end
  return self._handle:fold(session, reducer, opts and opts.at)
end

function Engine:close()
  if self._handle then
    self._handle:close()
    self._handle = nil
    if self._owned then self.store:close() end
  end
end
Engine.__close = Engine.close
Engine.__gc = Engine.close

return new
