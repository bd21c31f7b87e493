-- The server under attack (docs/http.md "Limits", docs/limits.md): each
-- test attacks `eventstore serve` with a bounded client on loopback and
-- asserts the bound: an answer that comes without waiting for what the
-- attacker holds back, the server's resident memory (/proc/PID/status),
-- the bytes on a keep-alive connection.
local socket = require("socket")
local helpers = require("helpers")
local hh = require("http_helpers")
local ch = require("cli_helpers")

local connect, read_head, rss_kib, with_server = hh.connect, hh.read_head, hh.rss_kib, hh.with_server

-- Asks with token until the answer's status is want (the tokens file is
-- looked at once a second at most, when a request comes); returns the
-- last status.
local function await_status(srv, token, want)
  local status, deadline = nil, helpers.wall() + 10
  repeat
    status = hh.get(srv, token, "/v1/sessions")
    if status ~= want then helpers.sleep(0.1) end
  until status == want or helpers.wall() > deadline
  return status
end

-- How many times text occurs in the server's log.
local function log_count(srv, text)
  local n, from = 0, 1
  local log = helpers.read_file(srv.log) or ""
  while true do
    local i = log:find(text, from, true)
    if not i then return n end
    n, from = n + 1, i + 1
  end
end

describe("eventstore serve tokens fail closed", function()
  it("an emptied, removed or unusable tokens file refuses every token, logged until it is back", function()
    with_server({ db = "memory:", no_engine = true }, function(srv)
      local good = helpers.read_file(srv.tokens_file)
      assert.equal(200, await_status(srv, "admin-token", 200))
      local refused = "every token is refused until it is: "
      local cases = {
        { function() helpers.write_file(srv.tokens_file, "") end, "holds no token" },
        { function() helpers.write_file(srv.tokens_file, "# all revoked\n") end, "holds no token" },
        { function() os.remove(srv.tokens_file) end, "No such file or directory" },
        { function()
          os.remove(srv.tokens_file)
          assert(os.execute("mkdir " .. helpers.sh_quote(srv.tokens_file)))
        end, "not a regular file" },
        { function() helpers.write_file(srv.tokens_file, good .. "#" .. ("x"):rep(5000) .. "\n") end,
          "is over 4096 bytes" },
        { function() helpers.write_file(srv.tokens_file, good .. ("#\n"):rep(600 * 1024)) end,
          "is over 1048576 bytes" },
      }
      for _, case in ipairs(cases) do
        case[1]()
        assert.equal(401, await_status(srv, "admin-token", 401), case[2])
        assert.equal(401, (hh.get(srv, "acme-rw", "/v1/sessions")), case[2])
        assert.matches(refused .. "[^\n]*" .. case[2]:gsub("%p", "%%%0"), helpers.read_file(srv.log))
        -- said again at the next look, for as long as it lasts
        local n, deadline = log_count(srv, case[2]), helpers.wall() + 10
        repeat
          assert.equal(401, (hh.get(srv, "admin-token", "/v1/sessions")))
          helpers.sleep(0.1)
        until log_count(srv, case[2]) > n or helpers.wall() > deadline
        assert.is_true(log_count(srv, case[2]) > n, case[2] .. " was said once only")
        os.execute("rm -rf " .. helpers.sh_quote(srv.tokens_file))
        helpers.write_file(srv.tokens_file, good)
        assert.equal(200, await_status(srv, "admin-token", 200), "back after " .. case[2])
      end
    end)
  end)

  it("warns about a tokens file others may read, at start and on reload", function()
    with_server({ db = "memory:", no_engine = true, hashed = true }, function(srv)
      assert(os.execute("chmod 600 " .. helpers.sh_quote(srv.tokens_file)))
      assert.equal(200, await_status(srv, "admin-token", 200))
      local before = log_count(srv, "has mode")
      -- chmod makes another version of the file: it is read again
      local deadline = helpers.wall() + 10
      assert(os.execute("chmod 644 " .. helpers.sh_quote(srv.tokens_file)))
      repeat
        hh.get(srv, "admin-token", "/v1/sessions")
        helpers.sleep(0.1)
      until log_count(srv, "has mode") > before or helpers.wall() > deadline
      assert.matches("the tokens file " .. srv.tokens_file:gsub("%p", "%%%0") .. " has mode 0644: others than its owner may read",
        helpers.read_file(srv.log))
      -- still served: a warning, not a refusal
      assert.equal(200, (hh.get(srv, "admin-token", "/v1/sessions")))
    end)
  end)

  it("refuses to start on a tokens file that is not a regular file or is over its limits", function()
    local work = ch.mkdtemp()
    helpers.write_file(work .. "/long", "#" .. ("x"):rep(5000) .. "\n")
    helpers.write_file(work .. "/big", ("#\n"):rep(600 * 1024))
    for _, case in ipairs({ { "/dev/zero", "not a regular file" }, { work, "not a regular file" },
      { "long", "long:1: the line is over 4096 bytes" }, { "big", "is over 1048576 bytes" } }) do
      local r = ch.run(work, { "serve", "--db", "memory:", "--no-engine", "--tokens", case[1],
        "--listen", "127.0.0.1:0" })
      assert.equal(1, r.code, case[1] .. ": " .. r.err)
      assert.matches(case[2], r.err, 1, true)
    end
    os.execute("rm -rf " .. helpers.sh_quote(work))
  end)
end)

-- Opens a connection from source address `from` (any 127.x.y.z: a
-- separate client to the server) and sends `bytes`; nil when refused.
local function open_from(srv, from, bytes)
  local c = assert(socket.tcp())
  c:settimeout(5)
  assert(c:bind(from, 0))
  if not c:connect(srv.host, srv.port) then
    c:close()
    return nil
  end
  if bytes then c:send(bytes) end
  return c
end

describe("eventstore serve against slow and greedy clients", function()
  it("closes a connection whose headers trickle past --header-timeout-ms, and counts it", function()
    with_server({ db = "memory:", no_engine = true, args = { "--header-timeout-ms", "1500" } }, function(srv)
      local c = open_from(srv, "127.0.0.2", "GET /healthz HTTP/1.1\r\nX")
      c:settimeout(1)
      local t0, closed = helpers.wall(), false
      -- a byte a second: never idle long enough for the idle timeout
      while helpers.wall() - t0 < 10 do
        c:send("a")
        local _, err = c:receive(1)
        if err == "closed" then
          closed = true
          break
        end
      end
      c:close()
      assert.is_true(closed, "the trickling connection stayed open")
      local waited = helpers.wall() - t0
      assert.is_true(waited < 1.5 + 1.5, ("closed after %.1f s"):format(waited))
      local m = hh.metrics(srv, "admin-token")
      assert.equal(1, m.value("eventstore_http_header_timeouts_total"))
    end)
  end)

  it("answers a normal client within header_timeout_ms + 1 s while trickling clients hold every connection", function()
    local timeout_ms = 1500
    with_server({ db = "memory:", no_engine = true, args = { "--header-timeout-ms", tostring(timeout_ms),
      "--max-connections", "16", "--request-timeout", "30" } }, function(srv)
      for round = 1, 3 do
        -- 6 addresses x 8 (the per-client cap: half of 16) = 48 attempts,
        -- more than the 16 connections and the 503 slack together
        local attackers = {}
        for a = 2, 7 do
          for _ = 1, 8 do
            local c = open_from(srv, "127.0.0." .. a, "GET /v1/sessions HTTP/1.1\r\nX")
            if c then attackers[#attackers + 1] = c end
          end
        end
        -- trickle a byte a second for a second or two
        for _ = 1, round do
          for _, c in ipairs(attackers) do c:send("a") end
          helpers.sleep(1)
        end
        local t0 = helpers.wall()
        local c = open_from(srv, "127.0.0.99")
        assert(c, "the normal client could not connect")
        c:settimeout(timeout_ms / 1000 + 1, "t")
        c:send("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        local status = read_head(c)
        local took = helpers.wall() - t0
        c:close()
        for _, k in ipairs(attackers) do k:close() end
        assert.is_true(status == 200 or status == 503, "round " .. round .. ": no answer: " .. tostring(status))
        assert.is_true(took <= timeout_ms / 1000 + 1, ("round %d: answered after %.2f s"):format(round, took))
      end
    end)
  end)

  it("closes connections past --max-per-client from one address at once; other addresses are served", function()
    with_server({ db = "memory:", no_engine = true, args = { "--max-per-client", "3" } }, function(srv)
      local held = {}
      for _ = 1, 3 do held[#held + 1] = assert(open_from(srv, "127.0.0.3", "GET /healthz HTTP/1.1\r\nX")) end
      local extra = open_from(srv, "127.0.0.3", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
      local got, err = extra:receive("*l")
      extra:close()
      assert.is_nil(got)
      assert.equal("closed", err)
      local other = assert(open_from(srv, "127.0.0.4", "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
      assert.equal(200, (read_head(other)))
      other:close()
      for _, c in ipairs(held) do c:close() end
    end)
  end)
end)

for _, template in ipairs(helpers.urls()) do
  if template:match("^memory:") or template:match("^sqlite:") then
    describe("eventstore serve under attack on " .. template, function()
      it("refuses a body on a route that takes none at once, without reading it", function()
        local static = hh.scripts({ ["index.html"] = "<!doctype html><title>x</title>\n" })
        with_server({ db = hh.backend_db(template), no_engine = true, args = { "--static", static } },
          function(srv)
            local body_size = 15 * 1024 * 1024
            local before = rss_kib(srv)
            -- The headers announce the body but none of it is sent: the
            -- answer must come without it (before the fix the server waited
            -- for the body and this read timed out).
            for _, target in ipairs({ "GET /healthz", "GET /index.html", "GET /v1/sessions",
              "HEAD /healthz", "DELETE /v1/refs/r" }) do
              local c = connect(srv)
              assert(c:send(("%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"):format(target, body_size)))
              local status = read_head(c)
              c:close()
              assert.equal(413, status, target)
            end
            -- A chunked body is refused the same way.
            local c = connect(srv)
            assert(c:send("GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"))
            assert.equal(413, (read_head(c)))
            c:close()
            -- Many such connections that push their whole body anyway: the
            -- server closes them, and holds none of it.
            local chunk = string.rep("x", 64 * 1024)
            local conns = {}
            for i = 1, 8 do
              local k = connect(srv)
              k:settimeout(2)
              local target = i % 2 == 0 and "/healthz" or "/index.html"
              k:send(("GET %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"):format(target, body_size))
              conns[#conns + 1] = k
            end
            for _, k in ipairs(conns) do
              for _ = 1, math.floor(body_size / #chunk) do
                if not k:send(chunk) then break end
              end
            end
            for _, k in ipairs(conns) do
              local all, _, partial = k:receive("*a")
              k:close()
              assert.matches("^HTTP/1%.1 413", all or partial or "")
            end
            local grown = rss_kib(srv) - before
            -- 8 bodies of 15 MiB would be 120 MiB; a few MiB of thread
            -- stacks and buffers are allowed.
            assert.is_true(grown < 16 * 1024, ("the server grew by %d KiB"):format(grown))
            -- The server still answers.
            assert.equal(200, (hh.get(srv, nil, "/healthz")))
            assert.equal(200, (hh.get(srv, nil, "/index.html")))
          end)
        hh.rm(static)
      end)

      it("answers HEAD with headers only on every route, so a keep-alive connection goes on", function()
        with_server({ db = hh.backend_db(template), no_engine = true }, function(srv)
          hh.append_ok(srv, "admin-token", "s", { { type = "t" } })
          local m0 = hh.metrics(srv, "admin-token")
          local c = connect(srv)
          for _, path in ipairs({ "/v1/stream", "/v1/sessions/s/stream", "/v1/presence/p/stream",
            "/v1/sessions", "/v1/sessions/s/events", "/healthz", "/v1/sessions/nope%00/stream" }) do
            assert(c:send(("HEAD %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n\r\n"):format(path)))
            local status, headers = read_head(c)
            assert.is_number(status, path)
            assert.is_nil(headers["transfer-encoding"], path)
            if path:find("%%00") then
              assert.equal(400, status, path)
              break -- a refusal closes the connection
            end
            assert.equal(200, status, path)
            -- The next request on the same connection gets its own answer
            -- first: no body (not even a chunked end) came before it.
            assert(c:send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
            local next_status, next_headers = read_head(c)
            assert.equal(200, next_status, "the answer after HEAD " .. path)
            assert(c:receive(math.tointeger(tonumber(next_headers["content-length"]))))
          end
          c:close()
          -- No stream was opened, so none was dropped.
          local m1 = hh.metrics(srv, "admin-token")
          assert.equal(m0.value("eventstore_http_streams_opened_total"), m1.value("eventstore_http_streams_opened_total"))
          assert.equal(m0.value("eventstore_http_streams_dropped_total"), m1.value("eventstore_http_streams_dropped_total"))
        end)
      end)

      it("refuses conflicting Content-Length headers, and Content-Length with Transfer-Encoding, with 400", function()
        with_server({ db = hh.backend_db(template), no_engine = true }, function(srv)
          local body = '{"events":[{"type":"t"}]}'
          local function post(framing, payload)
            return hh.raw(srv, "POST /v1/sessions/s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n"
              .. "Connection: close\r\nContent-Type: application/json\r\n" .. framing .. "\r\n" .. payload, 10)
          end
          -- {framing, whether the answer is the server's JSON error (a value
          -- that is not a number at all is libmicrohttpd's own 400)}
          for _, case in ipairs({
            { ("Content-Length: %d\r\nContent-Length: %d\r\n"):format(#body, #body + 1), true },
            { ("Content-Length: %d\r\nContent-Length: 0\r\n"):format(#body), true },
            { ("Content-Length: %d\r\nTransfer-Encoding: chunked\r\n"):format(#body), true },
            { ("Transfer-Encoding: chunked\r\nContent-Length: %d\r\n"):format(#body), true },
            { ("Content-Length: %d, %d\r\n"):format(#body, #body), false },
            { ("Content-Length: +%d\r\n"):format(#body), false },
          }) do
            local answer = post(case[1], body)
            assert.matches("^HTTP/1%.1 400", answer, 1, false, case[1])
            if case[2] then assert.matches("INVALID_ARGUMENT", answer, 1, true) end
          end
          -- nothing was appended by any of them
          assert.equal(0, hh.head(srv, "admin-token", "s"))
          -- the same length twice is one length (RFC 9112 §6.3)
          local answer = post(("Content-Length: %d\r\nContent-Length: %d\r\n"):format(#body, #body), body)
          assert.matches("^HTTP/1%.1 200", answer)
          assert.equal(1, hh.head(srv, "admin-token", "s"))
        end)
      end)
    end)
  end
end
