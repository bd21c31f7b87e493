-- eventstore.loader: finds, loads and caches handlers and reducers from a
-- scripts directory (docs/engine.md). One loader lives in each of the
-- engine's Lua states (core/engine/), so its caches need no locks; the
-- engine calls it inside a budgeted call, so a script whose top level
-- loops or allocates without end fails the attempt that loads it.
--
--   local loader = require("eventstore.loader")(dir, stat, hash, shared)
--   loader.handler(type, now_ms)  --> fn | nil, err | nil, exists
--   loader.reducer(name, now_ms)  --> tbl | nil, err | nil, version
--   loader.upcaster(type, now_ms) --> tbl | nil, err | nil, version (docs/upcasting.md)
--   loader.projection(name, now_ms) --> tbl | nil, err | nil, version (§8)
--   loader.new_run()              -- look at every file again
--
-- stat(path) gives a file's signature (mtime, size, inode) or nil; hash(src)
-- a reducer's version. A file is looked at again when a run starts and at
-- most once a second while it runs; a name with no file is looked at each
-- time it is asked for (it is not cached: docs/limits.md).
--
-- shared (optional; core/engine/scripts.c) is what the engine's states
-- share: shared.put(path, src) keeps the last source that loaded,
-- shared.get(path) gives it back, shared.failed(path, sig, why) logs and
-- counts a failed reload. A reload that fails keeps the last good version
-- (docs/contract.md §4): this state's own, or, in a state that never ran the file
-- (a fresh worker), the shared source. Only a file that never loaded
-- anywhere is an error for the events that need it.
-- How long (ms) a file's answer stands before the file is looked at again.
local RECHECK_MS = 1000

return function(dir, stat, hash, shared)
  local handlers, reducers, upcasters, projections, gen = {}, {}, {}, {}, 0
  local M = {}

  function M.new_run() gen = gen + 1 end

  -- A name is a relative path below the kind's folder: no empty, "." or
  -- ".." parts, no NUL.
  local function valid(name)
    if name == "" or name:find("\0", 1, true) or name:sub(1, 1) == "/" then return false end
    for part in (name .. "/"):gmatch("([^/]*)/") do
      if part == "" or part == "." or part == ".." then return false end
    end
    return true
  end

  -- An upcaster file's table (§7): `current`, an integer revision, and
  -- steps [r] (r -> r + 1) for revisions below it, nothing else, so a
  -- misspelt `Current` or a step past the end is an error at load, not an
  -- event that silently skips its upcasting.
  local MAX_REVISION = 2147483647
  local function check_upcaster(t)
    local cur = t.current
    if math.type(cur) ~= "integer" or cur < 1 or cur > MAX_REVISION then
      return "current must be an integer revision from 1 to " .. MAX_REVISION .. ", not " .. tostring(cur)
    end
    for k, v in pairs(t) do
      if k ~= "current" then
        if math.type(k) ~= "integer" or k < 1 or k >= cur then
          return "unexpected key " .. tostring(k) .. " (steps are [1] to [current - 1] = [" .. (cur - 1) .. "])"
        end
        if type(v) ~= "function" then return "step [" .. k .. "] must be a function, not " .. type(v) end
      end
    end
  end

  -- Compiles and runs a script's source: its value, or nil and why.
  local function compile(path, src, want, check)
    local chunk, err = load(src, "@" .. path, "t")
    if not chunk then return nil, err end
    local ok, res = pcall(chunk)
    if not ok then return nil, tostring(res) end
    if type(res) ~= want then return nil, "must return a " .. want .. ", not " .. type(res) end
    local bad = check and check(res)
    if bad then return nil, bad end
    return res
  end

  -- "cannot load PATH:LINE: why" (Lua's messages lead with the path and
  -- line already) or "cannot load PATH: why".
  local function cannot(path, why)
    why = tostring(why)
    if why:sub(1, #path + 1) == path .. ":" then return "cannot load " .. why end
    return "cannot load " .. path .. ": " .. why
  end

  local function lookup(cache, kind, name, now, want, check)
    local c = cache[name]
    if c and c.gen == gen and now - c.checked < RECHECK_MS then return c end
    local path = dir .. "/" .. kind .. "/" .. name .. ".lua"
    local sig = valid(name) and stat(path) or nil
    if c and c.sig == sig then
      c.checked, c.gen = now, gen
      return c
    end
    -- The entry is cached only once complete: a load cut short by a
    -- budget must not leave a half-made entry that reads as "no file".
    local new = {sig = sig, checked = now, gen = gen}
    if sig then
      local f, err = io.open(path, "rb")
      local src = f and f:read("a")
      if f then f:close() end
      local value
      if src then value, err = compile(path, src, want, check) end
      if value ~= nil then
        new.value, new.version = value, hash(src)
        if shared then shared.put(path, src) end
      else
        err = cannot(path, err)
        if c and c.value ~= nil then
          new.value, new.version = c.value, c.version
        elseif shared then
          local good = shared.get(path)
          local v = good and compile(path, good, want, check)
          if v ~= nil then new.value, new.version = v, hash(good) end
        end
        if new.value == nil then
          new.err = err
        elseif shared then
          shared.failed(path, sig, err)
        end
      end
    end
    -- Only names that have a file are kept: those are bounded by the
    -- directory, while the names asked for are anyone's (a state request's
    -- reducer, an event's type) and would grow the cache without end.
    -- Asking again for a name with no file costs one stat.
    cache[name] = sig and new or nil
    return new
  end

  -- The fourth result, when the first is the handler, is until when (ms,
  -- on now's clock) this answer stands: the engine's workers use the
  -- function again without asking until then or the next new_run, as
  -- lookup would.
  function M.handler(name, now)
    local c = lookup(handlers, "handlers", name, now, "function")
    return c.value, c.err, c.sig ~= nil, c.checked + RECHECK_MS
  end

  function M.reducer(name, now)
    local c = lookup(reducers, "reducers", name, now, "table")
    return c.value, c.err, c.version
  end

  function M.upcaster(name, now)
    local c = lookup(upcasters, "upcasters", name, now, "table", check_upcaster)
    return c.value, c.err, c.version
  end

  function M.projection(name, now)
    local c = lookup(projections, "projections", name, now, "table")
    return c.value, c.err, c.version
  end

  return M
end
