-- docs/contract.md §3.12: store:stats() (docs/stats.md). Runs once per backend URL
-- (helpers.urls()): the counts the store keeps (sessions, events, pending,
-- dead) follow every call that changes them, and the call figures count
-- calls, errors and latency percentiles. Also: the counts of a reopened
-- SQLite file and of a file of the previous schema version (migrated at
-- open), tenant handles, sharded handles.
local eventstore = require("eventstore")
local helpers = require("helpers")

local expect_error = helpers.expect_error

local function counts(store)
  local st = store:stats()
  return { sessions = st.sessions, events = st.events, pending = st.pending, dead = st.dead }
end

-- The same sums by walking the sessions (what the counts replace).
local function walked(store)
  local c = { sessions = 0, events = 0, pending = 0, dead = 0 }
  local after
  repeat
    local page = store:sessions({ after = after, limit = 100 })
    for _, s in ipairs(page.sessions) do
      c.sessions = c.sessions + 1
      c.events = c.events + s.events
      c.pending = c.pending + s.pending
      c.dead = c.dead + s.dead
    end
    after = page.cursor
  until after == nil
  return c
end

local sqlite3 = helpers.sqlite3

-- A closed store (its URL returned) holding tenants T (two events, in
-- sessions a and c) and U and a session of no tenant, for the migration
-- tests of events_scope; tenant_reads checks a tenant's read_all on it.
local function tenants_store(url)
  local store, _, concrete = helpers.new(url)
  local t, u = store:tenant("T"), store:tenant("U")
  t:append("a", { { type = "t1" } })
  u:append("b", { { type = "u1" }, { type = "u2" } })
  t:append("c", { { type = "t2" } })
  store:append("plain", { { type = "p" } })
  store:close()
  return concrete
end

local function tenant_reads(again)
  local got = again:tenant("T"):read_all()
  assert.same({ "t1", "t2" }, helpers.pluck(got, "type"))
  assert.same({ "a", "c" }, helpers.pluck(got, "session"))
  assert.same({ "t2" }, helpers.pluck(again:tenant("T"):read_all({ after = got[1].position }), "type"))
  assert.same({}, again:tenant("V"):read_all())
end

local function psql(url, sql)
  -- psql takes the libpq URI itself (our schema= option stripped)
  local base = url:gsub("[?&]schema=[%w_]*", "")
  local p = assert(io.popen(("psql %s -v ON_ERROR_STOP=1 -XAtqc %s 2>&1"):format(
    helpers.sh_quote(base), helpers.sh_quote(sql)), "r"))
  local out = p:read("a")
  assert(p:close(), "psql failed: " .. out)
  return (out:gsub("\n$", ""))
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    it("counts sessions, events, pending and dead through every call that changes them", function()
      local store = helpers.new(url)
      assert.same({ sessions = 0, events = 0, pending = 0, dead = 0 }, counts(store))
      store:append("a", { { type = "t" }, { type = "t" }, { type = "t", settled = true } })
      store:append("b", { { type = "t" } })
      assert.same({ sessions = 2, events = 4, pending = 3, dead = 0 }, counts(store))
      -- a failed append changes nothing
      expect_error("WRONG_EXPECTED_HEAD", store.append, store, "a", { { type = "t" } }, { expected = 9 })
      assert.same({ sessions = 2, events = 4, pending = 3, dead = 0 }, counts(store))

      -- complete with a result event: one processed, one more pending
      local got = store:claim_next({ holder = "w", ttl_ms = 60000 })
      assert.equal(1, #got)
      local e = got[1]
      store:complete(e.session, e.index, e.attempt, { { type = "t" } })
      assert.same({ sessions = 2, events = 5, pending = 3, dead = 0 }, counts(store))

      -- fail at max_failures: dead
      got = store:claim("b", { holder = "w", ttl_ms = 60000 }).events
      assert.equal(1, #got)
      store:fail("b", 1, got[1].attempt, { error = "boom", max_failures = 1 })
      assert.same({ sessions = 2, events = 5, pending = 2, dead = 1 }, counts(store))
      store:revive("b", 1)
      assert.same({ sessions = 2, events = 5, pending = 3, dead = 0 }, counts(store))
      got = store:claim("b", { holder = "w", ttl_ms = 60000 }).events
      store:fail("b", 1, got[1].attempt, { error = "boom", max_failures = 1 })
      store:settle("b", 1, "given up")
      assert.same({ sessions = 2, events = 5, pending = 2, dead = 0 }, counts(store))

      -- fork copies settled history: events and a session, nothing pending
      store:fork("b", 1, "c")
      assert.same({ sessions = 3, events = 6, pending = 2, dead = 0 }, counts(store))
      -- truncate drops processed events; delete drops a session whole
      store:truncate("c", 1)
      assert.same({ sessions = 3, events = 5, pending = 2, dead = 0 }, counts(store))
      store:delete("a")
      assert.same(walked(store), counts(store))
      assert.same({ sessions = 2, events = 1, pending = 0, dead = 0 }, counts(store))
    end)

    it("counts calls and errors with ordered latency percentiles", function()
      local store = helpers.new(url)
      for i = 1, 20 do store:append("s", { { type = "t", payload = { i = i } } }) end
      for _ = 1, 3 do
        expect_error("WRONG_EXPECTED_HEAD", store.append, store, "s", { { type = "t" } }, { expected = 0 })
      end
      expect_error("INVALID_ARGUMENT", store.read, store, "")
      store:read("s")
      local calls = store:stats().calls
      assert.equal(23, calls.append.count)
      assert.equal(3, calls.append.errors)
      assert.equal(2, calls.read.count)
      assert.equal(1, calls.read.errors)
      for name, c in pairs(calls) do
        assert.is_true(c.count > 0, name)
        assert.is_true(c.p50_us > 0, name)
        assert.is_true(c.p50_us <= c.p99_us and c.p99_us <= c.max_us, name)
      end
      -- the stats call itself is counted, after it answered
      assert.equal(1, store:stats().calls.stats.count)
      -- an op never called is not listed
      assert.is_nil(calls.fork)
    end)

    it("counts each call once: a call made inside another is part of it", function()
      local store = helpers.new(url)
      store:append("s", { { type = "t" } })
      -- wait reads (es_store_read inside es_store_wait): one wait, no read
      store:wait("s", 0, 0)
      local calls = store:stats().calls
      assert.equal(1, calls.wait.count)
      assert.is_nil(calls.read)
    end)

    it("takes no argument", function()
      local store = helpers.new(url)
      local ok, err = pcall(function() return store:stats({}) end)
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'stats' %(stats takes no arguments%)", tostring(err))
      store:close()
      expect_error("CLOSED", store.stats, store)
    end)

    it("a tenant handle: its own calls and its tenant's counts; the store's include them", function()
      local store = helpers.new(url)
      local a, b = store:tenant("A"), store:tenant("B")
      a:append("s", { { type = "t" }, { type = "t" } })
      a:append("u", { { type = "t", settled = true } })
      b:append("s", { { type = "t" } })
      store:append("root", { { type = "t" } })
      assert.same({ sessions = 2, events = 3, pending = 2, dead = 0 }, counts(a))
      assert.same({ sessions = 1, events = 1, pending = 1, dead = 0 }, counts(b))
      assert.same({ sessions = 4, events = 5, pending = 4, dead = 0 }, counts(store))
      assert.same(walked(a), counts(a))
      assert.equal(2, a:stats().calls.append.count)
      assert.equal(1, b:stats().calls.append.count)
      -- the store's calls include its tenants' (counted once each)
      assert.equal(4, store:stats().calls.append.count)
      a:delete("s")
      assert.same({ sessions = 1, events = 1, pending = 0, dead = 0 }, counts(a))
      assert.same({ sessions = 3, events = 3, pending = 2, dead = 0 }, counts(store))
    end)

    if url:match("^postgres") then
      it("a schema of version 1 is migrated at open with its counts computed", function()
        local store, _, concrete = helpers.new(url)
        store:append("a", { { type = "t" }, { type = "t", settled = true } })
        store:append("b", { { type = "t" } })
        local got = store:claim("b", { holder = "w", ttl_ms = 60000 }).events
        store:fail("b", 1, got[1].attempt, { error = "x", max_failures = 1 })
        store:tenant("T"):append("x", { { type = "t" } })
        store:close()
        local schema = concrete:match("schema=([%w_]+)")
        psql(concrete, ("SET search_path TO %s; DROP TABLE counts; DROP FUNCTION counts_apply() CASCADE;"
          .. " ALTER TABLE events DROP COLUMN revision, DROP COLUMN meta;"
          .. " UPDATE meta SET value = 1 WHERE key = 'schema_version'"):format(schema))
        local again = helpers.open_same(concrete)
        assert.same({ sessions = 3, events = 4, pending = 2, dead = 1 }, counts(again))
        assert.same({ sessions = 1, events = 1, pending = 1, dead = 0 }, counts(again:tenant("T")))
        again:append("c", { { type = "t" } })
        assert.same({ sessions = 4, events = 5, pending = 3, dead = 1 }, counts(again))
        assert.equal(helpers.PG_SCHEMA, psql(concrete, ("SELECT value FROM %s.meta WHERE key = 'schema_version'"):format(schema)))
      end)

      it("a schema of version 3 gets events_scope at open: a tenant's read_all seeks in it", function()
        local concrete = tenants_store(url)
        local schema = concrete:match("schema=([%w_]+)")
        local has = ("SELECT count(*) FROM pg_indexes WHERE schemaname = '%s' AND indexname = 'events_scope'")
          :format(schema)
        psql(concrete, ("SET search_path TO %s; DROP INDEX events_scope;"
          .. " UPDATE meta SET value = 3 WHERE key = 'schema_version'"):format(schema))
        assert.equal("0", psql(concrete, has))
        local again = helpers.open_same(concrete)
        assert.equal(helpers.PG_SCHEMA, psql(concrete, ("SELECT value FROM %s.meta WHERE key = 'schema_version'"):format(schema)))
        assert.equal("1", psql(concrete, has))
        tenant_reads(again)
        assert.equal(5, #again:read_all())
      end)
    end

    if url:match("^sqlite:") then
      it("a reopened file has its counts", function()
        local store, _, concrete = helpers.new(url)
        store:append("a", { { type = "t" }, { type = "t", settled = true } })
        store:tenant("T"):append("x", { { type = "t" } })
        store:close()
        local again = helpers.open_same(concrete)
        assert.same({ sessions = 2, events = 3, pending = 2, dead = 0 }, counts(again))
        assert.same({ sessions = 1, events = 1, pending = 1, dead = 0 }, counts(again:tenant("T")))
      end)

      it("a file of schema version 6 is migrated at open with its counts computed", function()
        local store, _, concrete = helpers.new(url)
        store:append("a", { { type = "t" }, { type = "t", settled = true } })
        store:append("b", { { type = "t" } })
        local got = store:claim("b", { holder = "w", ttl_ms = 60000 }).events
        store:fail("b", 1, got[1].attempt, { error = "x", max_failures = 1 })
        store:tenant("T"):append("x", { { type = "t" } })
        store:close()
        -- back to what version 6 wrote: no counts, no triggers, no revision or meta
        local path = concrete:match("^sqlite:(.*)$")
        sqlite3(path, helpers.SQLITE_BACK_TO_10 .. " DROP TABLE counts; ALTER TABLE events DROP COLUMN revision; ALTER TABLE events DROP COLUMN meta;"
          .. " PRAGMA user_version = 6")
        local again = helpers.open_same(concrete)
        assert.same({ sessions = 3, events = 4, pending = 2, dead = 1 }, counts(again))
        assert.same({ sessions = 1, events = 1, pending = 1, dead = 0 }, counts(again:tenant("T")))
        assert.equal(helpers.SQLITE_SCHEMA, helpers.sqlite_version(path))
        -- by the store itself since version 12: the triggers version 7 made are gone
        assert.equal("0", (sqlite3(path, "SELECT count(*) FROM sqlite_master WHERE type = 'trigger'"):gsub("%s", "")))
        -- and kept up to date from then on
        again:append("c", { { type = "t" } })
        assert.same({ sessions = 4, events = 5, pending = 3, dead = 1 }, counts(again))
      end)

      it("a file of schema version 8 gets events_scope at open: a tenant's read_all seeks in it", function()
        local concrete = tenants_store(url)
        local path = concrete:match("^sqlite:(.*)$")
        sqlite3(path, helpers.SQLITE_BACK_TO_10 .. " DROP INDEX events_scope; PRAGMA user_version = 8")
        assert.equal("", sqlite3(path, "SELECT name FROM sqlite_master WHERE name = 'events_scope'"))
        local again = helpers.open_same(concrete)
        assert.equal(helpers.SQLITE_SCHEMA, helpers.sqlite_version(path))
        assert.equal("events_scope\n", sqlite3(path, "SELECT name FROM sqlite_master WHERE name = 'events_scope'"))
        -- only tenants' events have an entry (the index's own WHERE, its
        -- separator byte included, so the planner can use it)
        assert.equal("4\n", sqlite3(path, "SELECT count(*) FROM events INDEXED BY events_scope"
          .. " WHERE instr(session, '\31') BETWEEN 2 AND 65"))
        tenant_reads(again)
        assert.equal(5, #again:read_all())
      end)

      it("counts what another process's handle writes to the same file", function()
        local store, _, concrete = helpers.new(url)
        local other = helpers.open_same(concrete)
        other:append("o", { { type = "t" }, { type = "t" } })
        store:append("s", { { type = "t" } })
        assert.same({ sessions = 2, events = 3, pending = 3, dead = 0 }, counts(store))
        assert.same(counts(store), counts(other))
      end)
    end
  end)
end

describe("shards: stats", function()
  after_each(helpers.cleanup)

  it("sums the shards' counts; a moved session counts once", function()
    local store = eventstore.open("shards:", { catalog = "memory:",
      plan = { version = 1, shards = { one = "memory:" } } })
    for i = 1, 20 do store:append("s" .. i, { { type = "t" }, { type = "t", settled = true } }) end
    assert.same({ sessions = 20, events = 40, pending = 20, dead = 0 }, counts(store))
    assert.equal(20, store:stats().calls.append.count)
    local moved = store:set_plan({ version = 2, shards = { one = "memory:", two = "memory:" } }).moved
    assert.is_true(moved > 0)
    assert.same({ sessions = 20, events = 40, pending = 20, dead = 0 }, counts(store))
    store:close()
  end)
end)

describe("engine:stats()", function()
  after_each(helpers.cleanup)
  local dir

  before_each(function()
    local p = assert(io.popen("mktemp -d"))
    dir = p:read("l")
    p:close()
    os.execute("mkdir -p " .. helpers.sh_quote(dir .. "/handlers"))
    helpers.write_file(dir .. "/handlers/ok.lua", "return function() return {{type = 'done'}} end\n")
    helpers.write_file(dir .. "/handlers/bad.lua", "return function() error('boom') end\n")
  end)
  after_each(function() os.execute("rm -rf " .. helpers.sh_quote(dir)) end)

  local engine_it = type(eventstore.engine) == "function" and it or pending
  engine_it("counts handled, failed and dead per event type, with run latencies, and the store's stats", function()
    local store = helpers.open("memory:")
    local engine = eventstore.engine({ store = store, scripts = dir, max_failures = 2, backoff_ms = 0,
      backoff_cap_ms = 0 })
    store:append("a", { { type = "ok" }, { type = "ok" }, { type = "bad" } })
    engine:run({ until_idle = true })
    engine:run({ until_idle = true })
    local st = engine:stats()
    assert.same({ handled = 2, failed = 0, dead = 0, runs = 2 },
      { handled = st.types.ok.handled, failed = st.types.ok.failed, dead = st.types.ok.dead,
        runs = st.types.ok.runs })
    assert.same({ handled = 0, failed = 1, dead = 1, runs = 2 },
      { handled = st.types.bad.handled, failed = st.types.bad.failed, dead = st.types.bad.dead,
        runs = st.types.bad.runs })
    assert.same({ 2, 1, 1 }, { st.handled, st.failed, st.dead })
    for name, t in pairs(st.types) do
      assert.is_true(t.p50_us > 0 and t.p50_us <= t.p99_us and t.p99_us <= t.max_us, name)
    end
    -- the store's figures: the results of type 'done' have no handler, stored processed
    assert.same({ sessions = 1, events = 5, pending = 0, dead = 1 },
      { sessions = st.store.sessions, events = st.store.events, pending = st.store.pending, dead = st.store.dead })
    -- the engine commits its completions in batches (docs/engine.md): two events, one or two batches
    assert.is_true(st.store.calls.complete_many.count >= 1 and st.store.calls.complete_many.count <= 2)
    local ok_, err = pcall(function() return engine:stats(1) end)
    assert.is_false(ok_)
    assert.matches("stats takes no arguments", tostring(err))
    engine:close()
  end)
end)
