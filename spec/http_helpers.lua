-- spec/http_helpers.lua: the HTTP specs' server and client (spec/8N-http_*).
--
-- hh.serve starts `eventstore serve` (the built binary) on a free loopback
-- port with a tokens file written for the test, and returns a server
-- record; hh.request sends one HTTP/1.1 request over a fresh connection
-- (LuaSocket, Debian lua-socket) and returns status, decoded body and
-- headers; hh.sse opens a Server-Sent Events stream and reads it event by
-- event. Raw sockets, not curl, so a spec can also send what no client
-- library would (a malformed request line, a body that never ends).
local socket = require("socket")
local eventstore = require("eventstore")
local helpers = require("helpers")
local ph = require("proc_helpers")

local json = eventstore.json
local hh = {}

local BUILD = os.getenv("BUILD") or "build"
hh.BIN = BUILD .. "/bin/eventstore"

-- Tokens every test server accepts unless a spec passes its own list:
-- {token, tenant, rights}.
hh.TOKENS = {
  { "admin-token", "*", "read,append,work,admin" },
  { "acme-rw", "acme", "read,append,work" },
  { "acme-read", "acme", "read" },
  { "acme-admin", "acme", "admin" },
  { "globex-rw", "globex", "read,append,work" },
}

-- A reducer the API specs install (scripts/reducers/<name>.lua): counts
-- `add` events and sums their payload's v.
hh.SUM_REDUCER = [[
return {
  init = function() return {n = 0, sum = 0} end,
  add = function(state, event)
    state.n = state.n + 1
    state.sum = state.sum + event.payload.v
    return state
  end,
}
]]

-- Starts a server. opts: db (a store URL; default a fresh sqlite file in
-- the server's directory), scripts (a directory; default none: an empty
-- one), tokens (as hh.TOKENS; written in plain text unless hashed = true:
-- then through `eventstore token hash`), args (more command line words),
-- no_engine (adds --no-engine). Returns {url, scheme ("http", or "https"
-- when args hold --tls-cert and --tls-key), host, port, proc, log, dir,
-- db, tokens_file}. Raises, with the server's log, when it does not start.
function hh.serve(opts)
  opts = opts or {}
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. helpers.sh_quote(dir .. "/scripts/handlers") ..
    " " .. helpers.sh_quote(dir .. "/scripts/reducers")))
  local srv = { dir = dir, log = dir .. "/serve.log", tokens_file = dir .. "/tokens" }
  srv.db = opts.db or ("sqlite:" .. dir .. "/es.db")
  local lines = {}
  for _, t in ipairs(opts.tokens or hh.TOKENS) do
    local tok = t[1]
    if opts.hashed then
      local p = assert(io.popen(helpers.sh_quote(hh.BIN) .. " token hash " .. helpers.sh_quote(tok)))
      tok = p:read("l")
      p:close()
    end
    lines[#lines + 1] = ("%s %s %s"):format(tok, t[2], t[3])
  end
  helpers.write_file(srv.tokens_file, table.concat(lines, "\n") .. "\n")
  local argv = { hh.BIN, "serve", "--db", srv.db, "--scripts", opts.scripts or (dir .. "/scripts"),
    "--listen", "127.0.0.1:0", "--tokens", srv.tokens_file }
  if opts.no_engine then argv[#argv + 1] = "--no-engine" end
  for _, a in ipairs(opts.args or {}) do argv[#argv + 1] = a end
  srv.proc = ph.spawn(argv, opts.env, srv.log)
  local deadline = helpers.wall() + 60 -- ends when it listens; only a hang runs out
  repeat
    local text = helpers.read_file(srv.log) or ""
    local scheme, host, port = text:match("listening on (https?)://([%d%.]+):(%d+)")
    if port then
      srv.scheme, srv.host, srv.port = scheme, host, math.tointeger(tonumber(port))
      srv.url = ("%s://%s:%d"):format(scheme, host, srv.port)
      return srv
    end
    if ph.status(srv.proc) then break end
    helpers.sleep(0.02)
  until helpers.wall() > deadline
  local log = ph.tail(srv.log, 30)
  ph.reap(srv.proc)
  error("eventstore serve did not start:\n" .. log, 2)
end

-- Stops a server with SIGTERM (kill -9 when `sig` says so) and waits for
-- it; returns its exit status. Removes its directory unless keep is set.
function hh.stop(srv, sig, keep)
  if not srv or srv.stopped then return srv and srv.rc end
  ph.signal(srv.proc, sig or "TERM")
  srv.rc = ph.wait(srv.proc, 20)
  ph.reap(srv.proc)
  srv.stopped = true
  if not keep then os.execute("rm -rf " .. helpers.sh_quote(srv.dir)) end
  return srv.rc
end

-- Starts the same server again (same db, scripts, tokens), e.g. after a
-- kill -9; the port is a new one.
function hh.restart(srv, opts)
  opts = opts or {}
  local again = hh.serve({ db = srv.db, tokens = opts.tokens, args = opts.args,
    no_engine = opts.no_engine, scripts = opts.scripts or (srv.dir .. "/scripts") })
  return again
end

local function connect(srv, timeout)
  local c = assert(socket.tcp())
  c:settimeout(timeout or 10)
  assert(c:connect(srv.host, srv.port))
  return c
end

hh.connect = connect

-- Percent-encodes one path segment or query value (every byte but
-- unreserved ones).
function hh.enc(s)
  return (tostring(s):gsub("[^%w%-%._~]", function(ch) return ("%%%02X"):format(ch:byte()) end))
end

-- The raw request text.
local function request_text(srv, method, path, o)
  local body = o.body
  if type(body) == "table" then body = json.encode(body) end
  local head = { ("%s %s HTTP/1.1"):format(method, path), ("Host: %s:%d"):format(srv.host, srv.port),
    "Connection: close" }
  if o.token then head[#head + 1] = "Authorization: Bearer " .. o.token end
  for k, v in pairs(o.headers or {}) do head[#head + 1] = k .. ": " .. v end
  if body then
    head[#head + 1] = "Content-Type: application/json"
    head[#head + 1] = "Content-Length: " .. #body
  end
  return table.concat(head, "\r\n") .. "\r\n\r\n" .. (body or "")
end

-- Reads the status line and headers; returns status, headers (lower-case
-- names), or nil and an error.
local function read_head(c)
  local line, err = c:receive("*l")
  if not line then return nil, err end
  local status = math.tointeger(tonumber(line:match("^HTTP/1%.%d (%d%d%d)")))
  if not status then return nil, "bad status line: " .. line end
  local headers = {}
  while true do
    local h = assert(c:receive("*l"))
    if h == "" then break end
    local k, v = h:match("^([^:]+):%s*(.-)%s*$")
    if k then headers[k:lower()] = v end
  end
  return status, headers
end

hh.read_head = read_head

-- Reads a whole body (Content-Length, chunked, or until close).
local function read_body(c, headers)
  if headers["content-length"] then
    local n = math.tointeger(tonumber(headers["content-length"]))
    if n == 0 then return "" end
    return assert(c:receive(n))
  end
  if (headers["transfer-encoding"] or ""):lower():find("chunked") then
    local parts = {}
    while true do
      local size = tonumber(assert(c:receive("*l")):match("^(%x+)"), 16)
      if size == 0 then
        repeat local l = c:receive("*l") until l == nil or l == ""
        break
      end
      parts[#parts + 1] = assert(c:receive(size))
      c:receive("*l")
    end
    return table.concat(parts)
  end
  local all, _, partial = c:receive("*a")
  return all or partial
end

-- One request. o: token, body (a string, or a table sent as JSON),
-- headers, timeout (seconds, default 10). Returns status, body (decoded
-- JSON when the answer is JSON, else the text), headers. A request the
-- server closed without an answer returns nil and the error.
function hh.request(srv, method, path, o)
  o = o or {}
  local c = connect(srv, o.timeout)
  assert(c:send(request_text(srv, method, path, o)))
  local status, headers = read_head(c)
  if not status then
    c:close()
    return nil, headers
  end
  local text = read_body(c, headers)
  c:close()
  local body = text
  if (headers["content-type"] or ""):find("json", 1, true) and text ~= "" then
    body = json.decode(text)
  end
  -- spec/openapi_helpers.lua's oh.record(): answers checked against the document
  if hh.recorder then hh.recorder(method, path, status, headers, text) end
  return status, body, headers, text
end

-- Shorthands with a token: hh.get(srv, token, path), hh.post(srv, token,
-- path, body), hh.put, hh.delete.
function hh.get(srv, token, path) return hh.request(srv, "GET", path, { token = token }) end
function hh.post(srv, token, path, body) return hh.request(srv, "POST", path, { token = token, body = body or {} }) end
function hh.put(srv, token, path, body) return hh.request(srv, "PUT", path, { token = token, body = body or {} }) end
function hh.delete(srv, token, path) return hh.request(srv, "DELETE", path, { token = token }) end

-- Sends raw bytes and returns whatever comes back before the server closes
-- the connection or `timeout` seconds pass (for malformed requests).
function hh.raw(srv, bytes, timeout)
  local c = connect(srv, timeout or 5)
  c:send(bytes)
  local all, _, partial = c:receive("*a")
  c:close()
  return all or partial or ""
end

-- An SSE stream: hh.sse(srv, path, {token, last_event_id, timeout}) ->
-- stream with :next(timeout) -> {id, event, data (decoded JSON or text)}
-- or nil, "timeout"/"closed"; :close(). Comments (": ...") are skipped.
-- Returns nil, status, body when the server answers with an error.
function hh.sse(srv, path, o)
  o = o or {}
  local headers = { Accept = "text/event-stream" }
  if o.last_event_id then headers["Last-Event-ID"] = tostring(o.last_event_id) end
  local c = connect(srv, o.timeout)
  assert(c:send(request_text(srv, "GET", path, { token = o.token, headers = headers })))
  local status, h = read_head(c)
  if status ~= 200 then
    local text = status and read_body(c, h) or ""
    c:close()
    local ok, decoded = pcall(json.decode, text)
    return nil, status, ok and decoded or text
  end
  local chunked = (h["transfer-encoding"] or ""):lower():find("chunked")
  local s = { c = c, headers = h, buf = "", left = 0 }
  -- The next raw bytes of the body (chunked framing taken off).
  local function more(timeout)
    c:settimeout(timeout)
    if not chunked then
      local data, err, partial = c:receive(4096)
      data = data or partial
      if data and data ~= "" then return data end
      return nil, err
    end
    if s.left == 0 then
      local line, err = c:receive("*l")
      if line == "" then line, err = c:receive("*l") end
      if not line then return nil, err end
      s.left = tonumber(line:match("^(%x+)"), 16) or 0
      if s.left == 0 then return nil, "closed" end
    end
    local data, err, partial = c:receive(s.left)
    data = data or partial
    if not data or data == "" then return nil, err end
    s.left = s.left - #data
    return data
  end
  function s:next(timeout)
    local deadline = helpers.wall() + (timeout or 10)
    while true do
      local block, rest = self.buf:match("^(.-)\n\n(.*)$")
      if block then
        self.buf = rest
        local ev = {}
        local data = {}
        for line in (block .. "\n"):gmatch("([^\n]*)\n") do
          local k, v = line:match("^([^:]*):?%s?(.*)$")
          if k == "id" then ev.id = v
          elseif k == "event" then ev.event = v
          elseif k == "data" then data[#data + 1] = v
          end
        end
        if #data > 0 then
          local text = table.concat(data, "\n")
          local ok, decoded = pcall(json.decode, text)
          ev.data = ok and decoded or text
        end
        if ev.id or ev.event or ev.data ~= nil then return ev end
      else
        local left = deadline - helpers.wall()
        if left <= 0 then return nil, "timeout" end
        local data, err = more(math.min(left, 1))
        if data then
          self.buf = self.buf .. data:gsub("\r\n", "\n")
        elseif err ~= "timeout" then
          return nil, "closed"
        end
      end
    end
  end
  function s:close() self.c:close() end
  return s
end

-- ---- live tails and metrics (spec/83-85, docs/http-live.md) ----------------

-- Parses a Prometheus text exposition (format 0.0.4) and checks its rules,
-- raising with the line at fault: every line is a comment (`# HELP name
-- text`, `# TYPE name type`, other `#` text) or a sample `name{labels}
-- value [timestamp]`; names and label names are well formed; label values
-- use only the escapes \\ \" \n; a family's TYPE comes once and before its
-- samples, and its samples are not interleaved with another family's;
-- counters are >= 0; each histogram series has buckets with increasing
-- `le`, cumulative (non-decreasing) counts, a last bucket `+Inf` equal to
-- its `_count`. Returns {families = {name = {type, help, samples}},
-- value = function(name, labels) -> number or nil}; a sample is {name,
-- labels (table), value}.
function hh.parse_metrics(text)
  assert(text:sub(-1) == "\n", "the exposition must end with a line feed")
  local families, order = {}, {}
  local current -- the family whose samples are being read
  local closed = {} -- families another family followed
  local samples = {}
  local function family_of(name)
    if families[name] then return families[name], name end
    for _, suffix in ipairs({ "_bucket", "_count", "_sum" }) do
      local base = name:sub(1, -#suffix - 1)
      if name:sub(-#suffix) == suffix and families[base] and
          (families[base].type == "histogram" or families[base].type == "summary") then
        return families[base], base
      end
    end
    return nil, name
  end
  local n = 0
  for line in text:gmatch("([^\n]*)\n") do
    n = n + 1
    local where = ("line %d: %q"):format(n, line)
    if line:sub(1, 1) == "#" then
      local kind, name, rest = line:match("^# (%u+) ([^ ]+) ?(.*)$")
      if kind == "TYPE" or kind == "HELP" then
        assert(name:match("^[%a_:][%w_:]*$"), "bad metric name in " .. where)
        local f = families[name]
        if not f then
          f = { name = name, samples = {} }
          families[name] = f
          order[#order + 1] = name
        end
        assert(not closed[name], "family comments after its samples ended: " .. where)
        if kind == "TYPE" then
          assert(not f.type, "a second TYPE for " .. name)
          assert(#f.samples == 0, "TYPE after samples: " .. where)
          assert(({ counter = 1, gauge = 1, histogram = 1, summary = 1, untyped = 1 })[rest],
            "unknown type in " .. where)
          f.type = rest
        else
          assert(not f.help, "a second HELP for " .. name)
          assert(not rest:find("\\[^\\n]"), "bad escape in HELP: " .. where)
          f.help = rest
        end
        if current and current ~= name then closed[current] = true end
        current = name
      end
    elseif line ~= "" then
      local name, rest = line:match("^([%a_:][%w_:]*)(.*)$")
      assert(name, "bad sample in " .. where)
      local labels = {}
      if rest:sub(1, 1) == "{" then
        local i = 2
        while rest:sub(i, i) ~= "}" do
          local lname, j = rest:match("^([%a_][%w_]*)=\"()", i)
          assert(lname, "bad label in " .. where)
          local value, k = {}, j
          while true do
            local c = rest:sub(k, k)
            assert(c ~= "", "unterminated label value in " .. where)
            if c == "\\" then
              local e = rest:sub(k + 1, k + 1)
              local map = { ["\\"] = "\\", ['"'] = '"', n = "\n" }
              assert(map[e], "bad escape in label value: " .. where)
              value[#value + 1] = map[e]
              k = k + 2
            elseif c == '"' then
              k = k + 1
              break
            else
              value[#value + 1] = c
              k = k + 1
            end
          end
          assert(labels[lname] == nil, "label given twice in " .. where)
          labels[lname] = table.concat(value)
          i = k
          if rest:sub(i, i) == "," then i = i + 1 end
        end
        rest = rest:sub(i + 1)
      end
      local v, ts = rest:match("^ ([^ ]+) ?(%-?%d*)$")
      assert(v, "bad value part in " .. where)
      local value = ({ ["+Inf"] = math.huge, ["-Inf"] = -math.huge, NaN = 0 / 0 })[v] or tonumber(v)
      assert(value, "bad value in " .. where)
      local f, base = family_of(name)
      assert(f and f.type, "sample before its family's TYPE: " .. where)
      assert(not closed[base], "samples of " .. base .. " are not together: " .. where)
      if current and current ~= base then closed[current] = true end
      current = base
      if f.type == "counter" then assert(value >= 0, "a negative counter: " .. where) end
      local sample = { name = name, labels = labels, value = value }
      f.samples[#f.samples + 1] = sample
      samples[#samples + 1] = sample
    end
  end
  -- histograms: per series (labels but le), cumulative buckets ending +Inf = _count
  for _, name in ipairs(order) do
    local f = families[name]
    if f.type == "histogram" then
      local series = {}
      local function key(labels)
        local parts = {}
        for k, v in pairs(labels) do if k ~= "le" then parts[#parts + 1] = k .. "=" .. v end end
        table.sort(parts)
        return table.concat(parts, ",")
      end
      for _, s in ipairs(f.samples) do
        local k = key(s.labels)
        series[k] = series[k] or { buckets = {} }
        if s.name == name .. "_bucket" then
          local le = s.labels.le
          assert(le, "a bucket without le in " .. name)
          local b = series[k].buckets
          local lev = le == "+Inf" and math.huge or assert(tonumber(le), "bad le " .. le)
          if #b > 0 then
            assert(lev > b[#b].le, name .. "{" .. k .. "}: le not increasing at " .. le)
            assert(s.value >= b[#b].value, name .. "{" .. k .. "}: buckets not cumulative at " .. le)
          end
          b[#b + 1] = { le = lev, value = s.value }
        elseif s.name == name .. "_count" then
          series[k].count = s.value
        end
      end
      for k, sr in pairs(series) do
        local b = sr.buckets
        assert(#b > 0 and b[#b].le == math.huge, name .. "{" .. k .. "}: no +Inf bucket")
        assert(sr.count == b[#b].value, name .. "{" .. k .. "}: +Inf bucket ~= _count")
      end
    end
  end
  local m = { families = families, samples = samples }
  -- The value of the sample `name` whose labels include all of `labels`.
  function m.value(sample_name, want)
    for _, s in ipairs(samples) do
      if s.name == sample_name then
        local match = true
        for k, v in pairs(want or {}) do if s.labels[k] ~= v then match = false end end
        if match then return s.value end
      end
    end
    return nil
  end
  return m
end

-- GET /metrics with token; returns the parsed exposition (hh.parse_metrics),
-- or raises with the status and body.
function hh.metrics(srv, token)
  local status, body, headers = hh.request(srv, "GET", "/metrics", { token = token })
  assert(status == 200, "GET /metrics: " .. tostring(status) .. " " .. tostring(body))
  assert((headers["content-type"] or ""):find("text/plain; version=0.0.4", 1, true),
    "content type " .. tostring(headers["content-type"]))
  return hh.parse_metrics(body), body
end

-- Appends events to a session through the API: returns status, body.
-- events: a list of event tables ({type, payload, id, ...}).
function hh.append(srv, token, session, events, expected)
  return hh.request(srv, "POST", "/v1/sessions/" .. hh.enc(session) .. "/events",
    { token = token, body = { events = events, expected = expected } })
end

-- Reads SSE events from stream s until `n` events (event lines of type
-- `kind`, default "event") arrived or timeout seconds passed; returns the
-- list (possibly shorter).
function hh.sse_take(s, n, timeout, kind)
  local got = {}
  local deadline = helpers.wall() + (timeout or 10)
  while #got < n do
    local left = deadline - helpers.wall()
    if left <= 0 then break end
    local ev = s:next(left)
    if not ev then break end
    if ev.event == "error" and kind ~= "error" then
      error("the stream sent an error: " .. json.encode(ev.data), 2)
    end
    if ev.event == (kind or "event") then got[#got + 1] = ev end
  end
  return got
end

-- ---------------------------------------------------------------------
-- Conformance helpers (spec/81-http_api_spec.lua, spec/82-http_tenants_spec.lua)

-- The --db URL for one server from a backend URL template of
-- helpers.urls(): "memory:" as is (the server's own memory store), nil for
-- any sqlite: template (hh.serve then makes a fresh file in its own
-- directory), a fresh schema for postgres.
function hh.backend_db(template)
  if template:match("^memory:") then return "memory:" end
  if template:match("^sqlite:") then return nil end
  if template:match("^postgres") then return helpers.pg_fresh_url(template) end
  return template
end

-- Whether the test process can open the server's database beside it
-- (SQLite file, PostgreSQL schema; not memory:), e.g. to make a fork,
-- which HTTP does not offer.
function hh.shared_db(srv)
  return not srv.db:match("^memory:")
end

-- A scripts directory made for a server before it starts: files maps a
-- path under the directory ("reducers/count.lua") to its text. Returns
-- the directory (remove it with hh.rm).
function hh.scripts(files)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. helpers.sh_quote(dir .. "/handlers") .. " " ..
    helpers.sh_quote(dir .. "/reducers")))
  for rel, text in pairs(files or {}) do
    local sub = rel:match("^(.*)/[^/]*$")
    if sub then assert(os.execute("mkdir -p " .. helpers.sh_quote(dir .. "/" .. sub))) end
    helpers.write_file(dir .. "/" .. rel, text)
  end
  return dir
end

function hh.rm(dir)
  if dir and dir ~= "" and dir ~= "/" then os.execute("rm -rf " .. helpers.sh_quote(dir)) end
end

-- A server on one backend template (hh.backend_db), otherwise as hh.serve.
function hh.serve_on(template, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.db = hh.backend_db(template)
  return hh.serve(o)
end

-- A server on one backend template (hh.serve_on) with what every route
-- may need: an engine whose scripts directory has hh.SUM_REDUCER as
-- reducers/count.lua (unless opts.scripts names one), an archive directory
-- and a master key file (`--archive`, `--keys`, both in srv.extra). Stop
-- it with hh.stop_full, which removes them too.
function hh.serve_full(template, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  local own_scripts = not o.scripts
  if own_scripts then o.scripts = hh.scripts({ ["reducers/count.lua"] = hh.SUM_REDUCER }) end
  local extra = os.tmpname()
  os.remove(extra)
  assert(os.execute("mkdir -p " .. helpers.sh_quote(extra)))
  local args = { "--archive", extra .. "/archive", "--keys", extra .. "/master.key" }
  for _, a in ipairs(o.args or {}) do args[#args + 1] = a end
  o.args = args
  local srv = hh.serve_on(template, o)
  srv.extra = extra
  srv.own_scripts = own_scripts and o.scripts or nil
  return srv
end

function hh.stop_full(srv)
  if not srv then return end
  hh.stop_clean(srv)
  hh.rm(srv.own_scripts)
  hh.rm(srv.extra)
end

-- "/v1/sessions/<s>" plus more segments, each percent-encoded (numbers
-- as they are).
function hh.spath(session, ...)
  local parts = { "/v1/sessions/" .. hh.enc(session) }
  for _, seg in ipairs({ ... }) do parts[#parts + 1] = hh.enc(seg) end
  return table.concat(parts, "/")
end

-- Builds a query string from an array of {name, value} pairs (values
-- percent-encoded); "" when empty.
function hh.query(pairs_)
  local out = {}
  for _, kv in ipairs(pairs_) do out[#out + 1] = hh.enc(kv[1]) .. "=" .. hh.enc(kv[2]) end
  return #out > 0 and ("?" .. table.concat(out, "&")) or ""
end

-- Asserts an error answer: the status, the body {code, message} with
-- `code` (when given) and a non-empty message, and nothing else than
-- those two fields. `what` names the request in the failure message.
-- `extra` lists further fields the body may carry (REF_CONFLICT's
-- expected and actual).
function hh.check_error(status, code, st, body, what, extra)
  what = what or "request"
  local shown = type(body) == "table" and json.encode(body) or tostring(body)
  assert(st == status, ("%s: expected status %d, got %s: %s"):format(what, status, tostring(st), shown))
  assert(type(body) == "table", ("%s: error body is not JSON: %s"):format(what, shown))
  if code then
    assert(body.code == code, ("%s: expected code %s, got %s"):format(what, code, shown))
  end
  assert(type(body.code) == "string" and body.code ~= "", what .. ": no code: " .. shown)
  assert(type(body.message) == "string" and body.message ~= "", what .. ": no message: " .. shown)
  for k in pairs(body) do
    local allowed = k == "code" or k == "message"
    for _, x in ipairs(extra or {}) do allowed = allowed or k == x end
    assert(allowed, ("%s: unexpected error field %s: %s"):format(what, k, shown))
  end
end

-- Asserts a 2xx answer and returns the body; `what` names the request.
function hh.check_ok(st, body, what)
  local shown = type(body) == "table" and json.encode(body) or tostring(body)
  assert(type(st) == "number" and st >= 200 and st < 300,
    ("%s: expected success, got %s: %s"):format(what or "request", tostring(st), shown))
  return body
end

-- Appends through HTTP and returns the decoded answer (asserting success).
function hh.append_ok(srv, token, session, events, extra)
  local body = { events = events }
  for k, v in pairs(extra or {}) do body[k] = v end
  local st, b = hh.post(srv, token, hh.spath(session, "events"), body)
  return hh.check_ok(st, b, "append to " .. session)
end

-- A session's events through HTTP (GET .../events, one page: the
-- server's default limit unless query says) and the raw answer text, and
-- the whole answer ({events, through}).
function hh.events(srv, token, session, query)
  local st, b, _, text = hh.get(srv, token, hh.spath(session, "events") .. (query or ""))
  hh.check_ok(st, b, "read " .. session)
  return b.events, text, b
end

-- A session's head through HTTP.
function hh.head(srv, token, session)
  local st, b = hh.get(srv, token, hh.spath(session, "head"))
  hh.check_ok(st, b, "head of " .. session)
  return b.head
end

-- Sends a request whose body may be refused before it is all sent (over
-- the body limit): the body goes in 64 KiB pieces and a send error stops
-- sending (the server may answer and close early); then the answer is
-- read. Returns status (nil when the server closed without one), decoded
-- body, and the raw answer text.
function hh.send_large(srv, method, path, token, body)
  local c = connect(srv, 20)
  local head = { ("%s %s HTTP/1.1"):format(method, path), ("Host: %s:%d"):format(srv.host, srv.port),
    "Connection: close", "Content-Type: application/json", "Content-Length: " .. #body }
  if token then head[#head + 1] = "Authorization: Bearer " .. token end
  c:send(table.concat(head, "\r\n") .. "\r\n\r\n")
  local i = 1
  while i <= #body do
    local ok = c:send(body, i, math.min(#body, i + 65535))
    if not ok then break end
    i = i + 65536
  end
  local all, _, partial = c:receive("*a")
  c:close()
  local text = all or partial or ""
  local status = math.tointeger(tonumber(text:match("^HTTP/1%.%d (%d%d%d)")))
  local payload = text:match("\r\n\r\n(.*)$") or ""
  local ok, decoded = pcall(json.decode, payload)
  return status, ok and decoded or payload, text
end

-- The server's resident set in KiB (VmRSS of /proc/PID/status): the
-- attack specs' measure of what a client made it hold.
function hh.rss_kib(srv)
  local text = assert(helpers.read_file(("/proc/%d/status"):format(srv.proc.pid)))
  return assert(math.tointeger(tonumber(text:match("VmRSS:%s*(%d+)"))))
end

-- Runs fn(srv) on a fresh server (opts as hh.serve), then stops it and
-- asserts it exited 0 (hh.stop_clean); a failing fn stops it and raises.
function hh.with_server(opts, fn)
  local srv = hh.serve(opts)
  local ok, err = pcall(fn, srv)
  if not ok then
    hh.stop(srv)
    error(err, 0)
  end
  hh.stop_clean(srv)
end

-- A throwaway certificate authority and a server certificate it signed
-- for 127.0.0.1 and localhost, made with openssl in a fresh directory
-- (`make deps` installs openssl): {dir, ca, cert, key, spki}. ca is the
-- CA's certificate (curl --cacert trusts it), cert and key the server's
-- (serve --tls-cert, --tls-key; the key mode 0600), spki the base64
-- SHA-256 of the server's public key (Chromium's
-- --ignore-certificate-errors-spki-list). Remove dir with hh.rm.
function hh.tls_files()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. helpers.sh_quote(dir)))
  local t = { dir = dir, ca = dir .. "/ca.pem", cert = dir .. "/cert.pem", key = dir .. "/key.pem" }
  helpers.write_file(dir .. "/ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    .. "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
  local newkey = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
  local script = table.concat({
    "set -e; cd " .. helpers.sh_quote(dir),
    "umask 077",
    "openssl req -x509 " .. newkey .. " -keyout ca.key -out ca.pem -days 2 -subj '/CN=eventstore spec CA'"
      .. " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign",
    "openssl req " .. newkey .. " -keyout key.pem -out cert.csr -subj /CN=127.0.0.1",
    "openssl x509 -req -in cert.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cert.pem -days 2 -extfile ext",
    "openssl x509 -in cert.pem -pubkey -noout | openssl pkey -pubin -outform der"
      .. " | openssl dgst -sha256 -binary | openssl base64 -A > spki",
  }, "\n")
  local p = assert(io.popen("sh -c " .. helpers.sh_quote(script) .. " 2>&1"))
  local out = p:read("a")
  local ok = p:close()
  assert(ok, "openssl could not make the test certificates (make deps installs openssl):\n" .. out)
  t.spki = assert(helpers.read_file(dir .. "/spki")):match("^%s*(.-)%s*$")
  return t
end

-- Runs curl (`make deps` installs it) with args (a list of words) and
-- returns its exit code, the status, the headers (lower-case names; nil
-- when no answer came), the body and curl's stderr.
function hh.curl(args)
  local base = os.tmpname()
  local words = { "curl", "-sS", "-D", base .. ".head", "-o", base .. ".body" }
  for _, a in ipairs(args) do words[#words + 1] = a end
  for i, w in ipairs(words) do words[i] = helpers.sh_quote(w) end
  local p = assert(io.popen(table.concat(words, " ") .. " 2>" .. helpers.sh_quote(base .. ".err")
    .. "; echo $?"))
  local rc = math.tointeger(tonumber(p:read("a"):match("(%d+)%s*$")))
  p:close()
  local head = helpers.read_file(base .. ".head") or ""
  local body = helpers.read_file(base .. ".body")
  local err = helpers.read_file(base .. ".err") or ""
  for _, f in ipairs({ base, base .. ".head", base .. ".body", base .. ".err" }) do os.remove(f) end
  local status = math.tointeger(tonumber(head:match("^HTTP/[%d%.]+ (%d%d%d)")))
  local headers
  if status then
    headers = {}
    for k, v in head:gmatch("\n([^:\r\n]+):%s*([^\r\n]*)") do headers[k:lower()] = v end
  end
  return rc, status, headers, body, err
end

-- Stops a server (SIGTERM), removes its directory and asserts it exited 0:
-- under AddressSanitizer (make check-sanitize) a leak or a memory error
-- in the server shows as a non-zero exit, with its log's tail.
function hh.stop_clean(srv)
  if not srv or srv.stopped then return end
  local rc = hh.stop(srv, nil, true)
  local log = ph.tail(srv.log, 40)
  hh.rm(srv.dir)
  assert(rc == 0, ("the server exited %s:\n%s"):format(tostring(rc), log))
end

return hh
