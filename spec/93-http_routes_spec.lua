-- spec/93-http_routes_spec.lua: the §3.7-§3.10 routes of §6 over real HTTP
-- (docs/http-api.md "Branches, fences, leases, seals" and "Retention,
-- archive, shredding"): fork, fence, lease, release, seal, snapshots,
-- truncate, DELETE session, archive, segments and shred. Each with its
-- exact answer (the Lua face's, as JSON), its right (403 without it), 409
-- for STALE_FENCE and SEALED, and 4xx for bad input that changes nothing
-- (read back after each refusal). One server per backend (helpers.urls()),
-- with an engine (a reducer, so truncate keeps state readable), an
-- archive directory and a master key file. Tenant scoping of these routes
-- is spec/82's. Every answer is checked against the OpenAPI document's
-- schema for its route at the end (spec/openapi_helpers.lua).
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")
local oh = require("openapi_helpers")

local json = eventstore.json
local ADMIN = "admin-token"
local RW = "root-rw" -- every tenant, every right but admin
local READ = "root-read"
local TOKENS = { { RW, "*", "read,append,work" }, { READ, "*", "read" } }
for _, t in ipairs(hh.TOKENS) do TOKENS[#TOKENS + 1] = t end

local function shown(v) return type(v) == "table" and json.encode(v) or tostring(v) end

local function keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

for _, template in ipairs(helpers.urls()) do
  describe("HTTP §3.7-§3.10 routes on " .. template, function()
    local srv, records
    local serial = 0
    local function name(p)
      serial = serial + 1
      return ("%s-%d"):format(p, serial)
    end

    setup(function()
      srv = hh.serve_full(template, { tokens = TOKENS })
      records = oh.record()
    end)
    teardown(function()
      oh.stop()
      hh.stop_full(srv)
    end)

    local function post(token, session, what, body)
      return hh.post(srv, token, hh.spath(session, what), body)
    end

    -- settled `add` events with payload {v = ...}, one per value
    local function adds(session, ...)
      local evs = {}
      for i, v in ipairs({ ... }) do evs[i] = { type = "add", payload = { v = v }, settled = true } end
      return hh.append_ok(srv, ADMIN, session, evs)
    end

    -- The session's row as GET /v1/sessions shows it (nil when none).
    local function row(session)
      local st, b = hh.get(srv, ADMIN, "/v1/sessions" .. hh.query({ { "prefix", session }, { "limit", "1" } }))
      hh.check_ok(st, b, "sessions")
      local r = b.sessions[1]
      return r and r.session == session and r or nil
    end

    -- Every refused request of `cases` ({token, body, status, code}) on
    -- POST .../{what} leaves `view()` as it was.
    local function refused(session, what, cases, view)
      for i, c in ipairs(cases) do
        local before = view()
        local st, b = post(c[1], session, what, c[2])
        hh.check_error(c[3], c[4], st, b, ("%s case %d %s"):format(what, i, shown(c[2])))
        assert.same(before, view(), ("%s case %d changed something"):format(what, i))
      end
    end

    describe("POST /v1/sessions/{s}/fork", function()
      it("answers the lineage record and copies events 1..at (admin)", function()
        local from, to = name("f-from"), name("f-to")
        adds(from, 1, 2, 3)
        local st, b = post(ADMIN, from, "fork", { at = 2, to = to })
        hh.check_ok(st, b, "fork")
        assert.same({ "at", "created_at", "parent", "session" }, keys(b))
        assert.equal(to, b.session)
        assert.equal(from, b.parent)
        assert.equal(2, b.at)
        assert.equal("integer", math.type(b.created_at))
        local evs = hh.events(srv, ADMIN, to)
        assert.same({ 1, 2 }, helpers.pluck(evs, "index"))
        assert.same({ session = from, index = 1 }, evs[1].origin)
        assert.same({ v = 2 }, evs[2].payload)
        local _, lin = hh.get(srv, ADMIN, hh.spath(to, "lineage"))
        assert.same(b, lin.lineage)
        assert.equal(3, hh.head(srv, ADMIN, from)) -- the fork does not change from
      end)

      it("refuses bad input with 4xx and creates nothing", function()
        local from, to, full = name("fb-from"), name("fb-to"), name("fb-full")
        adds(from, 1, 2)
        adds(full, 9)
        local function view()
          return { hh.head(srv, ADMIN, to), hh.head(srv, ADMIN, full), hh.head(srv, ADMIN, from) }
        end
        refused(from, "fork", {
          { RW, { at = 1, to = to }, 403, "FORBIDDEN" },
          { ADMIN, "null", 400, "INVALID_ARGUMENT" },
          { ADMIN, { to = to }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { at = 1 }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { at = "1", to = to }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { at = 1.5, to = to }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { at = 1, to = to, into = to }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { at = 1, to = "" }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { at = 3, to = to }, 404, "NO_SUCH_EVENT" },
          { ADMIN, { at = 1, to = full }, 400, "INVALID_ARGUMENT" },
        }, view)
        local st, b = post(ADMIN, name("fb-missing"), "fork", { at = 0, to = to })
        hh.check_error(404, "NOT_FOUND", st, b, "fork of a missing session")
        assert.equal(0, hh.head(srv, ADMIN, to))
      end)
    end)

    describe("POST /v1/sessions/{s}/fence", function()
      it("hands out increasing tokens; if_token is a compare-and-set (409 STALE_FENCE)", function()
        local s = name("fence")
        local st, b = post(ADMIN, s, "fence", nil)
        hh.check_ok(st, b, "fence")
        assert.same({ token = 1 }, b)
        st, b = post(ADMIN, s, "fence", {})
        assert.same({ token = 2 }, b)
        st, b = post(ADMIN, s, "fence", { if_token = 1 })
        hh.check_error(409, "STALE_FENCE", st, b, "stale if_token")
        assert.equal(2, row(s).fence)
        st, b = post(ADMIN, s, "fence", { if_token = 2 })
        hh.check_ok(st, b, "fence if_token 2")
        assert.same({ token = 3 }, b)
        -- a write fenced with an older token is refused, the current one passes
        st, b = post(ADMIN, s, "events", { events = { { type = "x" } }, fence = 2 })
        hh.check_error(409, "STALE_FENCE", st, b, "append with a stale fence")
        hh.append_ok(srv, ADMIN, s, { { type = "x", settled = true } }, { fence = 3 })
      end)

      it("refuses bad input with 4xx and moves no token", function()
        local s = name("fence-bad")
        post(ADMIN, s, "fence", {})
        refused(s, "fence", {
          { RW, {}, 403, "FORBIDDEN" },
          { ADMIN, { if_token = "1" }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { if_tokn = 1 }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { 1 }, 400, "INVALID_ARGUMENT" },
        }, function() return row(s).fence end)
      end)
    end)

    describe("POST /v1/sessions/{s}/lease and .../release", function()
      it("one live lease per session; release ends it only for its holder and token (work)", function()
        local s = name("lease")
        local st, a = post(RW, s, "lease", { holder = "w-1", ttl_ms = 3600000 })
        hh.check_ok(st, a, "lease")
        assert.same({ "expires_at", "holder", "outcome", "token" }, keys(a))
        assert.equal("acquired", a.outcome)
        assert.equal("w-1", a.holder)
        assert.equal("integer", math.type(a.token))
        local st2, h = post(RW, s, "lease", { holder = "w-2", ttl_ms = 3600000 })
        hh.check_ok(st2, h, "lease held")
        assert.same({ outcome = "held", holder = "w-1", expires_at = a.expires_at }, h)
        -- the same holder renews and keeps its token
        local _, again = post(RW, s, "lease", { holder = "w-1", ttl_ms = 3600000 })
        assert.equal("acquired", again.outcome)
        assert.equal(a.token, again.token)
        local _, r = post(RW, s, "release", { holder = "w-2", token = a.token })
        assert.same({ released = false }, r)
        assert.equal("w-1", row(s).lease.holder)
        _, r = post(RW, s, "release", { holder = "w-1", token = a.token + 1 })
        assert.same({ released = false }, r)
        _, r = post(RW, s, "release", { holder = "w-1", token = a.token })
        assert.same({ released = true }, r)
        assert.is_nil(row(s).lease)
        local _, b = post(RW, s, "lease", { holder = "w-2", ttl_ms = 3600000 })
        assert.equal("acquired", b.outcome)
        assert.equal("w-2", b.holder)
      end)

      it("refuses bad input with 4xx and takes or ends no lease", function()
        local s = name("lease-bad")
        local _, a = post(RW, s, "lease", { holder = "w-1", ttl_ms = 3600000 })
        local function view() return row(s).lease end
        refused(s, "lease", {
          { READ, { holder = "w-2", ttl_ms = 1000 }, 403, "FORBIDDEN" },
          { RW, nil, 400, "INVALID_ARGUMENT" },
          { RW, { holder = "w-2" }, 400, "INVALID_ARGUMENT" },
          { RW, { ttl_ms = 1000 }, 400, "INVALID_ARGUMENT" },
          { RW, { holder = "w-1", ttl_ms = 0 }, 400, "INVALID_ARGUMENT" },
          { RW, { holder = "w-1", ttl_ms = -5 }, 400, "INVALID_ARGUMENT" },
          { RW, { holder = 7, ttl_ms = 1000 }, 400, "INVALID_ARGUMENT" },
          { RW, { holder = "w-1", ttl_ms = 1000, token = 1 }, 400, "INVALID_ARGUMENT" },
        }, view)
        refused(s, "release", {
          { READ, { holder = "w-1", token = a.token }, 403, "FORBIDDEN" },
          { RW, { holder = "w-1" }, 400, "INVALID_ARGUMENT" },
          { RW, { token = a.token }, 400, "INVALID_ARGUMENT" },
          { RW, { holder = "w-1", token = tostring(a.token) }, 400, "INVALID_ARGUMENT" },
          { RW, { holder = "w-1", token = a.token, ttl_ms = 1 }, 400, "INVALID_ARGUMENT" },
        }, view)
        assert.equal("w-1", view().holder)
      end)
    end)

    describe("POST /v1/sessions/{s}/seal", function()
      it("seals (appends 409 SEALED), twice is a no-op, the row shows it (admin)", function()
        local s = name("seal")
        adds(s, 1)
        local st, b = post(ADMIN, s, "seal", { reason = "lost to plane" })
        hh.check_ok(st, b, "seal")
        assert.same({ sealed = true }, b)
        st, b = post(ADMIN, s, "events", { events = { { type = "x" } } })
        hh.check_error(409, "SEALED", st, b, "append to a sealed session")
        assert.equal(1, hh.head(srv, ADMIN, s))
        st, b = post(ADMIN, s, "seal", {})
        assert.same({ sealed = true }, b)
        local r = row(s)
        assert.is_true(r.sealed)
        assert.equal("lost to plane", r.seal_reason) -- the first reason stays
      end)

      it("refuses bad input with 4xx and seals nothing", function()
        local s = name("seal-bad")
        adds(s, 1)
        refused(s, "seal", {
          { RW, {}, 403, "FORBIDDEN" },
          { ADMIN, { reason = 5 }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { why = "x" }, 400, "INVALID_ARGUMENT" },
          { ADMIN, "[", 400, "INVALID_ARGUMENT" },
        }, function() return row(s).sealed end)
        assert.is_false(row(s).sealed)
        hh.append_ok(srv, ADMIN, s, { { type = "x", settled = true } })
      end)
    end)

    describe("POST /v1/sessions/{s}/truncate and GET .../snapshots", function()
      it("drops 1..through, keeps state readable by a snapshot, lists it (admin / read)", function()
        local s = name("trunc")
        adds(s, 1, 2, 3)
        local st, b = hh.get(srv, READ, hh.spath(s, "snapshots"))
        hh.check_ok(st, b, "snapshots")
        assert.same({ snapshots = {} }, b)
        st, b = post(ADMIN, s, "truncate", { through = 2 })
        hh.check_ok(st, b, "truncate")
        assert.same({ first_index = 3 }, b)
        st, b = hh.get(srv, ADMIN, hh.spath(s, "events"))
        hh.check_error(410, "TRUNCATED", st, b, "read below the truncation")
        local evs = hh.events(srv, ADMIN, s, "?after=2")
        assert.same({ 3 }, helpers.pluck(evs, "index"))
        assert.equal(3, hh.head(srv, ADMIN, s))
        assert.equal(3, row(s).first_index)
        st, b = hh.get(srv, READ, hh.spath(s, "state", "count"))
        hh.check_ok(st, b, "state after truncate")
        assert.same({ state = { n = 3, sum = 6 }, index = 3 }, b)
        st, b = hh.get(srv, READ, hh.spath(s, "snapshots"))
        hh.check_ok(st, b, "snapshots after truncate")
        -- by reducer name, as store:snapshots (the engine's truncate also
        -- keeps a "<reducer>@truncated" row: docs/retention.md)
        assert.same({ "count", "count@truncated" }, helpers.pluck(b.snapshots, "reducer"), shown(b))
        local sn = b.snapshots[1]
        assert.same({ "index", "reducer", "updated_at", "version" }, keys(sn))
        assert.equal("count", sn.reducer)
        assert.is_true(sn.index >= 2, shown(sn))
        -- a retried truncate (its answer lost) answers the same
        st, b = post(ADMIN, s, "truncate", { through = 2 })
        hh.check_ok(st, b, "truncate again")
        assert.same({ first_index = 3 }, b)
        -- below the floor: nothing left to drop, the same answer, as
        -- engine:truncate and store:truncate give (docs/http-api.md)
        st, b = post(ADMIN, s, "truncate", { through = 1 })
        hh.check_ok(st, b, "truncate below the floor")
        assert.same({ first_index = 3 }, b)
        assert.equal(3, row(s).first_index)
        st, b = hh.get(srv, READ, hh.spath(s, "state", "count"))
        hh.check_ok(st, b, "state after a truncate below the floor")
        assert.same({ state = { n = 3, sum = 6 }, index = 3 }, b)
      end)

      it("refuses a pending event in the range, bad bodies and other rights with 4xx; drops nothing", function()
        local s = name("trunc-bad")
        hh.append_ok(srv, ADMIN, s, { { type = "add", payload = { v = 1 }, settled = true }, { type = "job" },
          { type = "add", payload = { v = 2 }, settled = true } })
        local function view() return #hh.events(srv, ADMIN, s) end
        refused(s, "truncate", {
          { RW, { through = 1 }, 403, "FORBIDDEN" },
          { ADMIN, {}, 400, "INVALID_ARGUMENT" },
          { ADMIN, { through = "1" }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { through = 1, at = 1 }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { through = 2 }, 400, "INVALID_ARGUMENT" }, -- event 2 is pending
          { ADMIN, { through = 4 }, 404, "NO_SUCH_EVENT" },
        }, view)
        assert.equal(3, view())
      end)
    end)

    describe("DELETE /v1/sessions/{s}", function()
      it("removes the session and the refs naming it; again answers deleted = false (admin)", function()
        local s = name("del")
        adds(s, 1, 2)
        hh.check_ok(hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(s .. "-ref"), { session = s }))
        local st, b = hh.delete(srv, RW, hh.spath(s))
        hh.check_error(403, "FORBIDDEN", st, b, "delete without admin")
        assert.equal(2, hh.head(srv, ADMIN, s))
        st, b = hh.delete(srv, ADMIN, hh.spath(s))
        hh.check_ok(st, b, "delete")
        assert.same({ deleted = true }, b)
        assert.equal(0, hh.head(srv, ADMIN, s))
        assert.is_nil(row(s))
        st, b = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(s .. "-ref"))
        hh.check_error(404, "NOT_FOUND", st, b, "the ref naming a deleted session")
        st, b = hh.delete(srv, ADMIN, hh.spath(s))
        assert.same({ deleted = false }, b)
        -- its name can be used again
        assert.equal(1, adds(s, 7).events[1].index)
      end)
    end)

    describe("POST /v1/sessions/{s}/archive and GET .../segments", function()
      it("moves processed events into a segment; reads stay transparent (admin / read)", function()
        local s = name("arch")
        local stored = adds(s, 1, 2, 3).events
        local st, b = post(ADMIN, s, "archive", { through = 2 })
        hh.check_ok(st, b, "archive")
        local g = b.segment
        assert.same({ "bytes", "checksum", "count", "created_at", "file", "from", "through" }, keys(g))
        assert.same({ 1, 2, 2 }, { g.from, g.through, g.count })
        assert.truthy(g.checksum:match("^%x+$") and #g.checksum == 64, g.checksum)
        assert.is_true(g.bytes > 0)
        assert.is_nil(g.file:find("^/"), "a segment's file is relative: " .. g.file)
        st, b = post(ADMIN, s, "archive", { through = 2 })
        hh.check_ok(st, b, "archive again")
        assert.same({ segment = json.null }, b) -- idempotent
        st, b = hh.get(srv, READ, hh.spath(s, "segments"))
        hh.check_ok(st, b, "segments")
        assert.same({ segments = { g } }, b)
        assert.same(stored, hh.events(srv, ADMIN, s)) -- exactly as stored
        local _, arch = hh.get(srv, READ, "/v1/archived?limit=1000")
        local found
        for _, r in ipairs(arch.sessions) do if r.session == s then found = r end end
        assert.same({ session = s, archived_through = 2 }, found)
      end)

      it("refuses a pending event in the range, bad bodies and other rights with 4xx; writes no segment", function()
        local s = name("arch-bad")
        hh.append_ok(srv, ADMIN, s, { { type = "add", payload = { v = 1 }, settled = true }, { type = "job" } })
        local function view()
          local _, b = hh.get(srv, READ, hh.spath(s, "segments"))
          return b
        end
        refused(s, "archive", {
          { RW, { through = 1 }, 403, "FORBIDDEN" },
          { ADMIN, nil, 400, "INVALID_ARGUMENT" },
          { ADMIN, { through = true }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { through = 1, compact = true }, 400, "INVALID_ARGUMENT" },
          { ADMIN, { through = 2 }, 400, "INVALID_ARGUMENT" }, -- event 2 is pending
          { ADMIN, { through = 3 }, 404, "NO_SUCH_EVENT" },
        }, view)
        assert.same({ segments = {} }, view())
      end)
    end)

    describe("POST /v1/keys/{name}/shred", function()
      it("destroys the key: its payloads read as shredded; again answers false (admin)", function()
        local s, key = name("vault"), name("customer")
        hh.append_ok(srv, ADMIN, s, { { type = "card", key = key, payload = { pan = "4111" }, settled = true } })
        assert.same({ pan = "4111" }, hh.events(srv, ADMIN, s)[1].payload)
        local path = "/v1/keys/" .. hh.enc(key) .. "/shred"
        local st, b = hh.post(srv, RW, path, {})
        hh.check_error(403, "FORBIDDEN", st, b, "shred without admin")
        st, b = hh.post(srv, ADMIN, path, { key = key })
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "shred with an unknown field")
        assert.same({ pan = "4111" }, hh.events(srv, ADMIN, s)[1].payload)
        st, b = hh.request(srv, "POST", path, { token = ADMIN })
        hh.check_ok(st, b, "shred")
        assert.same({ shredded = true }, b)
        local e = hh.events(srv, ADMIN, s)[1]
        assert.equal(json.null, e.payload)
        assert.is_true(e.shredded)
        assert.equal(key, e.key)
        st, b = hh.post(srv, ADMIN, path, {})
        assert.same({ shredded = false }, b)
      end)
    end)

    it("every answer above met the OpenAPI document's schema for its route", function()
      local failures, n = oh.check(records)
      assert.same({}, failures)
      assert.is_true(n >= 100, n)
    end)
  end)
end
