-- Moving a store (docs/contract.md §10, docs/moving.md): store:export and
-- eventstore.import. A store holding every kind of state is moved
-- memory: -> sqlite: -> postgres: (when ES_TEST_URLS has one) -> shards: ->
-- sqlite:; at each step every read call answers on the target as on the
-- source, and the target's export is the source's byte for byte apart from
-- the header's backend. An engine on the last copy then goes on where the
-- source stopped. Every store has an archive directory of its own (on
-- shards:, each shard's below the router's): archived events move inline
-- and come back as the same segments.
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local T0 = helpers.T0
local expect_error = helpers.expect_error

local pg_url = helpers.pg_url()

local files, opened = {}, {}
local function track(store)
  opened[#opened + 1] = store
  return store
end
local function sqlite_url()
  local base = os.tmpname()
  files[#files + 1] = base
  files[#files + 1] = base .. ".db"
  return "sqlite:" .. base .. ".db"
end
local function fresh_url(kind)
  if kind == "sqlite" then return sqlite_url() end
  if kind == "postgres" then return helpers.pg_fresh_url(pg_url) end
  return "memory:"
end
local dirs = {}
local function archive_dir()
  local d = os.tmpname()
  os.remove(d)
  dirs[#dirs + 1] = d
  return d
end
local function cleanup()
  eh.cleanup()
  for i = #opened, 1, -1 do
    pcall(function() opened[i]:close() end)
    opened[i] = nil
  end
  for i = #files, 1, -1 do
    helpers.remove_db(files[i])
    files[i] = nil
  end
  for i = #dirs, 1, -1 do
    os.execute("rm -rf " .. helpers.sh_quote(dirs[i]))
    dirs[i] = nil
  end
end

-- A fresh store of a kind ("memory", "sqlite", "postgres", "shards") on
-- clock, with an archive directory of its own (opts.archive = false: none).
local function open_kind(kind, clock, opts)
  local o = { clock = clock, archive = archive_dir() }
  for k, v in pairs(opts or {}) do o[k] = v end
  if o.archive == false then o.archive = nil end
  if kind ~= "shards" then return track(eventstore.open(fresh_url(kind), o)) end
  local shard = pg_url and "postgres" or "sqlite"
  o.catalog = fresh_url(shard)
  o.plan = { version = 1, shards = { a = fresh_url(shard), b = fresh_url(shard) } }
  return track(eventstore.open("shards:", o))
end

-- The steps of a move, those whose backend this run has (a table
-- constructor with a nil in the middle would end ipairs there).
local function steps(...)
  local out = {}
  for i = 1, select("#", ...) do
    local k = select(i, ...)
    if k then out[#out + 1] = k end
  end
  return out
end

local function export_of(store)
  local lines = {}
  local n = store:export(function(line) lines[#lines + 1] = line end)
  assert.equal(#lines, n)
  return lines
end

-- The export apart from the header's backend.
local function comparable(lines)
  local copy = { (lines[1]:gsub('"backend":"[^"]*"', '"backend":_')) }
  for i = 2, #lines do copy[i] = lines[i] end
  return copy
end

local function pages(call)
  local out, cursor = {}, nil
  repeat
    local page = call(cursor)
    for _, row in ipairs(page.sessions or page) do out[#out + 1] = row end
    cursor = page.cursor
  until not cursor
  return out
end

-- A session's segments as §3.9 lists them, without `file`: a segment's
-- file name holds a random nonce (docs/retention.md), new on every store.
local function segments_of(store, session)
  local ok, list = pcall(store.segments, store, session)
  if not ok then return "error: " .. tostring(list) end
  for _, g in ipairs(list) do g.file = nil end
  return list
end

-- What every read call of §3 answers, as one table.
local function view(store)
  local v = { sessions = pages(function(after) return store:sessions({ after = after, limit = 3 }) end) }
  v.read_all = store:read_all({ after = 0, limit = 10000 })
  for _, e in ipairs(v.read_all) do e.cursor = nil end -- shards:' resume token, opaque
  if store:capabilities().sharded then
    -- shards: merges its shards' streams in an order of its own (§5: a
    -- cursor, not a position, resumes it); the events and their positions
    -- must be the source's
    table.sort(v.read_all, function(a, b) return a.position < b.position end)
  end
  v.dead = store:dead_letters({ limit = 100 })
  v.refs = store:list_refs({ limit = 100 })
  v.per = {}
  -- an answer or the error it raises (a read below first_index is TRUNCATED)
  local function try(method, ...)
    local ok, r = pcall(store[method], store, ...)
    return ok and r or ("error: " .. tostring(r))
  end
  for _, si in ipairs(v.sessions) do
    local s = si.session
    local from = { after = (si.first_index or 1) - 1 }
    v.per[s] = {
      read = try("read", s, from),
      read_all_of_it = try("read", s),
      head = try("head", s),
      snapshots = try("snapshots", s),
      state = try("read_state", s, "count"),
      lineage = try("lineage", s),
      children = try("children", s, {}),
      segments = segments_of(store, s),
      at_rest = try("read_at_rest", s, from),
    }
  end
  for _, r in ipairs(v.refs) do v["ref " .. r.name] = store:get_ref(r.name) end
  return v
end

-- The store with every kind of state the shards: step can hold on main.
local function build(store, clock)
  store:append("orders/1", { { type = "order", payload = { n = 1 } }, { type = "order", payload = { n = 2 } } })
  assert.equal("claimed", store:claim("orders/1", { holder = "old", ttl_ms = 30000, limit = 1 }).outcome)
  store:append("orders/2", { { type = "order", payload = { n = 3 }, meta = { trace = "t1" }, revision = 2 } })
  local c2 = store:claim("orders/2", { holder = "old", ttl_ms = 1000 })
  assert.equal("failed", store:fail("orders/2", 1, c2.events[1].attempt,
    { error = "later", max_failures = 5, retry_after_ms = 60000 }).outcome)
  store:append("orders/3", { { type = "order", payload = "poison" } })
  local c3 = store:claim("orders/3", { holder = "old", ttl_ms = 1000 })
  assert.equal("dead_lettered", store:fail("orders/3", 1, c3.events[1].attempt,
    { error = "boom", max_failures = 1 }).outcome)
  store:append("orders/4", { { type = "order", payload = { n = 4 } } })
  local c4 = store:claim("orders/4", { holder = "old", ttl_ms = 1000 })
  store:complete("orders/4", 1, c4.events[1].attempt, { { type = "shipped", payload = { n = 4 }, settled = true } })
  store:put_snapshot("orders/4", "count", 1, "\0bytes\255", "v1")
  store:fork("orders/4", 1, "orders/4-try")
  store:put_ref("main", "orders/4")
  store:put_ref("try", "orders/4-try")
  store:append("timers/1", { { type = "tick", payload = {}, not_before = T0 + 5000 } })
  store:append("timers/2", { { type = "tick", payload = {}, not_before = T0 + 9000 } })
  store:cancel("timers/2", 1, { reason = "paid" })
  store:append("lanes/1", { { type = "order", lane = "l", payload = 1 }, { type = "order", lane = "l", payload = 2 } })
  store:fence("fenced/1")
  store:fence("fenced/1")
  assert.equal("acquired", store:lease("leased/1", { holder = "w1", ttl_ms = 60000 }).outcome)
  store:append("sealed/1", { { type = "note", payload = 1, settled = true } })
  store:seal("sealed/1", { reason = "closed" })
  store:append("old/1", { { type = "note", payload = 1, settled = true }, { type = "note", payload = 2, settled = true },
    { type = "note", payload = 3, settled = true } })
  store:truncate("old/1", 2)
  store:append("gone/1", { { type = "note", payload = 1, settled = true } })
  store:delete("gone/1")
  store:append("cut/1", { { type = "note", payload = 1, settled = true } })
  store:truncate("cut/1", 1) -- every event dropped: no row left
  local ok, acme = pcall(store.tenant, store, "acme")
  if ok then acme:append("t/1", { { type = "note", payload = "tenant's", settled = true } }) end
  -- archived (§3.9): two segments of different times, the older dropped by
  -- a truncate that cut into the newer (which still holds event 3, below
  -- first_index), and a session archived whole (no row left)
  local settled = {}
  for i = 1, 5 do settled[i] = { type = "note", payload = { i = i }, settled = true } end
  store:append("arch/1", settled)
  store:archive("arch/1", { through = 2 })
  clock:advance(1)
  store:archive("arch/1", { through = 4 })
  store:truncate("arch/1", 3)
  store:append("arch/2", { settled[1], settled[2] })
  store:archive("arch/2", { through = 1 })
  store:archive("arch/2", { through = 2 })
  clock:advance(10)
  store:append("orders/5", { { type = "order", payload = { n = 5 } } })
end

describe("moving a store (§10)", function()
  after_each(cleanup)

  it("moves memory: -> sqlite: -> postgres: -> shards: -> sqlite: with every read answering as on the source", function()
    local clock = helpers.manual_clock(T0)
    local src = open_kind("memory", clock)
    build(src, clock)
    local lines = export_of(src)
    local want = view(src)
    -- the archived state is there to move (not just empty lists compared)
    assert.same({ { 3, 4 } }, { { want.per["arch/1"].segments[1].from, want.per["arch/1"].segments[1].through } })
    assert.equal(2, #want.per["arch/2"].segments)
    assert.same({ 4, 5 }, { want.per["arch/1"].read[1].index, want.per["arch/1"].read[2].index })
    assert.same({ i = 4 }, want.per["arch/1"].at_rest[1].payload)
    local chain = steps("sqlite", pg_url and "postgres", "shards", "sqlite")
    local prev = src
    for _, kind in ipairs(chain) do
      local dst = open_kind(kind, clock)
      local r = eventstore.import(dst, lines)
      assert.is_false(r.already, kind)
      assert.equal(#want.sessions, r.sessions, kind)
      local got = export_of(dst)
      assert.same(comparable(lines), comparable(got), kind)
      assert.equal(('"backend":"%s"'):format(dst:capabilities().backend), got[1]:match('"backend":"[^"]*"'))
      local v = view(dst)
      assert.same(want, v, kind)
      -- the tenant reads through its handle as on the source
      assert.same(src:tenant("acme"):read("t/1"), dst:tenant("acme"):read("t/1"))
      -- a new event gets a position past every moved one
      assert.is_true(dst:append("new/1", { { type = "note", settled = true } })[1].position > want.read_all[#want.read_all].position)
      lines = export_of(dst)
      want = view(dst)
      prev = dst
    end

    -- an engine on the last copy goes on where the source stopped
    local dir = eh.scripts_dir()
    local handler = [[
return function(event, ctx)
  return { { type = "handled", payload = { of = event.session .. "#" .. event.index }, settled = true } }
end
]]
    eh.handler(dir, "order", handler)
    eh.handler(dir, "tick", handler)
    local engine = eh.engine({ store = prev, scripts = dir, clock = clock })
    clock:set(T0 + 4000) -- the old claim (30 s) still holds orders/1#1; the backoff still runs
    engine:run({ until_idle = true })
    local function handled()
      local seen = {}
      for _, e in ipairs(prev:read_all({ after = 0, limit = 10000 })) do
        if e.type == "handled" then seen[e.payload.of] = (seen[e.payload.of] or 0) + 1 end
      end
      return seen
    end
    local h = handled()
    assert.is_nil(h["orders/1#1"], "a live claim of the source is honoured on the copy")
    assert.equal(1, h["orders/1#2"])
    assert.is_nil(h["timers/1#1"], "the timer is not due yet")
    assert.equal(1, h["lanes/1#1"])
    assert.equal(1, h["lanes/1#2"])
    clock:set(T0 + 70000) -- past the claim, the backoff and the timer
    engine:run({ until_idle = true })
    h = handled()
    for _, key in ipairs({ "orders/1#1", "orders/1#2", "orders/2#1", "timers/1#1", "lanes/1#1", "lanes/1#2", "orders/5#1" }) do
      assert.equal(1, h[key], key .. " handled once")
    end
    assert.is_nil(h["orders/3#1"], "the dead letter stays dead")
    assert.is_nil(h["orders/4#1"], "the processed event is not handled again")
    assert.is_nil(h["timers/2#1"], "the cancelled timer does not fire")
    assert.equal("dead", eh.event(prev, "orders/3", 1).status)
    local timer = eh.event(prev, "timers/1", 1)
    assert.equal("processed", timer.status)
    assert.is_true(timer.processed_at >= T0 + 5000, "the timer fired at its time, not before")
  end)

  it("carries sealed and shredded payloads as ciphertext with their wrapped keys", function()
    local keys = os.tmpname()
    files[#files + 1] = keys
    os.remove(keys)
    local clock = helpers.manual_clock(T0)
    local src = open_kind("memory", clock, { keys = keys })
    -- the plaintexts hold spaces, which no hex, base64url or id in an
    -- export can: a find below cannot hit random ciphertext by chance
    local visa, amex = "4111 1111 1111 1111", "3700 0000 0000 002"
    src:append("c/1", { { type = "pii", payload = { card = visa }, key = "alice" } })
    src:append("c/2", { { type = "pii", payload = { card = "5500" }, key = "bob" } })
    src:shred("bob")
    -- an archived sealed event moves as the ciphertext its segment holds
    src:append("c/3", { { type = "pii", payload = { card = amex }, key = "carol", settled = true } })
    src:archive("c/3", { through = 1 })
    -- an unsealed payload shows in the export: the finds below can hit
    src:append("c/4", { { type = "note", payload = { card = "6011 0000 0000 0004" } } })
    local lines = export_of(src)
    local text = table.concat(lines, "\n")
    assert.truthy(text:find("6011 0000 0000 0004", 1, true), "an unsealed payload is in the export")
    assert.is_nil(text:find(visa, 1, true), "no plaintext in the export")
    assert.is_nil(text:find(amex, 1, true), "no plaintext of an archived event")
    assert.truthy(text:find('"archived_event"', 1, true))
    local want = view(src)
    for _, kind in ipairs(steps("sqlite", pg_url and "postgres", "shards", "sqlite")) do
      local dst = open_kind(kind, clock, { keys = keys })
      eventstore.import(dst, lines)
      assert.same(want, view(dst), kind)
      assert.same({ card = visa }, dst:read("c/1")[1].payload)
      assert.same({ card = amex }, dst:read("c/3")[1].payload)
      assert.is_true(dst:read("c/2")[1].shredded)
      assert.same(comparable(lines), comparable(export_of(dst)))
      lines = export_of(dst)
    end
    -- another master key cannot open what was moved: refused, nothing written
    local other = os.tmpname()
    files[#files + 1] = other
    os.remove(other)
    local dst = open_kind("sqlite", clock, { keys = other })
    dst:append("x", {}) -- opening with keys wrote the check row; the store is still empty
    expect_error("INVALID_ARGUMENT", eventstore.import, dst, lines)
    assert.equal(0, #dst:sessions({}).sessions)
  end)

  it("refuses to export a shards: store whose shards made different data keys of one name", function()
    local keys = os.tmpname()
    files[#files + 1] = keys
    os.remove(keys)
    local clock = helpers.manual_clock(T0)
    local src = open_kind("shards", clock, { keys = keys })
    -- enough sessions that both shards seal under "alice" on their own
    for i = 1, 40 do
      src:append("k/" .. i, { { type = "pii", payload = { n = i }, key = "alice" } })
    end
    local err = expect_error("INVALID_ARGUMENT", src.export, src, function() end)
    assert.truthy(tostring(err):find("'alice'", 1, true), tostring(err))
    -- once shredded, "alice" is the same tombstone on every shard: it exports
    src:shred("alice")
    local _, rows = table.concat(export_of(src), "\n"):gsub('"name":"alice"', "")
    assert.equal(1, rows)
  end)

  it("refuses a non-empty target, a newer format and a stream cut short, writing nothing", function()
    local clock = helpers.manual_clock(T0)
    local src = open_kind("memory", clock)
    build(src, clock)
    local lines = export_of(src)
    local dst = open_kind("sqlite", clock)
    dst:append("mine", { { type = "note", settled = true } })
    local err = expect_error("INVALID_ARGUMENT", eventstore.import, dst, lines)
    assert.truthy(tostring(err):find("not empty", 1, true))
    assert.equal(1, #dst:sessions({}).sessions)

    local empty = open_kind("sqlite", clock)
    local newer = { (lines[1]:gsub('"eventstore_export":2', '"eventstore_export":3')) }
    for i = 2, #lines do newer[i] = lines[i] end
    err = expect_error("INVALID_ARGUMENT", eventstore.import, empty, newer)
    assert.truthy(tostring(err):find("newer", 1, true))
    local cut = {}
    for i = 1, #lines - 1 do cut[i] = lines[i] end
    err = expect_error("INVALID_ARGUMENT", eventstore.import, empty, cut)
    assert.truthy(tostring(err):find("cut short", 1, true))
    assert.equal(0, #empty:sessions({}).sessions)
    assert.equal(0, #empty:read_all({ after = 0 }))

    -- a rerun on the finished target changes nothing
    assert.is_false(eventstore.import(empty, lines).already)
    local before = export_of(empty)
    assert.is_true(eventstore.import(empty, lines).already)
    assert.same(before, export_of(empty))
  end)

  it("keeps sessions and ids that look like the import's own gap fillers", function()
    local clock = helpers.manual_clock(T0)
    local src = open_kind("memory", clock)
    src:append("gone", { { type = "t", settled = true }, { type = "t", settled = true } })
    src:delete("gone") -- positions 1 and 2 become gaps the import fills
    src:append("\1import-filler", { { type = "t", id = "\1import-filler:1", payload = 1 } })
    src:append("\1import-filler~", { { type = "t", id = "\1import-filler~:2", payload = 2 } })
    local lines = export_of(src)
    local dst = open_kind("sqlite", clock)
    eventstore.import(dst, lines)
    assert.same(view(src), view(dst))
    assert.same(comparable(lines), comparable(export_of(dst)))
  end)

  it("imports a version 1 stream (before archived events were carried)", function()
    local clock = helpers.manual_clock(T0)
    local src = open_kind("memory", clock)
    src:append("v/1", { { type = "note", payload = 1, settled = true }, { type = "note", payload = 2 } })
    local lines = export_of(src)
    local old = { (lines[1]:gsub('"eventstore_export":2', '"eventstore_export":1')) }
    for i = 2, #lines do old[i] = lines[i] end
    local n = #old
    old[n] = old[n]:gsub(',"archived_events":0', "")
    assert.is_nil(old[n]:find("archived", 1, true))
    local dst = open_kind("sqlite", clock)
    eventstore.import(dst, old)
    assert.same(view(src), view(dst))
    -- a version 1 stream never held archived events: one that claims some is cut short
    local bad = open_kind("sqlite", clock)
    local err = expect_error("INVALID_ARGUMENT", eventstore.import, bad, { old[1], old[2], old[3],
      old[3]:gsub('^{"event":{', '{"archived_event":{"segment":{"from":1,"through":1,"created_at":0},"event":{'):gsub("}$", "}}"),
      old[n] })
    assert.truthy(tostring(err):find("counts", 1, true), tostring(err))
    assert.equal(0, #bad:sessions({}).sessions)
  end)

  it("refuses archived events into a target without an archive directory, writing nothing", function()
    local clock = helpers.manual_clock(T0)
    local src = open_kind("sqlite", clock)
    src:append("a", { { type = "note", settled = true }, { type = "note", settled = true } })
    src:archive("a", { through = 1 })
    local lines = export_of(src)
    -- (shards: of postgres:// shards, which have no default archive directory)
    for _, kind in ipairs(steps("memory", pg_url and "postgres", pg_url and "shards")) do
      local dst = open_kind(kind, clock, { archive = false })
      local err = expect_error("INVALID_ARGUMENT", eventstore.import, dst, lines)
      assert.truthy(tostring(err):find("archive = DIR", 1, true), tostring(err))
      assert.equal(0, #dst:sessions({}).sessions, kind)
      assert.equal(0, #dst:read_all({ after = 0 }), kind)
    end
    -- a segment whose events are not all there, or not the segment's own
    src:append("b", { { type = "note", settled = true }, { type = "note", settled = true } })
    src:archive("b", { through = 2 })
    lines = export_of(src)
    local function without(pred, fix)
      local out = {}
      for _, l in ipairs(lines) do
        if not pred(l) then out[#out + 1] = fix and fix(l) or l end
      end
      return out
    end
    local first_b = '"event":{"position":3,"session":"b","index":1'
    local cut = without(function(l) return l:find('"event":{"position":4,"session":"b","index":2', 1, true) end,
      function(l) return (l:gsub('"archived_events":3', '"archived_events":2')) end)
    local moved = without(function() return false end,
      function(l) return l:find(first_b, 1, true) and (l:gsub('"through":2', '"through":3', 1)) or l end)
    for what, stream in pairs({ ["not all in the stream"] = cut, ["disagree about their segment"] = moved }) do
      local dst = open_kind("sqlite", clock)
      local err = expect_error("INVALID_ARGUMENT", eventstore.import, dst, stream)
      assert.truthy(tostring(err):find(what, 1, true), tostring(err))
      assert.equal(0, #dst:sessions({}).sessions)
      assert.same({}, dst:segments("a"))
    end
  end)

  it("exports one prefix of sessions, and refuses a tenant handle", function()
    local clock = helpers.manual_clock(T0)
    local src = open_kind("memory", clock)
    build(src, clock)
    local dst = open_kind("sqlite", clock)
    local lines = {}
    src:export(function(l) lines[#lines + 1] = l end, { sessions = "orders/" })
    eventstore.import(dst, lines)
    for _, si in ipairs(dst:sessions({}).sessions) do
      assert.truthy(si.session:match("^orders/"), si.session)
    end
    assert.same(src:read("orders/2"), dst:read("orders/2"))
    expect_error("INVALID_ARGUMENT", src:tenant("acme").export, src:tenant("acme"), function() end)
  end)
end)
