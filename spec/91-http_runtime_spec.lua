-- spec/91-http_runtime_spec.lua: the routes of issue 28 (docs/http-api.md,
-- docs/contract.md §6) over real HTTP: POST /v1/events (§3.1 append_many,
-- every batch or none), POST .../events/{i}/cancel and complete with
-- cancel (§3.2), GET /v1/archived (§3.9), and the lineage in ref answers
-- (§3.7). Each route
-- with its right, tenant scoping, exact answers, and 4xx for bad input
-- that changes nothing. One server per backend (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")
local oh = require("openapi_helpers")

local json = eventstore.json
local ADMIN = "admin-token"
-- the default tokens and a work-only one of tenant acme
local TOKENS = { { "acme-work", "acme", "work" } }
for _, t in ipairs(hh.TOKENS) do TOKENS[#TOKENS + 1] = t end

local function shown(v) return type(v) == "table" and json.encode(v) or tostring(v) end

for _, template in ipairs(helpers.urls()) do
  describe("HTTP runtime routes on " .. template, function()
    local srv, records
    local serial = 0
    local function name(p)
      serial = serial + 1
      return ("%s-%d"):format(p, serial)
    end

    setup(function()
      srv = hh.serve_on(template, { no_engine = true, tokens = TOKENS, args = { "--max-batch", "20" } })
      records = oh.record()
    end)
    teardown(function()
      oh.stop()
      hh.stop(srv)
    end)

    -- A session's events as the admin sees them (all of them).
    local function read(session, token)
      local st, b = hh.get(srv, token or ADMIN, hh.spath(session, "events"))
      return hh.check_ok(st, b, "read " .. session).events
    end

    describe("POST /v1/events", function()
      it("appends every batch in one call and answers per batch", function()
        local a, b = name("am-a"), name("am-b")
        hh.append_ok(srv, ADMIN, b, { { type = "old" } })
        local st, body = hh.post(srv, ADMIN, "/v1/events", { batches = {
          { session = a, events = { { type = "x", payload = { n = 1 } }, { type = "y", settled = true } } },
          { session = b, events = { { type = "z", id = name("id") } }, expected = 1 },
        } })
        hh.check_ok(st, body, "append_many")
        assert.equal(2, #body.batches)
        assert.same({ 1, 2 }, { body.batches[1].events[1].index, body.batches[1].events[2].index })
        assert.same({ n = 1 }, body.batches[1].events[1].payload)
        assert.is_true(body.batches[1].pending)
        assert.equal(2, body.batches[2].events[1].index)
        assert.equal(b, body.batches[2].events[1].session)
        assert.equal(2, #read(a))
        assert.equal(2, #read(b))
      end)

      it("answers each batch's ids under \"answer\": \"ids\", and refuses another answer", function()
        local a, b = name("ids-a"), name("ids-b")
        local st, body = hh.post(srv, ADMIN, "/v1/events", { answer = "ids", batches = {
          { session = a, events = { { type = "x", id = name("given") }, { type = "y", settled = true } } },
          { session = b, events = json.array({}) },
        } })
        hh.check_ok(st, body, "append_many answering ids")
        local stored = read(a)
        assert.same({ { ids = { stored[1].id, stored[2].id }, pending = true }, { ids = {}, pending = false } },
          body.batches)
        -- a tenant's token gets its own names of the ids
        local mine = name("mine")
        st, body = hh.post(srv, "acme-rw", "/v1/events", { answer = "ids", batches = {
          { session = a, events = { { type = "x", id = mine } } } } })
        hh.check_ok(st, body, "tenant append_many answering ids")
        assert.same({ mine }, body.batches[1].ids)
        for _, bad in ipairs({ "rows", 1, { "ids" } }) do
          st, body = hh.post(srv, ADMIN, "/v1/events", { answer = bad, batches = {
            { session = name("ids-bad"), events = { { type = "x" } } } } })
          hh.check_error(400, "INVALID_ARGUMENT", st, body, "answer " .. json.encode(bad))
          assert.truthy(body.message:find("answer", 1, true), body.message)
        end
        assert.equal(2, #read(a))
      end)

      it("a refused batch in the middle leaves nothing written (409 for the head)", function()
        local a, b, c = name("at-a"), name("at-b"), name("at-c")
        hh.append_ok(srv, ADMIN, b, { { type = "old" } })
        local st, body = hh.post(srv, ADMIN, "/v1/events", { batches = {
          { session = a, events = { { type = "x" } } },
          { session = b, events = { { type = "y" } }, expected = 0 },
          { session = c, events = { { type = "z" } } },
        } })
        hh.check_error(409, "WRONG_EXPECTED_HEAD", st, body, "stale head")
        assert.truthy(body.message:find("batches[2]", 1, true), body.message)
        assert.same({}, read(a))
        assert.equal(1, #read(b))
        assert.same({}, read(c))
      end)

      it("refuses bad bodies with 4xx and writes nothing", function()
        local s = name("bad")
        local cases = {
          { { events = {} }, 400 },
          { { batches = { session = s, events = {} } }, 400 },
          { { batches = { { session = s } } }, 400 },
          { { batches = { { events = { { type = "x" } } } } }, 400 },
          { { batches = { { session = s, events = { { type = "x" } }, extra = 1 } } }, 400 },
          { { batches = { { session = s, events = { { type = "x" } }, expected = -1 } } }, 400 },
          { { batches = { { session = s, events = { { type = "x" } } }, "no" } }, 400 },
          { { batches = { { session = s, events = { { type = "x" } } }, { session = "", events = { { type = "x" } } } } }, 400 },
          { { batches = { { session = s, events = { { type = "" } } } } }, 400 },
        }
        for _, c in ipairs(cases) do
          local st, body = hh.post(srv, ADMIN, "/v1/events", c[1])
          hh.check_error(c[2], nil, st, body, json.encode(c[1]))
        end
        -- over the server's batch limit, in all
        local many = {}
        for i = 1, 21 do many[i] = { type = "x" } end
        local st, body = hh.post(srv, ADMIN, "/v1/events", { batches = {
          { session = s, events = { many[1] } }, { session = s, events = { table.unpack(many, 1, 20) } } } })
        hh.check_error(413, "TOO_LARGE", st, body, "over max_batch in all")
        assert.same({}, read(s))
      end)

      it("needs the append right, and a tenant's token writes the tenant's sessions", function()
        local s = name("tn")
        local st, body = hh.post(srv, "acme-read", "/v1/events", { batches = { { session = s, events = { { type = "x" } } } } })
        hh.check_error(403, nil, st, body, "read-only token")
        st, body = hh.post(srv, nil, "/v1/events", { batches = { { session = s, events = { { type = "x" } } } } })
        hh.check_error(401, nil, st, body, "no token")
        st, body = hh.post(srv, "acme-rw", "/v1/events", { batches = { { session = s, events = { { type = "x" } } } } })
        hh.check_ok(st, body, "tenant append_many")
        assert.equal(s, body.batches[1].events[1].session)
        assert.equal(1, #read(s, "acme-rw"))
        assert.same({}, read(s, "globex-rw"))
        assert.equal(1, #read("acme\31" .. s))
        assert.same({}, read(s))
      end)
    end)

    describe("POST /v1/sessions/{s}/events/{i}/cancel", function()
      it("cancels a pending event with the work right and answers {event}", function()
        local s = name("cx")
        hh.append_ok(srv, ADMIN, s, { { type = "order" }, { type = "remind", delay_ms = 60000 } })
        local st, body = hh.post(srv, "acme-read", hh.spath(s, "events", 2, "cancel"), { reason = "paid" })
        hh.check_error(403, nil, st, body, "read-only token")
        st, body = hh.post(srv, ADMIN, hh.spath(s, "events", 2, "cancel"), { reason = "paid" })
        hh.check_ok(st, body, "cancel")
        assert.equal("processed", body.event.status)
        assert.equal("paid", body.event.cancelled)
        assert.is_nil(body.event.last_error)
        assert.equal("paid", read(s)[2].cancelled)
        -- again: the same answer, nothing changes
        local st2, again = hh.post(srv, ADMIN, hh.spath(s, "events", 2, "cancel"), {})
        hh.check_ok(st2, again, "cancel again")
        assert.same(body.event, again.event)
        -- no body: the default reason
        st, body = hh.post(srv, ADMIN, hh.spath(s, "events", 1, "cancel"))
        assert.equal("cancelled", hh.check_ok(st, body, "cancel").event.cancelled)
      end)

      it("refuses a live-claimed event, a missing index and bad bodies, changing nothing", function()
        local s = name("cy")
        hh.append_ok(srv, "acme-rw", s, { { type = "x" } })
        local st, body = hh.post(srv, "acme-work", "/v1/claims", { holder = "h", ttl_ms = 3600000, limit = 100 })
        hh.check_ok(st, body, "claim")
        local before = json.encode(read(s, "acme-rw"))
        st, body = hh.post(srv, "acme-work", hh.spath(s, "events", 1, "cancel"), {})
        hh.check_error(400, "INVALID_ARGUMENT", st, body, "claimed")
        assert.truthy(body.message:find("claimed", 1, true), body.message)
        st, body = hh.post(srv, "acme-work", hh.spath(s, "events", 5, "cancel"), {})
        hh.check_error(404, "NO_SUCH_EVENT", st, body, "missing")
        st, body = hh.post(srv, "acme-work", hh.spath(s, "events", 1, "cancel"), { why = "x" })
        hh.check_error(400, "INVALID_ARGUMENT", st, body, "unknown field")
        st, body = hh.post(srv, "acme-work", hh.spath(s, "events", 1, "cancel"), { reason = 5 })
        hh.check_error(400, "INVALID_ARGUMENT", st, body, "reason not text")
        -- another tenant's token does not reach it
        st, body = hh.post(srv, "globex-rw", hh.spath(s, "events", 1, "cancel"), {})
        hh.check_error(404, "NO_SUCH_EVENT", st, body, "other tenant")
        assert.equal(before, json.encode(read(s, "acme-rw")))
      end)
    end)

    describe("POST .../complete with cancel", function()
      it("cancels with the completion and answers not_cancelled", function()
        local s = name("cc")
        hh.append_ok(srv, "acme-rw", s, { { type = "pay" }, { type = "remind", delay_ms = 600000 },
          { type = "done", settled = true } })
        local st, body = hh.post(srv, "acme-work", "/v1/claims", { holder = "h", ttl_ms = 3600000, limit = 100 })
        hh.check_ok(st, body, "claim")
        local attempt
        for _, e in ipairs(body.events) do if e.session == s then attempt = e.attempt end end
        assert.is_not_nil(attempt)
        -- a bad cancel list changes nothing
        st, body = hh.post(srv, "acme-work", hh.spath(s, "events", 1, "complete"), { attempt = attempt,
          cancel = { "2" } })
        hh.check_error(400, "INVALID_ARGUMENT", st, body, "cancel not an index")
        st, body = hh.post(srv, "acme-work", hh.spath(s, "events", 1, "complete"), { attempt = attempt,
          cancel = { { index = 2, why = "x" } } })
        hh.check_error(400, "INVALID_ARGUMENT", st, body, "unknown field in a cancel")
        assert.equal("pending", read(s, "acme-rw")[1].status)
        assert.equal("pending", read(s, "acme-rw")[2].status)
        st, body = hh.post(srv, "acme-work", hh.spath(s, "events", 1, "complete"), { attempt = attempt,
          cancel = { { index = 2, reason = "paid" }, 3, 8 } })
        hh.check_ok(st, body, "complete with cancel")
        assert.equal("completed", body.outcome)
        assert.same({ 3, 8 }, body.not_cancelled)
        assert.equal("paid", read(s, "acme-rw")[2].cancelled)
      end)
    end)

    describe("GET /v1/archived", function()
      it("lists the token's tenant's archived sessions with the read right", function()
        local st, body, _, text = hh.get(srv, "globex-rw", "/v1/archived")
        hh.check_ok(st, body, "archived")
        assert.truthy(text:find('"sessions":[]', 1, true), text)
        assert.truthy(text:find('"cursor":null', 1, true), text)
        st, body = hh.get(srv, nil, "/v1/archived")
        hh.check_error(401, nil, st, body, "no token")
        st, body = hh.get(srv, ADMIN, "/v1/archived?limit=0")
        hh.check_error(400, "INVALID_ARGUMENT", st, body, "limit 0")
        -- sqlite: the test archives beside the server's file (the default place both use)
        if not template:match("^sqlite:") then return end
        local s1, s2 = name("ar-a"), name("ar-b")
        hh.append_ok(srv, "acme-rw", s1, { { type = "a", settled = true }, { type = "b", settled = true } })
        hh.append_ok(srv, "acme-rw", s2, { { type = "a", settled = true } })
        local store = eventstore.open(srv.db)
        store:archive("acme\31" .. s1, { through = 2 })
        store:archive("acme\31" .. s2, { through = 1 })
        store:close()
        st, body = hh.get(srv, "acme-read", "/v1/archived?limit=1")
        hh.check_ok(st, body, "archived page 1")
        assert.same({ { session = s1, archived_through = 2 } }, body.sessions)
        assert.equal(s1, body.cursor)
        st, body = hh.get(srv, "acme-read", "/v1/archived?after=" .. hh.enc(body.cursor))
        hh.check_ok(st, body, "archived page 2")
        assert.same({ { session = s2, archived_through = 1 } }, body.sessions)
        st, body = hh.get(srv, "globex-rw", "/v1/archived")
        assert.same({}, hh.check_ok(st, body, "other tenant").sessions)
      end)
    end)

    describe("refs carry the lineage", function()
      -- the fork is made over HTTP, so this runs on the server's own memory: store too
      it("GET /v1/refs/{name} shows parent and at of a forked session, null when not forked", function()
        local src, dst, r1, r2 = name("src"), name("dst"), name("ref"), name("ref")
        hh.append_ok(srv, ADMIN, src, { { type = "a", settled = true }, { type = "b", settled = true } })
        hh.check_ok(hh.post(srv, ADMIN, hh.spath(src, "fork"), { at = 1, to = dst }))
        hh.check_ok(hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(r1), { session = dst }))
        hh.check_ok(hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(r2), { session = src }))
        local st, body, _, text = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(r1))
        hh.check_ok(st, body, "get_ref")
        assert.equal(src, body.parent, shown(body))
        assert.equal(1, body.at)
        st, body, _, text = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(r2))
        hh.check_ok(st, body, "get_ref")
        assert.truthy(text:find('"parent":null', 1, true), text)
        assert.truthy(text:find('"at":null', 1, true), text)
      end)
    end)

    -- every answer of the routes above against the OpenAPI document
    -- (spec/openapi_helpers.lua): its schema for the route, or Error
    it("every answer met the OpenAPI document's schema for its route", oh.checks(function() return records end))
  end)
end
