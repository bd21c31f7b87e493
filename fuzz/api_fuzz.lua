-- fuzz/api_fuzz.lua: a seeded random-call fuzzer for the Lua API (the store
-- handle, tenant handles, the manual clock and the engine handle).
--
-- Each call is drawn from a grammar of valid and hostile arguments: nil,
-- wrong types, NaN, infinities, math.maxinteger / math.mininteger, empty
-- and huge strings, NUL bytes and invalid UTF-8 in names, tables whose
-- metamethods raise or change the call's other arguments, re-entrant calls
-- from callbacks (subscribers, presence subscribers, clock functions, the
-- engine's progress function), closing and reopening, collections at
-- random. The rule checked after every call (docs/contract.md §2): a call either
-- returns or raises a standard Lua argument error ("bad argument #n to
-- 'f'") or an eventstore error object; the fuzzer's own hostile raise
-- passing through is allowed. Every few hundred calls the stores'
-- invariants are checked: dense indexes, strictly increasing positions,
-- statuses in the contract's set, and head equal to the number of events
-- of a session that nothing truncated or deleted.
--
-- Used by spec/36-api_fuzz_spec.lua (a short fixed-seed pass in make test)
-- and by `make fuzz-api` (many seeds, under AddressSanitizer), which runs
-- this file as a program:
--
--   lua5.4 fuzz/api_fuzz.lua [first_seed [seeds [calls]]]
--
-- with the backend URLs from ES_TEST_URLS (as the specs: "memory:",
-- "sqlite:", "postgres://..."), or FUZZ_SEED / FUZZ_SEEDS / FUZZ_CALLS in
-- the environment. A failure prints the seed, the URL, the call that
-- failed and the calls before it; the same seed, URL and call count
-- replays the same calls as long as the store answers alike (the calls
-- drawn depend on earlier answers, e.g. which events a claim returned, and
-- an engine with two workers may order its work differently).
local eventstore = require("eventstore")
local core = require("eventstore.core")

local M = {}

-- per call name: {returned, raised}, summed over every run of this process
-- (printed by the program with FUZZ_STATS=1: is the grammar reaching past
-- the argument checks?)
M.tally = {}

local HOSTILE = "fuzz: hostile raise" -- what the fuzzer's own callbacks raise
local CODES = {}
for _, c in ipairs({ "PARTIAL_DUPLICATE_BATCH", "ID_CONFLICT", "SUPERSEDED_ATTEMPT", "NO_SUCH_EVENT",
  "WRONG_EXPECTED_HEAD", "STALE_FENCE", "SEALED", "TRUNCATED", "REF_CONFLICT", "NOT_FOUND",
  "INVALID_ARGUMENT", "TOO_LARGE", "STORAGE", "CLOSED" }) do
  CODES[c] = true
end
local STATUSES = { pending = true, processed = true, dead = true }
-- option fields some call needs (claim's holder and ttl_ms, fail's error,
-- ...): always given in a clean call
local REQUIRED = { holder = true, ttl_ms = true, error = true, token = true, claims = true }
local T0 = 1000000

-- Whether err is an error the contract allows a call to raise (§2), or the
-- fuzzer's own hostile raise passed through unchanged.
function M.acceptable(err)
  if type(err) == "string" then
    if err:find(HOSTILE, 1, true) then return true end
    return err:match("bad argument #%d+ to '[^']*'") ~= nil or err:match("calling '[^']*' on bad self") ~= nil
  end
  if eventstore.is_error(err) then return CODES[err.code] == true and type(err.message) == "string" end
  return false
end

-- xorshift64*: the fuzzer's own generator, so nothing else drawing from
-- math.random changes a seed's calls.
local function generator(seed)
  local s = (seed * 0x9E3779B97F4A7C15) ~ 0x2545F4914F6CDD1D
  if s == 0 then s = 1 end
  local r = {}
  function r.int(a, b) -- 1..a, or a..b
    s = s ~ (s >> 12)
    s = s ~ (s << 25)
    s = s ~ (s >> 27)
    local lo, hi = b and a or 1, b or a
    return ((s * 0x2545F4914F6CDD1D) >> 1) % (hi - lo + 1) + lo
  end
  function r.chance(p) return r.int(1000) <= p * 1000 end
  function r.pick(list) return list[r.int(#list)] end
  return r
end

---------------------------------------------------------------------------
-- describing values (for the report)

local described = setmetatable({}, { __mode = "k" }) -- value -> its name in the grammar

local function describe(v, depth)
  depth = depth or 0
  local t = type(v)
  if described[v] then return described[v] end
  if t == "string" then
    if #v > 60 then return ("<string of %d bytes>"):format(#v) end
    -- bytes outside ASCII as \xHH: the report stays printable text
    return (("%q"):format(v):gsub("\\\n", "\\n"):gsub("[\128-\255]", function(c)
      return ("\\x%02X"):format(c:byte())
    end))
  elseif t == "number" then
    if v ~= v then return "0/0" end
    if v == math.huge then return "math.huge" end
    if v == -math.huge then return "-math.huge" end
    if v == math.maxinteger then return "math.maxinteger" end
    if v == math.mininteger then return "math.mininteger" end
    return math.type(v) == "float" and ("%.17g"):format(v) .. (math.floor(v) == v and "(float)" or "") or tostring(v)
  elseif t == "table" then
    if depth > 3 then return "{...}" end
    local parts, n = {}, 0
    for k, x in next, v do
      n = n + 1
      if n > 8 then
        parts[#parts + 1] = "..."
        break
      end
      local key = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. describe(k, depth + 1) .. "]")
      parts[#parts + 1] = key .. " = " .. describe(x, depth + 1)
    end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return "<" .. t .. ">"
end

local function describe_args(args)
  local parts = {}
  for i = 1, args.n do parts[i] = describe(args[i]) end
  return table.concat(parts, ", ")
end

local function named(v, name)
  described[v] = name
  return v
end

---------------------------------------------------------------------------
-- the world: the stores, handles and subscriptions one run plays with

local HANDLERS = {
  ok = "return function(event, ctx) return { { type = 'done', payload = { of = event.index } } } end",
  fail = "return function() error('handler failed') end",
  loop = "return function() while true do end end",
  bad = "return function() return 'not a list' end",
  timer = "return function(event, ctx) return { { type = 'done', delay_ms = 10 } } end",
  cancel = "return function(event, ctx) ctx.cancel(event.index + 1, 'fuzz'); return nil end",
  state = "return function(event, ctx) ctx.state('count'); return {} end",
}
local REDUCERS = {
  count = "return { init = function() return { n = 0 } end, ok = function(s) s.n = s.n + 1 return s end, "
    .. "fail = function(s) s.bad = function() end return s end }",
}

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function scripts_dir()
  local reserved = os.tmpname()
  local dir = reserved .. ".fuzz-scripts"
  assert(os.execute("mkdir -p " .. sh_quote(dir .. "/handlers") .. " " .. sh_quote(dir .. "/reducers")))
  for name, src in pairs(HANDLERS) do
    local f = assert(io.open(dir .. "/handlers/" .. name .. ".lua", "w"))
    f:write(src)
    f:close()
  end
  for name, src in pairs(REDUCERS) do
    local f = assert(io.open(dir .. "/reducers/" .. name .. ".lua", "w"))
    f:write(src)
    f:close()
  end
  return reserved, dir
end

-- A concrete URL for one store of a run, from a template as the specs
-- take them (spec/helpers.lua): sqlite: a fresh file, postgres: a fresh
-- schema; reopening a run's store opens the same one again.
local run_serial = 0
local function concrete_url(template, files)
  if template:match("^sqlite:$") then
    local reserved = os.tmpname()
    files[#files + 1] = reserved
    local path = reserved .. ".db"
    for _, suffix in ipairs({ "", "-wal", "-shm", "-journal" }) do files[#files + 1] = path .. suffix end
    return "sqlite:" .. path
  end
  if template:match("^postgres") then
    run_serial = run_serial + 1
    local reserved = os.tmpname()
    os.remove(reserved)
    local id = reserved:match("([%w]+)$"):lower()
    local base, query = template:match("^([^?]*)%??(.*)$")
    local parts = {}
    for kv in query:gmatch("[^&]+") do
      if not kv:match("^schema=") then parts[#parts + 1] = kv end
    end
    parts[#parts + 1] = ("schema=fz_%s_%d"):format(id, run_serial)
    return base .. "?" .. table.concat(parts, "&")
  end
  return template
end

---------------------------------------------------------------------------
-- one run

-- M.run{seed, calls, url, check_every, log} -> ok, report (report: the
-- failure, with the calls that led to it)
function M.run(o)
  local seed, calls, template = o.seed, o.calls or 500, o.url or "memory:"
  local check_every = o.check_every or 200
  local R = generator(seed)
  local files = {}
  local reserved, dir = scripts_dir()
  local url = concrete_url(template, files)
  local history = {} -- the last calls, for the report
  local failure
  local W = {
    clock = eventstore.manual_clock(T0),
    stores = {},   -- every store handle opened (closed or not)
    tenants = {},  -- tenant handles
    engines = {},  -- engine objects
    unsubs = {},   -- unsubscribe functions
    sessions = { "s1", "s2", "s3" },
    touched = {},  -- sessions a truncate/delete/fork/promote may have changed: head ~= count allowed
    depth = 0,     -- re-entrant calls in progress
    clean = false, -- the current call draws valid values only (see call_random)
    closed = setmetatable({}, { __mode = "k" }), -- handles closed by the fuzzer's calls
    root = setmetatable({}, { __mode = "k" }),   -- tenant handle or engine -> the store it was made on
    claims = {},   -- {store, session, index, attempt} of recent claims, for complete/fail/renew
  }

  local function record(text)
    history[#history + 1] = text
    if #history > 40 then table.remove(history, 1) end
  end

  ------------------------------------------------------------------------
  -- the grammar

  local function session()
    if W.clean or R.chance(0.9) then return R.pick(W.sessions) end
    return R.pick({ "", ("x"):rep(256), "a\0b", "\xff\xfe", "s\xc3", "tenant/\0evil", "é", " " })
  end

  local function raising_table()
    return named(setmetatable({}, {
      __index = function() error(HOSTILE, 0) end,
      __len = function() error(HOSTILE, 0) end,
      __pairs = function() error(HOSTILE, 0) end,
      __newindex = function() error(HOSTILE, 0) end,
    }), "<table whose metamethods raise>")
  end

  local hostile_values = {
    function() return nil end,
    function() return true end,
    function() return false end,
    function() return 0 end,
    function() return -1 end,
    function() return 1.5 end,
    function() return 0 / 0 end,
    function() return math.huge end,
    function() return -math.huge end,
    function() return math.maxinteger end,
    function() return math.mininteger end,
    function() return 2 ^ 63 end,
    function() return -(2 ^ 64) end,
    function() return "" end,
    function() return "3" end,
    function() return ("h"):rep(R.pick({ 255, 256, 70000 })) end,
    function() return "a\0b" end,
    function() return "\xff\xfe\xfd" end,
    function() return {} end,
    function() return { 1, 2, 3 } end,
    function() return { x = 1, [1] = 2 } end,
    raising_table,
    function() return named(function() end, "<function>") end,
    function() return named(coroutine.create(function() end), "<thread>") end,
    function() return W.clock end,
    function() return W.stores[1] end,
  }

  local function hostile() return R.pick(hostile_values)() end

  -- v with probability p (always in a clean call), else a hostile value
  local function maybe(p, v)
    if W.clean or R.chance(p) then return v end
    return hostile()
  end

  local function small_int()
    return maybe(0.85, R.pick({ 0, 1, 2, 3, 5, 10, 100 }))
  end

  local function name_of(list)
    return maybe(0.9, R.pick(list))
  end

  local function payload()
    local choice = W.clean and R.pick({ 2, 5, 6, 8 }) or R.int(12)
    if choice == 1 then return hostile() end
    if choice == 2 then return { nested = { 1, 2.5, "x", eventstore.json.null } } end
    if choice == 3 then return named({ f = function() end }, "{f = <function>}") end
    if choice == 4 then
      local t = {}
      t.self = t
      return named(t, "<cycle>")
    end
    if choice == 5 then return ("p"):rep(R.pick({ 10, 2000 })) end
    if choice == 6 then return { n = math.maxinteger, m = math.mininteger, f = 0.1 } end
    if choice == 7 then return { bad = "\xff" } end
    return { k = R.int(100) }
  end

  local TYPES = { "ok", "fail", "loop", "bad", "timer", "cancel", "state", "done", "other" }
  local REVISIONS = { 1, 2, 3, 0, 2147483647, 2147483648, 1.5 }
  local METAS = {
    function() return { trace = "t" } end,
    function() return {} end,
    function() return { n = 1, deep = { 1, { x = 0.5 } } } end,
    function() return eventstore.json.array({ 1 }) end,       -- not an object
    function() return { big = ("m"):rep(9000) } end,          -- over 8 KiB
  }
  local metas_drawn = 0

  -- An event table, sometimes with a metamethod that changes the list it
  -- is in (events) while it is read.
  local function event(events)
    if not W.clean and R.chance(0.04) then return hostile() end
    local e = { type = name_of(TYPES) }
    if R.chance(0.7) then e.payload = payload() end
    if R.chance(0.15) then e.id = maybe(0.7, "id" .. R.int(30)) end
    if R.chance(0.1) then e.lane = maybe(0.8, "lane" .. R.int(3)) end
    if R.chance(0.05) then e.settled = maybe(0.8, true) end
    if R.chance(0.05) then e.not_before = maybe(0.6, T0 + R.int(100)) end
    if not W.clean and R.chance(0.05) then e.cause = maybe(0.6, { index = small_int(), attempt = small_int() }) end
    -- §3.1: valid revisions and metas, and the edges just past them. Each
    -- takes as many draws as before they were varied (one pick; metas by
    -- turns), so a seed still draws the calls it drew then.
    if R.chance(0.05) then e.revision = maybe(0.6, R.pick(REVISIONS)) end
    if R.chance(0.05) then
      metas_drawn = metas_drawn % #METAS + 1
      e.meta = maybe(0.6, METAS[metas_drawn]())
    end
    if not W.clean and R.chance(0.04) then e.key = hostile() end
    if events and not W.clean and R.chance(0.04) then
      local later = R.int(4)
      local replacement = R.pick({ false, 5, "x", {} })
      local fields = e
      e = named(setmetatable({}, { __index = function(_, k)
        events[later] = replacement or nil
        if R.chance(0.3) then collectgarbage("collect") end
        return fields[k]
      end }), "<event whose __index replaces events[" .. later .. "]>")
    end
    return e
  end

  local function events()
    local c = W.clean and R.int(4, 20) or R.int(20)
    if c == 1 then return hostile() end
    if c == 2 then return event() end -- one event without its list
    if c == 3 then return {} end
    local list = {}
    for i = 1, R.int(4) do list[i] = event(list) end
    if R.chance(0.03) then list[#list + 2] = { type = "gap" } end
    return list
  end

  local function opts_table(fields)
    if not W.clean and R.chance(0.08) then return hostile() end
    local t, keys = {}, {}
    for k in pairs(fields) do keys[#keys + 1] = k end
    table.sort(keys) -- pairs' order may differ between runs: a seed must replay
    for _, k in ipairs(keys) do
      -- a clean call gives few options: an `expected` or `fence` drawn at
      -- random refuses nearly every write
      local p = W.clean and 0.15 or 0.6
      if REQUIRED[k] then p = W.clean and 1 or 0.9 end
      if R.chance(p) then t[k] = fields[k]() end
    end
    if not W.clean and R.chance(0.05) then
      -- a field whose read runs a finalizer or a collection mid-call
      setmetatable(t, { __index = function(_, k)
        if k ~= nil then collectgarbage("step") end
        return nil
      end })
    end
    return t
  end

  local function ttl() return maybe(0.85, R.pick({ 1, 10, 1000, 60000 })) end
  local function holder() return name_of({ "w1", "w2" }) end
  -- A wait's timeout: 0, or a value that is refused; never one that
  -- blocks (nothing else writes while the fuzzer waits).
  local function timeout()
    if R.chance(0.9) then return 0 end
    return R.pick({ -1, 1.5, "x", 0 / 0, math.mininteger, {} })
  end
  -- An engine option: valid, or refused before the engine opens; never a
  -- value that makes a run wait for ever (no instruction budget, no
  -- backoff under a handler that always fails).
  local function engine_opt(v)
    if W.clean or R.chance(0.93) then return v end
    return R.pick({ "x", 1.5, -1, 0 / 0, math.huge, {} })
  end

  ------------------------------------------------------------------------
  -- picking handles

  local function is_open(h)
    if W.closed[h] then return false end
    return W.root[h] == nil or is_open(W.root[h])
  end

  -- The handles of list that are open (as far as the fuzzer closed them);
  -- all of them in a hostile call now and then.
  local function pick_handle(list)
    local open = {}
    for _, h in ipairs(list) do
      if is_open(h) then open[#open + 1] = h end
    end
    if #open > 0 and (W.clean or R.chance(0.9)) then
      if R.chance(0.7) then return open[#open] end
      return R.pick(open)
    end
    if #list == 0 or W.clean then return nil end -- a clean call then picks another call
    return R.pick(list)
  end

  local function a_store()
    if #W.tenants > 0 and R.chance(0.2) then return pick_handle(W.tenants) end
    return pick_handle(W.stores)
  end

  local function an_engine() return pick_handle(W.engines) end

  -- A claim made earlier (for complete, fail, renew), or nil.
  local function a_claim()
    if #W.claims == 0 or not (W.clean or R.chance(0.5)) then return nil end
    local c = R.pick(W.claims)
    if is_open(c.store) or R.chance(0.1) then return c end
  end

  -- Keeps the events a claim returned (at most the last 20).
  local function remember_claims(store, list)
    for _, e in ipairs(type(list) == "table" and list or {}) do
      W.claims[#W.claims + 1] = { store = store, session = e.session, index = e.index, attempt = e.attempt }
      if #W.claims > 20 then table.remove(W.claims, 1) end
    end
  end

  ------------------------------------------------------------------------
  -- re-entrant callbacks

  local call_random -- forward: one random call (from inside a callback too)

  local function reenter(where)
    if W.depth >= 2 then return end
    local c = R.int(10)
    if c == 1 then error(HOSTILE, 0) end
    if c == 2 then collectgarbage("collect") end
    if c <= 5 then
      W.depth = W.depth + 1
      local ok, err = pcall(call_random, where)
      W.depth = W.depth - 1
      if not ok then error(err, 0) end -- an unacceptable error: reported by the outer call
    end
  end

  local function subscriber(where)
    return named(function() reenter(where) end, "<subscriber that re-enters>")
  end

  local function clock_fn()
    local calls_left = R.int(50)
    local store_ref -- filled once opened
    local fn = function()
      calls_left = calls_left - 1
      local c = R.int(40)
      if c == 1 then error(HOSTILE, 0) end
      if c == 2 then return R.pick({ math.mininteger, -1, 1.5, "x", 0 / 0, nil }) end
      if c == 3 and store_ref and store_ref[1] then
        -- a store call from its own clock: INVALID_ARGUMENT, or close()
        if R.chance(0.5) then
          pcall(store_ref[1].head, store_ref[1], "s1")
        else
          W.closed[store_ref[1]] = true
          store_ref[1]:close()
        end
      end
      return W.clock:now()
    end
    store_ref = {}
    return named(fn, "<clock function>"), store_ref
  end

  ------------------------------------------------------------------------
  -- the calls: name -> function returning the function to call and its
  -- arguments (nil: not possible now)

  local methods = core.store_methods
  local ops = {}
  local function op(weight, name, make)
    for _ = 1, weight do ops[#ops + 1] = { name = name, make = make } end
  end

  local function store_call(method, argsf)
    return function()
      local s = a_store()
      if not s or not methods[method] then return nil end
      return methods[method], table.pack(s, argsf())
    end
  end

  local function engine_call(method, argsf)
    return function()
      local e = an_engine()
      if not e then return nil end
      return e[method], table.pack(e, argsf())
    end
  end

  -- A session name for a call that may drop events (truncate, delete):
  -- its head may then differ from its count.
  local function touched_session()
    local name = session()
    if type(name) == "string" then W.touched[name] = true end
    return name
  end

  -- opts.answer (§3.1): both answers, or a refused one
  local function answer() return R.pick({ "ids", "events", "rows", 1 }) end
  op(12, "append", store_call("append", function()
    return session(), events(), opts_table({ expected = small_int, fence = small_int, answer = answer })
  end))
  op(3, "read", store_call("read", function()
    return session(), opts_table({ after = small_int, through = small_int, limit = small_int })
  end))
  op(2, "head", store_call("head", function() return session() end))
  op(2, "read_all", store_call("read_all", function() return opts_table({ after = small_int, limit = small_int }) end))
  op(4, "claim", function()
    local s = a_store()
    if not s then return nil end
    return function(st, ...)
      local r = methods.claim(st, ...)
      if type(r) == "table" then remember_claims(st, r.events) end
      return r
    end, table.pack(s, session(), opts_table({ holder = holder, ttl_ms = ttl, limit = small_int,
      exclude = function() return maybe(0.8, { 1, 2 }) end,
      expires_at = function() return maybe(0.7, T0 + 100) end }))
  end)
  op(3, "claim_next", function()
    local s = a_store()
    if not s then return nil end
    return function(st, ...)
      local list = methods.claim_next(st, ...)
      remember_claims(st, list)
      return list
    end, table.pack(s, opts_table({ holder = holder, ttl_ms = ttl, limit = small_int,
      types = function() return maybe(0.8, { R.pick(TYPES) }) end }))
  end)

  -- session, index, attempt of a remembered claim (on its store), or drawn
  local function claimed()
    local c = a_claim()
    if c then return c.store, c.session, c.index, c.attempt end
    return a_store(), session(), small_int(), small_int()
  end

  op(2, "renew", function()
    local s, name, index, attempt = claimed()
    if not s then return nil end
    return methods.renew, table.pack(s, name, opts_table({ holder = holder, ttl_ms = ttl,
      claims = function() return maybe(0.8, { { index, attempt } }) end }))
  end)
  op(3, "complete", function()
    local s, name, index, attempt = claimed()
    if not s then return nil end
    return methods.complete, table.pack(s, name, index, attempt, maybe(0.8, events()),
      opts_table({ fence = small_int, cancel = function()
        return maybe(0.7, { math.type(index) == "integer" and index + 1 or 2 })
      end }))
  end)
  op(2, "complete_many", function()
    local s = a_store()
    if not s then return nil end
    -- up to three remembered claims (or drawn ones) of any store: an item
    -- of another store's session is an error of that item alone
    local list = {}
    for i = 1, R.int(3) do
      local _, name, index, attempt = claimed()
      local item = opts_table({ fence = small_int, cancel = function()
        return maybe(0.7, { math.type(index) == "integer" and index + 1 or 2 })
      end })
      if type(item) == "table" then -- raw: a hostile table's __newindex raises
        rawset(item, "session", maybe(0.95, name))
        rawset(item, "index", maybe(0.95, index))
        rawset(item, "attempt", maybe(0.95, attempt))
        rawset(item, "events", maybe(0.8, events()))
      end
      list[i] = item
    end
    return methods.complete_many, table.pack(s, maybe(0.95, list))
  end)
  op(3, "fail", function()
    local s, name, index, attempt = claimed()
    if not s then return nil end
    return methods.fail, table.pack(s, name, index, attempt, opts_table({
      error = function() return maybe(0.8, R.pick({ "boom", "a\0b", "\xff", ("e"):rep(70000) })) end,
      max_failures = small_int, retry_after_ms = small_int }))
  end)
  op(1, "revive", store_call("revive", function() return session(), small_int() end))
  op(1, "settle", store_call("settle", function() return session(), small_int(), maybe(0.8, "why") end))
  op(1, "cancel", store_call("cancel", function()
    return session(), small_int(), opts_table({ reason = function() return maybe(0.8, "paid") end })
  end))
  op(2, "append_many", store_call("append_many", function()
    return { { session = session(), events = events(), opts = opts_table({ expected = small_int }) },
      { session = session(), events = events() } }, opts_table({ answer = answer })
  end))
  op(1, "capabilities", store_call("capabilities", function() end))
  op(1, "archived", store_call("archived", function() return opts_table({ after = session, limit = small_int }) end))
  op(1, "dead_letters", store_call("dead_letters", function()
    return opts_table({ session = session, after = small_int, limit = small_int })
  end))
  op(1, "read_state", store_call("read_state", function() return session(), name_of({ "count", "r" }) end))
  op(1, "put_snapshot", store_call("put_snapshot", function()
    return session(), name_of({ "count", "r" }), small_int(), maybe(0.8, "state-bytes"), maybe(0.8, "v1")
  end))
  op(1, "snapshots", store_call("snapshots", function() return session() end))
  op(2, "sessions", store_call("sessions", function()
    return opts_table({ prefix = function() return maybe(0.8, "s") end, after = session, limit = small_int })
  end))
  op(1, "pending_types", store_call("pending_types", function() return end))
  op(1, "events_page", store_call("events_page", function()
    return session(), opts_table({ after = small_int, through = small_int, limit = small_int })
  end))
  op(3, "subscribe", function()
    local s = a_store()
    if not s then return nil end
    return function(...)
      local un = methods.subscribe(...)
      W.unsubs[#W.unsubs + 1] = un
      return un
    end, table.pack(s, R.chance(0.3) and nil or session(), maybe(0.9, subscriber("subscriber")))
  end)
  op(2, "unsubscribe", function()
    if #W.unsubs == 0 then return nil end
    return R.pick(W.unsubs), table.pack()
  end)
  op(2, "wait", store_call("wait", function()
    return R.chance(0.3) and nil or session(), small_int(), timeout()
  end))
  op(1, "stream", function()
    local s = a_store()
    if not s then return nil end
    return function(st, ...)
      local n = 0
      for _ in methods.stream(st, ...) do
        n = n + 1
        if n > 50 then break end
      end
      return n
    end, table.pack(s, session(), R.chance(0.05) and R.pick({ 5, "x", true })
      or { after = small_int(), timeout_ms = timeout() })
  end)
  op(1, "now", store_call("now", function() return end))
  op(3, "presence_set", store_call("presence_set", function()
    return name_of({ "room", "hall" }), name_of({ "ann", "bob" }),
      maybe(0.85, { a = R.int(9), b = R.chance(0.2) and eventstore.json.null or "x" }),
      opts_table({ ttl_ms = ttl, at = small_int, seen = small_int })
  end))
  op(1, "presence_read", store_call("presence_read", function() return name_of({ "room", "hall" }) end))
  op(2, "presence_subscribe", function()
    local s = a_store()
    if not s then return nil end
    return function(...)
      local un = methods.presence_subscribe(...)
      W.unsubs[#W.unsubs + 1] = un
      return un
    end, table.pack(s, name_of({ "room", "hall" }), maybe(0.9, subscriber("presence subscriber")))
  end)
  op(1, "read_states", store_call("read_states", function()
    return maybe(0.8, { session(), session() }), name_of({ "count" })
  end))
  op(1, "fork", function()
    local s = a_store()
    if not s or not methods.fork then return nil end
    local to = "f" .. R.int(5)
    W.touched[to] = true
    local found = false
    for _, x in ipairs(W.sessions) do found = found or x == to end
    if not found then W.sessions[#W.sessions + 1] = to end
    return methods.fork, table.pack(s, session(), small_int(), maybe(0.9, to))
  end)
  op(1, "lineage", store_call("lineage", function() return session() end))
  op(1, "children", store_call("children", function() return session(), opts_table({ limit = small_int }) end))
  op(1, "put_ref", store_call("put_ref", function() return name_of({ "main", "try" }), session() end))
  op(1, "get_ref", store_call("get_ref", function() return name_of({ "main", "try" }) end))
  op(1, "list_refs", store_call("list_refs", function() return opts_table({ limit = small_int }) end))
  op(1, "delete_ref", store_call("delete_ref", function() return name_of({ "main", "try" }) end))
  op(1, "promote", store_call("promote", function()
    return name_of({ "main", "try" }), name_of({ "main", "try" }),
      opts_table({ expect = function() return R.pick({ false, "s1", 5 }) end })
  end))
  op(1, "fence", store_call("fence", function() return session(), opts_table({ if_token = small_int }) end))
  op(1, "lease", store_call("lease", function() return session(), opts_table({ holder = holder, ttl_ms = ttl }) end))
  op(1, "release", store_call("release", function() return session(), opts_table({ holder = holder, token = small_int }) end))
  op(1, "seal", store_call("seal", function()
    return W.clean and R.pick({ "s3", "f1" }) or session(), opts_table({ reason = function() return "done" end })
  end))
  op(1, "truncate", store_call("truncate", function() return touched_session(), small_int() end))
  op(1, "delete", function()
    local s = a_store()
    if not s or R.chance(0.5) then return nil end
    return methods.delete, table.pack(s, touched_session())
  end)
  op(1, "shred", store_call("shred", function() return name_of({ "k1" }) end))
  op(1, "stats", store_call("stats", function() if R.chance(0.1) then return hostile() end end))
  op(1, "tenant", function()
    local s = a_store()
    if not s then return nil end
    return function(st, name)
      local t = methods.tenant(st, name)
      W.tenants[#W.tenants + 1] = named(t, ("<tenant %s of %s>"):format(name, describe(st)))
      W.root[t] = st
      return t
    end, table.pack(s, name_of({ "acme", "beta" }))
  end)
  op(1, "bad self", function()
    local names = {}
    for k in pairs(methods) do
      if type(k) == "string" and k:sub(1, 1) ~= "_" then names[#names + 1] = k end
    end
    table.sort(names)
    local bad = R.pick({ 5, "s", {}, W.clock, true })
    local m = R.pick(names)
    return named(methods[m], "store." .. m), table.pack(bad, "s1", {})
  end)
  op(1, "close store", function()
    local s = a_store()
    if not s or not R.chance(0.3) then return nil end
    return function(st)
      W.closed[st] = true
      return methods.close(st)
    end, table.pack(s)
  end)
  local function reopen()
    return function(clock_kind)
      local opts = { clock = W.clock, max_payload_bytes = R.pick({ 0, 1000, 100000 }) }
      local ref
      if clock_kind == "function" then opts.clock, ref = clock_fn() end
      local s = eventstore.open(url, opts)
      if ref then ref[1] = s end
      W.stores[#W.stores + 1] = named(s, "<store " .. #W.stores + 1 .. ">")
      return s
    end, table.pack(R.chance(0.3) and "function" or "manual")
  end
  op(1, "reopen", function()
    if R.chance(0.5) then return nil end
    return reopen()
  end)
  op(1, "open hostile", function()
    return eventstore.open, table.pack(maybe(0.5, url), opts_table({
      clock = function() return hostile() end,
      max_payload_bytes = small_int,
      ids = function() return hostile() end,
    }))
  end)
  op(1, "collect", function()
    return function(kind) return collectgarbage(kind) end, table.pack(R.pick({ "collect", "step" }))
  end)
  op(2, "clock", function()
    local c = W.clock
    if R.chance(0.5) then
      return c.advance, table.pack(c, maybe(0.8, R.pick({ 1, 10, 1000, -1 })))
    end
    return c.set, table.pack(c, maybe(0.7, T0 + R.int(100000)))
  end)
  op(1, "manual_clock", function()
    return eventstore.manual_clock, table.pack(maybe(0.6, T0))
  end)

  -- the engine
  op(2, "engine", function()
    local s = a_store()
    if not s or #W.engines >= 12 then return nil end
    return function(o)
      local e = eventstore.engine(o)
      W.engines[#W.engines + 1] = named(e, "<engine " .. #W.engines + 1 .. ">")
      W.root[e] = o.store
      return e
    end, table.pack(R.chance(0.03) and hostile() or {
      store = s, scripts = engine_opt(dir), workers = engine_opt(R.int(2)),
      instruction_budget = engine_opt(200000), ttl_ms = engine_opt(1000),
      max_failures = engine_opt(2), backoff_ms = engine_opt(1), snapshot_every = engine_opt(R.pick({ 0, 2 })),
      holder = engine_opt(R.pick({ nil, "h1", "h2" })),
    })
  end)
  -- an engine that opens its own store from the URL (and closes it)
  op(1, "engine from url", function()
    if #W.engines >= 12 then return nil end
    return function(o)
      local e = eventstore.engine(o)
      W.engines[#W.engines + 1] = named(e, "<engine " .. #W.engines + 1 .. " on its own store>")
      return e
    end, table.pack({
      store = url, clock = engine_opt(W.clock), scripts = dir, workers = engine_opt(R.int(2)),
      instruction_budget = 200000, max_failures = 2, backoff_ms = 1,
    })
  end)
  op(1, "engine:run", function()
    local e = an_engine()
    if not e then return nil end
    local o
    if R.chance(0.7) then
      o = { until_idle = true }
    else
      -- runs until its progress function stops it, re-entering first
      local left = R.int(2)
      o = { progress_ms = maybe(0.9, 1), progress = named(function()
        left = left - 1
        if left <= 0 then e:stop() end
        if R.chance(0.3) then pcall(e.run, e, { until_idle = true }) end
        if R.chance(0.2) then
          local ok, err = pcall(e.close, e)
          if not ok and not M.acceptable(err) then error(err, 0) end
        end
        reenter("progress")
      end, "<progress that re-enters>") }
      if type(o.progress_ms) ~= "number" then o.progress_ms = nil end -- a bad value must not block
    end
    return e.run, table.pack(e, o)
  end)
  op(2, "engine:append", engine_call("append", function()
    return session(), events(), opts_table({ expected = small_int, answer = answer })
  end))
  op(1, "engine:state", engine_call("state", function()
    return session(), name_of({ "count", "nope" }), opts_table({ at = small_int })
  end))
  op(1, "engine:lease", engine_call("lease", function() return session(), opts_table({ ttl_ms = ttl }) end))
  op(1, "engine:release", engine_call("release", function() return session() end))
  op(1, "engine:truncate", engine_call("truncate", function() return touched_session(), small_int() end))
  op(1, "engine:misc", function()
    local e = an_engine()
    if not e then return nil end
    local m = R.pick({ "has_handler", "stats", "stop" })
    return e[m], table.pack(maybe(0.9, e), name_of(TYPES))
  end)
  op(1, "engine:close", function()
    local e = an_engine()
    if not e or not R.chance(0.3) then return nil end
    return function(en)
      en:close()
      W.closed[en] = true
    end, table.pack(e)
  end)

  ------------------------------------------------------------------------
  -- invariants

  local function check_invariants(where)
    for _, s in ipairs(W.stores) do
      local ok, page = pcall(methods.sessions, s, { limit = 1000 })
      if ok then
        local last_pos = -1
        local all_ok, all = pcall(methods.read_all, s, {})
        if all_ok then
          for _, ev in ipairs(all) do
            if not (ev.position > last_pos) then
              return ("read_all: position %s after %s (%s)"):format(ev.position, last_pos, where)
            end
            last_pos = ev.position
          end
        elseif not M.acceptable(all) then
          return "read_all raised " .. describe(all)
        end
        for _, row in ipairs(page.sessions) do
          local name = row.session
          local rok, evs = pcall(methods.read, s, name)
          local hok, head = pcall(methods.head, s, name)
          if rok and hok then
            local first = row.first_index or 1
            local pos = -1
            for i, ev in ipairs(evs) do
              if ev.index ~= first + i - 1 then
                return ("session %q: event %d has index %s, expected %d"):format(name, i, ev.index, first + i - 1)
              end
              if not (ev.position > pos) then
                return ("session %q: position %s after %s"):format(name, ev.position, pos)
              end
              pos = ev.position
              if not STATUSES[ev.status] then
                return ("session %q: event %d has status %s"):format(name, ev.index, describe(ev.status))
              end
              if math.type(ev.created_at) ~= "integer" then
                return ("session %q: event %d has created_at %s"):format(name, ev.index, describe(ev.created_at))
              end
              -- §3.1: nothing out of range is ever stored
              if math.type(ev.revision) ~= "integer" or ev.revision < 1 or ev.revision > 2147483647 then
                return ("session %q: event %d has revision %s"):format(name, ev.index, describe(ev.revision))
              end
              if ev.meta ~= nil and (type(ev.meta) ~= "table" or #eventstore.json.encode(ev.meta) > 8192
                  or eventstore.json.encode(ev.meta):sub(1, 1) ~= "{") then
                return ("session %q: event %d has meta %s"):format(name, ev.index, describe(ev.meta))
              end
            end
            local touched = false
            for t in pairs(W.touched) do
              touched = touched or name == t or name:sub(-#t - 1) == "/" .. t or name:sub(-#t) == t
            end
            if first == 1 and not touched and head ~= #evs then
              return ("session %q: head %d but %d events"):format(name, head, #evs)
            end
            if #evs > 0 and evs[#evs].index ~= head then
              return ("session %q: head %d but the last event has index %d"):format(name, head, evs[#evs].index)
            end
          elseif not rok and not M.acceptable(evs) then
            return "read raised " .. describe(evs)
          elseif not hok and not M.acceptable(head) then
            return "head raised " .. describe(head)
          end
        end
      elseif not M.acceptable(page) then
        return "sessions raised " .. describe(page)
      end
    end
  end

  ------------------------------------------------------------------------
  -- the loop

  local n_call = 0
  call_random = function(where)
    local fn, args, o
    local outer_clean = W.clean
    -- Most calls draw valid values only, so the run gets past the argument
    -- checks to claimed, completed, failed and dead events; the others mix
    -- hostile values into any argument.
    W.clean = R.chance(0.6)
    local any_open = false
    for _, h in ipairs(W.stores) do any_open = any_open or is_open(h) end
    if not any_open and R.chance(0.8) then
      o = { name = "reopen", make = reopen } -- every store closed: mostly open one again
      fn, args = o.make()
    end
    for _ = 1, 20 do
      if fn then break end
      o = R.pick(ops)
      fn, args = o.make()
    end
    if not fn then return end
    n_call = n_call + 1
    local text = ("#%d %s%s%s(%s)"):format(n_call, where and (where .. " -> ") or "", o.name,
      described[fn] and (" " .. described[fn]) or "", describe_args(args))
    record(text)
    local ok, err = pcall(fn, table.unpack(args, 1, args.n))
    W.clean = outer_clean
    local tally = M.tally[o.name] or { returned = 0, raised = 0, codes = {} }
    M.tally[o.name] = tally
    if ok then
      tally.returned = tally.returned + 1
    else
      tally.raised = tally.raised + 1
      local code = eventstore.is_error(err) and err.code or "argument/hostile"
      tally.codes[code] = (tally.codes[code] or 0) + 1
    end
    if not ok and not M.acceptable(err) then
      local what = type(err) == "string" and err:sub(1, 500) or describe(err)
      failure = failure or ("call %s raised a %s that is neither an argument error nor an error object: %s")
        :format(text, type(err), what)
      error(failure, 0)
    end
  end

  -- the first store, on the manual clock
  W.stores[1] = named(eventstore.open(url, { clock = W.clock }), "<store 1>")
  named(W.clock, "<manual clock>")

  local ok, err = pcall(function()
    for i = 1, calls do
      call_random(nil)
      if i % check_every == 0 or i == calls then
        local bad = check_invariants(("after call %d"):format(i))
        if bad then
          failure = "invariant broken: " .. bad
          error(failure, 0)
        end
      end
      if failure then error(failure, 0) end
    end
  end)
  if not ok and not failure then failure = "the fuzzer itself raised: " .. describe(err) .. "\n" .. tostring(err) end

  -- cleanup: every engine, then every handle (errors here are failures too)
  for _, e in ipairs(W.engines) do
    local cok, cerr = pcall(e.close, e)
    if not cok and not failure then failure = "closing an engine raised " .. describe(cerr) end
  end
  for _, t in ipairs(W.tenants) do pcall(methods.close, t) end
  for _, s in ipairs(W.stores) do
    local cok, cerr = pcall(methods.close, s)
    if not cok and not failure then failure = "closing a store raised " .. describe(cerr) end
  end
  W = nil
  collectgarbage("collect")
  collectgarbage("collect")
  for _, f in ipairs(files) do os.remove(f) end
  os.execute("rm -rf " .. sh_quote(dir))
  os.remove(reserved)

  if failure then
    local report = {
      ("api fuzz FAILED: seed %d, url %s, %d calls (replay: FUZZ_SEED=%d FUZZ_SEEDS=1 FUZZ_CALLS=%d ES_TEST_URLS='%s')")
        :format(seed, template, calls, seed, calls, template),
      failure,
      "the calls before it (newest last):",
    }
    for _, h in ipairs(history) do report[#report + 1] = "  " .. h end
    return false, table.concat(report, "\n")
  end
  return true, ("seed %d, url %s: %d calls"):format(seed, template, n_call)
end

function M.urls()
  local env = os.getenv("ES_TEST_URLS")
  local urls = {}
  for u in (env or "memory: sqlite:"):gmatch("%S+") do urls[#urls + 1] = u end
  return urls
end

-- as a program: run seeds first..first+seeds-1 on every URL
if not pcall(debug.getlocal, 4, 1) then
  local first = tonumber(arg[1] or os.getenv("FUZZ_SEED") or "1")
  local seeds = tonumber(arg[2] or os.getenv("FUZZ_SEEDS") or "10")
  local calls = tonumber(arg[3] or os.getenv("FUZZ_CALLS") or "2000")
  local failed = 0
  print(("api fuzz: seeds %d..%d, %d calls each, on %s"):format(first, first + seeds - 1, calls,
    table.concat(M.urls(), " ")))
  for seed = first, first + seeds - 1 do
    for _, url in ipairs(M.urls()) do
      local ok, report = M.run({ seed = seed, calls = calls, url = url })
      print((ok and "ok " or "FAILED ") .. report)
      io.stdout:flush()
      if not ok then failed = failed + 1 end
    end
  end
  if os.getenv("FUZZ_STATS") then
    local names = {}
    for name in pairs(M.tally) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      local t, codes = M.tally[name], {}
      for code, n in pairs(t.codes) do codes[#codes + 1] = ("%s %d"):format(code, n) end
      table.sort(codes)
      print(("  %-20s returned %6d  raised %6d  %s"):format(name, t.returned, t.raised, table.concat(codes, ", ")))
    end
  end
  print(("api fuzz: %d seeds x %d urls, %d failed"):format(seeds, #M.urls(), failed))
  os.exit(failed == 0 and 0 or 1)
end

return M
