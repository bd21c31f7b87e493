-- eventstore.loader: finds, loads and caches handlers and reducers from a
-- scripts directory (docs/engine.md). One loader lives in each of the
-- engine's Lua states (core/engine/), so its caches need no locks; the
-- engine calls it inside a budgeted call, so a script whose top level
-- loops or allocates without end fails the attempt that loads it.
--
--   local loader = require("eventstore.loader")(dir, stat, hash)
--   loader.handler(type, now_ms)  --> fn | nil, err | nil, exists
--   loader.reducer(name, now_ms)  --> tbl | nil, err | nil, version
--   loader.new_run()              -- look at every file again
--
-- stat(path) gives a file's signature (mtime, size, inode) or nil; hash(src)
-- a reducer's version. A file is looked at again when a run starts and at
-- most once a second while it runs.
return function(dir, stat, hash)
  local handlers, reducers, gen = {}, {}, 0
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

  local function lookup(cache, kind, name, now, want)
    local c = cache[name]
    if c and c.gen == gen and now - c.checked < 1000 then return c end
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
      local chunk
      if src then chunk, err = load(src, "@" .. path, "t") end
      if chunk then
        local ok, res = pcall(chunk)
        if not ok then
          err = tostring(res)
        elseif type(res) ~= want then
          err = path .. " must return a " .. want .. ", not " .. type(res)
        else
          new.value, new.version = res, hash(src)
        end
      end
      if err then new.err = "cannot load " .. path .. ": " .. tostring(err) end
    end
    cache[name] = new
    return new
  end

  function M.handler(name, now)
    local c = lookup(handlers, "handlers", name, now, "function")
    return c.value, c.err, c.sig ~= nil
  end

  function M.reducer(name, now)
    local c = lookup(reducers, "reducers", name, now, "table")
    return c.value, c.err, c.version
  end

  return M
end
