-- eventstore: the Lua face of the event store.
--
--   local eventstore = require("eventstore")
--   local store <close> = eventstore.open("sqlite:app.db")
--
-- The store itself is C (eventstore.core); this file adds what is simplest
-- in Lua: stream(), is_error(). See README.md for the API.
local core = require("eventstore.core")

local M = {
  _VERSION = core._VERSION,
  open = core.open,
  manual_clock = core.manual_clock,
  counter_ids = core.counter_ids,
  json = core.json,
  state = core.state,
  engine = require("eventstore.engine"),
}

-- eventstore.replay{store, scripts, baseline?, sessions?, limit?} -> report
-- (docs/replay.md); loaded on first use.
function M.replay(opts) return require("eventstore.replay").replay(opts) end

-- Whether e is an eventstore error object (with the given code, if any).
function M.is_error(e, code)
  if type(e) ~= "table" or getmetatable(e) ~= core.error_mt then return false end
  return code == nil or e.code == code
end

local methods = core.store_methods

-- Moving a store (docs/moving.md): store:export(fn, opts),
-- eventstore.import(store, source, opts), eventstore.copy(from, to, opts).
local move = require("eventstore.move")
methods.export = move.export
M.import = move.import
M.copy = move.copy

-- store:stream(session, {after = 0, timeout_ms = nil}): history first, then
-- live events, no gaps, no duplicates; ends once no new event has come for
-- timeout_ms (nil: never ends).
function methods.stream(self, session, opts)
  -- Checked here, not at the iterator's first call (where a number would
  -- raise the VM's "attempt to index"): as the C methods' own check.
  if type(self) ~= "userdata" or (getmetatable(self) or {}).__index ~= methods then
    error("bad argument #1 to 'stream' (eventstore.Store expected, got " .. type(self) .. ")", 2)
  end
  if type(session) ~= "string" then
    error("bad argument #1 to 'stream' (string expected, got " .. type(session) .. ")", 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #2 to 'stream' (table expected, got " .. type(opts) .. ")", 2)
  end
  opts = opts or {}
  local after = opts.after or 0
  local timeout = opts.timeout_ms
  local batch, i = {}, 1
  return function()
    if i > #batch then
      batch, i = self:read(session, {after = after, limit = 1000}), 1
      while #batch == 0 do
        batch = self:wait(session, after, timeout or 1000)
        if #batch == 0 and timeout ~= nil then return nil end
      end
    end
    local e = batch[i]
    i = i + 1
    after = e.index
    return e
  end
end

return M
