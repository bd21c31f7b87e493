-- spec/engine_helpers.lua: what the engine specs (spec/4N-engine_*_spec.lua)
-- share on top of spec/helpers.lua.
--
-- Each test gets its own scripts directory in a temporary location
-- (eh.scripts_dir()), writes handler and reducer files into it with
-- eh.handler / eh.reducer, and opens engines with eh.engine (tracked, so
-- eh.cleanup closes them before helpers.cleanup closes the stores and the
-- directories are removed). Register `after_each(eh.cleanup)` in each file.
--
-- Every write of a script file also moves its mtime to a distinct future
-- second (touch -d '+N seconds', N growing with every write), so an engine
-- that looks at mtimes sees each edit as a change, without sleeping.
local eventstore = require("eventstore")
local helpers = require("helpers")
local luassert = require("luassert")

local eh = {}

local dirs = {}    -- {reserved_tmpname, dir} created by the current test
local engines = {} -- engines opened by the current test
local bump = 0     -- seconds in the future of the last script write

local q = helpers.sh_quote
eh.sh_quote = q

-- A fresh scripts directory with empty handlers/ and reducers/.
function eh.scripts_dir()
  local reserved = os.tmpname() -- an empty file reserving the unique name
  local dir = reserved .. ".scripts"
  local ok = os.execute("mkdir -p " .. q(dir .. "/handlers") .. " " .. q(dir .. "/reducers"))
  assert(ok, "cannot create the scripts directory " .. dir)
  dirs[#dirs + 1] = { reserved, dir }
  return dir
end

function eh.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

function eh.read_file(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

-- Writes path and gives it an mtime strictly later than any earlier script
-- write of this process.
function eh.write_script(path, text)
  eh.write_file(path, text)
  bump = bump + 2
  local ok = os.execute(("touch -d '+%d seconds' %s"):format(bump, q(path)))
  assert(ok, "touch failed for " .. path)
end

function eh.handler_path(dir, event_type)
  return dir .. "/handlers/" .. event_type .. ".lua"
end

function eh.reducer_path(dir, name)
  return dir .. "/reducers/" .. name .. ".lua"
end

-- Writes scripts/handlers/<event_type>.lua.
function eh.handler(dir, event_type, source)
  eh.write_script(eh.handler_path(dir, event_type), source)
end

-- Writes scripts/reducers/<name>.lua.
function eh.reducer(dir, name, source)
  eh.write_script(eh.reducer_path(dir, name), source)
end

-- eventstore.engine(opts), closed by eh.cleanup.
function eh.engine(opts)
  assert(type(eventstore.engine) == "function",
    "eventstore.engine does not exist (require('eventstore').engine is " .. tostring(eventstore.engine) .. ")")
  local engine = eventstore.engine(opts)
  engines[#engines + 1] = engine
  return engine
end

-- {handled, failed, dead} of a run() result, extra fields ignored.
function eh.counts(r)
  luassert.is_table(r, "engine:run must return a table")
  return { handled = r.handled, failed = r.failed, dead = r.dead }
end

-- One stored event by index.
function eh.event(store, session, index)
  return store:read(session, { after = index - 1, limit = 1 })[1]
end

-- The events of a session (or of the whole store) of one type.
function eh.of_type(events, event_type)
  local out = {}
  for _, e in ipairs(events) do
    if e.type == event_type then out[#out + 1] = e end
  end
  return out
end

-- The events whose cause is {index = index} (any attempt).
function eh.caused_by(events, index)
  local out = {}
  for _, e in ipairs(events) do
    if e.cause ~= nil and e.cause.index == index then out[#out + 1] = e end
  end
  return out
end

-- The fields of an error (an error object or a string) as one string.
function eh.error_text(err)
  if type(err) == "table" then
    return tostring(err.code) .. ": " .. tostring(err.message) .. " | " .. tostring(err)
  end
  return tostring(err)
end

-- A fresh store (helpers.new: a manual clock at T0) and an empty scripts
-- directory; t.engine(opts) opens an engine on them (opts added to
-- store/scripts), t.handler / t.reducer write scripts into the directory.
function eh.setup(url)
  local store, clock, concrete = helpers.new(url)
  local t = { store = store, clock = clock, url = concrete, dir = eh.scripts_dir() }
  function t.engine(opts)
    local o = { store = store, scripts = t.dir }
    for k, v in pairs(opts or {}) do o[k] = v end
    return eh.engine(o)
  end
  function t.reducer(name, source) eh.reducer(t.dir, name, source) end
  function t.handler(event_type, source) eh.handler(t.dir, event_type, source) end
  return t
end

-- run{until_idle = true}, as counts.
function eh.run(engine)
  return eh.counts(engine:run({ until_idle = true }))
end

function eh.cleanup()
  for i = #engines, 1, -1 do
    pcall(function() engines[i]:close() end)
    engines[i] = nil
  end
  helpers.cleanup()
  for i = #dirs, 1, -1 do
    os.execute("rm -rf " .. q(dirs[i][2]))
    os.remove(dirs[i][1])
    dirs[i] = nil
  end
end

return eh
