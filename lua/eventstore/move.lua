-- eventstore.move: moving a store (docs/moving.md, contract §10).
--
--   store:export(fn, {sessions = PREFIX})      fn(line) for each NDJSON line
--   eventstore.import(store, source, {mode})   source: an iterator of lines
--                                              (io.lines(path)) or a list
--   eventstore.copy(from, to)                  export piped into import
--
-- The raw work is C (store:_export, store:_import: core/store/move.c); this
-- file gives it the shape a host uses. An export is made whole before fn
-- sees its first line (one read transaction per backend, so fn may call
-- the store), and an import reads its whole stream before it writes, so a
-- stream cut short writes nothing.
local json = require("eventstore.core").json

local M = {}

local function check_store(self, name)
  if type(self) ~= "userdata" or type(self._export) ~= "function" then
    error(("bad argument #1 to '%s' (eventstore.Store expected, got %s)"):format(name, type(self)), 3)
  end
end

-- The lines of an export (opts.sessions: a prefix; opts.after: a position,
-- for a follower's increment).
local function export_lines(store, opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("bad argument #2 to 'export' (table expected, got " .. type(opts) .. ")", 3)
  end
  if opts.sessions ~= nil and type(opts.sessions) ~= "string" then
    error("bad argument #2 to 'export' (sessions: string expected, got " .. type(opts.sessions) .. ")", 3)
  end
  return store:_export(opts.sessions or "", opts.after or 0, opts.rows_only, opts.names)
end

-- store:export(fn, opts) -> number of lines: fn(line) for each line, in
-- order (without the newline). fn returning false stops the export
-- (its result is then false).
function M.export(store, fn, opts)
  check_store(store, "export")
  if type(fn) ~= "function" then
    error("bad argument #1 to 'export' (function expected, got " .. type(fn) .. ")", 2)
  end
  local lines = export_lines(store, opts)
  for i = 1, #lines do
    if fn(lines[i]) == false then return false end
  end
  return #lines
end

-- eventstore.import(store, source, {mode = "empty" | "upsert"}) ->
-- {already, sessions, events, position}: source is an iterator function
-- returning lines (io.lines(path)), or a list of lines. "empty" (the
-- default) writes into an empty store only (§10: a rerun on a store that
-- already holds exactly this stream changes nothing, already = true);
-- "upsert" applies a follower's increment (eventstore copy --follow).
function M.import(store, source, opts)
  check_store(store, "import")
  local lines = source
  if type(source) == "function" then
    lines = {}
    for line in source do
      if line ~= "" then lines[#lines + 1] = line end
    end
  elseif type(source) ~= "table" then
    error("bad argument #2 to 'import' (function or table expected, got " .. type(source) .. ")", 2)
  end
  opts = opts or {}
  return store:_import(lines, opts.mode or "empty")
end

-- eventstore.copy(from, to, {sessions}) -> import's result: the export of
-- `from` imported into the empty `to`.
function M.copy(from, to, opts)
  check_store(from, "copy")
  check_store(to, "copy")
  return M.import(to, export_lines(from, opts))
end

-- One step of a follower: the sessions of `from` with events past
-- position `after`, whole (rows, every event, the keys they use), applied
-- to `to`. Returns the
-- position the increment is consistent at (the next step's `after`) and
-- how many events it carried.
function M.catch_up(from, to, after, opts)
  local lines = export_lines(from, { sessions = opts and opts.sessions, after = after })
  local position = json.decode(lines[1]).position
  if #lines <= 2 then return math.max(position, after), 0 end
  local r = M.import(to, lines, { mode = "upsert" })
  return math.max(position, after), r.events
end

-- The last step of a move, after the writers stopped: every session row,
-- the check row of the keys and the refs of `from`, then the whole state
-- (every event's dispatch record, snapshots) of each session whose row
-- differs on `to` (a claim, a completion, a failure, a revive, a fence
-- moves the row's counts, tokens or updated_at), applied to `to`. Costs
-- what the sessions and the changed sessions hold, not the whole store.
function M.sync(from, to, opts)
  local prefix = opts and opts.sessions
  local rows = export_lines(from, { sessions = prefix, rows_only = true })
  local theirs = {}
  for _, line in ipairs(export_lines(to, { sessions = prefix, rows_only = true })) do
    local r = json.decode(line).session
    if r then theirs[r.session] = line end
  end
  local changed = {}
  for _, line in ipairs(rows) do
    local r = json.decode(line).session
    if r and theirs[r.session] ~= line then changed[#changed + 1] = r.session end
  end
  local r = M.import(to, rows, { mode = "upsert" })
  if #changed > 0 then
    r = M.import(to, export_lines(from, { sessions = prefix, names = changed }), { mode = "upsert" })
  end
  return r
end

return M
