-- eventstore.replay: what-if over real history (docs/contract.md §9,
-- docs/replay.md).
--
--   local report = eventstore.replay{store = store_or_url, scripts = "NEW",
--     baseline = "OLD" (optional), sessions = PREFIX, limit = N,
--     reducers_only = true (fold the stored events with OLD's and NEW's
--     reducers and diff the states, no handler runs; needs baseline),
--     engine = {max_failures, backoff_ms, ...}, each = fn(session_report),
--     progress = fn(done, total)}
--   --> {sessions = {...} (unless `each` took them), summary = {replayed,
--        identical, diverged, failed, rate}}
--
-- For each selected session the outside inputs (events without a cause)
-- are fed one at a time into a scratch memory: store on a manual clock set
-- to each input's created_at; the engine of the scripts under test runs to
-- idle between inputs, and timers and backoffs fire in virtual time: the
-- clock jumps to the next one due. Each session gets its own scratch store
-- and engine, so memory does not grow with the number of sessions and no
-- session's ids or clock depend on another's. The source store is only
-- read: a URL is opened read-only where the backend allows (sqlite:
-- ?mode=ro).
--
-- Upcasters (§7): events are compared and folded as the scripts read them,
-- upcast by the upcasters of the side they belong to (`upcast` below); the
-- inputs are fed to the scratch engine as stored, and its engine upcasts
-- them as a live one would.
local core = require("eventstore.core")
local new_engine = require("eventstore.engine")

local json = core.json
local null = json.null

local M = {}


local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The script names of one kind in a scripts directory (DIR/KIND/**/*.lua,
-- as the engine's loader names them), sorted. -L: a symlinked folder is
-- followed, as the loader's open of the file would follow it.
local function script_names(dir, kind)
  local names = {}
  local p = io.popen("find -L " .. quote(dir .. "/" .. kind) .. " -name '*.lua' -type f 2>/dev/null")
  if not p then return names end
  local base = dir .. "/" .. kind .. "/"
  for line in p:lines() do names[#names + 1] = (line:sub(#base + 1):gsub("%.lua$", "")) end
  p:close()
  table.sort(names)
  return names
end

-- The event types with an upcaster file (upcasters/<type>.lua, §7): only
-- events of these types can read differently once upcast, so only they
-- cross into an engine to be.
local function upcaster_types(dir)
  local types = {}
  for _, t in ipairs(script_names(dir, "upcasters")) do types[t] = true end
  return types
end

-- The bytes of DIR/KIND/NAME.lua, or false when there is no such file.
local function script_bytes(dir, kind, name)
  local f = io.open(dir .. "/" .. kind .. "/" .. name .. ".lua", "rb")
  if not f then return false end
  local src = f:read("a")
  f:close()
  return src or false
end

-- Whether the scripts of KIND named in `names` are byte for byte the same
-- in dirs a and b (a name missing from both is the same). Two sides whose
-- upcasters are the same read every event alike; a reducer that is the
-- same on both sides, over events read alike, folds to the same state on
-- both (whatever it requires resolves alike for both: package.path).
local function same_scripts(a, b, kind, names)
  for _, n in ipairs(names) do
    if script_bytes(a, kind, n) ~= script_bytes(b, kind, n) then return false end
  end
  return true
end

local function is_dir(path)
  local ok = os.execute("test -d " .. quote(path))
  return ok == true or ok == 0
end

-- A URL opened read-only where the backend can.
function M.read_only(url)
  if url:sub(1, 7) == "sqlite:" and not url:find("[?&]mode=") then
    return url .. (url:find("?", 1, true) and "&" or "?") .. "mode=ro"
  end
  return url
end

---------------------------------------------------------------------------
-- Diffs by JSON path

local function seg(t, k)
  if math.type(k) == "integer" and json.is_array(t) then return "[" .. (k - 1) .. "]" end
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return "." .. k end
  return "[" .. json.encode(type(k) == "string" and k or tostring(k)) .. "]"
end

local function keys_of(a, b)
  local seen, keys = {}, {}
  for _, t in ipairs({ a, b }) do
    for k in pairs(t) do
      if not seen[k] then seen[k], keys[#keys + 1] = true, k end
    end
  end
  table.sort(keys, function(x, y)
    if type(x) == type(y) and (type(x) == "number" or type(x) == "string") then return x < y end
    return type(x) < type(y)
  end)
  return keys
end

local MAX_DIFFS = 100 -- paths kept per compared pair: a diff is for reading

-- Whether a and b hold the same values at every path (what diff finds no
-- difference in), without making a path or a key list: most of what a
-- replay compares is the same, and diff's paths cost more than the walk.
local function same(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  for k, v in pairs(a) do
    if not same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

-- Appends {path, baseline, replayed} for each place a and b differ.
local function diff(a, b, path, out)
  if #out >= MAX_DIFFS or same(a, b) then return out end
  if type(a) == "table" and type(b) == "table" then
    local arr = json.is_array(a) or json.is_array(b)
    for _, k in ipairs(keys_of(a, b)) do
      diff(a[k], b[k], path .. seg(arr and a or (a[k] ~= nil and a or b), k), out)
    end
  elseif a ~= b then
    out[#out + 1] = { path = path, baseline = a == nil and null or a, replayed = b == nil and null or b }
  end
  return out
end
M.diff = function(a, b) return diff(a, b, "$", {}) end

---------------------------------------------------------------------------
-- Events as compared: what a handler decided (§9: type, payload, lane,
-- cause, timer). Ids, positions and dispatch records are not behaviour; a
-- cause is its index (a result of attempt 3 live is a result of attempt 1
-- in a replay that did not meet the outside failure); a timer is its delay
-- after the event was written, as live completions ran later than their
-- inputs while a replay's run at the input's instant.
local function view(e)
  if e == nil then return nil end
  local timer = null
  if e.not_before ~= nil then timer = { delay_ms = e.not_before - e.created_at } end
  return {
    type = e.type,
    payload = e.payload == nil and null or e.payload,
    lane = e.lane == nil and null or e.lane,
    cause = e.cause and e.cause.index or null,
    timer = timer,
  }
end

-- Ids are names, not behaviour: an event a handler wrote has a generated
-- id, another one in the scratch store than live, and a handler that uses
-- its event's id (an idempotency key, "ch_" .. event.id) puts it in what
-- it returns. Each side's events are compared and folded as copies in
-- which every id of the session, wherever it appears in a payload string
-- and as the event's own id, reads "<id #INDEX>" (the index of the event
-- that has it). Sessions over MAX_NAMED events are left as they are (the
-- search is per string and id).
local MAX_NAMED = 2000

local function named(events)
  if #events > MAX_NAMED then return events end
  local ids = {}
  for _, e in ipairs(events) do
    if type(e.id) == "string" and #e.id >= 8 then ids[#ids + 1] = { e.id, "<id #" .. e.index .. ">" } end
  end
  local function str(v)
    for _, p in ipairs(ids) do
      if v:find(p[1], 1, true) then
        v = v:gsub(p[1]:gsub("%p", "%%%0"), (p[2]:gsub("%%", "%%%%")))
      end
    end
    return v
  end
  local function copy(v)
    if type(v) == "string" then return str(v) end
    if type(v) ~= "table" then return v end
    local t = {}
    for k, x in pairs(v) do t[copy(k)] = copy(x) end
    if json.is_array(v) then json.array(t) end
    return t
  end
  local out = {}
  for i, e in ipairs(events) do
    local c = {}
    for k, v in pairs(e) do c[k] = v end
    c.id = "<id #" .. e.index .. ">"
    c.payload = copy(e.payload)
    out[i] = c
  end
  return out
end

local function first_divergence(baseline, replayed)
  local n = math.max(#baseline, #replayed)
  for i = 1, n do
    -- one event table on both sides (reducers only: an event not upcast) is the same
    if baseline[i] ~= replayed[i] then
      local b, r = view(baseline[i]), view(replayed[i])
      if b == nil or r == nil or #diff(b, r, "$", {}) > 0 then
        return { index = i, baseline = b or null, replayed = r or null }
      end
    end
  end
  return nil
end

---------------------------------------------------------------------------
-- Reducer folds, in this state under an instruction budget (a reducer
-- that loops fails the session, not the replay).

local function budgeted(limit, fn, ...)
  local left = limit
  debug.sethook(function()
    left = left - 1000
    if left < 0 then error(("instruction budget exceeded (%d instructions)"):format(limit), 2) end
  end, "", 1000)
  local res = table.pack(pcall(fn, ...))
  debug.sethook()
  return table.unpack(res, 1, res.n)
end

-- The reducer `name` of dir, loaded once per replay (as an engine's state
-- loads it once): its table, false when dir has none; raises when it does
-- not load.
local function reducer_module(modules, dir, name, budget)
  local path = dir .. "/reducers/" .. name .. ".lua"
  local m = modules[path]
  if m == nil then
    local f = io.open(path, "rb")
    if f then
      f:close()
      local ok, r = budgeted(budget, function()
        local chunk = assert(loadfile(path, "t"))
        return chunk()
      end)
      if not ok then r = tostring(r) elseif type(r) ~= "table" then r = path .. " must return a table" end
      m = r
    else
      m = false
    end
    modules[path] = m
  end
  if type(m) == "string" then error(("reducer '%s': %s"):format(name, m), 0) end
  return m
end

local function fold(modules, dir, name, events, budget)
  local r = reducer_module(modules, dir, name, budget)
  if not r then return nil end -- no such reducer there: no state
  local ok, state = budgeted(budget, function()
    local s = r.init and r.init() or {}
    for _, e in ipairs(events) do
      local step = r[e.type]
      if step then
        local out = step(s, e)
        if out ~= nil then s = out end
      end
    end
    return s
  end)
  if not ok then error(("reducer '%s': %s"):format(name, tostring(state)), 0) end
  return state
end

---------------------------------------------------------------------------
-- One session under one set of scripts

local BUDGET_RE = { "budget exceeded", "deadline exceeded" }

local function budget_error(msg)
  for _, p in ipairs(BUDGET_RE) do
    if tostring(msg):find(p, 1, true) then return true end
  end
  return false
end

-- The earliest time a pending event of the session becomes ready.
local function next_due(events)
  local due
  for _, e in ipairs(events) do
    if e.status == "pending" then
      local t = math.max(e.not_before or 0, e.retry_at or 0)
      if due == nil or t < due then due = t end
    end
  end
  return due
end

-- A scratch memory: store on a manual clock and an engine of the scripts
-- of dir over it, kept for the whole replay: making an engine loads every
-- script, which would cost more than most sessions' replay. Each session
-- is deleted from it once replayed, so memory stays flat; ids come from a
-- counter (compared as names: `named`); the clock is set back to each
-- session's first input.
local function new_sandbox(dir, eopts)
  local clock = core.manual_clock(0)
  local scratch = core.open("memory:", { clock = clock, ids = core.counter_ids("replay-", 1) })
  local o = { store = scratch, scripts = dir, workers = 1, holder = "replay", snapshot_every = 0, quiet = true }
  for k, v in pairs(eopts or {}) do o[k] = v end
  -- Each run to idle on this thread, no threads started per run (docs/
  -- engine.md "Inline runs"): nothing else claims from the scratch store.
  -- Only with one worker; engine options that ask for more get threads.
  if o.inline_runs == nil and o.workers == 1 then o.inline_runs = true end
  local ok, engine = pcall(new_engine, o)
  if not ok then
    scratch:close()
    error(engine, 0)
  end
  return { clock = clock, scratch = scratch, engine = engine }
end

-- §7: events as the scripts of dir read them (upcast in the engine of its
-- sandbox, under its budgets). Raises when an upcaster fails. Only the
-- events of a type with an upcaster file (o.upcasters[dir]) are sent (a
-- copy of each crosses into the engine's state and back); the list itself
-- comes back when it has none.
local function upcast(o, dir, events)
  local types = o.upcasters[dir]
  local picked, at = {}, {}
  for i, e in ipairs(events) do
    if types[e.type] then picked[#picked + 1], at[#at + 1] = e, i end
  end
  if #picked == 0 then return events end
  local sb = o.sandboxes[dir]
  if not sb then
    sb = new_sandbox(dir, o.engine)
    o.sandboxes[dir] = sb
  end
  local up = sb.engine:upcast(picked)
  local out = table.move(events, 1, #events, 1, {})
  for k, i in ipairs(at) do out[i] = up[k] end
  return out
end

local function close_sandbox(sb)
  pcall(sb.engine.close, sb.engine)
  pcall(sb.scratch.close, sb.scratch)
end

-- Runs `inputs` through the scripts in `dir` (in the sandbox kept in
-- sandboxes[dir]): the session's events as the scratch store ended, the
-- errors met, and a budget error if one was met.
local function run_session(o, dir, session, inputs, max_events)
  local sandboxes = o.sandboxes
  local sb = sandboxes[dir]
  if not sb then
    sb = new_sandbox(dir, o.engine)
    sandboxes[dir] = sb
  end
  local clock, scratch, engine = sb.clock, sb.scratch, sb.engine
  clock:set(inputs[1] and inputs[1].created_at or 0)
  -- The session as the last look found it, while no run has changed it
  -- since (the final read below is then that one).
  local last
  local ok, err = pcall(function()
    local ran_at -- the virtual time of the last run to idle
    local function run()
      last = nil
      ran_at = clock:now()
      engine:run({ until_idle = true })
    end
    -- Fires what falls due by `t` (timers, backoffs), in time order: one
    -- due at t itself first, since live it was ready (not_before <= now)
    -- before an input that came at t.
    local function advance_to(t)
      while true do
        local events = scratch:read(session)
        last = events
        if #events > max_events then
          error(("more than %d events in the replayed session (a handler that never stops "
            .. "scheduling work?)"):format(max_events), 0)
        end
        local due = next_due(events)
        if due == nil or (t and due > t) or due < clock:now() then return end
        -- still due at the instant of the last run to idle: it cannot run
        -- here (its type's handler is another engine's), and time must move
        if due == ran_at then return end
        clock:set(due)
        run()
      end
    end
    for _, input in ipairs(inputs) do
      advance_to(input.created_at)
      if input.created_at > clock:now() then clock:set(input.created_at) end
      local ev = { id = input.id, type = input.type, payload = input.payload, lane = input.lane,
        revision = input.revision, meta = input.meta }
      if input.not_before ~= nil then ev.at = input.not_before end
      -- Never dispatched live (processed without an attempt): appended
      -- settled, it is a fact here too; cancelled before it ran (an
      -- outside cancel is no event to replay), it is cancelled again here
      -- before it can run.
      local unrun = input.status == "processed" and input.attempts == 0
      if unrun and input.cancelled == nil then ev.settled = true end
      last = nil
      local stored = engine:append(session, { ev })[1]
      if unrun and input.cancelled ~= nil and stored.status == "pending" then
        scratch:cancel(session, stored.index, { reason = input.cancelled })
      end
      run()
    end
    advance_to(nil)
  end)
  local events = ok and last or scratch:read(session)
  local seen_ok, seen = pcall(upcast, o, dir, events)
  local gone = pcall(scratch.delete, scratch, session)
  if not ok or not gone then
    -- Whatever state a failed replay left is not the next session's.
    close_sandbox(sb)
    sandboxes[dir] = nil
  end
  local errors, budget = {}, nil
  for _, e in ipairs(events) do
    if e.failures > 0 or e.status == "dead" then
      errors[#errors + 1] = { index = e.index, type = e.type, failures = e.failures,
        dead = e.status == "dead", error = e.last_error or null }
      if budget == nil and e.last_error and budget_error(e.last_error) then budget = e.last_error end
    end
  end
  if not ok then
    errors[#errors + 1] = { error = tostring(err) }
    budget = budget or tostring(err)
  end
  if not seen_ok then
    errors[#errors + 1] = { error = tostring(seen) }
    budget = budget or tostring(seen)
    seen = events
  end
  return seen, errors, budget
end

-- sides: the stored events as OLD's and as NEW's scripts read them (in a
-- full replay, {nil, NEW's}) when they were upcast for many sessions at
-- once (upcast_chunk), else nil.
local function replay_session(o, session, stored, sides)
  local inputs = {}
  for _, e in ipairs(stored) do
    if e.cause == nil then inputs[#inputs + 1] = e end
  end
  local max_events = (#stored + 100) * 10
  local rep = { session = session }
  local replayed, errors, failure, baseline
  -- §7: each side's events as its own scripts read them
  local function read_as(dir)
    local ok, res = pcall(upcast, o, dir, stored)
    if ok then return res end
    errors[#errors + 1] = { error = tostring(res) }
    failure = failure or tostring(res)
    return stored
  end
  if o.reducers_only then
    -- No handler runs: both sides are the stored events, folded with
    -- OLD's reducers and NEW's (check_opts asks for a baseline).
    errors = {}
    if sides then
      baseline, replayed = sides[1], sides[2]
    else
      baseline = read_as(o.baseline)
      replayed = o.same_reading and baseline or read_as(o.scripts)
    end
  else
    replayed, errors, failure = run_session(o, o.scripts, session, inputs, max_events)
    baseline = sides and sides[2] or read_as(o.scripts)
  end
  if o.baseline and not o.reducers_only then
    local berrors, bfail
    baseline, berrors, bfail = run_session(o, o.baseline, session, inputs, max_events)
    for _, e in ipairs(berrors) do
      e.baseline = true
      errors[#errors + 1] = e
    end
    failure = failure or bfail
  end
  rep.errors = errors
  if o.reducers_only then
    -- Both sides are the stored events (upcast by each side's scripts):
    -- the same ids, nothing to rename; folded as stored, as live reducers
    -- fold them. They differ only where the upcasters do.
    if baseline ~= replayed then rep.divergence = first_divergence(baseline, replayed) end
  else
    baseline, replayed = named(baseline), named(replayed)
    rep.divergence = first_divergence(baseline, replayed)
  end
  -- §9: without a baseline each reducer under test folds the stored events
  -- and the replayed ones; with one, the baseline's states are OLD's
  -- reducers over OLD's replay.
  rep.states = {}
  local budget = o.engine and o.engine.instruction_budget or 100000000
  if budget == 0 then budget = math.maxinteger end
  for _, name in ipairs(o.reducers) do
    local ok, res = pcall(function()
      local b = fold(o.modules, o.baseline or o.scripts, name, baseline, budget)
      -- The same reducer over the very same events: one fold (it still
      -- runs, so a reducer that fails fails the session as before).
      if baseline == replayed and o.same_reducer[name] then return {} end
      local r = fold(o.modules, o.scripts, name, replayed, budget)
      return diff(b, r, "$", {})
    end)
    if ok then
      if #res > 0 then rep.states[name] = res end
    else
      errors[#errors + 1] = { error = tostring(res) }
      failure = failure or tostring(res)
    end
  end
  if failure then
    rep.status, rep.failure = "failed", failure
  elseif rep.divergence or next(rep.states) then
    rep.status = "diverged"
  else
    rep.status = "identical"
  end
  return rep
end

-- A replay reads CHUNK sessions at a time and upcasts their stored events
-- with one engine:upcast call per side (a call crosses into an engine's
-- state and back, which costs more than most sessions' folds): both sides
-- in a reducer-only replay, NEW's alone in a full one (the stored side
-- of the comparison when there is no baseline; the replayed events are
-- upcast as each session ends). Returns sides[k] = {OLD's list, NEW's
-- list} for lists[k] (OLD's nil when not asked for), or nil when an
-- upcaster failed on one of them: each session is then upcast alone, so
-- only the sessions it fails on fail.
local CHUNK = 100

local function upcast_chunk(o, lists, new_only)
  local function side(dir)
    local all, from = {}, {}
    for k, list in ipairs(lists) do
      from[k] = #all
      table.move(list, 1, #list, #all + 1, all)
    end
    local ok, up = pcall(upcast, o, dir, all)
    if not ok then return nil end
    local out = {}
    for k, list in ipairs(lists) do
      out[k] = up == all and list or table.move(up, from[k] + 1, from[k] + #list, 1, {})
    end
    return out
  end
  local b, r
  if not new_only then
    b = side(o.baseline)
    if not b then return nil end
  end
  r = o.same_reading and b or side(o.scripts)
  if not r then return nil end
  local sides = {}
  for k in ipairs(lists) do sides[k] = { b and b[k], r[k] } end
  return sides
end

---------------------------------------------------------------------------

-- An eventstore error object, as the C face raises them.
local function core_error(code, message)
  return setmetatable({ code = code, message = message }, core.error_mt)
end

-- Wall-clock milliseconds, for the rate only (nothing replayed reads it).
local function wall_ms()
  local p = io.popen("date +%s%3N")
  local ms = p and tonumber(p:read("l"))
  if p then p:close() end
  return ms or os.time() * 1000
end

local function check_opts(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'replay' (table expected, got " .. type(opts) .. ")", 3)
  end
  local function bad(msg) error(core_error("INVALID_ARGUMENT", "replay: " .. msg), 3) end
  if opts.store == nil then bad("store is required (an open store or a URL)") end
  if type(opts.scripts) ~= "string" then bad("scripts is required (the scripts directory under test)") end
  if not is_dir(opts.scripts) then bad("the scripts directory " .. opts.scripts .. " does not exist") end
  if opts.baseline ~= nil and (type(opts.baseline) ~= "string" or not is_dir(opts.baseline)) then
    bad("baseline must be an existing scripts directory")
  end
  if opts.sessions ~= nil and type(opts.sessions) ~= "string" then bad("sessions must be a prefix string") end
  if opts.limit ~= nil and (math.type(opts.limit) ~= "integer" or opts.limit < 1) then
    bad("limit must be a positive integer")
  end
  if opts.engine ~= nil and type(opts.engine) ~= "table" then bad("engine must be a table of engine options") end
  if opts.reducers_only and opts.baseline == nil then
    bad("reducers_only needs a baseline: the scripts whose reducers the new ones are compared with")
  end
end

function M.replay(opts)
  check_opts(opts)
  -- The sandboxes are made first: every script of the scripts under test
  -- and of the baseline loads (as an engine makes sure at its start), or
  -- the replay is an error naming the file before any session is replayed,
  -- never a report of sessions all failed by one typo.
  local sandboxes = {}
  local ok, err = pcall(function()
    for _, dir in ipairs({ opts.scripts, opts.baseline }) do
      if not sandboxes[dir] then sandboxes[dir] = new_sandbox(dir, opts.engine) end
    end
  end)
  if not ok then
    for _, sb in pairs(sandboxes) do close_sandbox(sb) end
    error(err, 0)
  end
  local store, owned = opts.store, false
  local report
  if type(store) == "string" then
    ok, store = pcall(core.open, M.read_only(store))
    if not ok then
      for _, sb in pairs(sandboxes) do close_sandbox(sb) end
      error(store, 0)
    end
    owned = true
  end
  ok, report = pcall(function()
    -- The names first (names only: a page at a time), for the total.
    local names, cursor = {}, nil
    repeat
      local page = store:sessions({ prefix = opts.sessions or "", after = cursor, limit = 100 })
      for _, s in ipairs(page.sessions) do
        if opts.limit and #names >= opts.limit then break end
        names[#names + 1] = s.session
      end
      cursor = page.cursor
    until cursor == nil or (opts.limit and #names >= opts.limit)
    local o = { scripts = opts.scripts, baseline = opts.baseline, engine = opts.engine,
      reducers_only = opts.reducers_only == true, sandboxes = sandboxes, modules = {}, upcasters = {} }
    for _, dir in ipairs({ opts.scripts, opts.baseline }) do o.upcasters[dir] = upcaster_types(dir) end
    local seen, reducers = {}, {}
    for _, dir in ipairs({ opts.scripts, opts.baseline }) do
      for _, n in ipairs(script_names(dir, "reducers")) do
        if not seen[n] then seen[n], reducers[#reducers + 1] = true, n end
      end
    end
    table.sort(reducers)
    o.reducers = reducers
    -- A reducer-only replay of a change to one script of several: the
    -- sides that read and fold alike are read and folded once.
    o.same_reducer = {}
    if o.reducers_only then
      local ups = {}
      for _, dir in ipairs({ opts.scripts, opts.baseline }) do
        for t in pairs(o.upcasters[dir]) do ups[#ups + 1] = t end
      end
      o.same_reading = o.scripts == o.baseline or same_scripts(o.scripts, o.baseline, "upcasters", ups)
      for _, n in ipairs(reducers) do
        o.same_reducer[n] = o.scripts == o.baseline or same_scripts(o.scripts, o.baseline, "reducers", { n })
      end
    else
      o.same_reading = o.scripts == o.baseline
    end
    local summary = { replayed = 0, identical = 0, diverged = 0, failed = 0, rate = 0 }
    local sessions = {}
    local started = wall_ms()
    local function done(i, rep)
      summary.replayed = summary.replayed + 1
      summary[rep.status] = summary[rep.status] + 1
      if opts.each then opts.each(rep) else sessions[#sessions + 1] = rep end
      if opts.progress then opts.progress(i, #names) end
    end
    -- With a baseline, a full replay compares with the baseline's replay,
    -- not with the stored events: it reads one session at a time.
    if o.reducers_only or not o.baseline then
      for first = 1, #names, CHUNK do
        local lists = {}
        for i = first, math.min(first + CHUNK - 1, #names) do lists[#lists + 1] = store:read(names[i]) end
        local sides = upcast_chunk(o, lists, not o.reducers_only)
        for k, list in ipairs(lists) do
          done(first + k - 1, replay_session(o, names[first + k - 1], list, sides and sides[k]))
        end
      end
    else
      for i, name in ipairs(names) do done(i, replay_session(o, name, store:read(name))) end
    end
    local secs = (wall_ms() - started) / 1000
    summary.rate = secs > 0 and math.floor(summary.replayed / secs * 10 + 0.5) / 10 or summary.replayed
    return { sessions = sessions, summary = summary }
  end)
  for _, sb in pairs(sandboxes) do close_sandbox(sb) end
  if owned then store:close() end
  if not ok then error(report, 0) end
  return report
end

return M
