-- Live tails over HTTP (docs/contract.md §6, docs/http-live.md): Server-Sent Events
-- for one session (id = index), for every session of the token's store
-- (id = position) and for presence; resuming with Last-Event-ID or ?after
-- without gaps or duplicates; auth and tenant isolation on streams; the
-- stream limit; many clients at once; a client that never reads does not
-- hold up appends or other streams, and is dropped.
local hh = require("http_helpers")
local helpers = require("helpers")
local socket = require("socket")
local json = require("eventstore").json

local TOKENS = { { "reader-none", "acme", "append" } }
for _, t in ipairs(hh.TOKENS) do TOKENS[#TOKENS + 1] = t end

local function ok_append(srv, token, session, events)
  local status, body = hh.append(srv, token, session, events)
  assert(status == 200, ("append to %s: %s %s"):format(session, tostring(status),
    type(body) == "table" and (body.message or "") or tostring(body)))
  return body
end

local function ids_of(list)
  local ids = {}
  for i, ev in ipairs(list) do ids[i] = ev.id end
  return ids
end

describe("http live: SSE", function()
  local srv
  setup(function() srv = hh.serve({ no_engine = true, tokens = TOKENS }) end)
  -- exit 0: a clean stop with every stream freed (ASan builds fail on leaks)
  teardown(function() assert.equals(0, hh.stop(srv)) end)

  it("a session stream sends the history, then live events, in index order", function()
    local session = "order/1 é"
    ok_append(srv, "admin-token", session, {
      { type = "placed", payload = { n = 9007199254740993 } },
      { type = "paid" }, { type = "packed" } })
    local s = assert(hh.sse(srv, "/v1/sessions/" .. hh.enc(session) .. "/stream", { token = "admin-token" }))
    assert.matches("text/event-stream", s.headers["content-type"], 1, true)
    local got = hh.sse_take(s, 3)
    assert.same({ "1", "2", "3" }, ids_of(got))
    assert.equals("placed", got[1].data.type)
    assert.equals(session, got[1].data.session)
    assert.equals(1, got[1].data.index)
    -- the payload's integer is exact (not a double rounded to ...992)
    assert.equals(9007199254740993, got[1].data.payload.n)
    ok_append(srv, "admin-token", session, { { type = "shipped" } })
    ok_append(srv, "admin-token", session, { { type = "delivered" }, { type = "rated" } })
    local live = hh.sse_take(s, 3)
    assert.same({ "4", "5", "6" }, ids_of(live))
    assert.same({ "shipped", "delivered", "rated" }, { live[1].data.type, live[2].data.type, live[3].data.type })
    -- nothing more than what was appended
    local extra = s:next(1.2)
    assert.is_nil(extra and extra.event == "event" and extra or nil)
    s:close()
  end)

  it("resumes after Last-Event-ID or ?after with no gap and no duplicate", function()
    local session = "resume"
    local evs = {}
    for i = 1, 10 do evs[i] = { type = "t" .. i } end
    ok_append(srv, "admin-token", session, evs)
    local path = "/v1/sessions/" .. session .. "/stream"
    local a = assert(hh.sse(srv, path, { token = "admin-token" }))
    local first = hh.sse_take(a, 4)
    assert.same({ "1", "2", "3", "4" }, ids_of(first))
    a:close() -- the client drops after id 4
    ok_append(srv, "admin-token", session, { { type = "t11" }, { type = "t12" } })
    local b = assert(hh.sse(srv, path, { token = "admin-token", last_event_id = first[4].id }))
    local rest = hh.sse_take(b, 8)
    assert.same({ "5", "6", "7", "8", "9", "10", "11", "12" }, ids_of(rest))
    assert.equals("t5", rest[1].data.type)
    b:close()
    local c = assert(hh.sse(srv, path .. "?after=10", { token = "admin-token" }))
    assert.same({ "11", "12" }, ids_of(hh.sse_take(c, 2)))
    c:close()
    -- Last-Event-ID wins over ?after (a reconnecting browser repeats the URL)
    local d = assert(hh.sse(srv, path .. "?after=2", { token = "admin-token", last_event_id = 11 }))
    assert.same({ "12" }, ids_of(hh.sse_take(d, 1)))
    d:close()
    -- a resume point beyond the head waits for events after it
    local e = assert(hh.sse(srv, path, { token = "admin-token", last_event_id = 13 }))
    ok_append(srv, "admin-token", session, { { type = "t13" }, { type = "t14" } })
    assert.same({ "14" }, ids_of(hh.sse_take(e, 1)))
    e:close()
  end)

  it("refuses a bad Last-Event-ID or ?after with 400 and opens no stream", function()
    for _, bad in ipairs({ "-1", "1.5", "abc", "+3", "99999999999999999999", "0x10" }) do
      local s, status, body = hh.sse(srv, "/v1/sessions/x/stream", { token = "admin-token", last_event_id = bad })
      assert.is_nil(s)
      assert.equals(400, status, bad)
      assert.equals("INVALID_ARGUMENT", body.code)
      assert.matches("Last-Event-ID", body.message, 1, true)
      s, status, body = hh.sse(srv, "/v1/stream?after=" .. hh.enc(bad), { token = "admin-token" })
      assert.is_nil(s)
      assert.equals(400, status, bad)
      assert.matches("after", body.message, 1, true)
    end
  end)

  it("the all-sessions stream goes by position, a tenant's only its own", function()
    -- the stream starts at the store's current last position
    local status, page = hh.get(srv, "admin-token", "/v1/events?after=0&limit=1000")
    assert.equals(200, status)
    local last = 0
    for _, ev in ipairs(page.events) do last = math.max(last, ev.position) end
    local acme = assert(hh.sse(srv, "/v1/stream?after=" .. last, { token = "acme-read" }))
    local all = assert(hh.sse(srv, "/v1/stream", { token = "admin-token", last_event_id = last }))
    ok_append(srv, "acme-rw", "a1", { { type = "acme.one", payload = { secret = false } } })
    ok_append(srv, "globex-rw", "g1", { { type = "globex.one", payload = { secret = true } } })
    ok_append(srv, "acme-rw", "a2", { { type = "acme.two" } })
    ok_append(srv, "globex-rw", "a1", { { type = "globex.two" } })
    local mine = hh.sse_take(acme, 2)
    assert.same({ "acme.one", "acme.two" }, { mine[1].data.type, mine[2].data.type })
    assert.same({ "a1", "a2" }, { mine[1].data.session, mine[2].data.session })
    assert.equals(tostring(mine[1].data.position), mine[1].id)
    assert.is_true(tonumber(mine[2].id) > tonumber(mine[1].id) + 1) -- globex's position skipped
    local more = acme:next(1.2)
    assert.is_nil(more and more.event == "event" and more or nil) -- nothing of globex's
    local every = hh.sse_take(all, 4)
    assert.equals(4, #every)
    for i = 2, 4 do assert.equals(tonumber(every[i - 1].id) + 1, tonumber(every[i].id)) end
    assert.equals("acme\031a1", every[1].data.session) -- a * token sees stored names
    acme:close()
    all:close()
  end)

  it("presence: a snapshot, then one patch per winning write (deletions as null)", function()
    local st = hh.put(srv, "acme-rw", "/v1/presence/room/ann", { values = { cursor = 1 }, ttl_ms = 60000 })
    assert.equals(200, st)
    local s = assert(hh.sse(srv, "/v1/presence/room/stream", { token = "acme-read", last_event_id = "ignored" }))
    local snap = hh.sse_take(s, 1, 10, "snapshot")[1]
    assert.is_nil(snap.id)
    assert.equals(1, #snap.data.rows)
    assert.same({ "ann", "cursor", 1 }, { snap.data.rows[1].participant, snap.data.rows[1].field, snap.data.rows[1].value })
    assert.equals(200, (hh.put(srv, "acme-rw", "/v1/presence/room/bob",
      { values = { cursor = 7, typing = true }, ttl_ms = 60000, seen = 3 })))
    assert.equals(200, (hh.put(srv, "acme-rw", "/v1/presence/room/bob",
      { values = { typing = json.null }, ttl_ms = 60000 })))
    -- another tenant's namespace of the same name is not this one
    assert.equals(200, (hh.put(srv, "globex-rw", "/v1/presence/room/eve", { values = { x = 1 }, ttl_ms = 60000 })))
    local patches = hh.sse_take(s, 2, 10, "presence")
    assert.equals(2, #patches)
    assert.equals("bob", patches[1].data.participant)
    assert.same({ cursor = 7, typing = true }, patches[1].data.values)
    assert.equals(3, patches[1].data.seen)
    assert.is_number(patches[1].data.at)
    assert.equals(json.null, patches[2].data.values.typing)
    local more = s:next(1.2)
    assert.is_nil(more and more.event == "presence" and more or nil)
    s:close()
  end)

  it("streams need a token and the read right, and keep tenants apart", function()
    for _, path in ipairs({ "/v1/sessions/x/stream", "/v1/stream", "/v1/presence/room/stream" }) do
      local s, status, body = hh.sse(srv, path, {})
      assert.is_nil(s)
      assert.equals(401, status, path)
      assert.equals("UNAUTHORIZED", body.code)
      s, status = hh.sse(srv, path, { token = "wrong" })
      assert.equals(401, status, path)
      s, status, body = hh.sse(srv, path, { token = "reader-none" })
      assert.is_nil(s)
      assert.equals(403, status, path)
      assert.equals("FORBIDDEN", body.code)
    end
    -- globex writes "shared"; acme's "shared" is another session
    ok_append(srv, "globex-rw", "shared", { { type = "globex.private", payload = { k = "v" } } })
    local s = assert(hh.sse(srv, "/v1/sessions/shared/stream", { token = "acme-read" }))
    local first = s:next(1.5)
    assert.is_nil(first and first.event == "event" and first or nil)
    ok_append(srv, "acme-rw", "shared", { { type = "acme.own" } })
    local got = hh.sse_take(s, 1)
    assert.equals("acme.own", got[1].data.type)
    assert.equals("1", got[1].id)
    s:close()
  end)

  it("many clients (50 streams) all see every event", function()
    local streams = {}
    for i = 1, 50 do
      streams[i] = assert(hh.sse(srv, "/v1/sessions/fanout/stream", { token = i % 2 == 0 and "admin-token" or "acme-read" }))
    end
    -- half the clients are acme's, watching acme's "fanout"; half watch
    -- the root's
    for b = 1, 4 do
      local evs = {}
      for k = 1, 5 do evs[k] = { type = "e", payload = { n = (b - 1) * 5 + k } } end
      ok_append(srv, "admin-token", "fanout", evs)
      ok_append(srv, "acme-rw", "fanout", evs)
    end
    for i, s in ipairs(streams) do
      local got = hh.sse_take(s, 20, 20)
      assert.equals(20, #got, "stream " .. i)
      for k = 1, 20 do
        assert.equals(tostring(k), got[k].id)
        assert.equals(k, got[k].data.payload.n)
      end
      s:close()
    end
  end)
end)

describe("http live: limits", function()
  it("past --max-streams a stream is 503 UNAVAILABLE; a closed one frees its slot", function()
    local srv = hh.serve({ no_engine = true, args = { "--max-streams", "2" } })
    local a = assert(hh.sse(srv, "/v1/stream", { token = "admin-token" }))
    local b = assert(hh.sse(srv, "/v1/sessions/x/stream", { token = "admin-token" }))
    local s, status, body = hh.sse(srv, "/v1/presence/p/stream", { token = "admin-token" })
    assert.is_nil(s)
    assert.equals(503, status)
    assert.equals("UNAVAILABLE", body.code)
    -- other requests still work
    assert.equals(200, (hh.get(srv, "admin-token", "/v1/sessions/x/head")))
    a:close()
    -- the server notices the closed client when it next writes to it (a
    -- keep-alive): retry until the slot is free
    local c
    local deadline = helpers.wall() + 60
    repeat
      ok_append(srv, "admin-token", "wake", { { type = "x" } }) -- gives the all-sessions stream a write
      c = hh.sse(srv, "/v1/stream", { token = "admin-token" })
      if not c then helpers.sleep(0.5) end
    until c or helpers.wall() > deadline
    assert.is_truthy(c)
    b:close()
    c:close()
    assert.equals(0, hh.stop(srv))
  end)

  it("SIGTERM ends open streams: the server exits 0 and the clients see the end", function()
    local srv = hh.serve({ no_engine = true })
    local a = assert(hh.sse(srv, "/v1/sessions/idle/stream", { token = "admin-token" }))
    local b = assert(hh.sse(srv, "/v1/stream", { token = "admin-token" }))
    local c = assert(hh.sse(srv, "/v1/presence/p/stream", { token = "admin-token" }))
    assert.equals("snapshot", c:next(5).event)
    local t0 = helpers.wall()
    assert.equals(0, hh.stop(srv))
    -- ended within about a second each, not at a keep-alive (15 s): a
    -- ceiling ten times what it takes, below the keep-alive it tells apart
    assert.is_true(helpers.wall() - t0 < 10)
    for _, s in ipairs({ a, b, c }) do
      local ev, why = s:next(5)
      assert.is_nil(ev)
      assert.equals("closed", why)
      s:close()
    end
  end)

  it("a client that never reads holds up neither appends nor other streams, and is dropped", function()
    -- a short request timeout, so the dropped client shows within seconds
    local srv = hh.serve({ no_engine = true, args = { "--request-timeout", "3" } })
    -- the slow client: a raw connection that asks for the stream and
    -- never reads a byte (its receive buffer is kept small)
    local slow = assert(socket.tcp())
    slow:setoption("tcp-nodelay", true)
    pcall(slow.setoption, slow, "recv-buffer-size", 4096) -- not in every LuaSocket
    slow:settimeout(10)
    assert(slow:connect(srv.host, srv.port))
    assert(slow:send(("GET /v1/sessions/big/stream HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer admin-token\r\n\r\n")
      :format(srv.host)))
    local fast = assert(hh.sse(srv, "/v1/sessions/big/stream", { token = "admin-token" }))
    -- 24 MiB of events: more than any socket buffers hold
    local blob = string.rep("x", 64 * 1024)
    local t0 = helpers.wall()
    -- the other client reads as the events come: each batch appended is
    -- answered and then seen by it, while the slow one is stuck
    local n = 0
    for _ = 1, 48 do
      local evs = {}
      for k = 1, 8 do
        n = n + 1
        evs[k] = { type = "big", payload = { n = n, blob = blob } }
      end
      ok_append(srv, "admin-token", "big", evs)
      local got = hh.sse_take(fast, 8, 30)
      assert.equals(8, #got)
      for k = 1, 8 do assert.equals(tostring(n - 8 + k), got[k].id) end
    end
    -- (a hang ceiling, 20 times what it takes: the point is that nothing
    -- waited for the slow client to be dropped)
    assert.is_true(helpers.wall() - t0 < 120)
    -- the slow one is dropped after the request timeout: the server
    -- closes it; what it received is a prefix of the events, never all
    local deadline = helpers.wall() + 60
    local dropped = 0
    repeat
      helpers.sleep(0.5)
      local m = hh.metrics(srv, "admin-token")
      dropped = m.value("eventstore_http_streams_dropped_total")
    until dropped >= 1 or helpers.wall() > deadline
    assert.is_true(dropped >= 1)
    slow:settimeout(5)
    local received, closed = 0, false
    while true do
      local data, err, partial = slow:receive(65536)
      data = data or partial
      if data then received = received + #data end
      if err == "closed" then
        closed = true
        break
      end
      if err == "timeout" then break end
    end
    assert.is_true(closed)
    assert.is_true(received < n * #blob)
    slow:close()
    -- the fast one still works
    ok_append(srv, "admin-token", "big", { { type = "after" } })
    local last = hh.sse_take(fast, 1)
    assert.equals(tostring(n + 1), last[1].id)
    fast:close()
    assert.equals(0, hh.stop(srv))
  end)
end)
