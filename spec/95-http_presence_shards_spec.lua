-- spec/95-http_presence_shards_spec.lua (docs/http-live.md): presence
-- patches written by another process reach `/v1/presence/{ns}/stream`
-- (sqlite:, postgres:), and `serve` over `shards:` gives `/v1/events` and
-- `/v1/stream` the sharded cursors (the SSE `id:` is the cursor and
-- Last-Event-ID resumes with it).
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")
local oh = require("openapi_helpers")

local json = eventstore.json

-- Every backend a second process can share with the server.
local function shared_templates()
  local t = {}
  for _, url in ipairs(helpers.urls()) do
    if not url:match("^memory:") then t[#t + 1] = url end
  end
  return t
end

for _, template in ipairs(shared_templates()) do
  describe("presence across processes on " .. template:match("^%a+"), function()
    local srv, other
    setup(function()
      srv = hh.serve_on(template, { no_engine = true })
      -- this test process is the other process, on the server's database
      other = eventstore.open(srv.db)
    end)
    teardown(function()
      if other then other:close() end
      assert.equals(0, hh.stop(srv))
    end)

    it("a write by another process reaches the stream as a patch, deletions as null", function()
      other:presence_set("room", "ann", { cursor = 1 }, { ttl_ms = 600000 })
      local s = assert(hh.sse(srv, "/v1/presence/room/stream", { token = "admin-token" }))
      local snap = hh.sse_take(s, 1, 10, "snapshot")[1]
      assert.equals(1, #snap.data.rows)
      other:presence_set("room", "bob", { cursor = 7, typing = true }, { ttl_ms = 600000, seen = 3 })
      local p = hh.sse_take(s, 1, 20, "presence")[1]
      assert.is_table(p, "no patch for another process's write")
      assert.equals("bob", p.data.participant)
      assert.same({ cursor = 7, typing = true }, p.data.values)
      assert.equals(3, p.data.seen)
      other:presence_set("room", "bob", { typing = json.null }, { ttl_ms = 600000 })
      p = hh.sse_take(s, 1, 20, "presence")[1]
      assert.is_table(p, "no patch for another process's deletion")
      assert.same({ typing = json.null }, p.data.values)
      -- a write through the server itself comes once, not again as
      -- "another process's"
      assert.equals(200, (hh.put(srv, "admin-token", "/v1/presence/room/cat", { values = { x = 1 }, ttl_ms = 600000 })))
      other:presence_set("room", "dan", { y = 2 }, { ttl_ms = 600000 })
      local got = hh.sse_take(s, 2, 20, "presence")
      assert.same({ "cat", "dan" }, { got[1] and got[1].data.participant, got[2] and got[2].data.participant })
      local more = s:next(1.5)
      assert.is_nil(more and more.event == "presence" and more or nil)
      -- another namespace's write is not this stream's
      other:presence_set("hall", "eve", { z = 3 }, { ttl_ms = 600000 })
      other:presence_set("room", "fay", { w = 4 }, { ttl_ms = 600000 })
      p = hh.sse_take(s, 1, 20, "presence")[1]
      assert.equals("fay", p and p.data.participant)
      s:close()
    end)
  end)
end

describe("serve over shards:", function()
  local srv, dir, records
  local ADMIN = "admin-token"

  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. helpers.sh_quote(dir)))
    local catalog = "sqlite:" .. dir .. "/catalog.db"
    local plan = { version = 1, shards = { a = "sqlite:" .. dir .. "/a.db", b = "sqlite:" .. dir .. "/b.db" } }
    eventstore.open("shards:", { catalog = catalog, plan = plan }):close()
    srv = hh.serve({ db = "shards:" .. catalog, no_engine = true })
    records = oh.record()
  end)
  teardown(function()
    oh.stop()
    assert.equals(0, hh.stop(srv))
    hh.rm(dir)
  end)

  -- Appends one settled event to each of n sessions named prefix..i; their ids.
  local function spread(prefix, n)
    local ids = {}
    for i = 1, n do
      local body = hh.append_ok(srv, ADMIN, prefix .. i, { { type = "t", payload = { i = i }, settled = true } })
      ids[#ids + 1] = body.events[1].id
    end
    return ids
  end

  local function sorted(t)
    local c = {}
    for i, v in ipairs(t) do c[i] = v end
    table.sort(c)
    return c
  end

  it("GET /v1/events pages with the cursor each event carries, every event once", function()
    local ids = spread("page-", 8)
    local seen, after, pages = {}, nil, 0
    repeat
      local st, body = hh.get(srv, ADMIN, "/v1/events?limit=3" .. (after and ("&after=" .. hh.enc(after)) or ""))
      hh.check_ok(st, body, "read_all")
      for _, e in ipairs(body.events) do
        assert.is_string(e.cursor)
        assert.truthy(e.cursor:match("^c1"), e.cursor)
        seen[#seen + 1] = e.id
        after = e.cursor
      end
      pages = pages + 1
    until #body.events == 0 or pages > 10
    assert.same(sorted(ids), sorted(seen))
    -- a position is not a cursor of a sharded store: 400, nothing read
    local st, body = hh.get(srv, ADMIN, "/v1/events?after=5")
    hh.check_error(400, "INVALID_ARGUMENT", st, body, "a position on shards")
  end)

  it("GET /v1/stream: id: is the cursor; Last-Event-ID resumes after it, with no gap and no duplicate", function()
    local st0, all = hh.get(srv, ADMIN, "/v1/events?limit=1000")
    hh.check_ok(st0, all, "read_all")
    local before = #all.events
    local s = assert(hh.sse(srv, "/v1/stream", { token = ADMIN }))
    local history = hh.sse_take(s, before, 20)
    assert.equals(before, #history)
    for _, ev in ipairs(history) do assert.equals(ev.data.cursor, ev.id) end
    local live_ids = spread("live-", 4)
    local live = hh.sse_take(s, 4, 20)
    assert.equals(4, #live, "live events on a sharded stream")
    local got = {}
    for _, ev in ipairs(live) do
      assert.equals(ev.data.cursor, ev.id)
      got[#got + 1] = ev.data.id
    end
    assert.same(sorted(live_ids), sorted(got))
    s:close()
    -- resume after the second live event: the last two come, nothing else
    local again = assert(hh.sse(srv, "/v1/stream", { token = ADMIN, last_event_id = live[2].id }))
    local rest = hh.sse_take(again, 2, 20)
    assert.same({ live[3].data.id, live[4].data.id }, { rest[1] and rest[1].data.id, rest[2] and rest[2].data.id })
    local extra = again:next(1.5)
    assert.is_nil(extra and extra.event == "event" and extra or nil)
    again:close()
    -- a tenant's stream over the shards resumes by cursor too
    assert.equals(200, (hh.append(srv, "acme-rw", "t-1", { { type = "t", settled = true } })))
    local ts = assert(hh.sse(srv, "/v1/stream", { token = "acme-read" }))
    local mine = hh.sse_take(ts, 1, 20)
    assert.equals("t-1", mine[1] and mine[1].data.session)
    assert.equals(mine[1].data.cursor, mine[1].id)
    ts:close()
  end)

  -- the sharded answers (events with `cursor`) against the OpenAPI document
  it("every answer met the OpenAPI document's schema for its route", oh.checks(function() return records end))
end)

describe("retention over serve", function()
  it("the engine's sweeps and actions are at /metrics", function()
    local dir = hh.scripts({ ["retention.lua"] = [[return {{ sessions = "log-", keep_last = 1, action = "truncate" }}]] })
    local db = os.tmpname()
    local s = eventstore.open("sqlite:" .. db)
    s:append("log-1", { { type = "t", settled = true }, { type = "t", settled = true }, { type = "t", settled = true } })
    s:close()
    local srv = hh.serve({ db = "sqlite:" .. db, scripts = dir })
    finally(function()
      hh.stop(srv)
      hh.rm(dir)
      os.remove(db)
      os.remove(db .. "-wal")
      os.remove(db .. "-shm")
    end)
    local m
    local deadline = helpers.wall() + 30
    repeat
      m = hh.metrics(srv, "admin-token")
      -- a sweep is counted once its actions are
      local sweeps = m.value("eventstore_retention_sweeps_total", {})
      if sweeps and sweeps >= 1 then break end
      helpers.sleep(0.05)
    until helpers.wall() > deadline
    assert.equals(1, m.value("eventstore_retention_sweeps_total", {}))
    assert.equals(1, m.value("eventstore_retention_actions_total", { action = "truncate" }))
    assert.equals(0, m.value("eventstore_retention_actions_total", { action = "failed" }))
    local st, body = hh.get(srv, "admin-token", "/v1/sessions?prefix=log-")
    hh.check_ok(st, body, "sessions")
    assert.equals(3, body.sessions[1].first_index)
  end)
end)
