-- docs/contract.md §3.1: every event's `revision` (an integer 1..2^31-1,
-- default 1) and `meta` (a JSON object or nil, at most 8 KiB canonical),
-- stored and returned by every call that returns events, part of a
-- replay's identity; bad values refused with nothing written. Runs once
-- per backend URL (helpers.urls()), then through a tenant view and a
-- sharded store, then on stores written by the previous release's schema
-- (spec/fixtures/*.sql), which this build migrates at open.
local eventstore = require("eventstore")
local helpers = require("helpers")

local expect_error = helpers.expect_error
local json = eventstore.json

local META = { correlation = "c-1", tags = json.array({ "a", "b" }), n = 3, deep = { x = 0.5 } }

-- The revision and canonical meta text of each event (nil meta: "-").
local function shape(events)
  local out = {}
  for i, e in ipairs(events) do
    out[i] = ("%s:%d:%s"):format(e.type, e.revision, e.meta == nil and "-" or json.encode(e.meta))
  end
  return out
end

local WANT = { "a:7:" .. json.encode(META), "b:1:-", "c:1:{}" }

-- The same checks on any handle (a backend, a tenant view, a sharded store).
local function conformance(new)
  it("stores revision and meta and returns them from append, read and read_all", function()
    local store = new()
    local stored = store:append("s", { { type = "a", revision = 7, meta = META }, { type = "b" },
      { type = "c", meta = {} } })
    assert.same(WANT, shape(stored))
    assert.same(WANT, shape(store:read("s")))
    local all = store:read_all({})
    assert.same(WANT, shape({ all[#all - 2], all[#all - 1], all[#all] }))
    assert.equal("integer", math.type(stored[1].revision))
  end)

  it("returns them from claim, claim_next and dead_letters, and stores them on complete's events", function()
    local store = new()
    store:append("s", { { type = "a", revision = 7, meta = META } })
    local got = store:claim("s", { holder = "w", ttl_ms = 1000 }).events
    assert.same({ WANT[1] }, shape(got))
    store:complete("s", 1, got[1].attempt, { { type = "r", revision = 2, meta = { why = "done" } } })
    assert.same({ 'r:2:{"why":"done"}' }, shape(store:read("s", { after = 1 })))
    store:append("t", { { type = "a", revision = 7, meta = META } })
    local next_ = store:claim_next({ holder = "w", ttl_ms = 1000, limit = 10 })
    local mine
    for _, e in ipairs(next_) do
      if e.session == "t" then mine = e end
    end
    assert.same({ WANT[1] }, shape({ mine }))
    store:fail("t", 1, mine.attempt, { error = "x", max_failures = 1 })
    assert.same({ WANT[1] }, shape(store:dead_letters({ session = "t" })))
  end)

  it("a replay must repeat revision and meta: any difference is ID_CONFLICT", function()
    local store = new()
    store:append("s", { { id = "e1", type = "a", revision = 7, meta = META } })
    -- the same event again: the original comes back, nothing written
    local again = store:append("s", { { id = "e1", type = "a", revision = 7, meta = META } })
    assert.same({ WANT[1] }, shape(again))
    assert.equal(1, store:head("s"))
    local e1 = expect_error("ID_CONFLICT", store.append, store, "s",
      { { id = "e1", type = "a", revision = 8, meta = META } })
    assert.truthy(e1.message:find("revision", 1, true))
    -- revision 1 given is the default a missing revision stands for
    expect_error("ID_CONFLICT", store.append, store, "s", { { id = "e1", type = "a", meta = META } })
    local e2 = expect_error("ID_CONFLICT", store.append, store, "s",
      { { id = "e1", type = "a", revision = 7, meta = { correlation = "c-2" } } })
    assert.truthy(e2.message:find("meta", 1, true))
    expect_error("ID_CONFLICT", store.append, store, "s", { { id = "e1", type = "a", revision = 7 } })
    store:append("s", { { id = "e2", type = "b", revision = 1 } })
    assert.same({ "b:1:-" }, shape(store:append("s", { { id = "e2", type = "b" } })))
    assert.equal(2, store:head("s"))
  end)

  it("refuses a bad revision or meta, naming the field, and writes nothing", function()
    local store = new()
    store:append("s", { { type = "ok" } })
    local function refused(code, ev, field)
      local err
      if code == "argument" then
        local ok, e = pcall(store.append, store, "s", { { type = "ok" }, ev })
        assert.is_false(ok)
        err = tostring(e)
        assert.truthy(err:find("bad argument", 1, true), err)
      else
        err = expect_error(code, store.append, store, "s", { { type = "ok" }, ev }).message
      end
      assert.truthy(err:find("events[2]." .. field, 1, true), err)
      assert.equal(1, store:head("s"))
    end
    refused("INVALID_ARGUMENT", { type = "t", revision = 0 }, "revision")
    refused("INVALID_ARGUMENT", { type = "t", revision = -1 }, "revision")
    refused("INVALID_ARGUMENT", { type = "t", revision = 2147483648 }, "revision")
    refused("INVALID_ARGUMENT", { type = "t", revision = 1.5 }, "revision")
    refused("argument", { type = "t", revision = "2" }, "revision")
    refused("INVALID_ARGUMENT", { type = "t", meta = json.array({ 1 }) }, "meta")
    refused("INVALID_ARGUMENT", { type = "t", meta = { 1, 2 } }, "meta")
    refused("argument", { type = "t", meta = "x" }, "meta")
    refused("INVALID_ARGUMENT", { type = "t", meta = { f = function() end } }, "meta")
    refused("TOO_LARGE", { type = "t", meta = { s = ("x"):rep(8192) } }, "meta")
    -- the largest revision and a meta of exactly 8 KiB are accepted
    local edge = { s = ("x"):rep(8192 - #'{"s":""}') }
    assert.equal(8192, #json.encode(edge))
    local stored = store:append("s", { { type = "t", revision = 2147483647, meta = edge } })
    assert.equal(2147483647, stored[1].revision)
    assert.equal(edge.s, store:read("s", { after = 1 })[1].meta.s)
  end)

  it("fork copies keep revision and meta", function()
    local store = new()
    store:append("src", { { type = "a", revision = 7, meta = META, settled = true }, { type = "b", settled = true } })
    store:fork("src", 2, "dst")
    assert.same({ WANT[1], WANT[2] }, shape(store:read("dst")))
  end)
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)
    conformance(function() return (helpers.new(url)) end)

    describe("tenant view", function()
      conformance(function() return helpers.new(url):tenant("T") end)
    end)

    it("meta is never sealed: a shredded event keeps its meta and revision (§3.10)", function()
      local reserved = os.tmpname()
      local store = helpers.new(url, { keys = reserved .. ".key" })
      local ok, err = pcall(function()
        store:append("s", { { type = "a", payload = { pan = "4111" }, key = "k", revision = 4, meta = META } })
        -- at rest the payload is ciphertext, the meta and revision as given
        local rest = store:read_at_rest("s")[1]
        assert.truthy(rest.ciphertext)
        assert.same({ (WANT[1]:gsub("^a:7:", "a:4:")) }, shape({ rest }))
        assert.is_true(store:shred("k"))
        local e = store:read("s")[1]
        assert.is_true(e.shredded)
        assert.is_nil(e.payload)
        assert.same({ (WANT[1]:gsub("^a:7:", "a:4:")) }, shape({ e }))
      end)
      os.remove(reserved)
      os.remove(reserved .. ".key")
      assert(ok, err)
    end)

    if url:match("^sqlite:") or url:match("^postgres") then
      it("revision and meta survive closing and reopening", function()
        local store, _, concrete = helpers.new(url)
        store:append("s", { { type = "a", revision = 7, meta = META }, { type = "b" }, { type = "c", meta = {} } })
        store:close()
        assert.same(WANT, shape(helpers.open_same(concrete):read("s")))
      end)
    end
  end)
end

describe("shards: over sqlite files", function()
  local files = {}
  after_each(function()
    helpers.cleanup()
    for i = #files, 1, -1 do
      helpers.remove_db(files[i])
      files[i] = nil
    end
  end)
  local function file_url()
    local base = os.tmpname()
    files[#files + 1] = base
    files[#files + 1] = base .. ".db"
    return "sqlite:" .. base .. ".db"
  end
  conformance(function()
    local store = eventstore.open("shards:", { catalog = file_url(), clock = helpers.manual_clock(helpers.T0),
      plan = { version = 1, shards = { a = file_url(), b = file_url() } } })
    return store
  end)
end)

-- A store the previous release wrote (spec/support/old_store_writer.lua,
-- kept as SQL text in spec/fixtures/) opened by this build: migrated at
-- open, its events read with revision 1 and no meta, new ones take both.
local function read_file(path)
  return (assert(helpers.read_file(path), path))
end

local WRITTEN_AT = 1700000000000 -- the writer's clock: its pending events are due

local function check_migrated(store)
  assert.same({ "order.placed:1:-", "order.note:1:-" }, shape(store:read("order-1")))
  assert.same({ "order.placed:1:-", "order.confirmed:1:-" }, shape(store:read("order-2")))
  local e = store:read("order-2")[2]
  assert.same({ index = 1, attempt = 1 }, e.cause)
  assert.same({ ok = true }, e.payload)
  -- a replay of an old event names the same revision (1) and no meta
  assert.same({ "order.placed:1:-" }, shape(store:append("order-2",
    { { id = "given-id", type = "order.placed", payload = { qty = 1, price = 0.5 } } })))
  expect_error("ID_CONFLICT", store.append, store, "order-2",
    { { id = "given-id", type = "order.placed", payload = { qty = 1, price = 0.5 }, revision = 2 } })
  local new = store:append("order-2", { { type = "order.shipped", revision = 3, meta = { by = "x" } } })
  assert.same({ 3, 5 }, { new[1].index, new[1].position })
  assert.same({ 'order.shipped:3:{"by":"x"}' }, shape(store:read("order-2", { after = 2 })))
  -- the old pending events are claimed as before, beside the new one
  assert.equal(3, #store:claim_next({ holder = "w", ttl_ms = 1000, limit = 10 }))
end

describe("a store of the previous schema", function()
  after_each(helpers.cleanup)

  it("sqlite: a version 7 file is migrated at open", function()
    local url, path = helpers.sqlite_fixture("sqlite_schema_v7.sql")
    local store = helpers.open_same(url, { clock = helpers.manual_clock(WRITTEN_AT) })
    check_migrated(store)
    store:close()
    assert.equal(helpers.SQLITE_SCHEMA, helpers.sqlite_version(path))
    helpers.remove_db(path)
  end)

  local template = helpers.pg_url()
  if template then
    it("postgres: a version 2 schema is migrated at open", function()
      local url = helpers.pg_fresh_url(template)
      local schema = url:match("schema=([%w_]+)")
      local base = url:gsub("[?&]schema=[%w_]*", "")
      local sql = read_file("spec/fixtures/postgres_schema_v2.sql"):gsub("__SCHEMA__", schema)
      local p = assert(io.popen(("psql %s -v ON_ERROR_STOP=1 -Xq -f - >/dev/null 2>&1"):format(
        helpers.sh_quote(base)), "w"))
      p:write(sql)
      assert(p:close(), "loading the fixture failed")
      local store = helpers.open_same(url, { clock = helpers.manual_clock(WRITTEN_AT) })
      check_migrated(store)
      local v = io.popen(("psql %s -XAtqc %s"):format(helpers.sh_quote(base),
        helpers.sh_quote(("SELECT value FROM %s.meta WHERE key = 'schema_version'"):format(schema)))):read("a")
      assert.equal(helpers.PG_SCHEMA, (v:gsub("%s", "")))
    end)
  end
end)
