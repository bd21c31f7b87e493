-- The server killed mid-request (issue 13 "Done when", docs/http-live.md):
-- `kill -9` while eight clients have appends in flight. After a restart on
-- the same database (a new port), every append that was answered 2xx is
-- stored exactly once; retrying the unanswered ones with their ids stores
-- each exactly once too (idempotent ids); an SSE client that had seen up
-- to id N resumes with `Last-Event-ID: N` on the new server and gets N+1..
-- with no gap and no duplicate. On SQLite, and on PostgreSQL when ES_PG_URL
-- is set.
local hh = require("http_helpers")
local helpers = require("helpers")
local socket = require("socket")
local json = require("eventstore").json

local CLIENTS = 8

local targets = { { name = "sqlite" } }
local PG = os.getenv("ES_PG_URL")
if PG and PG ~= "" then targets[#targets + 1] = { name = "postgres", template = PG } end

-- One append request of a single event with a fixed id, as raw bytes.
local function append_request(srv, session, id, n)
  local body = json.encode({ events = { { id = id, type = "job", payload = { n = n } } } })
  return ("POST /v1/sessions/%s/events HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n" ..
    "Authorization: Bearer admin-token\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s")
    :format(session, srv.host, srv.port, #body, body)
end

-- Every event of a session, through the API's pages.
local function read_all(srv, session)
  local out, after = {}, 0
  while true do
    local status, body = hh.get(srv, "admin-token", ("/v1/sessions/%s/events?after=%d&limit=1000"):format(session, after))
    assert(status == 200, "read " .. session .. ": " .. tostring(status))
    for _, ev in ipairs(body.events) do out[#out + 1] = ev end
    if #body.events == 0 then return out end
    after = body.events[#body.events].index
  end
end

for _, target in ipairs(targets) do
  describe("http live: kill -9 mid-request (" .. target.name .. ")", function()
    it("loses nothing acknowledged; retries store each event once; SSE resumes without a gap", function()
      local db = target.template and helpers.pg_fresh_url(target.template) or nil
      local srv = hh.serve({ no_engine = true, db = db })
      local olddir = srv.dir
      -- the clients: each appends to its own session, one event per
      -- request, the next sent as soon as the last is answered
      local clients = {}
      for k = 1, CLIENTS do
        clients[k] = { session = "c" .. k, n = 0, sent = {}, acked = {}, nacked = 0 }
      end
      local function send_next(c)
        c.n = c.n + 1
        local id = ("%s-%d"):format(c.session, c.n)
        c.sent[c.n] = id
        local sock = assert(socket.tcp())
        sock:settimeout(5)
        assert(sock:connect(srv.host, srv.port))
        assert(sock:send(append_request(srv, c.session, id, c.n)))
        sock:settimeout(0)
        c.sock, c.reply = sock, {}
      end
      for _, c in ipairs(clients) do send_next(c) end
      -- an SSE client on c1, reading as it goes
      local sse = assert(hh.sse(srv, "/v1/sessions/c1/stream", { token = "admin-token" }))
      local seen = {}
      local function take_sse(timeout)
        local ev = sse:next(timeout)
        while ev do
          if ev.event == "event" then seen[#seen + 1] = ev end
          ev = sse:next(timeout)
        end
      end
      local total, t0 = 0, helpers.wall()
      while total < 300 or helpers.wall() - t0 < 1 do
        local socks = {}
        for _, c in ipairs(clients) do socks[#socks + 1] = c.sock end
        local readable = socket.select(socks, nil, 0.05)
        for _, c in ipairs(clients) do
          if readable[c.sock] then
            local data, err, partial = c.sock:receive(8192)
            data = data or partial
            if data and data ~= "" then c.reply[#c.reply + 1] = data end
            if err == "closed" then
              local text = table.concat(c.reply)
              local status = tonumber(text:match("^HTTP/1%.%d (%d%d%d)"))
              assert(status == 200, "append answered " .. tostring(status) .. ": " .. text)
              c.acked[c.sent[c.n]] = true
              c.nacked = c.nacked + 1
              total = total + 1
              c.sock:close()
              send_next(c)
            end
          end
        end
        take_sse(0.001)
        -- a hang ceiling (the loop takes a second or two)
        assert(helpers.wall() - t0 < 120, "the clients made no progress")
      end
      -- every client has a request out now: kill the server under them
      hh.stop(srv, "KILL", true)
      for _, c in ipairs(clients) do
        -- an answer that made it out before the kill still counts
        c.sock:settimeout(2)
        local rest, _, partial = c.sock:receive("*a")
        local text = table.concat(c.reply) .. (rest or partial or "")
        if tonumber(text:match("^HTTP/1%.%d (%d%d%d)")) == 200 then
          c.acked[c.sent[c.n]] = true
        end
        c.sock:close()
      end
      take_sse(0.5)
      sse:close()
      assert.is_true(#seen > 0)
      for i, ev in ipairs(seen) do assert.equals(tostring(i), ev.id) end
      local last_seen = #seen

      if os.getenv("ES_SPEC_VERBOSE") then
        local un = 0
        for _, c in ipairs(clients) do un = un + (c.n - c.nacked) end
        print(("# %d acknowledged, %d unanswered at the kill, SSE saw %d"):format(total, un, last_seen))
      end
      local again = hh.restart(srv, { no_engine = true })
      local ok, err = pcall(function()
        -- every acknowledged append is there, once
        for _, c in ipairs(clients) do
          local count = {}
          for _, ev in ipairs(read_all(again, c.session)) do count[ev.id] = (count[ev.id] or 0) + 1 end
          for id in pairs(c.acked) do assert.equals(1, count[id], id .. " acknowledged") end
          for id, k in pairs(count) do assert.equals(1, k, id .. " stored more than once") end
        end
        -- retrying the unacknowledged ones: each stored exactly once
        for _, c in ipairs(clients) do
          for n = 1, c.n do
            local id = c.sent[n]
            if not c.acked[id] then
              local status, body = hh.append(again, "admin-token", c.session, { { id = id, type = "job", payload = { n = n } } })
              assert.equals(200, status, tostring(body and body.message))
              assert.equals(id, body.events[1].id)
            end
          end
          local evs = read_all(again, c.session)
          assert.equals(c.n, #evs)
          local ids = {}
          for i, ev in ipairs(evs) do
            assert.equals(i, ev.index) -- dense
            assert.is_nil(ids[ev.id])
            ids[ev.id] = true
          end
          for n = 1, c.n do assert.is_true(ids[c.sent[n]], c.sent[n]) end
        end
        -- the SSE client resumes on the new server after what it saw
        local head = #read_all(again, "c1")
        local s = assert(hh.sse(again, "/v1/sessions/c1/stream", { token = "admin-token", last_event_id = last_seen }))
        local rest = hh.sse_take(s, head - last_seen, 30)
        assert.equals(head - last_seen, #rest)
        for i, ev in ipairs(rest) do assert.equals(tostring(last_seen + i), ev.id) end
        -- what the first server had sent agrees with the store
        local stored = read_all(again, "c1")
        for i, ev in ipairs(seen) do assert.equals(stored[i].id, ev.data.id) end
        for i, ev in ipairs(rest) do assert.equals(stored[last_seen + i].id, ev.data.id) end
        s:close()
      end)
      local rc = hh.stop(again, nil, true)
      local log = helpers.read_file(again.log) or ""
      os.execute("rm -rf " .. helpers.sh_quote(olddir) .. " " .. helpers.sh_quote(again.dir))
      assert(ok, err)
      assert(rc == 0, "the restarted server exited " .. tostring(rc) .. ":\n" .. log)
    end)
  end)
end
