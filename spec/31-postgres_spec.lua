-- The PostgreSQL backend's own behaviour (docs/postgres.md): what the
-- conformance suite cannot say because it opens every store fresh. The
-- schema a store lives in (created on first open, versioned, refused when
-- foreign or newer), the URL's own options, two schemas in one database,
-- and a connection the server drops.
--
-- Runs when ES_TEST_URLS names a postgres:// template (make test starts a
-- throwaway cluster and adds it: spec/support/pg_cluster.sh); without one
-- it is pending, not green.
local eventstore = require("eventstore")
local helpers = require("helpers")

local template = helpers.pg_url()

local function psql(url, sql)
  -- psql takes the libpq URI itself (our schema= option stripped)
  local base = url:gsub("[?&]schema=[%w_]*", "")
  local p = assert(io.popen(("psql %s -v ON_ERROR_STOP=1 -XAtqc %s 2>&1"):format(
    helpers.sh_quote(base), helpers.sh_quote(sql)), "r"))
  local out = p:read("a")
  local ok = p:close()
  assert(ok, "psql failed: " .. out)
  return (out:gsub("\n$", ""))
end

local function schema_of(url) return url:match("schema=([%w_]+)") end

if not template then
  describe("postgres:", function()
    pending("no postgres:// URL in ES_TEST_URLS (make test provides one)")
  end)
  return
end

describe("postgres: the store's schema", function()
  after_each(helpers.cleanup)

  it("is created on first open and reopened with its events, positions and version", function()
    local store, _, url = helpers.new(template)
    store:append("a", { { type = "t", payload = { n = 1 } }, { type = "t" } })
    store:close()
    assert.equal(helpers.PG_SCHEMA, psql(url, ("SELECT value FROM %s.meta WHERE key = 'schema_version'"):format(schema_of(url))))
    local again = helpers.open_same(url, { clock = helpers.manual_clock(helpers.T0) })
    assert.same({ 1, 2 }, helpers.pluck(again:read("a"), "position"))
    local more = again:append("b", { { type = "t" } })
    assert.equal(3, more[1].position)
    assert.same({ n = 1 }, again:read("a")[1].payload)
  end)

  it("keeps two stores of one database apart (one schema each)", function()
    local a, _, url_a = helpers.new(template)
    local b = helpers.new(template)
    a:append("s", { { type = "in-a" } })
    assert.equal(0, b:head("s"))
    assert.same({}, b:read_all({}))
    b:append("s", { { type = "in-b" } })
    assert.equal("in-a", a:read("s")[1].type)
    assert.equal(1, b:read("s")[1].position) -- positions are per store
    assert.are_not.equal(schema_of(url_a), nil)
  end)

  it("refuses a schema that holds another application's tables, and leaves it alone", function()
    local url = helpers.pg_fresh_url(template)
    local schema = schema_of(url)
    psql(url, ("CREATE SCHEMA %s; CREATE TABLE %s.users(id int); INSERT INTO %s.users VALUES (7)")
      :format(schema, schema, schema))
    local err = helpers.expect_error("INVALID_ARGUMENT", function() return eventstore.open(url) end)
    assert.truthy(err.message:find("not an eventstore schema", 1, true), err.message)
    assert.equal("users", psql(url, ("SELECT string_agg(relname, ',') FROM pg_class k JOIN pg_namespace n"
      .. " ON n.oid = k.relnamespace WHERE n.nspname = '%s'"):format(schema)))
    assert.equal("7", psql(url, ("SELECT id FROM %s.users"):format(schema)))
  end)

  it("refuses a schema of a newer version (STORAGE, nothing changed)", function()
    local store, _, url = helpers.new(template)
    store:append("a", { { type = "t" } })
    store:close()
    psql(url, ("UPDATE %s.meta SET value = 99 WHERE key = 'schema_version'"):format(schema_of(url)))
    local err = helpers.expect_error("STORAGE", function() return eventstore.open(url) end)
    assert.truthy(err.message:find("newer", 1, true), err.message)
    assert.equal("99", psql(url, ("SELECT value FROM %s.meta WHERE key = 'schema_version'"):format(schema_of(url))))
  end)

  it("sorts names in byte order (COLLATE \"C\"), whatever the database's locale", function()
    local store = helpers.new(template)
    for _, name in ipairs({ "b", "B", "a", "\xc3\xa9", "_", "Z" }) do store:append(name, { { type = "t" } }) end
    local names = helpers.pluck(store:sessions({}).sessions, "session")
    assert.same({ "B", "Z", "_", "a", "b", "\xc3\xa9" }, names)
    -- a prefix whose last byte is 0x7f: its range has no UTF-8 upper bound
    store:append("x\x7f1", { { type = "t" } })
    store:append("x\x7f2", { { type = "t" } })
    store:append("y", { { type = "t" } })
    assert.same({ "x\x7f1", "x\x7f2" }, helpers.pluck(store:sessions({ prefix = "x\x7f" }).sessions, "session"))
    assert.same({ "x\x7f2" }, helpers.pluck(store:sessions({ prefix = "x\x7f", after = "x\x7f1" }).sessions, "session"))
  end)
end)

describe("postgres: the URL", function()
  after_each(helpers.cleanup)

  local base = template:gsub("[?&]schema=[%w_]*", "")
  local function with(opt) return base .. (base:find("?", 1, true) and "&" or "?") .. opt end

  it("refuses a bad schema name, an unknown libpq option, a bad readers count", function()
    for _, bad in ipairs({ "schema=", "schema=a-b", "schema=1a", "schema=pg_x", "schema=a%20b",
                           "schema=" .. ("x"):rep(64), "readers=0", "readers=65", "readers=x",
                           "no_such_option=1" }) do
      local err = helpers.expect_error("INVALID_ARGUMENT", function() return eventstore.open(with(bad)) end)
      assert.truthy(err.message:find("postgres", 1, true), bad .. ": " .. err.message)
    end
    helpers.expect_error("INVALID_ARGUMENT", function() return eventstore.open("postgres:nohost") end)
  end)

  it("accepts postgresql:// and postgres:// alike, readers=N, and a 63-byte schema", function()
    local fresh = schema_of(helpers.pg_fresh_url(template))
    local schema = fresh .. ("x"):rep(63 - #fresh)
    local url = with("readers=2&schema=" .. schema)
    local s1 = helpers.open_same(url)
    s1:append("a", { { type = "t" } })
    local rest = url:match("^postgres[%a]*:(.*)$")
    for _, scheme in ipairs({ "postgres:", "postgresql:" }) do
      local s2 = helpers.open_same(scheme .. rest)
      assert.equal(1, s2:head("a"), scheme)
    end
  end)

  it("says STORAGE when the server cannot be reached", function()
    local err = helpers.expect_error("STORAGE", function()
      return eventstore.open("postgresql://postgres@/estest?host=/nonexistent-dir&connect_timeout=2&schema=x")
    end)
    assert.truthy(err.message:find("cannot connect", 1, true), err.message)
  end)
end)

describe("postgres: a connection the server drops", function()
  after_each(helpers.cleanup)

  -- Terminates the store's connections and waits until their server
  -- processes are gone: pg_terminate_backend only signals them, and a
  -- connection whose "terminating connection" message has not reached the
  -- client yet is not known to be dropped (a call sent on it in that
  -- instant fails with STORAGE, as docs/postgres.md says).
  local function drop_connections(app)
    local q = "FROM pg_stat_activity WHERE application_name = '" .. app .. "'"
    local killed = tonumber(psql(template, "SELECT count(pg_terminate_backend(pid)) " .. q))
    helpers.wait_until(function() return psql(template, "SELECT count(*) " .. q) == "0" end,
      "the terminated connections of " .. app .. " to go")
    return killed
  end

  it("is re-established by the next call; nothing committed is lost, nothing half-written", function()
    local app = "es_drop_" .. os.time() .. "_" .. math.random(1, 1e6)
    local url = helpers.pg_fresh_url(template) .. "&application_name=" .. app
    local store = helpers.open_same(url, { clock = helpers.manual_clock(helpers.T0) })
    store:append("a", { { type = "t", payload = 1 } })
    assert.equal(1, #store:read("a")) -- a read connection exists too
    local killed = drop_connections(app)
    assert.is_true(killed >= 2, "expected the write and read connections, killed " .. killed)
    -- idle connections that were dropped are reconnected when a call begins
    store:append("a", { { type = "t", payload = 2 } })
    assert.same({ 1, 2 }, helpers.pluck(store:read("a"), "payload"))
    assert.same({ 1, 2 }, helpers.pluck(store:read("a"), "index"))
    -- waiting still works (the watch connection reconnects)
    drop_connections(app)
    assert.same({}, store:wait("a", 2, 0))
    assert.equal(3, store:append("a", { { type = "t", payload = 3 } })[1].index)
    -- a wait that finds its idle watch connection dropped reconnects it
    -- rather than fail
    drop_connections(app)
    assert.same({}, store:wait("a", 3, 200))
    -- and claim_next's pooled connection too
    store:append("b", { { type = "t", payload = 4 } })
    drop_connections(app)
    assert.equal(1, #store:claim_next({ holder = "h", ttl_ms = 1000 }))
  end)
end)

-- Claims in parallel (docs/postgres.md "Concurrency"): claim_next runs in a
-- transaction of its own, outside the store's lock, and skips the rows
-- another transaction holds (FOR UPDATE SKIP LOCKED); writers lock the rows
-- they read before rewriting them, so a claim committed meanwhile is never
-- overwritten.

local LUA = os.getenv("LUA") or "lua5.4"
local spec_dir = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"

-- A libpq URI for psql: the template's host, without our schema= option,
-- under an application_name we can find in pg_stat_activity.
local function psql_url(app)
  local base = template:gsub("[?&]schema=[%w_]*", "")
  return base .. (base:find("?", 1, true) and "&" or "?") .. "application_name=" .. app
end

local serial = 0
local function app_name(what)
  serial = serial + 1
  return ("es_%s_%d_%d"):format(what, os.time(), serial) .. tostring(math.random(1, 1e6))
end

-- Runs sql in a psql of its own that then sleeps in the same transaction
-- (holding its row locks) for up to `seconds`; returns once the locks are
-- taken (the sleep has begun). release() ends it.
local function hold(sql, seconds)
  local app = app_name("hold")
  local p = assert(io.popen(("psql %s -v ON_ERROR_STOP=1 -XAtq -c %s 2>&1"):format(
    helpers.sh_quote(psql_url(app)),
    helpers.sh_quote(("BEGIN; %s; SELECT pg_sleep(%d); COMMIT"):format(sql, seconds))), "r"))
  local deadline = helpers.wall() + 120 -- ends when the sleep began; only a hang runs out
  repeat
    -- in the sleep itself, so after the statements before it: the query
    -- text names pg_sleep from the moment the whole string starts (a
    -- complete() spec under ASan once ran before the UPDATE had its lock)
    local n = psql(template, ("SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'"
      .. " AND wait_event = 'PgSleep'"):format(app))
    if n == "1" then
      return {
        release = function(commit)
          -- cancel the sleep: the transaction then commits or, if cancelled
          -- while sleeping, rolls back; terminating ends it at once
          psql(template, ("SELECT count(%s(pid)) FROM pg_stat_activity WHERE application_name = '%s'")
            :format(commit and "pg_cancel_backend" or "pg_terminate_backend", app))
          return p:read("a"), p:close()
        end,
      }
    end
    os.execute("sleep 0.02")
  until helpers.wall() > deadline
  local out = p:read("a")
  p:close()
  error("the psql holding locks never started its sleep: " .. out)
end

describe("postgres: claims in parallel", function()
  after_each(helpers.cleanup)

  it("claim_next passes over a ready row another transaction holds, without waiting for it", function()
    local store, _, url = helpers.new(template)
    store:append("a", { { type = "t" } })
    store:append("b", { { type = "t" } })
    local schema = schema_of(url)
    local h = hold(("SELECT 1 FROM %s.events WHERE session = 'a' AND idx = 1 FOR UPDATE"):format(schema), 120)
    local t0 = os.time()
    local got = store:claim_next({ holder = "w", ttl_ms = 60000, limit = 10 })
    local took = os.time() - t0
    h.release(false)
    assert.same({ "b" }, helpers.pluck(got, "session"))
    -- a hang ceiling: waiting for the row would take the hold's 120 s
    assert.is_true(took < 60, "claim_next waited " .. took .. " s for the held row")
    -- once released, the row is ready again for the next claim
    got = store:claim_next({ holder = "w", ttl_ms = 60000, limit = 10 })
    assert.same({ "a" }, helpers.pluck(got, "session"))
    assert.equal(1, got[1].attempt)
    assert.equal(2, helpers.session_row(store, "a").attempts + helpers.session_row(store, "b").attempts)
  end)

  it("claim() of one session waits for a concurrent claim and never hands out its row again", function()
    local store, _, url = helpers.new(template)
    store:append("s", { { type = "t" }, { type = "t" } })
    local schema = schema_of(url)
    -- another engine's claim of event 1, committed after claim() began: its
    -- row is locked, then changed as a claim changes it
    local later = helpers.T0 + 600000
    local h = hold(("UPDATE %s.events SET attempts = 1, claim_holder = 'other', claim_expires_at = %d,"
      .. " due_at = %d, first_claimed_at = %d, last_claimed_at = %d WHERE session = 's' AND idx = 1")
      :format(schema, later, later, helpers.T0, helpers.T0), 2)
    local r = helpers.claim(store, "s", { holder = "me", ttl_ms = 1000 })
    h.release(true)
    assert.equal("claimed", r.outcome)
    assert.same({ 2 }, helpers.indexes(r.events))
    local e1 = helpers.event(store, "s", 1)
    assert.equal(1, e1.attempts)
    assert.equal("other", e1.claim_holder)
  end)

  it("complete() reads the event after a concurrent claim committed: the old attempt is superseded", function()
    local clock
    local store, c, url = helpers.new(template)
    clock = c
    store:append("s", { { type = "t" } })
    local got = store:claim_next({ holder = "first", ttl_ms = 1000, limit = 1 })
    assert.equal(1, got[1].attempt)
    clock:advance(5000) -- the claim expired; another engine claims attempt 2
    local schema = schema_of(url)
    local later = helpers.T0 + 600000
    local h = hold(("UPDATE %s.events SET attempts = 2, claim_holder = 'second', claim_expires_at = %d,"
      .. " due_at = %d WHERE session = 's' AND idx = 1"):format(schema, later, later), 2)
    local res = store:complete("s", 1, 1, { { type = "late", settled = true } })
    h.release(true)
    assert.equal("superseded", res.outcome)
    local e1 = helpers.event(store, "s", 1)
    assert.equal("pending", e1.status)
    assert.equal(2, e1.attempts)
    assert.equal(1, store:head("s"))
  end)

  it("several processes claim and complete 1,200 events of few sessions: each claimed once, none lost", function()
    local N, SESSIONS, WORKERS = 1200, 4, 3
    local store, url = helpers.open(template)
    for s = 1, SESSIONS do
      local batch = {}
      for i = 1, N // SESSIONS do batch[i] = { type = "work", payload = { i = i } } end
      store:append("p" .. s, batch)
    end
    local go = os.tmpname()
    os.remove(go)
    local procs = {}
    for w = 1, WORKERS do
      procs[w] = assert(io.popen(("%s %s %s %s %s 2>&1"):format(LUA,
        helpers.sh_quote(spec_dir .. "support/pg_claim_worker.lua"), helpers.sh_quote(url), "w" .. w,
        helpers.sh_quote(go)), "r"))
    end
    helpers.write_file(go, "go")
    local claims, by_worker = {}, {}
    for w = 1, WORKERS do
      local text = procs[w]:read("a")
      procs[w]:close()
      assert.truthy(text:match("done\n$"), ("worker %d did not finish:\n%s"):format(w, text))
      by_worker[w] = 0
      for session, index, attempt, outcome in text:gmatch("claimed (%S+) (%d+) (%d+) (%S+)\n") do
        local key = session .. "/" .. index
        assert.is_nil(claims[key], key .. " claimed twice")
        assert.equal("1", attempt, key)
        assert.equal("completed", outcome, key)
        claims[key] = "w" .. w
        by_worker[w] = by_worker[w] + 1
      end
    end
    os.remove(go)
    local total = 0
    for s = 1, SESSIONS do
      local session = "p" .. s
      local done = {}
      for _, e in ipairs(store:read(session)) do
        if e.type == "done" then
          assert.is_nil(done[e.cause.index], session .. ": two results for " .. e.cause.index)
          done[e.cause.index] = e.payload.by
        end
      end
      for _, e in ipairs(store:read(session, { through = N // SESSIONS })) do
        local key = session .. "/" .. e.index
        assert.equal("processed", e.status, key)
        assert.equal(1, e.attempts, key)
        assert.equal(claims[key], done[e.index], key)
        total = total + 1
      end
      -- every claim's attempt counted on the session row, none lost to a
      -- concurrent rewrite of it
      assert.equal(N // SESSIONS, helpers.session_row(store, session).attempts, session)
    end
    assert.equal(N, total)
    print(("# claims per process: %s"):format(table.concat(by_worker, " ")))
  end)
end)

-- Waits woken by LISTEN/NOTIFY (docs/postgres.md "Connections"): a wait
-- blocks in poll() on the watch connection's socket, so it sleeps through
-- its timeout instead of waking every 50 ms to look (each look a read
-- transaction: several blocking round trips).

-- This process's voluntary context switches so far (each blocking call that
-- had to wait counts one).
local function switches()
  local f = assert(io.open("/proc/self/status", "r"))
  local text = f:read("a")
  f:close()
  return tonumber(text:match("voluntary_ctxt_switches:%s*(%d+)"))
end

describe("postgres: waits woken by NOTIFY", function()
  after_each(helpers.cleanup)

  it("sleep without polling, and wake when another process appends", function()
    local store, url = helpers.open(template)
    store:append("warm", { { type = "t" } }) -- the connections exist before we count
    assert.same({}, store:wait("idle", 0, 0))
    local before = switches()
    assert.same({}, store:wait("idle", 0, 1500))
    local idle = switches() - before
    -- a 50 ms polling loop would have looked ~30 times in 1.5 s
    assert.is_true(idle <= 20, "an idle 1.5 s wait switched context " .. idle .. " times")

    local p = assert(io.popen(("%s %s %s %s 1000 2>&1"):format(LUA,
      helpers.sh_quote(spec_dir .. "support/sqlite_append_later.lua"), helpers.sh_quote(url), "later"), "r"))
    before = switches()
    local got = store:wait("later", 0, 20000)
    local used = switches() - before
    local out = p:read("a")
    p:close()
    assert.equal(1, #got, "no event: " .. out)
    assert.equal("ping", got[1].type)
    assert.is_true(used <= 25, "a wait of about a second switched context " .. used .. " times")
  end)
end)

-- Updates sent without waiting (docs/postgres.md "Round trips"): an UPDATE
-- that must change its row and changes none is an error the server must
-- see, or the COMMIT (or a group commit's RELEASE) queued behind it runs
-- anyway. A trigger returning NULL makes the server skip the row, as if it
-- were gone.
describe("postgres: an update that changes no row", function()
  after_each(helpers.cleanup)

  -- A BEFORE UPDATE trigger on SCHEMA.tbl that skips the rows where cond.
  local function skip_rows(url, tbl, cond)
    local schema = schema_of(url)
    psql(url, ("CREATE FUNCTION %s.skip_%s() RETURNS trigger AS $$ BEGIN IF %s THEN RETURN NULL;"
      .. " END IF; RETURN NEW; END $$ LANGUAGE plpgsql; CREATE TRIGGER skip BEFORE UPDATE ON %s.%s"
      .. " FOR EACH ROW EXECUTE FUNCTION %s.skip_%s()"):format(schema, tbl, cond, schema, tbl, schema, tbl))
  end
  local function unskip(url, tbl)
    psql(url, ("DROP TRIGGER skip ON %s.%s"):format(schema_of(url), tbl))
  end

  it("fails the call and commits nothing of it (a caller alone in its transaction)", function()
    local store, _, url = helpers.new(template)
    store:append("k", { { type = "job" } })
    local e = store:claim_next({ holder = "h", ttl_ms = 60000 })[1]
    skip_rows(url, "events", "NEW.last_error = 'skipme'")
    local err = helpers.expect_error("STORAGE", function()
      return store:fail("k", e.index, e.attempt, { error = "skipme", max_failures = 5 })
    end)
    assert.truthy(err.message:find("row to update is gone", 1, true), err.message)
    -- the session row's failure count was written before the event: not kept
    assert.equal(0, helpers.session_row(store, "k").failures)
    assert.equal(0, helpers.event(store, "k", 1).failures)
    unskip(url, "events")
    assert.equal("failed", store:fail("k", e.index, e.attempt, { error = "other", max_failures = 5 }).outcome)
    assert.equal(1, helpers.session_row(store, "k").failures)
  end)

  it("fails claim_next and claims nothing when a session row is not updated", function()
    local store, _, url = helpers.new(template)
    store:append("skipme", { { type = "job" } })
    store:append("fine", { { type = "job" } })
    skip_rows(url, "sessions", "OLD.session = 'skipme'")
    local err = helpers.expect_error("STORAGE", function()
      return store:claim_next({ holder = "h", ttl_ms = 60000, limit = 2 })
    end)
    assert.truthy(err.message:find("session row to update is gone", 1, true), err.message)
    unskip(url, "sessions")
    -- neither event was claimed, neither session counted a claim
    local got = store:claim_next({ holder = "h", ttl_ms = 60000, limit = 2 })
    assert.same({ 1, 1 }, helpers.pluck(got, "attempt"))
    assert.equal(1, helpers.session_row(store, "skipme").attempts)
    assert.equal(1, helpers.session_row(store, "fine").attempts)
  end)
end)

-- A claim transaction's lock waits (docs/postgres.md "Deadlocks"): its
-- session updates are sent without waiting, and each may wait up to
-- lock_timeout; together they must still end within the budget
-- (3/4 · deadlock_timeout after the transaction began). Each update sleeps
-- in a trigger (a wait shorter than lock_timeout, as for a row a writer
-- holds briefly), and records, outside the transaction (a sequence), how
-- long after the transaction's start it ended.
--
-- The claim decides by its own clock when it may still begin a wait; the
-- server runs the statement later by however long a loaded machine keeps
-- its backend off a CPU, which no client can bound. The room for that is
-- lock_timeout minus the trigger's sleep: the last update is sent no later
-- than budget - lock_timeout. With deadlock_timeout 200 ms (lock_timeout
-- 50, sleep 20) that room was 30 ms, and a loaded 2-core CI measured an
-- update ending at 151 ms against the 150 ms budget. deadlock_timeout
-- 800 ms (lock_timeout 200, budget 600) and a 40 ms sleep leave 160 ms
-- for scheduling (the last update ends about 420 ms in), while a claim
-- that breaks the rule still overshoots: one that does not count its
-- unanswered updates as waits, or one that takes the whole deadlock_timeout
-- as its budget, ended its last update 613 to 627 ms in. Only the first 30
-- updates sleep (a sequence counts them across the claim's tries), so the
-- claim gives up a couple of times and then succeeds, in under two seconds.
describe("postgres: a claim transaction's lock-wait budget", function()
  after_each(helpers.cleanup)

  it("holds for session updates sent without waiting", function()
    -- deadlock_timeout 800 ms for this store's connections: lock_timeout
    -- 200 ms, budget 600 ms
    local url = helpers.pg_fresh_url(template) .. "&options=-c%20deadlock_timeout%3D800ms"
    local store = helpers.open_same(url, { clock = helpers.manual_clock(helpers.T0) })
    local n = 30
    for i = 1, n do store:append(("s%02d"):format(i), { { type = "job" } }) end
    local schema = schema_of(url)
    psql(url, ("CREATE SEQUENCE %s.waited MINVALUE 0 START 0; CREATE SEQUENCE %s.calls;"
      .. " CREATE FUNCTION %s.slow() RETURNS trigger AS $$ BEGIN"
      .. " IF nextval('%s.calls') <= %d THEN PERFORM pg_sleep(0.04); END IF;"
      .. " PERFORM setval('%s.waited', greatest((SELECT last_value FROM %s.waited),"
      .. " (extract(epoch FROM clock_timestamp() - now()) * 1000)::bigint)); RETURN NEW; END $$"
      .. " LANGUAGE plpgsql; CREATE TRIGGER slow BEFORE UPDATE ON %s.sessions FOR EACH ROW"
      .. " EXECUTE FUNCTION %s.slow()"):format(schema, schema, schema, schema, n, schema, schema,
      schema, schema))
    -- n updates of 40 ms each cannot all fit: the claim gives up (and
    -- runs again) rather than wait beyond its budget; once the sleeps are
    -- used up, a try claims them all
    local ok, got = pcall(store.claim_next, store, { holder = "h", ttl_ms = 60000, limit = n })
    local waited = tonumber(psql(url, ("SELECT last_value FROM %s.waited"):format(schema)))
    local calls = tonumber(psql(url, ("SELECT last_value FROM %s.calls"):format(schema)))
    assert.is_true(waited > 0, "no session update ran")
    assert.is_true(waited <= 600, ("a session update ended %d ms into its claim transaction"
      .. " (budget 600 ms); claim_next: %s"):format(waited, ok and (#got .. " claimed") or tostring(got)))
    assert.is_true(ok, tostring(got))
    assert.equal(n, #got)
    -- more updates than sessions: a try gave up (the first one fitting all
    -- of them would have been the only one)
    assert.is_true(calls > n, "the first try fit every update: the budget was never tested")
  end)
end)
