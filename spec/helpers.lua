-- spec/helpers.lua: what every conformance spec shares.
--
-- The conformance suite (spec/1N-store_*_spec.lua) runs every test once per
-- backend URL template returned by helpers.urls(). Each test opens a fresh
-- store through helpers.new / helpers.open, with an injected manual clock,
-- and every spec file registers `after_each(helpers.cleanup)` so the stores
-- a test opened are closed and their SQLite files removed.
--
-- A backend that is not compiled in is NOT skipped: helpers.open raises a
-- loud error for each of its tests, because CI must run every backend.

local eventstore = require("eventstore")

local helpers = {}

-- The start time of every test's manual clock (ms since the epoch).
helpers.T0 = 1000000

local DEFAULT_URLS = { "memory:", "sqlite:" }

local opened = {} -- store handles opened by the current test (closed by cleanup)
local files = {}  -- paths created by the current test (removed by cleanup)

-- The backend URL templates to run the suite on: ES_TEST_URLS
-- (space-separated, e.g. "memory: sqlite:") or memory: and sqlite:.
-- "sqlite:" means "a fresh temporary file per test"; "sqlite:DIR/" (ending
-- in a slash) means "a fresh file in DIR per test"; "postgres://..." means
-- "a fresh schema in that database per test" (make test starts a throwaway
-- cluster and adds its URL: spec/support/pg_cluster.sh).
function helpers.urls()
  local env = os.getenv("ES_TEST_URLS")
  if env == nil or not env:match("%S") then
    local copy = {}
    for i, u in ipairs(DEFAULT_URLS) do copy[i] = u end
    return copy
  end
  local urls = {}
  for u in env:gmatch("%S+") do urls[#urls + 1] = u end
  return urls
end

-- The postgres URL of this run (the last one), or nil.
function helpers.pg_url()
  local pg
  for _, u in ipairs(helpers.urls()) do
    if u:match("^postgres") then pg = u end
  end
  return pg
end

-- The URLs of this run whose stores outlive a process (sqlite:, postgres:).
function helpers.durable_urls()
  local out = {}
  for _, u in ipairs(helpers.urls()) do
    if u:match("^sqlite:") or u:match("^postgres") then out[#out + 1] = u end
  end
  return out
end

-- The templates of helpers.urls() and a sharded store over SQLite files
-- ("shards:sqlite:", unless a shards: template is there already): for the
-- conformance specs of what a shards: store must take like any store
-- (docs/contract.md §5: keys, archive, tenants).
function helpers.urls_and_shards()
  local urls = helpers.urls()
  for _, u in ipairs(urls) do
    if u:match("^shards:") then return urls end
  end
  urls[#urls + 1] = "shards:sqlite:"
  return urls
end

local fresh_url

-- "shards:INNER" (INNER a template other than memory:, default sqlite:):
-- a fresh sharded store of three shards a, b, c and a catalog, each a
-- fresh INNER store, its plan installed by one open here. The concrete
-- URL is "shards:" .. the catalog's URL, which opens it again (open_same).
local function fresh_shards_url(inner)
  if inner == "" then inner = "sqlite:" end
  if inner:match("^memory:") then
    error("a shards: test template needs shards that outlive a handle (shards:sqlite:, "
      .. "shards:postgres://...), not memory:", 0)
  end
  local catalog = fresh_url(inner)
  local plan = { version = 1, shards = { a = fresh_url(inner), b = fresh_url(inner), c = fresh_url(inner) } }
  eventstore.open("shards:", { catalog = catalog, plan = plan }):close()
  return "shards:" .. catalog
end

-- A fresh concrete URL for one test, from a URL template.
function fresh_url(template)
  local inner = template:match("^shards:(.*)$")
  if inner ~= nil then return fresh_shards_url(inner) end
  local dir = template:match("^sqlite:(.*)$")
  if dir ~= nil and (dir == "" or dir:sub(-1) == "/") then
    -- os.tmpname creates an empty file: keep it as a reservation of the
    -- unique name and put the database next to it.
    local reserved = os.tmpname()
    files[#files + 1] = reserved
    local path
    if dir == "" then
      path = reserved .. ".db"
    else
      path = dir .. reserved:match("[^/]+$") .. ".db"
    end
    for _, suffix in ipairs({ "", "-wal", "-shm", "-journal" }) do
      files[#files + 1] = path .. suffix
    end
    return "sqlite:" .. path
  end
  if template:match("^postgres://") or template:match("^postgresql://") then
    return helpers.pg_fresh_url(template)
  end
  -- memory: every open is a new, empty store. Other URLs are used as given.
  return template
end

-- postgres: a fresh schema per test (schema=t_<unique>, replacing any
-- schema= of the template), created by the first open. Nothing drops it:
-- the test cluster (spec/support/pg_cluster.sh) is thrown away whole after
-- the run, which costs less than a DROP SCHEMA per test.
local pg_serial = 0
local pg_run_id = nil
function helpers.pg_fresh_url(template)
  if not pg_run_id then
    -- unique across the processes of one run: busted's own and its children
    local reserved = os.tmpname()
    os.remove(reserved)
    pg_run_id = reserved:match("([%w]+)$"):lower():gsub("[^%w]", "")
  end
  pg_serial = pg_serial + 1
  local schema = ("t_%s_%d"):format(pg_run_id, pg_serial)
  local base, query = template:match("^([^?]*)%??(.*)$")
  local parts = {}
  for kv in query:gmatch("[^&]+") do
    if not kv:match("^schema=") then parts[#parts + 1] = kv end
  end
  parts[#parts + 1] = "schema=" .. schema
  return base .. "?" .. table.concat(parts, "&")
end

local function raw_open(url, opts)
  local ok, store = pcall(eventstore.open, url, opts)
  if not ok then
    local err = store
    if eventstore.is_error(err, "INVALID_ARGUMENT") then
      -- Do not skip: a backend that is not compiled in must fail loudly.
      error(("cannot open backend URL %q (%s): every backend in ES_TEST_URLS must be built, "
        .. "CI runs them all"):format(url, tostring(err)), 0)
    end
    error(err, 0)
  end
  opened[#opened + 1] = store
  return store
end

-- Opens a FRESH store for one test from a URL template. Returns the store
-- and the concrete URL it was opened with (for helpers.open_same).
function helpers.open(template, opts)
  local url = fresh_url(template)
  return raw_open(url, opts), url
end

-- Opens another handle on the concrete URL returned by helpers.open (only
-- meaningful for sqlite: and postgres:, whose URL names the same file or
-- schema again; memory stores are per handle).
function helpers.open_same(url, opts)
  return raw_open(url, opts)
end

-- The manual clock of the contract: :now(), :set(ms), :advance(ms).
function helpers.manual_clock(ms)
  return eventstore.manual_clock(ms)
end

-- The usual test setup: a fresh store on a manual clock at T0.
-- Returns store, clock, concrete url. opts are copied, clock added.
function helpers.new(template, opts)
  local clock = helpers.manual_clock(helpers.T0)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  if o.clock == nil then o.clock = clock end
  local store, url = helpers.open(template, o)
  return store, clock, url
end

-- Closes every store the current test opened and removes its files.
function helpers.cleanup()
  for i = #opened, 1, -1 do
    pcall(function() opened[i]:close() end)
    opened[i] = nil
  end
  for i = #files, 1, -1 do
    os.remove(files[i])
    files[i] = nil
  end
end

local function fail(msg)
  error(msg, 3)
end

-- Asserts that fn(...) raises an eventstore error object with this code:
-- a table with .code == code, a string .message, tostring(e) starting with
-- code .. ": ", and eventstore.is_error(e, code). Returns the error.
function helpers.expect_error(code, fn, ...)
  local ok, err = pcall(fn, ...)
  if ok then
    fail(("expected a %s error, but the call succeeded"):format(code))
  end
  if type(err) ~= "table" then
    fail(("expected a %s error object, got a %s error: %s"):format(code, type(err), tostring(err)))
  end
  if err.code ~= code then
    fail(("expected error code %s, got %s (%s)"):format(code, tostring(err.code), tostring(err)))
  end
  if type(err.message) ~= "string" then
    fail(("error object %s has no string message"):format(code))
  end
  local text = tostring(err)
  if text:sub(1, #code + 2) ~= code .. ": " then
    fail(("tostring of a %s error must start with %q, got %q"):format(code, code .. ": ", text))
  end
  if eventstore.is_error(err, code) ~= true then
    fail(("eventstore.is_error(e, %q) is not true for %s"):format(code, text))
  end
  return err
end

-- Asserts that fn(...) raises a standard Lua argument error (a string
-- containing "bad argument"). Returns the message.
function helpers.expect_arg_error(fn, ...)
  local ok, err = pcall(fn, ...)
  if ok then
    fail("expected a 'bad argument' error, but the call succeeded")
  end
  if type(err) ~= "string" or not err:find("bad argument", 1, true) then
    fail(("expected a standard 'bad argument' error, got %s: %s"):format(type(err), tostring(err)))
  end
  return err
end

-- Whether the value held in a weak table was collected: a store or engine
-- must not keep a callback reachable (a registry reference) once its
-- subscription ended or the call that took it was refused.
function helpers.collected(weak)
  collectgarbage("collect")
  collectgarbage("collect")
  return next(weak) == nil
end

-- A deterministic text form of any Lua value (sorted keys, integer vs
-- float kept apart), to compare whole store states before/after a call.
local function dump(v, seen)
  local t = type(v)
  if t == "table" then
    if seen[v] then return "<cycle>" end
    seen[v] = true
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b)
      local ta, tb = type(a), type(b)
      if ta ~= tb then return ta < tb end
      if ta == "number" or ta == "string" then return a < b end
      return tostring(a) < tostring(b)
    end)
    local parts = {}
    for _, k in ipairs(keys) do
      parts[#parts + 1] = "[" .. dump(k, seen) .. "]=" .. dump(v[k], seen)
    end
    seen[v] = nil
    return "{" .. table.concat(parts, ",") .. "}"
  elseif t == "number" then
    if math.type(v) == "integer" then return ("i%d"):format(v) end
    return ("f%.17g"):format(v)
  elseif t == "string" then
    return ("%q"):format(v)
  elseif v == eventstore.json.null then
    return "json.null"
  end
  return tostring(v)
end

function helpers.dump(v)
  return dump(v, {})
end

-- Everything a store holds in its log (every event with its dispatch
-- record), as text: equal before and after a call that must change nothing.
function helpers.log_state(store)
  return helpers.dump(store:read_all({}))
end

-- The list of a field of each element, e.g. helpers.pluck(events, "index").
function helpers.pluck(list, field)
  local out = {}
  for i, e in ipairs(list) do out[i] = e[field] end
  return out
end

-- One stored event by index.
function helpers.event(store, session, index)
  return store:read(session, { after = index - 1, limit = 1 })[1]
end

-- A session's row as sessions{} lists it, or nil.
function helpers.session_row(store, name)
  for _, s in ipairs(store:sessions({ limit = 1000 }).sessions) do
    if s.session == name then return s end
  end
  return nil
end

-- The whole store as text (log with dispatch records, session rows, refs):
-- what a refused call must leave as it was.
function helpers.world(store)
  return helpers.dump({
    log = store:read_all({}),
    sessions = store:sessions({ limit = 1000 }),
    refs = store:list_refs({ limit = 1000 }),
  })
end

-- fn() must raise `code` and change nothing in the store; returns the error.
function helpers.refused(store, code, fn)
  local before = helpers.world(store)
  local err = helpers.expect_error(code, fn)
  assert(before == helpers.world(store), "a refused call changed the store")
  return err
end

-- claim with the suite's defaults: holder "w1", ttl 1000 ms (unless
-- expires_at is given).
function helpers.claim(store, session, opts)
  opts = opts or {}
  opts.holder = opts.holder or "w1"
  if opts.expires_at == nil then opts.ttl_ms = opts.ttl_ms or 1000 end
  return store:claim(session, opts)
end

-- helpers.claim that must claim: its events.
function helpers.claimed(store, session, opts)
  local r = helpers.claim(store, session, opts)
  assert(r.outcome == "claimed", "expected outcome claimed, got " .. tostring(r.outcome))
  return r.events
end

function helpers.indexes(events)
  return helpers.pluck(events, "index")
end

-- A sorted copy of an array.
function helpers.sorted(list, cmp)
  local out = {}
  for i, v in ipairs(list) do out[i] = v end
  table.sort(out, cmp)
  return out
end

-- Wall-clock seconds (fractional when lua-system is available).
function helpers.wall()
  local ok, system = pcall(require, "system")
  if ok and type(system) == "table" and system.gettime then return system.gettime() end
  return os.time()
end

-- Processes and files, for the specs that run children (crash, multi-
-- process, CLI, examples).

-- The binary of this build (BUILD: build-san under make check-sanitize).
local ROOT = assert(io.popen("pwd")):read("l")
local BUILD = os.getenv("BUILD") or "build"
helpers.BIN = (BUILD:sub(1, 1) == "/" and "" or ROOT .. "/") .. BUILD .. "/bin/eventstore"
-- Whether this run is the sanitizer pass (make check-sanitize), where every
-- instruction of the build costs several times what it does in make test:
-- a bound on CPU time is the release build's, and checked there.
helpers.SANITIZED = BUILD:match("build%-san$") ~= nil

-- The schema versions this build writes (a migration spec checks that an
-- older store is brought up to them): one place to change with the next.
helpers.SQLITE_SCHEMA = "14"
-- SQL that takes a version 14 file back to what version 10 wrote (no
-- fence_floors table; long
-- payloads and metas back in their rows, no payloads table; a claim's due time in
-- due_at, no claim_due), for the specs that make an older file out of a
-- new one: prepend it to their own step back. (Version 12 only dropped the
-- counts triggers, which the migrations from a version before 7 make again
-- and 12 drops; a version 8 to 10 file made this way lacks them, which
-- changes nothing a spec reads: the store moves the counts itself.)
helpers.SQLITE_BACK_TO_10 = "DROP TABLE fence_floors; UPDATE events SET"
  .. " payload = coalesce(payload, (SELECT p.payload FROM payloads p WHERE p.position = events.position)),"
  .. " meta = coalesce(meta, (SELECT p.meta FROM payloads p WHERE p.position = events.position))"
  .. " WHERE position IN (SELECT position FROM payloads);"
  .. " DROP TABLE payloads;"
  .. " UPDATE events SET due_at = claim_due WHERE claim_due IS NOT NULL;"
  .. " DROP INDEX events_queued; DROP INDEX events_type_pending; ALTER TABLE events DROP COLUMN claim_due;"
  .. " CREATE INDEX events_queued ON events(due_at, position) WHERE queued = 1;"
  .. " CREATE INDEX events_type_pending ON events(type, queued, due_at, position) WHERE status = 0;"
helpers.PG_SCHEMA = "6"

-- use(f) on the file opened for reading, closed after; nil when it cannot
-- be opened.
local function with_file(path, use)
  local f = io.open(path, "rb")
  if not f then return nil end
  local v = use(f)
  f:close()
  return v
end

-- A file's size in bytes, or nil when it cannot be opened.
function helpers.file_size(path)
  return with_file(path, function(f) return f:seek("end") end)
end

-- A file's bytes, or nil when it cannot be read.
function helpers.read_file(path)
  return with_file(path, function(f) return f:read("a") end)
end

function helpers.write_file(path, bytes)
  local f = assert(io.open(path, "wb"))
  assert(f:write(bytes))
  f:close()
end

-- s quoted for sh.
function helpers.sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- What the sqlite3 shell prints for sql run on the file at path (raises
-- when the shell fails).
function helpers.sqlite3(path, sql)
  local p = assert(io.popen(("sqlite3 %s %s 2>&1"):format(helpers.sh_quote(path), helpers.sh_quote(sql))))
  local out = p:read("a")
  assert(p:close(), "sqlite3 failed: " .. out)
  return out
end

-- The schema version a sqlite: file records (PRAGMA user_version), as a
-- string to compare with helpers.SQLITE_SCHEMA.
function helpers.sqlite_version(path)
  return (helpers.sqlite3(path, "PRAGMA user_version"):gsub("%s", ""))
end

-- A sqlite: file made by the sqlite3 shell from spec/fixtures/NAME (the
-- SQL text of a store an older build wrote), not opened: its concrete URL
-- and its path. helpers.remove_db(path) removes it.
function helpers.sqlite_fixture(name)
  local _, _, url = helpers.new("sqlite:")
  helpers.cleanup() -- only its name: the fixture makes the file
  local path = url:match("^sqlite:(.*)$")
  local p = assert(io.popen(("sqlite3 %s 2>&1"):format(helpers.sh_quote(path)), "w"))
  p:write(helpers.read_file("spec/fixtures/" .. name))
  assert(p:close())
  return url, path
end

-- Seeds math.random for a randomised test: from ES_SEED when it is set (to
-- replay a failure), from the clock otherwise. Prints the seed as a TAP
-- comment, which spec/run.sh shows with the test's failure.
function helpers.seed(what)
  local given = os.getenv("ES_SEED")
  local seed = math.tointeger(tonumber(given or ""))
  if given and given ~= "" and not seed then error("ES_SEED must be a whole number, got " .. given, 2) end
  if not seed then
    seed = math.floor(helpers.wall() * 1000)
  end
  math.randomseed(seed)
  print(("# %s: seed %d (ES_SEED=%d replays it)"):format(what, seed, seed))
  io.stdout:flush()
  return seed
end

-- Whether two Lua values are the same JSON value as the codec sees it:
-- number subtypes (and the sign of a float zero), array marks and any
-- other metatable, json.null, every key.
function helpers.json_same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) == "number" then
    if math.type(a) ~= math.type(b) then return false end
    if a == 0 and b == 0 and math.type(a) == "float" then return 1 / a == 1 / b end
    return a == b
  end
  if type(a) ~= "table" then return a == b end
  if getmetatable(a) ~= getmetatable(b) then return false end
  for k, v in pairs(a) do
    if not helpers.json_same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

-- A random value for the JSON codec, drawn with math.random (seed it
-- first): integers and floats over their whole ranges, short strings of
-- random code points (a surrogate now and then, which the codec refuses:
-- pass valid_utf8 to draw none), booleans, json.null below the top (-0.0
-- at it), arrays (json.array) and objects, up to a few levels deep.
function helpers.random_json(depth, valid_utf8)
  local json = eventstore.json
  depth = depth or 0
  local function gen_string()
    local b = {}
    for i = 1, math.random(0, 8) do
      local cp = math.random(2) == 1 and math.random(0, 0x7f) or math.random(0, 0x10FFFF)
      if valid_utf8 and cp >= 0xD800 and cp <= 0xDFFF then cp = 0xFFFD end
      b[i] = utf8.char(cp)
    end
    return table.concat(b)
  end
  local r = math.random(depth > 3 and 6 or 8)
  if r == 1 then return math.random(math.mininteger, math.maxinteger)
  elseif r == 2 then
    local f = string.unpack("<d", string.pack("<i8", math.random(math.mininteger, math.maxinteger)))
    if f ~= f or f == math.huge or f == -math.huge then return 0.5 end
    return f
  elseif r == 3 then return math.random() * 10 ^ math.random(-20, 20)
  elseif r == 4 then return gen_string()
  elseif r == 5 then return math.random(2) == 1
  elseif r == 6 then return depth > 0 and json.null or -0.0
  elseif r == 7 then
    local t = json.array {}
    for i = 1, math.random(0, 5) do t[i] = helpers.random_json(depth + 1, valid_utf8) end
    return t
  else
    local t = {}
    for _ = 1, math.random(0, 5) do t[gen_string()] = helpers.random_json(depth + 1, valid_utf8) end
    return t
  end
end

-- This process's threads (Linux): an engine's workers, a store's
-- checkpointer, an abandoned worker's thread still in its C call.
function helpers.threads()
  local f = assert(io.open("/proc/self/status", "r"))
  local n = tonumber(f:read("a"):match("Threads:%s*(%d+)"))
  f:close()
  return n
end

-- Polls cond() every `every` seconds (default 0.02) until it returns a true
-- value, and returns that value. Raises "timed out waiting for WHAT" after
-- `seconds` (default 120): a deadline that only a hang reaches, never a
-- loaded machine (a count of polls would be, as each poll forks a sleep).
function helpers.wait_until(cond, what, seconds, every)
  local deadline = helpers.wall() + (seconds or 120)
  repeat
    local v = cond()
    if v then return v end
    helpers.sleep(every or 0.02)
  until helpers.wall() > deadline
  local v = cond()
  if v then return v end
  error("timed out waiting for " .. what, 2)
end

-- luasystem's sleep (busted depends on it) when it is there: the shell and
-- sleep(1) that os.execute("sleep") starts cost more than a 20 ms poll of
-- wait_until itself, thousands of times in a run.
local has_system, system = pcall(require, "system")
function helpers.sleep(seconds)
  if has_system and type(system) == "table" and system.sleep then
    system.sleep(seconds)
  else
    os.execute(("sleep %.3f"):format(seconds))
  end
end

-- Whether pid is still running (a zombie counts as gone: its files are
-- closed, its locks released).
function helpers.alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat", "r")
  if not f then return false end
  local stat = f:read("a") or ""
  f:close()
  local state = stat:match("^%d+ %b() (%a)")
  return state ~= nil and state ~= "Z" and state ~= "X"
end

-- Removes a SQLite file and its companions.
function helpers.remove_db(path)
  for _, suffix in ipairs({ "", "-wal", "-shm", "-journal" }) do os.remove(path .. suffix) end
end

return helpers
