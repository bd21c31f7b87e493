-- The HTTP server itself (docs/http.md): `eventstore serve` listens,
-- authenticates bearer tokens, checks rights, routes, decodes paths,
-- enforces its limits, serves the inspector's files and stops cleanly;
-- `eventstore token` makes the tokens. The endpoints' own behaviour is in
-- the later spec/8N files.
local socket = require("socket")
local helpers = require("helpers")
local hh = require("http_helpers")
local ch = require("cli_helpers")
local ph = require("proc_helpers")

local sh_quote = helpers.sh_quote

-- A route whose handler may still be a placeholder (501) in this tree: the
-- request got through routing, auth and decoding when the answer is
-- neither of those refusals.
local function got_through(status)
  return status ~= nil and status ~= 400 and status ~= 401 and status ~= 403 and status ~= 404
    and status ~= 405 and status ~= 413
end

-- Stops srv and re-raises the test's error, else checks the server exited
-- 0 (under AddressSanitizer a leak or a memory error makes it fail).
local function finish(srv, ok, err)
  local rc = hh.stop(srv, nil, true)
  local log = ph.tail(srv.log, 40)
  os.execute("rm -rf " .. sh_quote(srv.dir))
  if not ok then error(err, 0) end
  assert(rc == 0, ("the server exited %s:\n%s"):format(tostring(rc), log))
end

-- Connects and returns the socket (no request sent).
local function connect(srv)
  local c = assert(socket.tcp())
  c:settimeout(10)
  assert(c:connect(srv.host, srv.port))
  return c
end

describe("eventstore serve", function()
  local srv
  setup(function() srv = hh.serve({ no_engine = true }) end)
  teardown(function() finish(srv, true) end)

  it("prints the listening line with the port it picked", function()
    assert.is_true(srv.port > 0)
    assert.matches("listening on http://127%.0%.0%.1:" .. srv.port, helpers.read_file(srv.log))
  end)

  it("warns about plain-text tokens in the tokens file, naming the line", function()
    local log = helpers.read_file(srv.log)
    assert.matches("tokens:1: the token is in plain text", log, 1, true)
    assert.matches("eventstore token hash", log, 1, true)
    assert.not_matches("admin%-token", log) -- the token itself is never printed
  end)

  it("answers 401 UNAUTHORIZED with WWW-Authenticate without a token", function()
    local status, body, headers = hh.get(srv, nil, "/v1/sessions")
    assert.equal(401, status)
    assert.equal("UNAUTHORIZED", body.code)
    assert.is_string(body.message)
    assert.matches("^Bearer", headers["www-authenticate"])
  end)

  it("answers 401 for an unknown token and for a header that is not Bearer", function()
    local status, body, headers = hh.get(srv, "no-such-token", "/v1/sessions")
    assert.equal(401, status)
    assert.equal("UNAUTHORIZED", body.code)
    assert.matches("^Bearer", headers["www-authenticate"])
    status, body = hh.request(srv, "GET", "/v1/sessions", { headers = { Authorization = "Basic YWRtaW4tdG9rZW4=" } })
    assert.equal(401, status)
    assert.equal("UNAUTHORIZED", body.code)
    status = hh.request(srv, "GET", "/v1/sessions", { headers = { Authorization = "Bearer " } })
    assert.equal(401, status)
  end)

  it("answers 403 FORBIDDEN naming the right a token lacks", function()
    local status, body = hh.post(srv, "acme-read", "/v1/sessions/s/events", { events = { { type = "t" } } })
    assert.equal(403, status)
    assert.equal("FORBIDDEN", body.code)
    assert.matches("append", body.message)
    status, body = hh.post(srv, "acme-rw", "/v1/refs/r/promote", { from = "x" })
    assert.equal(403, status)
    assert.matches("admin", body.message)
  end)

  it("lets admin do what every other right allows", function()
    local status = hh.post(srv, "acme-admin", "/v1/sessions/s/events", { events = { { type = "t" } } })
    assert.is_true(got_through(status), "status " .. tostring(status))
    status = hh.post(srv, "acme-admin", "/v1/claims", { holder = "h", ttl_ms = 1000, limit = 1 })
    assert.is_true(got_through(status), "status " .. tostring(status))
    status = hh.get(srv, "acme-admin", "/v1/sessions")
    assert.is_true(got_through(status), "status " .. tostring(status))
  end)

  it("answers 404 NOT_FOUND for a path no route has, empty segments included", function()
    for _, path in ipairs({ "/v1/nope", "/v1/sessions/s/nope", "/v1//events", "/v1/sessions/", "/a/b/c/d/e/f/g/h/i" }) do
      local status, body = hh.get(srv, "admin-token", path)
      assert.equal(404, status, path)
      assert.equal("NOT_FOUND", body.code, path)
    end
  end)

  it("answers 405 METHOD_NOT_ALLOWED with Allow when the path takes other methods", function()
    local status, body, headers = hh.delete(srv, "admin-token", "/v1/sessions/s/events")
    assert.equal(405, status)
    assert.equal("METHOD_NOT_ALLOWED", body.code)
    assert.matches("GET", headers.allow)
    assert.matches("POST", headers.allow)
    assert.not_matches("DELETE", headers.allow)
  end)

  it("refuses %00, invalid UTF-8 and bad escapes in a path segment with 400 naming it", function()
    for _, seg in ipairs({ "a%00b", "%FF", "%zz", "a%2" }) do
      local status, body = hh.get(srv, "admin-token", "/v1/sessions/" .. seg .. "/events")
      assert.equal(400, status, seg)
      assert.equal("INVALID_ARGUMENT", body.code, seg)
      assert.matches("path segment 3", body.message, 1, true)
    end
    local status, body = hh.get(srv, "admin-token", "/v1/sessions?prefix=a%00")
    assert.equal(400, status)
    assert.matches("prefix", body.message)
  end)

  it("decodes a percent-encoded session name with '/' and spaces into one segment", function()
    local name = "orders/2024 Q1 ü"
    local status, body = hh.post(srv, "admin-token", "/v1/sessions/" .. hh.enc(name) .. "/events",
      { events = { { type = "note", payload = { n = 1 } } } })
    assert.is_true(got_through(status), "status " .. tostring(status))
    if status ~= 501 then -- the API is in this tree: the event landed in that session
      assert.equal(200, status)
      assert.equal(name, body.events[1].session)
    end
  end)

  it("answers HEAD as GET without a body", function()
    local c = connect(srv)
    assert(c:send("HEAD /v1/sessions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    local text = c:receive("*a")
    c:close()
    assert.matches("^HTTP/1%.1 401", text)
    assert.matches("\r\n\r\n$", text) -- headers only
    local _, _, headers = hh.delete(srv, "admin-token", "/v1/sessions/s/head")
    assert.matches("HEAD", headers.allow)
  end)

  it("answers 413 TOO_LARGE for a Content-Length over --max-body before reading it", function()
    local limited = hh.serve({ no_engine = true, args = { "--max-body", "1000" } })
    local ok, err = pcall(function()
      local status, body = hh.post(limited, "admin-token", "/v1/sessions/s/events", string.rep("x", 1500))
      assert.equal(413, status)
      assert.equal("TOO_LARGE", body.code)
      assert.matches("1000", body.message)
      -- a chunked body gives no length: refused once it grows past the limit
      local chunk = string.rep("y", 400)
      local req = "POST /v1/sessions/s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n"
        .. "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        .. string.rep(("%x\r\n%s\r\n"):format(#chunk, chunk), 4) .. "0\r\n\r\n"
      local answer = hh.raw(limited, req, 10)
      assert.matches("^HTTP/1%.1 413", answer)
      assert.matches("TOO_LARGE", answer)
      -- a body within the limit goes through
      status = hh.post(limited, "admin-token", "/v1/sessions/s/events", { events = { { type = "t" } } })
      assert.is_true(got_through(status), "status " .. tostring(status))
    end)
    finish(limited, ok, err)
  end)

  it("answers a malformed request with a 4xx and keeps serving", function()
    assert.matches("^HTTP/1%.1 4%d%d", hh.raw(srv, "GET /healthz\r\n\r\n"))
    assert.matches("^HTTP/1%.1 4%d%d", hh.raw(srv, "\1\2\3 / HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert.matches("^HTTP/1%.1 4%d%d", hh.raw(srv, "GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"))
    local status = hh.get(srv, nil, "/v1/sessions")
    assert.equal(401, status)
  end)
end)

describe("eventstore serve tokens", function()
  it("accepts a tokens file of hashed tokens, without a warning", function()
    local srv = hh.serve({ no_engine = true, hashed = true })
    local ok, err = pcall(function()
      local tokens = helpers.read_file(srv.tokens_file)
      assert.not_matches("admin%-token", tokens)
      assert.matches("^sha256:%x+ %* ", tokens)
      local status = hh.get(srv, "admin-token", "/v1/sessions")
      assert.is_true(got_through(status), "status " .. tostring(status))
      status = hh.get(srv, "acme-read", "/v1/sessions")
      assert.is_true(got_through(status), "status " .. tostring(status))
      -- the hash itself is not a token
      local hashed = tokens:match("^(sha256:%x+)")
      assert.equal(401, (hh.get(srv, hashed, "/v1/sessions")))
      assert.not_matches("plain text", helpers.read_file(srv.log))
    end)
    finish(srv, ok, err)
  end)

  it("rereads the tokens file when it changes, and refuses every token while the new file is bad", function()
    local srv = hh.serve({ no_engine = true })
    local ok, err = pcall(function()
      assert.equal(401, (hh.get(srv, "late-token", "/v1/sessions")))
      local hashed = ch.run(srv.dir, { "token", "hash", "late-token" }).out:gsub("\n$", "")
      helpers.write_file(srv.tokens_file, "admin-token * admin\n" .. hashed .. " acme read\n")
      -- the file is looked at once a second at most, when a request comes
      local status, deadline = nil, helpers.wall() + 10
      repeat
        status = hh.get(srv, "late-token", "/v1/sessions")
        if status == 401 then helpers.sleep(0.1) end
      until status ~= 401 or helpers.wall() > deadline
      assert.is_true(got_through(status), "status " .. tostring(status))
      -- a token that left the file stops working
      assert.equal(401, (hh.get(srv, "acme-rw", "/v1/sessions")))
      -- a bad file fails closed: no token works (not even one the file
      -- still names) until it is fixed
      helpers.write_file(srv.tokens_file, "admin-token * admin\nlate-token acme read,fly\n")
      deadline = helpers.wall() + 10
      repeat
        status = hh.get(srv, "admin-token", "/v1/sessions")
        if status ~= 401 then helpers.sleep(0.1) end
      until status == 401 or helpers.wall() > deadline
      assert.equal(401, status)
      assert.equal(401, (hh.get(srv, "late-token", "/v1/sessions")))
      assert.matches("every token is refused until it is: " .. srv.tokens_file .. ":2: unknown right 'fly'",
        helpers.read_file(srv.log), 1, true)
      helpers.write_file(srv.tokens_file, "admin-token * admin\n" .. hashed .. " acme read\n")
      deadline = helpers.wall() + 10
      repeat
        status = hh.get(srv, "late-token", "/v1/sessions")
        if status == 401 then helpers.sleep(0.1) end
      until status ~= 401 or helpers.wall() > deadline
      assert.is_true(got_through(status), "status " .. tostring(status))
      assert.equal(403, (hh.post(srv, "late-token", "/v1/sessions/s/events", { events = { { type = "t" } } })))
    end)
    finish(srv, ok, err)
  end)

  it("a port in use is one error line naming the address and port, exit 1", function()
    local work = ch.mkdtemp()
    -- a hashed token in a file only its owner may read: no warning beside
    -- the error
    helpers.write_file(work .. "/tokens", "sha256:" .. ("ab"):rep(32) .. " * read\n")
    assert(os.execute("chmod 600 " .. sh_quote(work .. "/tokens")))
    local srv = hh.serve({ no_engine = true })
    local busy = "127.0.0.1:" .. srv.port
    local r = ch.run(work, { "serve", "--db", "memory:", "--no-engine", "--tokens", "tokens", "--listen", busy })
    os.execute("rm -rf " .. sh_quote(work))
    finish(srv, true)
    assert.equal(1, r.code, r.err)
    assert.equal("", r.out)
    assert.equal("eventstore: STORAGE: cannot listen on " .. busy .. ": Address already in use\n", r.err)
  end)

  it("refuses to start on a bad tokens file, naming the file and line", function()
    local work = ch.mkdtemp()
    local cases = {
      { "admin-token * read\nacme-x acme read,fly\n", "tokens:2: unknown right 'fly'" },
      { "# comment\n\nt1 acme\n", "tokens:3: expected 'TOKEN TENANT RIGHTS'" },
      { "sha256:abcd acme read\n", "tokens:1: a hashed token" },
      { "t1 acme read\nt1 globex read\n", "tokens:2: the same token as line 1" },
      { "t1 " .. ("x"):rep(100) .. " read\n", "tokens:1: tenant" },
      { "# nothing\n", "holds no token" },
    }
    for _, case in ipairs(cases) do
      helpers.write_file(work .. "/tokens", case[1])
      local r = ch.run(work, { "serve", "--db", "memory:", "--no-engine", "--tokens", "tokens", "--listen", "127.0.0.1:0" })
      assert.equal(1, r.code, case[1])
      assert.matches(case[2], r.err, 1, true)
      assert.not_matches("listening", r.out)
    end
    local r = ch.run(work, { "serve", "--db", "memory:", "--no-engine", "--tokens", "missing", "--listen", "127.0.0.1:0" })
    assert.equal(1, r.code)
    assert.matches("missing", r.err)
    os.execute("rm -rf " .. sh_quote(work))
  end)

  it("token hash prints the SHA-256 form; token new prints a token and its tokens-file line", function()
    local work = ch.mkdtemp()
    local r = ch.run(work, { "token", "hash", "abc" })
    assert.equal(0, r.code)
    assert.equal("sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n", r.out)
    r = ch.run(work, { "token", "new", "acme", "read,append" })
    assert.equal(0, r.code)
    local lines = ch.lines(r.out)
    assert.equal(2, #lines)
    assert.matches("^%x+$", lines[1])
    assert.equal(64, #lines[1])
    local h = ch.run(work, { "token", "hash", lines[1] })
    assert.equal(h.out:gsub("\n$", "") .. " acme read,append", lines[2])
    local again = ch.run(work, { "token", "new", "acme", "read" })
    assert.not_equal(lines[1], ch.lines(again.out)[1])
    for _, bad in ipairs({ { "token" }, { "token", "new", "acme", "read,fly" }, { "token", "hash" },
                           { "token", "frob", "x" } }) do
      r = ch.run(work, bad)
      assert.equal(2, r.code, table.concat(bad, " "))
    end
    os.execute("rm -rf " .. sh_quote(work))
  end)
end)

describe("eventstore serve static files", function()
  it("serves the inspector's plain files with their content types, nothing else, no token needed", function()
    local dir = ch.mkdtemp()
    helpers.write_file(dir .. "/index.html", "<!doctype html><title>x</title>")
    helpers.write_file(dir .. "/app.js", "console.log(1)")
    helpers.write_file(dir .. "/style.css", "body{}")
    helpers.write_file(dir .. "/logo.svg", "<svg/>")
    helpers.write_file(dir .. "/.secret", "hidden")
    os.execute("mkdir " .. sh_quote(dir .. "/sub") .. " && echo x > " .. sh_quote(dir .. "/sub/f.txt"))
    os.execute("ln -s /etc/passwd " .. sh_quote(dir .. "/passwd.txt"))
    local srv = hh.serve({ no_engine = true, args = { "--static", dir } })
    local ok, err = pcall(function()
      local cases = { { "/", "text/html", "<!doctype html>" }, { "/index.html", "text/html", "<!doctype" },
                      { "/app.js", "text/javascript", "console" }, { "/style.css", "text/css", "body" },
                      { "/logo.svg", "image/svg+xml", "<svg/>" } }
      for _, case in ipairs(cases) do
        local status, body, headers = hh.get(srv, nil, case[1])
        assert.equal(200, status, case[1])
        assert.matches(case[2], headers["content-type"], 1, true)
        assert.matches(case[3], body, 1, true)
      end
      for _, path in ipairs({ "/.secret", "/passwd.txt", "/..%2F..%2Fetc%2Fpasswd", "/%2E%2E", "/sub%2Ff.txt",
                              "/sub/f.txt", "/missing.js" }) do
        local status, body = hh.get(srv, nil, path)
        assert.equal(404, status, path)
        assert.equal("NOT_FOUND", body.code, path)
      end
    end)
    os.execute("rm -rf " .. sh_quote(dir))
    finish(srv, ok, err)
  end)

  it("answers / with 404 saying why when there are no inspector files; the API still works", function()
    local srv = hh.serve({ no_engine = true, args = { "--static", "/nonexistent-inspector-dir" } })
    local ok, err = pcall(function()
      local status, body = hh.get(srv, nil, "/")
      assert.equal(404, status)
      assert.matches("index.html", body.message)
      assert.equal(401, (hh.get(srv, nil, "/v1/sessions")))
    end)
    finish(srv, ok, err)
  end)
end)

describe("eventstore serve limits and stopping", function()
  it("refuses connections past --max-connections with 503, and serves again once one closes", function()
    -- every connection comes from one address here: --max-per-client
    -- (default half of the 3) would close the extra ones without the 503
    local srv = hh.serve({ no_engine = true, args = { "--max-connections", "3", "--max-per-client", "10" } })
    local ok, err = pcall(function()
      local idle = { connect(srv), connect(srv), connect(srv) }
      local status, body = hh.get(srv, nil, "/v1/sessions")
      assert.equal(503, status)
      assert.equal("UNAVAILABLE", body.code)
      idle[1]:close()
      -- the server notices the close on its own schedule: retry briefly
      local deadline = helpers.wall() + 10
      repeat
        status = hh.get(srv, nil, "/v1/sessions")
        if status ~= 401 then helpers.sleep(0.05) end
      until status == 401 or helpers.wall() > deadline
      assert.equal(401, status)
      idle[2]:close()
      idle[3]:close()
    end)
    finish(srv, ok, err)
  end)

  it("cuts a client that sends half a request after --request-timeout", function()
    local srv = hh.serve({ no_engine = true, args = { "--request-timeout", "1" } })
    local ok, err = pcall(function()
      local c = connect(srv)
      c:settimeout(15)
      assert(c:send("GET /v1/sessions HTTP/1.1\r\nHost: x\r\n"))
      local data, rerr, partial = c:receive("*a")
      c:close()
      -- closed by the server without an answer, not our own 15 s timeout
      assert.is_nil(data)
      assert.equal("closed", rerr)
      assert.equal("", partial)
      -- and a whole request still gets its answer
      assert.equal(401, (hh.get(srv, nil, "/v1/sessions")))
    end)
    finish(srv, ok, err)
  end)

  it("stops on SIGTERM with exit 0 and frees the port", function()
    local srv = hh.serve({})
    local port = srv.port
    assert.equal(401, (hh.get(srv, nil, "/v1/sessions")))
    assert.equal(0, hh.stop(srv))
    local c = assert(socket.tcp())
    c:settimeout(5)
    local connected = c:connect("127.0.0.1", port)
    c:close()
    assert.is_nil(connected)
  end)

  it("refuses a bad command line with exit 2 before opening anything", function()
    local work = ch.mkdtemp()
    local r = ch.run(work, { "serve", "--db", "memory:", "--no-engine" })
    assert.equal(2, r.code)
    assert.matches("--tokens", r.err, 1, true)
    assert.matches("token new", r.err, 1, true)
    for _, listen in ipairs({ "nonsense", "127.0.0.1:99999", "example.com:80", "127.0.0.1:" }) do
      r = ch.run(work, { "serve", "--db", "memory:", "--no-engine", "--tokens", "t", "--listen", listen })
      assert.equal(2, r.code, listen)
      assert.matches("--listen", r.err, 1, true)
    end
    r = ch.run(work, { "serve", "--db", "memory:", "--tokens", "t", "--tenant", "acme" })
    assert.equal(2, r.code)
    r = ch.run(work, { "serve", "--db", "memory:", "--tokens", "t", "--max-body", "0" })
    assert.equal(2, r.code)
    -- without --no-engine the scripts directory must exist
    helpers.write_file(work .. "/t", "tok * admin\n")
    r = ch.run(work, { "serve", "--db", "memory:", "--tokens", "t", "--scripts", "nowhere", "--listen", "127.0.0.1:0" })
    assert.equal(1, r.code)
    assert.matches("nowhere", r.err)
    r = ch.run(work, { "help", "serve" })
    assert.equal(0, r.code)
    assert.matches("--tokens FILE", r.out, 1, true)
    assert.matches("listening on http://HOST:PORT", r.out, 1, true)
    os.execute("rm -rf " .. sh_quote(work))
  end)
end)
