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

local template
for _, u in ipairs(helpers.urls()) do
  if u:match("^postgres") then template = u end
end

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
    assert.equal("1", psql(url, ("SELECT value FROM %s.meta WHERE key = 'schema_version'"):format(schema_of(url))))
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

  it("is re-established by the next call; nothing committed is lost, nothing half-written", function()
    local app = "es_drop_" .. os.time() .. "_" .. math.random(1, 1e6)
    local url = helpers.pg_fresh_url(template) .. "&application_name=" .. app
    local store = helpers.open_same(url, { clock = helpers.manual_clock(helpers.T0) })
    store:append("a", { { type = "t", payload = 1 } })
    assert.equal(1, #store:read("a")) -- a read connection exists too
    local killed = psql(template, ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
      .. " WHERE application_name = '%s'"):format(app))
    assert.is_true(tonumber(killed) >= 2, "expected the write and read connections, killed " .. killed)
    -- idle connections that were dropped are reconnected when a call begins
    store:append("a", { { type = "t", payload = 2 } })
    assert.same({ 1, 2 }, helpers.pluck(store:read("a"), "payload"))
    assert.same({ 1, 2 }, helpers.pluck(store:read("a"), "index"))
    -- waiting still works (the watch connection reconnects)
    psql(template, ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '%s'"):format(app))
    assert.same({}, store:wait("a", 2, 0))
    assert.equal(3, store:append("a", { { type = "t", payload = 3 } })[1].index)
  end)
end)
