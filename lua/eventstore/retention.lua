-- eventstore.retention: retention policies (docs/contract.md §3.9,
-- docs/retention.md "Retention policies").
--
-- `scripts/retention.lua` returns a list of rules
--   {sessions = PREFIX, keep_last = n?, max_age_ms = ms?,
--    action = "truncate" | "archive" | "delete"}
-- and the first rule whose prefix matches a session decides for it. The
-- engine (lua/eventstore/engine.lua) applies them every
-- `retention_every_ms` of the store's clock, and `eventstore retain` once.
--
-- Written in Lua over the store's public calls (sessions{}, read, lease,
-- truncate, archive, delete), not in C: every step is one of those calls,
-- the policy file is Lua anyway, and the engine's Lua face already runs on
-- the thread that drives engine:run (its progress function), so no worker
-- state or lock is involved. The store's own rules stay the last word: a
-- truncate or archive of a range holding a pending or dead event is refused
-- by the store even if a race slipped past the scan below.
local core = require("eventstore.core")

local M = {}

M.FILE = "retention.lua"
-- The session whose lease makes one engine per store the one that sweeps.
-- A lease on it creates its row, so it shows in sessions{} (as any leased
-- session does); the sweep skips it as a session with a live lease.
M.LEASE_SESSION = "eventstore:retention"
M.ACTIONS = { truncate = true, archive = true, delete = true }

local PAGE = 500 -- events read per step while scanning a session

-- Raises INVALID_ARGUMENT as the C face does (an error object), so callers
-- (the CLI) report it as the store's own errors, without a traceback.
local function invalid(fmt, ...)
  error(setmetatable({ code = "INVALID_ARGUMENT", message = fmt:format(...) }, core.error_mt), 0)
end
M.invalid = invalid

local function bad(path, i, msg, ...)
  invalid("%s: rule %d: " .. msg, path, i, ...)
end

local function check_int(path, i, rule, field, min)
  local v = rule[field]
  if v == nil then return end
  if math.type(v) ~= "integer" or v < min then
    bad(path, i, "%s must be an integer >= %d, got %s", field, min, tostring(v))
  end
end

-- The rules of a retention file's returned value, checked: a mistake is an
-- error naming the file and the rule, never a policy that silently does
-- something else (§4: scripts that do not load are errors at open).
function M.check(rules, path)
  path = path or M.FILE
  if type(rules) ~= "table" then
    invalid("%s must return a list of rules, got %s", path, type(rules))
  end
  local known = { sessions = true, keep_last = true, max_age_ms = true, action = true }
  for i, rule in ipairs(rules) do
    if type(rule) ~= "table" then bad(path, i, "a rule is a table, got %s", type(rule)) end
    for k in pairs(rule) do
      if not known[k] then bad(path, i, "unknown field '%s' (fields: sessions, keep_last, max_age_ms, action)", tostring(k)) end
    end
    if type(rule.sessions) ~= "string" then
      bad(path, i, "sessions (a prefix; \"\" matches every session) must be a string, got %s", type(rule.sessions))
    end
    if not M.ACTIONS[rule.action] then
      bad(path, i, "action must be \"truncate\", \"archive\" or \"delete\", got %s", tostring(rule.action))
    end
    check_int(path, i, rule, "keep_last", 0)
    check_int(path, i, rule, "max_age_ms", 1)
    if rule.action == "delete" then
      if rule.max_age_ms == nil then bad(path, i, "delete needs max_age_ms (the age of a session's newest event)") end
      if rule.keep_last ~= nil then bad(path, i, "delete removes whole sessions: keep_last does not apply") end
    elseif rule.keep_last == nil and rule.max_age_ms == nil then
      bad(path, i, "%s needs keep_last or max_age_ms (or both)", rule.action)
    end
  end
  local n = 0
  for _ in pairs(rules) do n = n + 1 end
  if n ~= #rules then invalid("%s must return a list (a sequence) of rules", path) end
  return rules
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text
end

-- The rules of <scripts>/retention.lua, or nil when there is no such file.
-- The file runs with an empty environment: it is a description, and a
-- policy that reached the store or the file system would not be one.
function M.load(scripts)
  local path = scripts .. "/" .. M.FILE
  local text = read_file(path)
  if text == nil then return nil end
  local chunk, err = load(text, "@" .. path, "t", {})
  if not chunk then invalid("cannot load %s", err) end
  local ok, rules = pcall(chunk)
  if not ok then invalid("cannot load %s", tostring(rules)) end
  return M.check(rules, path)
end

function M.rule_for(rules, session)
  for _, rule in ipairs(rules) do
    if session:sub(1, #rule.sessions) == rule.sessions then return rule end
  end
end

-- Walks the session's events from `from` through `upto` and returns the
-- highest index that may go: processed, and (with `cutoff`) created
-- before it; it stops below the first pending or dead event (§3.9).
local function droppable_through(store, session, from, upto, cutoff)
  local through = from - 1
  while through < upto do
    local page = store:read(session, { after = through, limit = math.min(PAGE, upto - through) })
    if #page == 0 then break end
    for _, ev in ipairs(page) do
      if ev.status ~= "processed" then return through, ev end
      if cutoff and ev.created_at >= cutoff then return through end
      through = ev.index
    end
  end
  return through
end

local function live_lease(row, now)
  return row.lease ~= nil and row.lease.expires_at > now
end

-- The action the rule gives a session row, or nil.
local function plan_session(store, rule, row, now)
  if live_lease(row, now) then return nil end
  local session = row.session
  local head = store:head(session)
  if head == 0 then return nil end
  if rule.action == "delete" then
    if row.pending > 0 or row.dead > 0 then return nil end -- never drops pending or dead
    -- Every event truncated (first_index past the head): the newest is
    -- gone, and the session's last write (updated_at) is no earlier than it.
    local newest_at
    if (row.first_index or 1) > head then
      newest_at = row.updated_at
    else
      newest_at = store:read(session, { after = head - 1, limit = 1 })[1].created_at
    end
    if now - newest_at > rule.max_age_ms then
      return { action = "delete", session = session, newest_at = newest_at }
    end
    return nil
  end
  local first = row.first_index or 1
  if rule.action == "archive" then
    local segs = store:segments(session)
    local archived = #segs > 0 and segs[#segs].through or 0
    if archived >= first then first = archived + 1 end -- nothing to move again
  end
  -- Events beyond the newest keep_last go whatever their age; older ones
  -- than max_age_ms go whatever keep_last says (§3.9: "or").
  local by_count = rule.keep_last and head - rule.keep_last or first - 1
  local upto = rule.max_age_ms and head or by_count
  if upto < first then return nil end
  local cutoff = rule.max_age_ms and now - rule.max_age_ms
  local through, blocker = droppable_through(store, session, first, math.max(by_count, first - 1), nil)
  if not blocker and cutoff and through < upto then
    through, blocker = droppable_through(store, session, through + 1, upto, cutoff)
  end
  if through < first then return nil end
  return {
    action = rule.action, session = session, from = first, through = through,
    stopped_at = blocker and blocker.index, stopped_status = blocker and blocker.status,
  }
end

-- An error's text: "CODE: message" for the store's error objects.
local function error_text(err)
  return type(err) == "table" and (tostring(err.code) .. ": " .. tostring(err.message)) or tostring(err)
end

-- Every action the rules give the store now, in session byte order.
function M.plan(store, rules, now)
  local actions, after = {}, nil
  repeat
    local page = store:sessions({ after = after, limit = 100 })
    for _, row in ipairs(page.sessions) do
      local rule = M.rule_for(rules, row.session)
      if rule then
        -- One session that cannot be planned (a read failing) is reported
        -- as its action's failure; the others still apply.
        local ok, a = pcall(plan_session, store, rule, row, now)
        if not ok then a = { action = rule.action, session = row.session, error = error_text(a) } end
        if a then actions[#actions + 1] = a end
      end
    end
    after = page.cursor
  until after == nil
  return actions
end

-- Applies one planned action. truncate goes through `truncate` (the
-- engine's, which snapshots every reducer first, when there is one).
local function apply(store, truncate, a)
  if a.action == "truncate" then
    truncate(a.session, a.through)
  elseif a.action == "archive" then
    store:archive(a.session, { through = a.through })
  else
    store:delete(a.session)
  end
end

-- Applies the rules once: opts.truncate(session, through) (default the
-- store's), opts.dry_run (plan only), opts.on_action(a) after each action
-- (a.error set when it failed: one session's failure does not stop the
-- others). Returns the actions.
function M.apply(store, rules, opts)
  opts = opts or {}
  local truncate = opts.truncate or function(session, through) return store:truncate(session, through) end
  local actions = M.plan(store, rules, store:now())
  for _, a in ipairs(actions) do
    if not opts.dry_run and not a.error then
      local ok, err = pcall(apply, store, truncate, a)
      if not ok then a.error = error_text(err) end
    end
    if opts.on_action then opts.on_action(a) end
  end
  return actions
end

-- One line of text for an action (the CLI prints these).
function M.describe(a)
  local what
  if a.error and not (a.through or a.newest_at) then -- it could not be planned
    what = ("%s %s"):format(a.action, a.session)
  elseif a.action == "delete" then
    what = ("delete %s (newest event at %d)"):format(a.session, a.newest_at)
  else
    what = ("%s %s %d..%d"):format(a.action, a.session, a.from, a.through)
    if a.stopped_at then what = what .. (" (stopped below %s event %d)"):format(a.stopped_status, a.stopped_at) end
  end
  if a.error then what = what .. ": failed: " .. a.error end
  return what
end

return M
