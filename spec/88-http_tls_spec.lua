-- spec/88-http_tls_spec.lua: `eventstore serve --tls-cert FILE --tls-key
-- FILE` (docs/http.md "TLS") and the security headers every answer
-- carries (docs/http.md "Security headers"). A throwaway CA and a server
-- certificate are made with openssl for the file (hh.tls_files); curl,
-- trusting that CA only, is the HTTPS client. The servers are waited on by
-- their "listening on https://" line (hh.serve), never by a sleep.
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")
local ch = require("cli_helpers")

local json = eventstore.json
local sh_quote = helpers.sh_quote

local CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
  .. "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

describe("the security headers' policy", function()
  it("is the inspector's own <meta> policy plus frame-ancestors 'none'", function()
    -- so that the header never forbids what the page needs, nor allows
    -- what its <meta> forbids
    local html = assert(helpers.read_file("web/inspector/index.html"))
    local meta = html:match('<meta http%-equiv="Content%-Security%-Policy"%s+content="([^"]*)"')
    assert.is_string(meta)
    assert.equal(meta .. "; frame-ancestors 'none'", CSP)
  end)
end)

-- Asserts the security headers of one answer; hsts: whether
-- Strict-Transport-Security must be there (TLS) or must not (plain HTTP).
local function check_security_headers(headers, what, hsts)
  assert.is_table(headers, what .. ": no answer")
  assert.equal(CSP, headers["content-security-policy"], what)
  assert.equal("nosniff", headers["x-content-type-options"], what)
  assert.equal("no-referrer", headers["referrer-policy"], what)
  if hsts then
    assert.equal("max-age=31536000", headers["strict-transport-security"], what)
  else
    assert.is_nil(headers["strict-transport-security"], what)
  end
end

-- The inspector's files for a test server: an index.html only.
local function static_dir()
  return hh.scripts({ ["index.html"] = "<!doctype html><title>inspector</title>\n" })
end

local tls -- the CA and the server's certificate, made once for the file

-- A TLS server on template (opts as hh.serve_on, plus the certificate).
local function serve_tls(template, opts)
  opts = opts or {}
  local args = { "--tls-cert", tls.cert, "--tls-key", tls.key }
  for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
  opts.args = args
  opts.no_engine = true
  return hh.serve_on(template, opts)
end

-- curl trusting the test CA, with the token when given.
local function curl_tls(token, ...)
  local args = { "--cacert", tls.ca }
  if token then
    args[#args + 1] = "-H"
    args[#args + 1] = "Authorization: Bearer " .. token
  end
  for _, a in ipairs({ ... }) do args[#args + 1] = a end
  return hh.curl(args)
end

describe("eventstore serve over TLS", function()
  lazy_setup(function() tls = hh.tls_files() end)
  lazy_teardown(function() if tls then hh.rm(tls.dir) end end)

  it("refuses --tls-cert without --tls-key, and the other way round, as a usage error", function()
    local work = ch.mkdtemp()
    helpers.write_file(work .. "/tokens", "admin-token * admin\n")
    for _, args in ipairs({ { "--tls-cert", tls.cert }, { "--tls-key", tls.key } }) do
      local r = ch.run(work, { "serve", "--db", "memory:", "--no-engine", "--tokens", "tokens",
        "--listen", "127.0.0.1:0", table.unpack(args) })
      ch.fails(r, 2, "serve: --tls-cert and --tls-key go together")
      assert.truthy(r.err:find("got only " .. args[1], 1, true), r.err)
    end
    hh.rm(work)
  end)

  it("refuses to start on a certificate or key it cannot use, naming the file", function()
    local work = ch.mkdtemp()
    helpers.write_file(work .. "/tokens", "admin-token * admin\n")
    helpers.write_file(work .. "/empty", "")
    helpers.write_file(work .. "/junk", "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    -- a second key, which is not the certificate's
    assert(os.execute("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "
      .. sh_quote(work .. "/other.key") .. " 2>/dev/null"))
    local missing = work .. "/missing.pem"
    local cases = {
      { missing, tls.key, "cannot read the TLS certificate file '" .. missing .. "': No such file or directory" },
      { tls.cert, missing, "cannot read the TLS key file '" .. missing .. "': No such file or directory" },
      { work, tls.key, "TLS certificate file '" .. work .. "'" },
      { work .. "/empty", tls.key, "cannot use the TLS certificate file '" .. work .. "/empty': it is empty" },
      { work .. "/junk", tls.key, "the TLS certificate file '" .. work .. "/junk' holds no usable PEM certificate" },
      { work .. "/tokens", tls.key, "the TLS certificate file '" .. work .. "/tokens' holds no usable PEM certificate" },
      { tls.cert, tls.cert, "the TLS key file '" .. tls.cert .. "' holds no usable private key" },
      { tls.cert, work .. "/other.key", "the TLS certificate file '" .. tls.cert .. "' and key file '"
        .. work .. "/other.key' cannot be served together" },
      { tls.ca, tls.key, "the TLS certificate file '" .. tls.ca .. "' and key file '" .. tls.key
        .. "' cannot be served together" },
    }
    for _, case in ipairs(cases) do
      local r = ch.run(work, { "serve", "--db", "memory:", "--no-engine", "--tokens", "tokens",
        "--listen", "127.0.0.1:0", "--tls-cert", case[1], "--tls-key", case[2] })
      -- exit 1, never the listening line, and the error's one line
      -- (after the tokens file's warnings) names the file
      assert.equal(1, r.code, r.err)
      assert.equal("", r.out)
      local last = r.err:match("([^\n]*)\n$")
      assert.equal("eventstore: INVALID_ARGUMENT: ", last:sub(1, 30), r.err)
      assert.truthy(last:find(case[3], 1, true), case[3] .. "\nnot in: " .. r.err)
    end
    hh.rm(work)
  end)

  for _, template in ipairs(helpers.urls()) do
    if template:match("^memory:") or template:match("^sqlite:") then
      describe("on " .. template, function()
        it("answers the API over HTTPS, with the security headers on answers and errors", function()
          local static = static_dir()
          local srv = serve_tls(template, { args = { "--static", static } })
          assert.equal("https", srv.scheme)
          assert.equal("https://127.0.0.1:" .. srv.port, srv.url)
          -- an append and its read, as a client trusting only the test CA
          local rc, status, headers, body, err = curl_tls("admin-token", "-X", "POST",
            "-H", "Content-Type: application/json",
            "--data-binary", json.encode({ events = json.array({ { type = "t", payload = { v = 1 } } }) }),
            srv.url .. "/v1/sessions/s1/events")
          assert.equal(0, rc, err)
          assert.equal(200, status, body)
          check_security_headers(headers, "POST events", true)
          rc, status, headers, body, err = curl_tls("admin-token", srv.url .. "/v1/sessions/s1/events")
          assert.equal(0, rc, err)
          assert.equal(200, status, body)
          local read = json.decode(body)
          assert.equal(1, #read.events)
          assert.equal("t", read.events[1].type)
          assert.equal(1, read.events[1].payload.v)
          check_security_headers(headers, "GET events", true)
          -- errors: no token (401), a wrong one, a path that does not exist
          for _, case in ipairs({ { nil, "/v1/sessions", 401 }, { "nope", "/v1/sessions", 401 },
            { "admin-token", "/v1/nothing/here", 404 } }) do
            rc, status, headers, body, err = curl_tls(case[1], srv.url .. case[2])
            assert.equal(0, rc, err)
            assert.equal(case[3], status, body)
            check_security_headers(headers, case[2] .. " " .. case[3], true)
          end
          -- the inspector's index, /healthz (no token needed)
          for _, path in ipairs({ "/", "/healthz" }) do
            rc, status, headers, body, err = curl_tls(nil, srv.url .. path)
            assert.equal(0, rc, err)
            assert.equal(200, status, path)
            check_security_headers(headers, path, true)
          end
          -- a client that does not trust the test CA (the system's CAs
          -- only) refuses the server: 60, the certificate is not verified
          rc, status = hh.curl({ srv.url .. "/healthz" })
          assert.equal(60, rc)
          assert.is_nil(status)
          hh.stop_clean(srv)
          hh.rm(static)
        end)

        it("answers HEAD over TLS with headers only, on a kept-alive connection", function()
          local srv = serve_tls(template)
          -- HEAD on a listing and on a stream route, then a GET on the same
          -- connection: a body sent after a HEAD would corrupt the GET's
          -- answer, and curl says when it reuses the connection.
          local base = os.tmpname()
          local auth = "Authorization: Bearer admin-token"
          local words = { "curl", "-sS", "-v", "--cacert", tls.ca, "-I", "-H", auth, srv.url .. "/v1/sessions",
            "--next", "-sS", "--cacert", tls.ca, "-I", "-H", auth, srv.url .. "/v1/stream",
            "--next", "-sS", "--cacert", tls.ca, "-H", auth, srv.url .. "/v1/sessions" }
          for i, w in ipairs(words) do words[i] = sh_quote(w) end
          local ok = os.execute(table.concat(words, " ") .. " >" .. sh_quote(base .. ".out")
            .. " 2>" .. sh_quote(base .. ".err"))
          local out, err = helpers.read_file(base .. ".out"), helpers.read_file(base .. ".err")
          os.remove(base)
          os.remove(base .. ".out")
          os.remove(base .. ".err")
          assert.is_true(ok, err)
          -- two HEAD answers (headers only), then the GET's JSON body
          local heads = {}
          for st in out:gmatch("HTTP/1%.1 (%d%d%d)") do heads[#heads + 1] = st end
          assert.same({ "200", "200" }, heads, out)
          assert.equal('{"sessions":[],"cursor":null}', out:match("\r\n\r\n([^\r\n]*)$"), out)
          assert.truthy(err:find("Re%-using existing connection"), err)
          assert.is_nil(err:find("Excess found", 1, true), err)
          hh.stop_clean(srv)
        end)

        it("gives plain HTTP to the TLS port no HTTP answer, and keeps serving HTTPS", function()
          local srv = serve_tls(template)
          -- a raw request: the TLS handshake fails and the connection is
          -- closed; no status line, whatever bytes (a TLS alert) come back
          local got = hh.raw(srv, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
          assert.is_nil(got:find("HTTP/", 1, true), got)
          got = hh.raw(srv, "GET /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n\r\n")
          assert.is_nil(got:find("HTTP/", 1, true), got)
          -- curl over http:// gets nothing it can read as an answer
          local rc, status = hh.curl({ "http://127.0.0.1:" .. srv.port .. "/healthz" })
          assert.is_true(rc == 52 or rc == 56, "curl exit " .. tostring(rc))
          assert.is_nil(status)
          -- and the server still serves HTTPS
          local err
          rc, status, _, _, err = curl_tls("admin-token", srv.url .. "/v1/sessions")
          assert.equal(0, rc, err)
          assert.equal(200, status)
          hh.stop_clean(srv)
        end)

        it("sends the security headers over plain HTTP too, without Strict-Transport-Security", function()
          local static = static_dir()
          local srv = hh.serve_on(template, { no_engine = true, args = { "--static", static } })
          assert.equal("http", srv.scheme)
          for _, case in ipairs({ { "/v1/sessions", "admin-token", 200 }, { "/v1/sessions", nil, 401 },
            { "/v1/nothing", "admin-token", 404 }, { "/", nil, 200 }, { "/healthz", nil, 200 } }) do
            local status, _, headers = hh.get(srv, case[2], case[1])
            assert.equal(case[3], status, case[1])
            check_security_headers(headers, case[1], false)
          end
          -- a live tail's answer (its headers come before any event)
          local s = hh.sse(srv, "/v1/stream", { token = "admin-token" })
          assert.is_table(s)
          check_security_headers(s.headers, "/v1/stream", false)
          s:close()
          hh.stop_clean(srv)
          hh.rm(static)
        end)
      end)
    end
  end

  it("warns when others than its owner may read the key file, and serves", function()
    local key = tls.dir .. "/open.key"
    assert(os.execute("cp " .. sh_quote(tls.key) .. " " .. sh_quote(key) .. " && chmod 644 " .. sh_quote(key)))
    local srv = hh.serve({ db = "memory:", no_engine = true, args = { "--tls-cert", tls.cert, "--tls-key", key } })
    local log = helpers.read_file(srv.log)
    assert.truthy(log:find("warning: the TLS key file " .. key .. " has mode 0644", 1, true), log)
    local rc, status, _, _, err = curl_tls(nil, srv.url .. "/healthz")
    assert.equal(0, rc, err)
    assert.equal(200, status)
    hh.stop_clean(srv)
    -- the file of the other tests (mode 0600) is not warned about
    srv = hh.serve({ db = "memory:", no_engine = true, args = { "--tls-cert", tls.cert, "--tls-key", tls.key } })
    log = helpers.read_file(srv.log)
    assert.is_nil(log:find("TLS key file", 1, true), log)
    hh.stop_clean(srv)
  end)
end)
