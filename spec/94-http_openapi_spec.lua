-- spec/94-http_openapi_spec.lua: GET /v1/openapi.json (§6; docs/http-api.md
-- "OpenAPI"). The document is served without a token, exactly as built
-- from core/http/openapi.json; its schemas are valid JSON Schema 2020-12;
-- and a client made from the document alone (paths, parameter examples,
-- request body examples, which operations need a token) reaches every
-- route of it on every backend, each answer valid against the document's
-- schema for it. That the document and the server's route table list the
-- same routes is spec/c/http_openapi_test.c's (it reads the table).
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")
local oh = require("openapi_helpers")

local json = eventstore.json
local ADMIN = "admin-token"

local function shown(v) return type(v) == "table" and json.encode(v) or tostring(v) end

-- The operations of the document, in the order the generated client
-- calls them: reads, then writes, deletes last (a delete's example must
-- not remove what a later example needs), each group by path.
local function operations(doc)
  local rank = { get = 1, put = 2, post = 2, delete = 3 }
  local ops = {}
  for tpl, item in pairs(doc.paths) do
    for method, op in pairs(item) do
      ops[#ops + 1] = { path = tpl, method = method, op = op }
    end
  end
  table.sort(ops, function(a, b)
    if rank[a.method] ~= rank[b.method] then return rank[a.method] < rank[b.method] end
    if a.path ~= b.path then return a.path < b.path end
    return a.method < b.method
  end)
  return ops
end

-- The request the document describes: the path with each {param}'s
-- example (percent-encoded), the query parameters that have a non-empty
-- example, the body example, a token when the operation has security.
local function request_of(o)
  local params = {}
  for _, p in ipairs(o.op.parameters or {}) do params[#params + 1] = p end
  local path = o.path:gsub("{([^}]+)}", function(name)
    for _, p in ipairs(params) do
      if p["in"] == "path" and p.name == name then return hh.enc(tostring(p.example)) end
    end
    error(("%s %s: no example for path parameter %s"):format(o.method, o.path, name))
  end)
  local q = {}
  for _, p in ipairs(params) do
    if p["in"] == "query" and p.example ~= nil and p.example ~= "" then q[#q + 1] = { p.name, tostring(p.example) } end
  end
  local body
  local rb = o.op.requestBody
  if rb then body = rb.content["application/json"].example end
  local token = #o.op.security > 0 and ADMIN or nil
  local stream = o.op.responses["200"].content["text/event-stream"] ~= nil
  return { method = o.method:upper(), path = path .. hh.query(q), body = body, token = token, stream = stream }
end

describe("GET /v1/openapi.json", function()
  local srv
  setup(function() srv = hh.serve({ no_engine = true }) end)
  teardown(function() hh.stop(srv) end)

  it("is served without a token, exactly the document the server was built with", function()
    local st, b, h = hh.get(srv, nil, "/v1/openapi.json")
    hh.check_ok(st, b, "openapi.json")
    assert.truthy((h["content-type"] or ""):find("application/json", 1, true), h["content-type"])
    assert.equal("3.1.0", b.openapi)
    assert.same(oh.document(), b)
  end)

  it("names the bearer scheme, and each operation its right and whether it needs the token", function()
    local doc = oh.document()
    assert.same({ type = "http", scheme = "bearer" }, doc.components.securitySchemes.bearer)
    local rights = { none = true, read = true, append = true, work = true, admin = true }
    for tpl, item in pairs(doc.paths) do
      for method, op in pairs(item) do
        local what = method .. " " .. tpl
        assert(rights[op["x-right"]], what .. ": x-right " .. shown(op["x-right"]))
        assert.equal(op["x-right"] == "none" and 0 or 1, #op.security, what)
        assert(type(op.operationId) == "string", what .. ": operationId")
        assert(op.responses["200"] and op.responses.default, what .. ": responses")
      end
    end
  end)

  it("holds only valid JSON Schema 2020-12 schemas", function()
    local pointers = oh.schema_pointers()
    assert.is_true(#pointers > 50, #pointers)
    local failures = oh.run({ document = oh.document(), schemas = pointers })
    assert.same({}, failures)
    -- the checker can fail: a schema of a wrong type is caught
    local bad = oh.document()
    bad = json.decode(json.encode(bad))
    bad.components.schemas.Error.properties.code = { type = "strng" }
    local caught = oh.run({ document = bad, schemas = { "#/components/schemas/Error" } })
    assert.equal(1, #caught, shown(caught))
  end)
end)

for _, template in ipairs(helpers.urls()) do
  describe("a client made from /v1/openapi.json alone on " .. template, function()
    local srv, records, scripts

    setup(function()
      -- the projections the examples name: by_session (keyed), totals
      -- (one state), failing_a and failing_b (stopped at a "boom" event
      -- until retried or skipped)
      local failing = 'return { boom = function() error("boom") end }'
      scripts = hh.scripts({
        ["reducers/count.lua"] = hh.SUM_REDUCER,
        ["projections/by_session.lua"] = [[
return { key = function(e) return e.session end,
         add = function(s, e) s.n = (s.n or 0) + 1 end }]],
        ["projections/totals.lua"] = "return { add = function(s, e) s.n = (s.n or 0) + 1 end }",
        ["projections/failing_a.lua"] = failing,
        ["projections/failing_b.lua"] = failing,
      })
      srv = hh.serve_full(template, { scripts = scripts })
      records = oh.record()
    end)
    teardown(function()
      oh.stop()
      hh.stop_full(srv)
      hh.rm(scripts)
    end)

    it("reaches every route with the document's own examples; every answer meets its schema", function()
      local _, doc = hh.get(srv, nil, "/v1/openapi.json")
      -- what the examples name: session order-1 with settled `add` events
      -- 1 and 2 (the count reducer folds them; 2 under the key shred
      -- destroys), dead letters 3 and 4 (revive, settle), a timer 5 not yet
      -- due (cancel); a ref; a session to delete
      hh.append_ok(srv, ADMIN, "order-1", { { type = "add", payload = { v = 1 }, settled = true },
        { type = "add", payload = { v = 2 }, settled = true, key = "customer-7" },
        { type = "job" }, { type = "job" }, { type = "reminder", not_before = 1 << 50 } })
      local st, c = hh.post(srv, ADMIN, "/v1/claims", { holder = "seed", ttl_ms = 60000, limit = 2, types = { "job" } })
      assert.same({ 3, 4 }, helpers.pluck(hh.check_ok(st, c, "seed claim").events, "index"))
      for _, i in ipairs({ 3, 4 }) do
        local fst, f = hh.post(srv, ADMIN, hh.spath("order-1", "events", i, "fail"), { attempt = 1, error = "x", max_failures = 1 })
        assert.equal("dead_lettered", hh.check_ok(fst, f, "seed fail").outcome)
      end
      hh.check_ok(hh.put(srv, ADMIN, "/v1/refs/main", { session = "order-1" }))
      hh.append_ok(srv, ADMIN, "order-gone", { { type = "x", settled = true } })
      -- retry and skip need a failed projection: wait until both met "boom"
      hh.append_ok(srv, ADMIN, "fail-1", { { type = "boom", settled = true } })
      helpers.wait_until(function()
        local pst, pb = hh.get(srv, ADMIN, "/v1/projections")
        local failed = 0
        for _, row in ipairs(pst == 200 and pb.projections or {}) do
          if row.status == "failed" then failed = failed + 1 end
        end
        return failed == 2
      end, "failing_a and failing_b to stop at the boom event")
      local reached, ok2xx, failed = 0, 0, {}
      local ops = operations(doc)
      for _, o in ipairs(ops) do
        local req = request_of(o)
        local what = req.method .. " " .. req.path
        local st, b
        if req.stream then
          local s
          s, st, b = hh.sse(srv, req.path, { token = req.token, timeout = 5 })
          if s then
            st = 200
            s:close()
          end
        else
          st, b = hh.request(srv, req.method, req.path, { token = req.token, body = req.body })
        end
        assert(st, what .. ": no answer")
        -- reached: not the server's "no such path" 404 nor a 405
        local unknown = st == 404 and type(b) == "table" and tostring(b.message):find("^no such path")
        assert(not unknown and st ~= 405, what .. ": not a route: " .. tostring(st) .. " " .. shown(b))
        reached = reached + 1
        if st >= 200 and st < 300 then ok2xx = ok2xx + 1 else failed[#failed + 1] = what .. " -> " .. st .. " " .. shown(b) end
      end
      assert.equal(#ops, reached)
      -- the examples are meant to succeed, in this order, on a store seeded as above
      assert.same({}, failed)
      assert.is_true(ok2xx >= 40, ok2xx)
    end)

    it("every answer recorded met the document's schema", function()
      local failures, n = oh.check(records)
      assert.same({}, failures)
      assert.is_true(n >= 40, n)
      -- and the check can fail: an answer with a field the schema does not know
      local bad = { { method = "GET", path = "/v1/sessions/x/head", status = 200,
        ctype = "application/json", text = '{"head":1,"tail":2}' } }
      local caught = oh.check(bad)
      assert.equal(1, #caught, shown(caught))
    end)
  end)
end
