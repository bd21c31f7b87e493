-- Conformance: docs/contract.md §3.11, tenants (store:tenant(name)). Runs once per
-- backend URL (helpers.urls()).
--
-- The isolation test tries every method of the store handle through tenant
-- A against tenant B's data: the methods are enumerated from the handle's
-- metatable, and a method without an entry in ATTACKS fails the test, so a
-- new store method must come with its isolation case (one line: see how
-- `read` or `truncate` is written).
local helpers = require("helpers")

local expect_error = helpers.expect_error
local SEP = "\31"

-- A deterministic text of any Lua value (sorted keys), for "unchanged"
-- comparisons and for looking for leaked bytes in an answer.
local function dump(v, seen)
  seen = seen or {}
  local t = type(v)
  if t == "table" then
    if seen[v] then return "<cycle>" end
    seen[v] = true
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b)
      return tostring(a) < tostring(b)
    end)
    local parts = {}
    for _, k in ipairs(keys) do parts[#parts + 1] = tostring(k) .. "=" .. dump(v[k], seen) end
    seen[v] = nil
    return "{" .. table.concat(parts, ",") .. "}"
  elseif t == "string" then
    return ("%q"):format(v)
  end
  return tostring(v)
end

local function sorted(t)
  table.sort(t)
  return t
end

local function sessions_of(h)
  local names = {}
  for _, row in ipairs(h:sessions({ limit = 1000 }).sessions) do names[#names + 1] = row.session end
  return names
end

-- The same data under one tenant handle (or the root); every payload,
-- value, state, error and reason carries `who`, so a leak of another
-- tenant's data into an answer shows as that marker.
local function populate(h, who)
  local d = {}
  local s1 = h:append("s1", {
    { type = "t", payload = { who = who } },
    { type = "t", id = "e1", payload = { who = who } },
    { type = "u", lane = "L", payload = { who = who } },
  })
  d.generated_id = s1[1].id
  h:append("s2", { { type = "t", payload = { who = who }, settled = true },
    { type = "t", payload = { who = who }, settled = true } })
  h:put_snapshot("s2", "r", 2, who .. "-state", "v1")
  h:fork("s2", 2, "f1")
  h:append("d1", { { type = "t", payload = { who = who } } })
  local c = h:claim("d1", { holder = "w", ttl_ms = 1000 })
  h:fail("d1", 1, c.events[1].attempt, { error = who .. "-err", max_failures = 1 })
  h:append("c1", { { type = "t", payload = { who = who } } })
  d.claim = h:claim("c1", { holder = "w", ttl_ms = 60000 }).events[1]
  h:put_ref("main", "s1")
  h:put_ref("try/x", "f1")
  h:presence_set("room", "p", { x = who }, { ttl_ms = 60000 })
  d.lease = h:lease("l1", { holder = "w", ttl_ms = 60000 })
  d.fence = h:fence("fz")
  h:seal("sealed1", { reason = who })
  h:append("tr", { { type = "t", payload = { who = who }, settled = true } })
  -- §3.10: a sealed event under a key every tenant names "kb"
  h:append("k1", { { type = "t", payload = { who = who }, key = "kb" } })
  return d
end

-- Everything a tenant handle can see of its own data.
local function full_dump(h)
  local out = { sessions = h:sessions({ limit = 1000 }), refs = h:list_refs({ limit = 1000 }),
    dead = h:dead_letters({ limit = 1000 }), all = h:read_all(), pending = h:pending_types(),
    presence = h:presence_read("room") }
  out.events, out.snapshots, out.lineage, out.children = {}, {}, {}, {}
  for _, row in ipairs(out.sessions.sessions) do
    local s = row.session
    out.events[s] = h:read(s)
    out.snapshots[s] = h:snapshots(s)
    out.lineage[s] = h:lineage(s) or false
    out.children[s] = h:children(s)
  end
  out.state = h:read_state("s2", "r")
  return dump(out)
end

-- The names tenant A tries in order to reach B's data: B's names as the
-- root handle sees them, the same plain names, and separator tricks.
local function b_names(name)
  return { "B" .. SEP .. name, name, SEP .. name, "B" .. SEP .. "B" .. SEP .. name, "../B/" .. name }
end

-- ATTACKS[method](c): calls the method through A (c.A) at B's data with
-- c.try(method, ...) (each call may succeed or fail; neither may show or
-- change B's data), and asserts what A must see. c.b is what populate
-- returned for B, c.bgen B's generated ids (as B sees them).
local ATTACKS = {}

ATTACKS.append = function(c)
  for _, s in ipairs(b_names("s1")) do
    c.try("append", s, { { type = "t", payload = { who = "A" } } })
  end
  -- B's ids (given and generated) are free in A: ids are per tenant.
  local got = c.try("append", "mine", { { type = "t", id = c.b.generated_id } })
  assert.equal(c.b.generated_id, got[1].id)
  c.try("append", "s1", { { type = "t", id = "e1" } }) -- A's own e1: a replay of A's
  c.try("append", "sealed1", { { type = "t" } }, { fence = c.b.fence })
end
ATTACKS.append_many = function(c)
  for _, s in ipairs(b_names("s1")) do
    c.try("append_many", { { session = s, events = { { type = "t", payload = { who = "A" } } } } })
  end
  -- B's ids are free in A; a fenced write at B's sealed session is A's own session
  c.try("append_many", { { session = "mine2", events = { { type = "t", id = c.b.generated_id } } },
    { session = "sealed1", events = { { type = "t" } }, opts = { fence = c.b.fence } } })
end
ATTACKS.cancel = function(c)
  for _, s in ipairs(b_names("c1")) do c.try("cancel", s, 1, { reason = "A" }) end
  for _, s in ipairs(b_names("s1")) do c.try("cancel", s, 1, { reason = "A" }) end
end
ATTACKS.archived = function(c)
  c.try("archived", {})
  c.try("archived", { after = "B" })
  c.try("archived", { after = "", limit = 1 })
end
ATTACKS.read = function(c)
  for _, s in ipairs(b_names("s1")) do c.try("read", s) end
end
ATTACKS.head = function(c)
  assert.equal(0, c.try("head", "B" .. SEP .. "s1"))
end
ATTACKS.read_all = function(c)
  c.try("read_all")
  c.try("read_all", { after = 0, limit = 1000 })
  for _, e in ipairs(c.A:read_all()) do assert.is_nil(e.session:find(SEP, 1, true), e.session) end
end
ATTACKS.events_page = function(c)
  for _, s in ipairs(b_names("s1")) do c.try("events_page", s, { after = 0 }) end
end
ATTACKS.claim = function(c)
  for _, s in ipairs(b_names("c1")) do c.try("claim", s, { holder = "w", ttl_ms = 1000 }) end
  for _, s in ipairs(b_names("s1")) do c.try("claim", s, { holder = "x", ttl_ms = 1000 }) end
end
ATTACKS.claim_next = function(c)
  assert.is_table(c.try("claim_next", { holder = "x", ttl_ms = 1000, limit = 1000 }))
  c.try("claim_next", { holder = "x", ttl_ms = 1000, limit = 1000, types = { "t", "u" } })
end
ATTACKS.renew = function(c)
  for _, s in ipairs(b_names("c1")) do
    local r = c.try("renew", s, { holder = "w", claims = { { index = 1, attempt = c.b.claim.attempt } }, ttl_ms = 99999 })
    if r then assert.same({}, r.renewed) end
  end
end
ATTACKS.complete = function(c)
  for _, s in ipairs(b_names("c1")) do
    c.try("complete", s, 1, c.b.claim.attempt, { { type = "t" } })
  end
end
ATTACKS.complete_many = function(c)
  local all = {}
  for _, s in ipairs(b_names("c1")) do
    local item = { session = s, index = 1, attempt = c.b.claim.attempt, events = { { type = "t" } }, cancel = { 1, 2 } }
    c.try("complete_many", { item }) -- alone: a name refused for the whole call hides no other
    all[#all + 1] = item
  end
  c.try("complete_many", all)
end
ATTACKS.fail = function(c)
  for _, s in ipairs(b_names("c1")) do
    c.try("fail", s, 1, c.b.claim.attempt, { error = "x", max_failures = 1 })
  end
end
ATTACKS.revive = function(c)
  for _, s in ipairs(b_names("d1")) do c.try("revive", s, 1) end
end
ATTACKS.settle = function(c)
  for _, s in ipairs(b_names("d1")) do c.try("settle", s, 1, "x") end
end
ATTACKS.dead_letters = function(c)
  for _, e in ipairs(c.try("dead_letters", {})) do assert.equal("d1", e.session) end
  for _, s in ipairs(b_names("d1")) do c.try("dead_letters", { session = s }) end
end
ATTACKS.read_state = function(c)
  for _, s in ipairs(b_names("s2")) do c.try("read_state", s, "r") end
end
ATTACKS.read_states = function(c)
  c.try("read_states", b_names("s2"), "r")
end
ATTACKS.put_snapshot = function(c)
  for _, s in ipairs(b_names("s2")) do c.try("put_snapshot", s, "r", 0, "x", "v2") end
end
ATTACKS.snapshots = function(c)
  for _, s in ipairs(b_names("s2")) do c.try("snapshots", s) end
end
ATTACKS.sessions = function(c)
  c.try("sessions", {})
  c.try("sessions", { prefix = "B" })
  c.try("sessions", { prefix = "B" .. SEP })
  c.try("sessions", { after = "" })
  c.try("sessions", { after = "B" .. SEP .. "s1" })
  local names = sessions_of(c.A)
  for _, n in ipairs(names) do assert.is_nil(n:find("A" .. SEP, 1, true)) end
end
ATTACKS.pending_types = function(c)
  local p = c.try("pending_types")
  -- A's own pending events only (B has the same types and more of them)
  local mine = 0
  for _, e in ipairs(c.A:read_all()) do
    if e.status == "pending" then mine = mine + 1 end
  end
  local counted = 0
  for _, n in pairs(p) do counted = counted + n end
  assert.equal(mine, counted)
end
ATTACKS.subscribe = function(c)
  if c.root:capabilities().sharded then
    -- no store-wide position on shards: refused for a tenant too (docs/sharding.md)
    expect_error("INVALID_ARGUMENT", c.A.subscribe, c.A, nil, function() end)
  else
    c.subs[#c.subs + 1] = c.A:subscribe(nil, function(e) c.leaked[#c.leaked + 1] = e end)
  end
  for _, s in ipairs(b_names("s1")) do
    c.subs[#c.subs + 1] = c.A:subscribe(s, function(e) c.leaked[#c.leaked + 1] = e end)
  end
end
ATTACKS.wait = function(c)
  c.try("wait", nil, 0, 0)
  for _, s in ipairs(b_names("s1")) do c.try("wait", s, 0, 0) end
end
ATTACKS.stream = function(c)
  for _, s in ipairs(b_names("s1")) do
    for e in c.A:stream(s, { timeout_ms = 0 }) do c.check(e) end
  end
end
ATTACKS.now = function(c)
  assert.equal(c.A:now(), c.root:now()) -- one clock: no data to reach
end
ATTACKS.presence_set = function(c)
  for _, ns in ipairs(b_names("room")) do c.try("presence_set", ns, "p", { x = "A" }, { ttl_ms = 1000 }) end
end
ATTACKS.presence_read = function(c)
  for _, ns in ipairs(b_names("room")) do c.try("presence_read", ns) end
end
ATTACKS.presence_subscribe = function(c)
  for _, ns in ipairs(b_names("room")) do
    c.subs[#c.subs + 1] = c.A:presence_subscribe(ns, function(p) c.leaked[#c.leaked + 1] = p end)
  end
end
ATTACKS.fork = function(c)
  for _, s in ipairs(b_names("s1")) do c.try("fork", s, 1, "stolen") end
  for _, s in ipairs(b_names("f2")) do c.try("fork", "s1", 0, s) end
end
ATTACKS.lineage = function(c)
  for _, s in ipairs(b_names("f1")) do c.try("lineage", s) end
end
ATTACKS.children = function(c)
  for _, s in ipairs(b_names("s2")) do c.try("children", s) end
  c.try("children", "s2", { after = "B" })
end
ATTACKS.put_ref = function(c)
  for _, r in ipairs(b_names("main")) do c.try("put_ref", r, "s2") end
end
ATTACKS.get_ref = function(c)
  for _, r in ipairs(b_names("main")) do c.try("get_ref", r) end
end
ATTACKS.list_refs = function(c)
  c.try("list_refs", {})
  c.try("list_refs", { after = "B" })
  c.try("list_refs", { after = "", limit = 1 })
end
ATTACKS.delete_ref = function(c)
  for _, r in ipairs(b_names("try/x")) do c.try("delete_ref", r) end
end
ATTACKS.promote = function(c)
  for _, r in ipairs(b_names("main")) do
    c.try("promote", r, "taken")
    c.try("promote", "main", r)
    c.try("promote", "main", r, { expect = "s1" })
  end
end
ATTACKS.fence = function(c)
  for _, s in ipairs(b_names("fz")) do c.try("fence", s, { if_token = c.b.fence }) end
end
ATTACKS.lease = function(c)
  for _, s in ipairs(b_names("l1")) do c.try("lease", s, { holder = "w", ttl_ms = 1000 }) end
end
ATTACKS.release = function(c)
  for _, s in ipairs(b_names("l1")) do c.try("release", s, { holder = "w", token = c.b.lease.token }) end
end
ATTACKS.seal = function(c)
  for _, s in ipairs(b_names("s1")) do c.try("seal", s, { reason = "x" }) end
end
ATTACKS.truncate = function(c)
  for _, s in ipairs(b_names("tr")) do c.try("truncate", s, 1) end
end
ATTACKS.delete = function(c)
  for _, s in ipairs(b_names("s1")) do c.try("delete", s) end
  for _, s in ipairs(b_names("f1")) do c.try("delete", s) end
end
-- §3.9 archive: B's and the root's "s2" are archived through 2, A's through 1.
ATTACKS.archive = function(c)
  for _, s in ipairs(b_names("s2")) do c.try("archive", s, { through = 2 }) end
end
ATTACKS.segments = function(c)
  for _, s in ipairs(b_names("s2")) do c.try("segments", s) end
  assert.equal(1, c.try("segments", "s2")[1].from) -- A's own (archive may have run first)
end
ATTACKS.compact_archive = function(c)
  for _, s in ipairs(b_names("s2")) do c.try("compact_archive", s) end
end
ATTACKS.verify_archive = function(c)
  for _, s in ipairs(b_names("s2")) do c.try("verify_archive", s) end
  local all = c.try("verify_archive")
  assert.equal(#c.A:segments("s2"), all.checked) -- A's segments, not B's or the root's
  assert.same({}, all.problems)
end
-- §3.10: key names are per tenant; B's "kb" stays live whatever A shreds.
ATTACKS.shred = function(c)
  for _, k in ipairs(b_names("kb")) do c.try("shred", k) end
  assert.is_true(c.A:read("k1")[1].shredded) -- A's own "kb" went
end
ATTACKS.read_at_rest = function(c)
  for _, s in ipairs(b_names("k1")) do c.try("read_at_rest", s) end
end
-- §10: moving works on whole stores; a tenant handle is refused, so it
-- can neither read B's rows out nor write rows under B's names in.
ATTACKS.export = function(c)
  expect_error("INVALID_ARGUMENT", c.A.export, c.A, function() end)
end
ATTACKS._export = function(c)
  expect_error("INVALID_ARGUMENT", c.A._export, c.A, "", 0)
end
ATTACKS._import = function(c)
  -- a valid stream writing under B's stored names
  local lines = {}
  local m = require("eventstore").open("memory:")
  m:append("B" .. SEP .. "s1", { { type = "t", payload = "A wrote this" } })
  m:export(function(l) lines[#lines + 1] = l end)
  m:close()
  expect_error("INVALID_ARGUMENT", c.A._import, c.A, lines, "upsert")
  expect_error("INVALID_ARGUMENT", c.A._import, c.A, lines, "empty")
end
ATTACKS.backup = function(c)
  expect_error("INVALID_ARGUMENT", c.A.backup, c.A, os.tmpname() .. ".backup")
end
ATTACKS.tenant = function(c)
  expect_error("INVALID_ARGUMENT", c.A.tenant, c.A, "B") -- no nesting
end
-- §5: plan changes belong to sharded stores; a tenant handle is not one.
ATTACKS.plan = function(c)
  expect_error("INVALID_ARGUMENT", c.A.plan, c.A)
end
ATTACKS.set_plan = function(c)
  expect_error("INVALID_ARGUMENT", c.A.set_plan, c.A, { version = 2, shards = { x = "memory:" } })
end
ATTACKS._crash_after = function(c)
  expect_error("INVALID_ARGUMENT", c.A._crash_after, c.A, 1)
end
ATTACKS._pause_after = function(c)
  expect_error("INVALID_ARGUMENT", c.A._pause_after, c.A, 1, "gate")
end
-- §3.12: a tenant's stats count its own sessions and calls only.
-- §3.1: the store's capabilities, naming A and never B
ATTACKS.capabilities = function(c)
  assert.equal("A", c.try("capabilities").tenant)
end
ATTACKS.stats = function(c)
  local st = c.A:stats()
  local n = 0
  for _ in ipairs(sessions_of(c.A)) do n = n + 1 end
  assert.equal(n, st.sessions)
end
ATTACKS._stats_enabled = function(c)
  c.A:_stats_enabled(true)
end
-- §8 projections: an engine on the root folds every tenant's events into
-- p (keyed by session, each state holding its events' payloads, B's
-- secret included), once per test; A then reads at B's keys.
local function projected(c)
  if c.projected then return end
  c.projected = true
  local eventstore = require("eventstore")
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. helpers.sh_quote(dir .. "/projections")))
  helpers.write_file(dir .. "/projections/p.lua", [[
return { key = function(e) return e.session end,
         ["t"] = function(s, e) s[#s + 1] = e.payload end }
]])
  local engine = eventstore.engine({ store = c.root, scripts = dir })
  engine:run({ until_idle = true })
  engine:close()
  os.execute("rm -rf " .. helpers.sh_quote(dir))
  -- B's states exist (the root sees them only through B's handle)
  local s1 = c.root:tenant("B"):projection("p", "s1")
  assert.equal("B-secret", s1[1].who)
end
ATTACKS.projection = function(c)
  projected(c)
  for _, s in ipairs(b_names("s1")) do c.try("projection", "p", s) end
  -- A's own states read (the earlier cases may have removed A's s1)
  local mine = c.A:projection_keys("p", {}).keys[1]
  assert.is_string(mine)
  assert.equal("A", c.try("projection", "p", mine)[1].who)
end
ATTACKS.projection_keys = function(c)
  projected(c)
  c.try("projection_keys", "p", {})
  c.try("projection_keys", "p", { prefix = "B" .. SEP })
  c.try("projection_keys", "p", { after = "B" .. SEP .. "s1", limit = 1000 })
  for _, k in ipairs(c.A:projection_keys("p", {}).keys) do assert.is_nil(k:find(SEP, 1, true), k) end
end
ATTACKS.projections = function(c)
  projected(c)
  c.try("projections")
  c.try("projections", "p")
end
ATTACKS.projection_control = function(c)
  projected(c)
  for _, action in ipairs({ "rebuild", "retry", "skip" }) do
    local _, err = c.try("projection_control", "p", action)
    assert.equal("INVALID_ARGUMENT", err.code) -- a tenant steers no projection
  end
  assert.is_false(c.root:projections("p")[1].rebuild)
end
ATTACKS.close = function(c)
  c.close_last = true -- closing A (last) leaves B open: checked at the end
end

for _, url in ipairs(helpers.urls_and_shards()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    it("no call through tenant A reads or changes tenant B's data (every store method)", function()
      local dir = os.tmpname()
      os.remove(dir)
      local keys = dir .. ".keys"
      -- one finally: busted keeps only the last one a test registers
      finally(function()
        os.execute("rm -rf " .. helpers.sh_quote(dir))
        os.remove(keys)
      end)
      local root = new({ archive = dir, keys = keys })
      populate(root, "root-secret")
      local A, B = root:tenant("A"), root:tenant("B")
      local b = populate(B, "B-secret")
      populate(A, "A")
      root:archive("s2", { through = 2 })
      B:archive("s2", { through = 2 })
      A:archive("s2", { through = 1 })
      local before = full_dump(B)
      local bgen = {}
      for _, e in ipairs(B:read_all()) do bgen[#bgen + 1] = e.id end

      local c = { A = A, root = root, b = b, subs = {}, leaked = {} }
      -- Nothing of B's (or the root's) may show in what A gets back: not a
      -- marker, not a stored name of A's own (prefix).
      function c.check(v, what)
        local text = dump(v)
        for _, marker in ipairs({ "B-secret", "root-secret", "A" .. SEP }) do
          assert.is_nil(text:find(marker, 1, true), ("%s leaked %q: %s"):format(what or "answer", marker, text))
        end
      end
      function c.try(method, ...)
        local res = table.pack(pcall(A[method], A, ...))
        if res[1] then
          for i = 2, res.n do c.check(res[i], method) end
          return res[2]
        end
        c.check(res[2], method .. " error")
        return nil, res[2]
      end

      local methods = {}
      for name, fn in pairs(getmetatable(root).__index) do
        if type(fn) == "function" then methods[#methods + 1] = name end
      end
      table.sort(methods)
      local missing = {}
      for _, m in ipairs(methods) do
        if not ATTACKS[m] then missing[#missing + 1] = m end
      end
      assert.same({}, missing, "store methods without an isolation case in ATTACKS")
      for _, m in ipairs(methods) do ATTACKS[m](c) end

      assert.equal(before, full_dump(B))
      -- the root's own (unprefixed) data is no tenant's either
      local root_after = root:sessions({ limit = 1000 }).sessions
      local plain = {}
      for _, row in ipairs(root_after) do
        if not row.session:find(SEP, 1, true) then plain[#plain + 1] = row.session end
      end
      assert.same(sorted({ "c1", "d1", "f1", "fz", "k1", "l1", "s1", "s2", "sealed1", "tr" }), sorted(plain))
      for _, s in ipairs(plain) do assert.equal("root-secret", (root:read(s)[1] or { payload = { who = "root-secret" } }).payload.who) end

      -- B writes now: A's subscriptions (every session, B's names, B's
      -- namespace) hear nothing.
      B:append("s1", { { type = "t", payload = { who = "B-secret" } } })
      B:presence_set("room", "q", { y = "B-secret" }, { ttl_ms = 1000 })
      root:append("s1", { { type = "t", payload = { who = "root-secret" } } })
      A:head("s1") -- a call through A delivers what its subscribers have pending
      assert.same({}, c.leaked)
      for _, unsub in ipairs(c.subs) do unsub() end

      assert.is_true(c.close_last)
      A:close()
      expect_error("CLOSED", A.read, A, "s1")
      assert.equal(4, B:head("s1")) -- B and the store go on
      assert.equal(4, root:head("s1"))
    end)

    it("verify_archive through a tenant names the tenant's session without the prefix, in the problem text too", function()
      local dir = os.tmpname()
      os.remove(dir)
      finally(function() os.execute("rm -rf " .. helpers.sh_quote(dir)) end)
      local root = new({ archive = dir })
      local t = root:tenant("acme")
      for i = 1, 3 do t:append("orders", { { type = "x", payload = { i = i }, settled = true } }) end
      local g = t:archive("orders", { through = 2 })
      local f = assert(io.open(dir .. "/" .. g.file, "r+b"))
      f:seek("set", 100)
      f:write("\0\0\0\0")
      f:close()
      local v = t:verify_archive()
      assert.equal(1, #v.problems)
      assert.equal("orders", v.problems[1].session)
      assert.truthy(v.problems[1].problem:find("'orders'", 1, true))
      assert.is_nil(v.problems[1].problem:find(SEP, 1, true))
      local err = expect_error("STORAGE", t.read, t, "orders")
      assert.is_nil(tostring(err):find(SEP, 1, true))
    end)

    it("same names in two tenants are independent: sessions, ids, refs, presence", function()
      local root = new()
      local A, B = root:tenant("A"), root:tenant("B")
      local a = A:append("s", { { type = "t", id = "x", payload = 1 } })
      local b = B:append("s", { { type = "t", id = "x", payload = 2 } })
      assert.equal("x", a[1].id)
      assert.equal("x", b[1].id)
      assert.equal("s", b[1].session)
      assert.equal(1, A:read("s")[1].payload)
      assert.equal(2, B:read("s")[1].payload)
      -- a replay in A is A's (same payload: the original comes back) ...
      assert.equal(a[1].position, A:append("s", { { type = "t", id = "x", payload = 1 } })[1].position)
      -- ... and a different payload under A's id is A's conflict, not B's
      expect_error("ID_CONFLICT", A.append, A, "s", { { type = "t", id = "x", payload = 3 } })
      -- an id used in another of A's sessions is still refused within A
      expect_error("PARTIAL_DUPLICATE_BATCH", A.append, A, "other", { { type = "t", id = "x" } })
      A:put_ref("main", "s")
      B:put_ref("main", "s")
      B:delete_ref("main")
      assert.equal("s", A:get_ref("main").session)
      assert.is_nil(B:get_ref("main"))
      A:presence_set("ns", "p", { v = "a" }, { ttl_ms = 1000 })
      B:presence_set("ns", "p", { v = "b" }, { ttl_ms = 1000 })
      assert.equal("a", A:presence_read("ns")[1].value)
      assert.equal("b", B:presence_read("ns")[1].value)
      A:seal("s")
      B:append("s", { { type = "t" } }) -- B's "s" is not sealed
      assert.equal(2, B:head("s"))
    end)

    it("generated ids come back unprefixed, are stored behind the prefix, and are unique", function()
      local root = new()
      local A = root:tenant("A")
      local stored = A:append("s", { { type = "t" }, { type = "t" } })
      assert.matches("^%x+%-%x+%-7%x+%-%x+%-%x+$", stored[1].id)
      assert.are_not.equal(stored[1].id, stored[2].id)
      local raw = root:read("A" .. SEP .. "s")
      assert.equal("A" .. SEP .. stored[1].id, raw[1].id)
      assert.equal("A" .. SEP .. "s", raw[1].session)
      -- a fork's fresh ids and its origin too
      A:fork("s", 2, "f")
      local f = A:read("f")
      assert.equal("s", f[1].origin.session)
      assert.is_nil(f[1].id:find(SEP, 1, true))
      assert.equal("A" .. SEP, root:read("A" .. SEP .. "f")[1].id:sub(1, 2))
      -- complete's results
      A:append("w", { { type = "t" } })
      local c = A:claim("w", { holder = "h", ttl_ms = 1000 })
      local done = A:complete("w", 1, c.events[1].attempt, { { type = "r" } })
      assert.equal("w", done.events[1].session)
      assert.is_nil(done.events[1].id:find(SEP, 1, true))
      assert.equal("A" .. SEP, root:read("A" .. SEP .. "w")[2].id:sub(1, 2))
    end)

    it("the root handle sees tenant data as tenant\\x1fname; listings through a tenant are its own, unprefixed", function()
      local root = new()
      local A, B = root:tenant("A"), root:tenant("B")
      root:append("plain", { { type = "t" } })
      A:append("s", { { type = "t" } })
      B:append("s", { { type = "t" } })
      A:put_ref("r", "s")
      root:put_ref("A", "plain") -- a root ref named like the tenant
      root:put_ref("A\1x", "plain") -- sorts before A's refs
      root:put_ref("A ", "plain") -- sorts right after them
      assert.same(sorted({ "A" .. SEP .. "s", "B" .. SEP .. "s", "plain" }), sorted(sessions_of(root)))
      assert.same({ "s" }, sessions_of(A))
      local refs = A:list_refs()
      assert.equal(1, #refs)
      assert.equal("r", refs[1].name)
      assert.equal("s", refs[1].session)
      assert.equal(1, refs[1].head)
      assert.equal("A" .. SEP .. "s", root:get_ref("A" .. SEP .. "r").session)
      assert.same({ "s" }, (function()
        local out = {}
        for _, e in ipairs(A:read_all()) do out[#out + 1] = e.session end
        return out
      end)())
      assert.equal(3, #root:read_all())
      -- sessions{} paging: prefix and after are the tenant's own
      A:append("s2", { { type = "t" } })
      A:append("t1", { { type = "t" } })
      local page = A:sessions({ limit = 1 })
      assert.equal("s", page.cursor)
      page = A:sessions({ after = page.cursor, limit = 1 })
      assert.equal("s2", page.sessions[1].session)
      assert.same({ "t1" }, (function()
        local out = {}
        for _, row in ipairs(A:sessions({ prefix = "t" }).sessions) do out[#out + 1] = row.session end
        return out
      end)())
      -- list_refs paging across many refs, with root refs around them
      for i = 1, 5 do A:put_ref(("r%d"):format(i), "s") end
      local names, after = {}, nil
      repeat
        local got = A:list_refs({ after = after, limit = 2 })
        for _, r in ipairs(got) do names[#names + 1] = r.name end
        after = got[#got] and got[#got].name
      until #got < 2
      assert.same({ "r", "r1", "r2", "r3", "r4", "r5" }, names)
      -- children: only A's, even when the root forked A's session elsewhere
      A:fork("s", 1, "k1")
      root:fork("A" .. SEP .. "s", 1, "Z-root-child")
      root:fork("A" .. SEP .. "s", 1, "A\1early")
      local kids = A:children("s")
      assert.equal(1, #kids)
      assert.equal("k1", kids[1].session)
      assert.equal("s", kids[1].parent)
    end)

    it("claim_next, dead_letters, pending_types and wait(nil) are the tenant's own", function()
      local root, clock = new()
      local A, B = root:tenant("A"), root:tenant("B")
      -- B's ready events come first in the store's order
      B:append("b", { { type = "t" }, { type = "t" }, { type = "u" } })
      root:append("r", { { type = "t" } })
      A:append("a", { { type = "t" } })
      local got = A:claim_next({ holder = "h", ttl_ms = 1000, limit = 10 })
      assert.equal(1, #got)
      assert.equal("a", got[1].session)
      assert.is_nil(A:claim_next({ holder = "h", ttl_ms = 1000, types = { "t", "u" } })[1])
      local typed = B:claim_next({ holder = "h", ttl_ms = 1000, limit = 10, types = { "u" } })
      assert.equal(1, #typed)
      assert.equal("b", typed[1].session)
      -- retry_at is A's own: A's claim expires at +1000, B's at +1000 too;
      -- give B an earlier timer and A's retry_at stays A's
      B:append("b2", { { type = "t", not_before = helpers.T0 + 10 } })
      local _, retry = A:claim_next({ holder = "h", ttl_ms = 1000 })
      assert.equal(helpers.T0 + 1000, retry)
      -- dead letters
      local c = B:claim("b", { holder = "h", ttl_ms = 1000 })
      B:fail("b", 1, c.events and c.events[1].attempt or 1, { error = "x", max_failures = 1 })
      assert.same({}, A:dead_letters())
      assert.equal(1, #B:dead_letters())
      assert.equal("b", B:dead_letters()[1].session)
      -- pending types
      assert.same({ t = 1 }, A:pending_types())
      assert.same({ t = 2, u = 1 }, B:pending_types())
      assert.same({ t = 4, u = 1 }, root:pending_types())
      -- wait(nil): positions of A's events only (a sharded store has no
      -- store-wide position: refused, for a tenant too; docs/sharding.md)
      clock:advance(5000)
      if root:capabilities().sharded then
        expect_error("INVALID_ARGUMENT", A.wait, A, nil, 0, 0)
        return
      end
      local all = A:wait(nil, 0, 0)
      assert.equal(1, #all)
      assert.equal("a", all[1].session)
      assert.same({}, A:wait(nil, all[1].position, 0))
    end)

    it("subscribe(nil) on a tenant delivers the tenant's events only, from its own last position", function()
      local root = new()
      if root:capabilities().sharded then
        -- no store-wide position on shards (docs/sharding.md)
        expect_error("INVALID_ARGUMENT", root:tenant("A").subscribe, root:tenant("A"), nil, function() end)
        return
      end
      local A, B = root:tenant("A"), root:tenant("B")
      A:append("a", { { type = "t" } })
      B:append("b", { { type = "t" } })
      local seen = {}
      local unsub = A:subscribe(nil, function(e) seen[#seen + 1] = e.session .. ":" .. e.index end)
      B:append("b", { { type = "t" } })
      root:append("r", { { type = "t" } })
      A:append("a", { { type = "t" } })
      B:append("b", { { type = "t" } })
      A:head("a")
      unsub()
      assert.same({ "a:2" }, seen)
    end)

    it("tenant names: 1..64 bytes of UTF-8 without control bytes; no nesting; wrong types are argument errors", function()
      local root = new()
      expect_error("INVALID_ARGUMENT", root.tenant, root, "")
      expect_error("INVALID_ARGUMENT", root.tenant, root, ("x"):rep(65))
      expect_error("INVALID_ARGUMENT", root.tenant, root, "a\0b")
      expect_error("INVALID_ARGUMENT", root.tenant, root, "a" .. SEP)
      expect_error("INVALID_ARGUMENT", root.tenant, root, "a\nb")
      expect_error("INVALID_ARGUMENT", root.tenant, root, "\xff")
      assert.has_error(function() root:tenant(nil) end)
      assert.has_error(function() root:tenant(42) end)
      assert.has_error(function() root:tenant({}) end)
      local t = root:tenant(("x"):rep(64))
      t:append("s", { { type = "t" } })
      assert.equal(1, t:head("s"))
      local u = root:tenant("ünï")
      u:append("s", { { type = "t" } })
      expect_error("INVALID_ARGUMENT", u.tenant, u, "x")
      -- a tenant's names have the full 255 bytes, prefix not counted ...
      local long = ("n"):rep(255)
      t:append(long, { { type = "t", id = ("i"):rep(255) } })
      assert.equal(1, t:head(long))
      assert.equal(long, t:read(long)[1].session)
      -- ... and not one more
      local e = expect_error("INVALID_ARGUMENT", t.append, t, long .. "n", { { type = "t" } })
      assert.is_nil(e.message:find(SEP, 1, true))
      assert.truthy(e.message:find("256 bytes", 1, true))
      -- errors name the tenant's names, never the stored ones
      t:seal("sealed")
      e = expect_error("SEALED", t.append, t, "sealed", { { type = "t" } })
      assert.equal("session 'sealed' is sealed", e.message)
      e = expect_error("NOT_FOUND", t.fork, t, "nope", 0, "x")
      assert.is_nil(e.message:find("x" .. SEP, 1, true))
    end)

    it("REF_CONFLICT's actual is the tenant's name", function()
      local root = new()
      local A = root:tenant("A")
      A:put_ref("cand", "s1")
      A:put_ref("main", "s0")
      local e = expect_error("REF_CONFLICT", A.promote, A, "cand", "main", { expect = "other" })
      assert.equal("s0", e.actual)
      assert.equal("other", e.expected)
      assert.is_nil(e.message:find(SEP, 1, true))
      local r = A:promote("cand", "main", { expect = "s0" })
      assert.equal("s1", r.session)
      assert.equal("main", r.name)
    end)

    it("closing: a tenant handle closes alone; closing the store makes tenant calls CLOSED", function()
      local root = new()
      local A, A2 = root:tenant("A"), root:tenant("A")
      A:append("s", { { type = "t" } })
      A:close()
      A:close() -- twice is harmless
      expect_error("CLOSED", A.head, A, "s")
      assert.equal(1, A2:head("s"))
      assert.equal(1, root:head("A" .. SEP .. "s"))
      root:close()
      expect_error("CLOSED", A2.head, A2, "s")
      expect_error("CLOSED", root.tenant, root, "A")
    end)

    it("a tenant handle keeps its store alive (collection) and the store's clock", function()
      local clock = helpers.manual_clock(helpers.T0)
      local A = helpers.new(url, { clock = clock }):tenant("A")
      collectgarbage()
      collectgarbage()
      assert.equal(helpers.T0, A:append("s", { { type = "t" } })[1].created_at)
      assert.equal(helpers.T0, A:now())
      -- a Lua clock function runs inside the tenant's calls too
      local root = helpers.new(url, { clock = function() return 42 end })
      local T = root:tenant("T")
      assert.equal(42, T:append("s", { { type = "t" } })[1].created_at)
    end)

    if url:match("^sqlite:") then
      it("sqlite: tenant data survives reopening and is found by the same tenant name", function()
        local root, _, concrete = new()
        local A = root:tenant("A")
        A:append("s", { { type = "t", id = "x", payload = { v = 1 } } })
        A:put_ref("main", "s")
        root:close()
        local again = helpers.open_same(concrete):tenant("A")
        assert.equal("x", again:read("s")[1].id)
        assert.equal("s", again:get_ref("main").session)
        assert.same({ "s" }, sessions_of(again))
        assert.same({ "x" }, { again:read_all()[1].id })
      end)
    end
  end)
end
