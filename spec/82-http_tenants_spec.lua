-- spec/82-http_tenants_spec.lua: tenant isolation over HTTP (docs/contract.md §3.11,
-- §6; docs/tenants.md). Tenant acme's data is made through acme's tokens;
-- then every JSON route is tried with tenant globex's tokens (globex-rw:
-- read, append, work; globex-admin: admin): nothing of acme's is readable
-- (no answer holds acme's secret text or one of acme's event positions),
-- writes land in globex's own namespace, and acme's whole view (read back
-- through acme's tokens after each attempt) never changes. Names come back
-- unprefixed; the `*` token sees both tenants under the stored names
-- (`acme\x1forders`); a `%1F` in a tenant's name stays inside the tenant.
-- The §3.7-§3.10 routes (fork, fences, leases, seals, snapshots, truncate,
-- delete, archive, segments, shred) are tried too: the server has an
-- archive directory and a master key, and acme has a lease, fences, a
-- segment and a sealed payload for globex to reach for.
--
-- One server per backend (helpers.urls()); SSE streams and /metrics have
-- their own specs.
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")

local json = eventstore.json
local null = json.null

local SEP = "\31"
local ADMIN = "admin-token"

local TOKENS = {}
for _, t in ipairs(hh.TOKENS) do TOKENS[#TOKENS + 1] = t end
TOKENS[#TOKENS + 1] = { "globex-admin", "globex", "admin" }

local REDUCER = hh.SUM_REDUCER

local function shown(v) return type(v) == "table" and json.encode(v) or tostring(v) end

-- The answer to another tenant's state request: nothing of acme's events
-- folded (an empty fold of the session the token names, or 404).
local function assert_no_fold(st, b)
  if st == 200 then
    assert.equal(0, b.index)
    assert.same({ n = 0, sum = 0 }, b.state)
  else
    assert.equal(404, st, shown(b))
  end
end

for _, template in ipairs(helpers.urls()) do
  describe("HTTP tenant isolation on " .. template, function()
    local srv, scripts
    -- unique per run, so a hit cannot come from an earlier run's data
    local SECRET = ("acme-secret-%d-%d"):format(os.time(), math.random(1, 1 << 30))
    local acme_positions = {} -- position -> true, for every event of acme
    local acme_lease -- acme's lease on its ledger

    -- acme's events (all sessions) in position order.
    local function acme_events()
      local st, b = hh.get(srv, "acme-read", "/v1/events?limit=1000")
      hh.check_ok(st, b, "acme read_all")
      return b.events
    end

    local function note_acme_positions()
      for _, e in ipairs(acme_events()) do acme_positions[e.position] = true end
    end

    -- Everything acme can see, as raw answer texts (stats: its counts, not
    -- its call counters, which every request moves).
    local function acme_view()
      local paths = {
        "/v1/sessions/orders/events", "/v1/sessions/ledger/events", "/v1/sessions/work/events",
        "/v1/sessions/work/head", "/v1/sessions/ledger/state/count",
        "/v1/sessions", "/v1/events", "/v1/dead-letters", "/v1/refs", "/v1/refs/main",
        "/v1/refs/acme-only", "/v1/presence/room", "/v1/sessions/ledger/children",
        "/v1/sessions/ledger-fork/lineage", "/v1/sessions/vault/events", "/v1/sessions/orders/segments",
        "/v1/sessions/ledger/snapshots", "/v1/archived",
      }
      local view = {}
      for _, path in ipairs(paths) do
        local st, _, _, text = hh.get(srv, "acme-read", path)
        view[#view + 1] = path .. " -> " .. tostring(st) .. " " .. tostring(text)
      end
      local st, b = hh.get(srv, "acme-read", "/v1/stats")
      hh.check_ok(st, b, "acme stats")
      view[#view + 1] = ("stats: events %s pending %s dead %s sessions %s"):format(
        tostring(b.events), tostring(b.pending), tostring(b.dead), tostring(b.sessions))
      return table.concat(view, "\n")
    end

    -- Walks a decoded answer: no event of acme's (by position) anywhere.
    local function no_acme_event(v, what)
      if type(v) ~= "table" then return end
      if math.type(v.position) == "integer" and v.type ~= nil then
        assert(not acme_positions[v.position], what .. ": holds acme's event " .. shown(v))
      end
      for _, x in pairs(v) do no_acme_event(x, what) end
    end

    -- A request as globex: the answer holds nothing of acme's. Returns
    -- status, body, headers, text.
    local function gx(token, method, path, body)
      local st, b, h, text = hh.request(srv, method, path, { token = token, body = body })
      local what = ("%s %s as %s"):format(method, path, token)
      assert(st, what .. ": no answer")
      assert(not tostring(text):find(SECRET, 1, true), what .. ": answer holds acme's secret: " .. tostring(text))
      no_acme_event(b, what)
      return st, b, h, text
    end

    -- Asserts a globex attempt on acme's event was not effective: a 404
    -- NO_SUCH_EVENT (acme's index does not exist in globex's session), or
    -- for work calls a superseded/empty answer.
    local function not_found_event(st, b, what)
      hh.check_error(404, "NO_SUCH_EVENT", st, b, what)
    end

    setup(function()
      scripts = hh.scripts({ ["reducers/count.lua"] = REDUCER })
      srv = hh.serve_full(template, { scripts = scripts, tokens = TOKENS })
      -- acme's data, through acme's tokens
      hh.append_ok(srv, "acme-rw", "orders", { { id = "o-1", type = "placed", payload = { secret = SECRET }, settled = true },
        { type = "placed", payload = { n = 2 }, settled = true } })
      hh.append_ok(srv, "acme-rw", "ledger", { { type = "add", payload = { v = 2, note = SECRET }, settled = true },
        { type = "add", payload = { v = 5 }, settled = true } })
      -- work: 1 dead letter, 2 claimed by acme's worker, 3 pending and ready
      hh.append_ok(srv, "acme-rw", "work", { { id = "j-1", type = "job", payload = { secret = SECRET } } })
      local st, c = hh.post(srv, "acme-rw", "/v1/claims", { holder = "acme-w", ttl_ms = 3600000, limit = 1 })
      hh.check_ok(st, c, "acme claim")
      assert(c.events[1].index == 1, shown(c))
      local st2, f = hh.post(srv, "acme-rw", "/v1/sessions/work/events/1/fail",
        { attempt = 1, error = "boom " .. SECRET, max_failures = 1 })
      hh.check_ok(st2, f, "acme fail")
      assert(f.outcome == "dead_lettered", shown(f))
      hh.append_ok(srv, "acme-rw", "work", { { id = "j-2", type = "job", payload = { secret = SECRET } } })
      local _, c2 = hh.post(srv, "acme-rw", "/v1/claims", { holder = "acme-w", ttl_ms = 3600000, limit = 1 })
      assert(c2.events[1].index == 2, shown(c2))
      hh.append_ok(srv, "acme-rw", "work", { { id = "j-3", type = "job", payload = { secret = SECRET } } })
      -- refs and presence
      hh.check_ok(hh.put(srv, "acme-admin", "/v1/refs/main", { session = "orders" }))
      hh.check_ok(hh.put(srv, "acme-admin", "/v1/refs/acme-only", { session = "ledger" }))
      hh.check_ok(hh.put(srv, "acme-rw", "/v1/presence/room/alice", { values = { secret = SECRET }, ttl_ms = 3600000 }))
      -- a fork of acme's ledger; fences and a live lease on it; a segment
      -- of its orders; a payload sealed under its data key card-1
      hh.check_ok(hh.post(srv, "acme-admin", "/v1/sessions/ledger/fork", { at = 1, to = "ledger-fork" }))
      hh.check_ok(hh.post(srv, "acme-admin", "/v1/sessions/ledger/fence", {}))
      hh.check_ok(hh.post(srv, "acme-admin", "/v1/sessions/ledger/fence", {}))
      local st3, lease = hh.post(srv, "acme-rw", "/v1/sessions/ledger/lease", { holder = "acme-w", ttl_ms = 3600000 })
      acme_lease = hh.check_ok(st3, lease, "acme lease")
      assert(acme_lease.token == 3, shown(acme_lease))
      hh.append_ok(srv, "acme-rw", "vault", { { type = "card", key = "card-1", payload = { secret = SECRET }, settled = true } })
      note_acme_positions()
      -- after noting its position: read_all reads live rows only (docs/retention.md)
      local st4, seg = hh.post(srv, "acme-admin", "/v1/sessions/orders/archive", { through = 1 })
      assert(hh.check_ok(st4, seg, "acme archive").segment ~= null, shown(seg))
    end)

    teardown(function()
      hh.rm(scripts)
      hh.stop_full(srv)
    end)

    it("acme sees its own data with unprefixed names", function()
      local evs = acme_events()
      for _, e in ipairs(evs) do
        assert.is_nil(e.session:find(SEP, 1, true), shown(e))
        assert.is_nil(e.id:find(SEP, 1, true), shown(e))
      end
      local _, orders = hh.get(srv, "acme-read", "/v1/sessions/orders/events")
      assert.equal("o-1", orders.events[1].id)
      assert.equal("orders", orders.events[1].session)
      assert.equal(SECRET, orders.events[1].payload.secret)
      local _, ls = hh.get(srv, "acme-read", "/v1/sessions?limit=1")
      assert.equal("ledger", ls.sessions[1].session)
      assert.equal("ledger", ls.cursor)
      local _, all = hh.get(srv, "acme-read", "/v1/sessions")
      assert.same({ "ledger", "ledger-fork", "orders", "vault", "work" }, helpers.pluck(all.sessions, "session"))
      local _, ref = hh.get(srv, "acme-read", "/v1/refs/main")
      assert.equal("main", ref.name)
      assert.equal("orders", ref.session)
      assert.equal(2, ref.head)
      local _, refs = hh.get(srv, "acme-read", "/v1/refs")
      assert.same({ "acme-only", "main" }, helpers.pluck(refs.refs, "name"))
      local _, dl = hh.get(srv, "acme-read", "/v1/dead-letters")
      assert.same({ "work" }, helpers.pluck(dl.events, "session"))
      assert.equal("j-1", dl.events[1].id)
      local _, pr = hh.get(srv, "acme-read", "/v1/presence/room")
      assert.equal(1, #pr.rows)
      assert.equal(SECRET, pr.rows[1].value)
      local _, state = hh.get(srv, "acme-read", "/v1/sessions/ledger/state/count")
      assert.same({ n = 2, sum = 7 }, state.state)
      local _, stats = hh.get(srv, "acme-read", "/v1/stats")
      -- stats counts orders/1 in its segment too; read_all reads live rows only
      assert.equal(#evs + 1, stats.events)
      -- error messages name acme's names without the prefix too
      local st, err = hh.post(srv, "acme-admin", "/v1/sessions/work/events/99/revive", {})
      hh.check_error(404, "NO_SUCH_EVENT", st, err, "acme revive of a missing index")
      assert.truthy(err.message:find("'work'", 1, true), err.message)
      assert.is_nil(err.message:find(SEP, 1, true), err.message)
      assert.is_nil(err.message:find("acme", 1, true), err.message)
      local _, lin = hh.get(srv, "acme-read", "/v1/sessions/ledger-fork/lineage")
      local rec = lin.lineage
      assert.equal("ledger", rec.parent)
      assert.equal("ledger-fork", rec.session)
      local _, ch = hh.get(srv, "acme-read", "/v1/sessions/ledger/children")
      assert.same({ "ledger-fork" }, helpers.pluck(ch.children, "session"))
      local _, segs = hh.get(srv, "acme-read", "/v1/sessions/orders/segments")
      assert.equal(1, #segs.segments)
      local _, vault = hh.get(srv, "acme-read", "/v1/sessions/vault/events")
      assert.equal(SECRET, vault.events[1].payload.secret)
    end)

    it("every read route as globex shows none of acme's data", function()
      local before = acme_view()
      for _, tok in ipairs({ "globex-rw", "globex-admin" }) do
        for _, s in ipairs({ "orders", "ledger", "work", "ledger-fork" }) do
          local st, b = gx(tok, "GET", hh.spath(s, "events"))
          hh.check_ok(st, b, "globex read " .. s)
          st, b = gx(tok, "GET", hh.spath(s, "head"))
          hh.check_ok(st, b, "globex head " .. s)
          if s ~= "orders" then assert.equal(0, b.head) end -- globex writes only to orders (below)
          st, b = gx(tok, "GET", hh.spath(s, "lineage"))
          hh.check_ok(st, b, "globex lineage " .. s)
          assert.equal(null, b.lineage, shown(b))
          st, b = gx(tok, "GET", hh.spath(s, "children"))
          hh.check_ok(st, b, "globex children " .. s)
          assert.equal(0, #b.children)
        end
        -- state of acme's ledger: no reducer fold of acme's events
        local st, b = gx(tok, "GET", "/v1/sessions/ledger/state/count")
        assert_no_fold(st, b)
        st, b = gx(tok, "GET", "/v1/sessions/ledger/state/count?at=2")
        hh.check_error(404, "NO_SUCH_EVENT", st, b, "globex state of ledger at 2")
        -- listings
        st, b = gx(tok, "GET", "/v1/sessions")
        hh.check_ok(st, b, "globex sessions")
        for _, row in ipairs(b.sessions) do
          assert.is_true(row.session ~= "ledger" and row.session ~= "work" and row.session ~= "ledger-fork", shown(row))
          assert.is_nil(row.session:find("^acme"), shown(row))
        end
        st, b = gx(tok, "GET", "/v1/sessions?prefix=acme")
        assert.equal(0, #b.sessions)
        st, b = gx(tok, "GET", "/v1/events?limit=1000")
        hh.check_ok(st, b, "globex read_all")
        st, b = gx(tok, "GET", "/v1/dead-letters")
        hh.check_ok(st, b, "globex dead letters")
        assert.equal(0, #b.events)
        st, b = gx(tok, "GET", "/v1/dead-letters?session=work")
        assert.equal(0, #b.events)
        st, b = gx(tok, "GET", "/v1/refs/acme-only")
        hh.check_error(404, "NOT_FOUND", st, b, "globex get acme's ref")
        st, b = gx(tok, "GET", "/v1/refs")
        hh.check_ok(st, b, "globex refs")
        for _, r in ipairs(b.refs) do assert.is_true(r.name ~= "acme-only", shown(r)) end
        st, b = gx(tok, "GET", "/v1/presence/room")
        hh.check_ok(st, b, "globex presence")
        for _, row in ipairs(b.rows) do assert.is_true(row.participant ~= "alice" or row.value ~= SECRET) end
        st, b = gx(tok, "GET", "/v1/stats")
        hh.check_ok(st, b, "globex stats")
        local _, gs = gx(tok, "GET", "/v1/sessions")
        local own = 0
        for _, row in ipairs(gs.sessions) do own = own + row.events end
        assert.equal(own, b.events)
      end
      assert.equal(before, acme_view())
    end)

    it("appends as globex land in globex's own session of the same name", function()
      local before = acme_view()
      local acme_head = hh.head(srv, "acme-read", "orders")
      -- the same id as acme's o-1: another event, no ID_CONFLICT
      local st, b = gx("globex-rw", "POST", "/v1/sessions/orders/events",
        { events = { { id = "o-1", type = "placed", payload = { globex = true } } } })
      hh.check_ok(st, b, "globex append")
      local own_head = hh.head(srv, "globex-rw", "orders")
      assert.equal("orders", b.events[1].session)
      assert.equal("o-1", b.events[1].id)
      assert.equal(own_head, b.events[1].index)
      -- expected is globex's head, not acme's
      if own_head ~= acme_head then
        st, b = gx("globex-rw", "POST", "/v1/sessions/orders/events", { events = { { type = "x" } }, expected = acme_head })
        hh.check_error(409, "WRONG_EXPECTED_HEAD", st, b, "globex append expecting acme's head")
      end
      st, b = gx("globex-rw", "POST", "/v1/sessions/orders/events", { events = { { type = "x", settled = true }, { type = "y", settled = true } }, expected = own_head })
      hh.check_ok(st, b, "globex append at its own head")
      -- a cause naming acme's claimed event: not acme's event (NO_SUCH_EVENT, or superseded)
      st, b = gx("globex-rw", "POST", "/v1/sessions/work/events",
        { events = { { type = "x", cause = { index = 2, attempt = 1 } } } })
      assert.is_true(st == 404 or st == 409, shown(b))
      assert.equal(0, hh.head(srv, "globex-rw", "work"))
      assert.equal(before, acme_view())
      -- the root sees globex's event under its stored name, acme's untouched
      local _, root = hh.get(srv, ADMIN, "/v1/sessions/" .. hh.enc("globex" .. SEP .. "orders") .. "/events")
      assert.equal("globex" .. SEP .. "orders", root.events[1].session)
      local _, aroot = hh.get(srv, ADMIN, "/v1/sessions/" .. hh.enc("acme" .. SEP .. "orders") .. "/events")
      assert.equal(SECRET, aroot.events[1].payload.secret)
      assert.equal(acme_head, #aroot.events)
    end)

    it("revive, settle, complete, fail, renew of acme's events as globex are never effective", function()
      local before = acme_view()
      -- work/1 is acme's dead letter, work/2 claimed by acme-w (attempt 1), work/3 pending
      local st, b = gx("globex-admin", "POST", "/v1/sessions/work/events/1/revive", {})
      not_found_event(st, b, "globex revive of acme's dead letter")
      st, b = gx("globex-admin", "POST", "/v1/sessions/work/events/1/settle", { reason = "x" })
      not_found_event(st, b, "globex settle of acme's dead letter")
      for _, idx in ipairs({ 2, 3 }) do
        st, b = gx("globex-rw", "POST", "/v1/sessions/work/events/" .. idx .. "/complete",
          { attempt = 1, events = { { type = "stolen" } } })
        if st == 200 then assert.equal("superseded", b.outcome) else not_found_event(st, b, "globex complete " .. idx) end
        st, b = gx("globex-rw", "POST", "/v1/sessions/work/events/" .. idx .. "/fail",
          { attempt = 1, error = "x", max_failures = 1 })
        if st == 200 then assert.equal("superseded", b.outcome) else not_found_event(st, b, "globex fail " .. idx) end
        st, b = gx("globex-rw", "POST", "/v1/sessions/work/events/" .. idx .. "/renew",
          { holder = "acme-w", attempt = 1, ttl_ms = 7200000 })
        if st == 200 then
          assert.equal(0, #b.renewed, shown(b))
        else
          not_found_event(st, b, "globex renew " .. idx)
        end
      end
      assert.equal(before, acme_view())
      assert.equal(0, hh.head(srv, "globex-rw", "work"))
      -- acme's claim is intact: its owner completes it
      local st2, done = hh.post(srv, "acme-rw", "/v1/sessions/work/events/2/complete", { attempt = 1 })
      hh.check_ok(st2, done, "acme completes its claim")
      assert.equal("completed", done.outcome)
      note_acme_positions()
    end)

    it("claims as globex never hand out acme's events", function()
      local before = acme_view()
      hh.append_ok(srv, "globex-rw", "gjobs", { { type = "job" } })
      local st, b = gx("globex-rw", "POST", "/v1/claims", { holder = "globex-w", ttl_ms = 60000, limit = 100 })
      hh.check_ok(st, b, "globex claim")
      for _, e in ipairs(b.events) do
        assert.is_true(e.session ~= "work", shown(e))
      end
      assert.is_true(#b.events >= 1, shown(b)) -- its own event
      assert.equal(before, acme_view())
      -- acme's ready event is still there for acme, at its first attempt
      local _, mine = hh.post(srv, "acme-rw", "/v1/claims", { holder = "acme-w", ttl_ms = 60000, limit = 10 })
      assert.same({ "j-3" }, helpers.pluck(mine.events, "id"))
      assert.equal(1, mine.events[1].attempt)
      assert.equal("work", mine.events[1].session)
      note_acme_positions()
    end)

    it("refs as globex: its own namespace; acme's refs are never read, moved or deleted", function()
      local before = acme_view()
      local st, b = gx("globex-admin", "POST", "/v1/refs/main/promote", { from = "acme-only" })
      hh.check_error(404, "NOT_FOUND", st, b, "globex promote from acme's ref")
      st, b = gx("globex-admin", "PUT", "/v1/refs/main", { session = "orders" })
      hh.check_ok(st, b, "globex put_ref")
      st, b = gx("globex-rw", "GET", "/v1/refs/main")
      hh.check_ok(st, b, "globex get_ref")
      assert.equal("orders", b.session)
      assert.equal(3, hh.head(srv, "globex-rw", "orders"))
      assert.equal(3, b.head) -- globex's orders (3 events), not acme's (2)
      st, b = gx("globex-admin", "POST", "/v1/refs/main/promote", { from = "main", expect = "ledger" })
      hh.check_error(409, "REF_CONFLICT", st, b, "globex promote expecting acme's target", { "expected", "actual" })
      assert.equal("orders", b.actual) -- globex's own ref, its name unprefixed
      st, b = gx("globex-admin", "POST", "/v1/refs/acme-only/promote", { from = "main", expect = false })
      hh.check_ok(st, b, "globex promote to its own acme-only")
      st, b = gx("globex-admin", "DELETE", "/v1/refs/acme-only")
      hh.check_ok(st, b, "globex delete_ref")
      st, b = gx("globex-admin", "DELETE", "/v1/refs/main")
      hh.check_ok(st, b, "globex delete_ref main")
      assert.equal(before, acme_view())
    end)

    it("presence as globex: its own namespace", function()
      local before = acme_view()
      local st, b = gx("globex-rw", "PUT", "/v1/presence/room/alice", { values = { secret = null, g = 1 }, ttl_ms = 3600000 })
      hh.check_ok(st, b, "globex presence set")
      st, b = gx("globex-rw", "GET", "/v1/presence/room")
      assert.equal(1, #b.rows)
      assert.equal("g", b.rows[1].field)
      assert.equal(before, acme_view())
    end)

    it("fork, fence, lease, release, seal, snapshots, truncate, delete, archive, segments, shred as globex never reach acme's", function()
      local before = acme_view()
      for _, tok in ipairs({ "globex-rw", "globex-admin" }) do
        local st, b = gx(tok, "GET", "/v1/sessions/ledger/snapshots")
        hh.check_ok(st, b, "globex snapshots of ledger")
        assert.same({ snapshots = {} }, b)
        st, b = gx(tok, "GET", "/v1/sessions/orders/segments")
        hh.check_ok(st, b, "globex segments of orders")
        assert.same({ segments = {} }, b)
        st, b = gx(tok, "GET", "/v1/archived")
        hh.check_ok(st, b, "globex archived")
        assert.same({ sessions = {}, cursor = null }, b)
      end
      -- admin routes need globex's admin token, whatever the session
      for _, r in ipairs({ { "/v1/sessions/ledger/fork", { at = 1, to = "stolen" } },
        { "/v1/sessions/ledger/fence", {} }, { "/v1/sessions/orders/seal", {} },
        { "/v1/sessions/orders/truncate", { through = 1 } }, { "/v1/sessions/orders/archive", { through = 1 } },
        { "/v1/keys/card-1/shred", {} } }) do
        local st, b = gx("globex-rw", "POST", r[1], r[2])
        hh.check_error(403, "FORBIDDEN", st, b, "globex-rw " .. r[1])
      end
      local st, b = gx("globex-rw", "DELETE", "/v1/sessions/ledger")
      hh.check_error(403, "FORBIDDEN", st, b, "globex-rw delete")
      -- fork: acme's sessions do not exist for globex
      st, b = gx("globex-admin", "POST", "/v1/sessions/ledger/fork", { at = 1, to = "stolen" })
      hh.check_error(404, "NOT_FOUND", st, b, "globex fork of acme's ledger")
      st, b = gx("globex-admin", "POST", "/v1/sessions/vault/fork", { at = 0, to = "stolen" })
      hh.check_error(404, "NOT_FOUND", st, b, "globex fork of acme's vault")
      assert.equal(0, hh.head(srv, "globex-rw", "stolen"))
      -- fences and leases: globex's own counters, acme's lease unseen
      st, b = gx("globex-admin", "POST", "/v1/sessions/ledger/fence", { if_token = acme_lease.token })
      hh.check_error(409, "STALE_FENCE", st, b, "globex fence with acme's token")
      st, b = gx("globex-admin", "POST", "/v1/sessions/ledger/fence", {})
      hh.check_ok(st, b, "globex fence")
      assert.same({ token = 1 }, b)
      st, b = gx("globex-rw", "POST", "/v1/sessions/ledger/release", { holder = "acme-w", token = acme_lease.token })
      hh.check_ok(st, b, "globex release of acme's lease")
      assert.same({ released = false }, b)
      st, b = gx("globex-rw", "POST", "/v1/sessions/ledger/lease", { holder = "globex-w", ttl_ms = 60000 })
      hh.check_ok(st, b, "globex lease")
      assert.equal("acquired", b.outcome, shown(b))
      assert.equal(2, b.token)
      -- seal, truncate, archive, delete, shred: globex's own names only
      st, b = gx("globex-admin", "POST", "/v1/sessions/vault/seal", { reason = "globex" })
      hh.check_ok(st, b, "globex seal")
      st, b = gx("globex-admin", "POST", "/v1/sessions/ledger/truncate", { through = 1 })
      hh.check_error(404, "NO_SUCH_EVENT", st, b, "globex truncate of acme's ledger")
      st, b = gx("globex-admin", "POST", "/v1/sessions/work/archive", { through = 1 })
      hh.check_error(404, "NO_SUCH_EVENT", st, b, "globex archive of acme's work")
      st, b = gx("globex-admin", "DELETE", "/v1/sessions/ledger-fork")
      hh.check_ok(st, b, "globex delete")
      assert.same({ deleted = false }, b)
      st, b = gx("globex-admin", "POST", "/v1/keys/card-1/shred", {})
      hh.check_ok(st, b, "globex shred")
      assert.same({ shredded = false }, b)
      st, b = gx("globex-admin", "DELETE", "/v1/sessions/ledger")
      hh.check_ok(st, b, "globex delete of its own ledger row")
      assert.equal(before, acme_view())
      -- acme's lease, fences, seal state and key are its own still
      local _, rows = hh.get(srv, "acme-read", "/v1/sessions?prefix=ledger&limit=1")
      assert.same({ holder = "acme-w", token = acme_lease.token, expires_at = acme_lease.expires_at }, rows.sessions[1].lease)
      hh.append_ok(srv, "acme-rw", "vault", { { type = "card", key = "card-1", payload = { n = 2 }, settled = true } })
      local _, vault = hh.get(srv, "acme-read", "/v1/sessions/vault/events")
      assert.same({ secret = SECRET }, vault.events[1].payload)
      note_acme_positions()
    end)

    it("a %1F in a globex name stays inside globex", function()
      local before = acme_view()
      local aw = hh.enc("acme" .. SEP .. "work")
      assert.equal("acme%1Fwork", aw)
      local st, b = gx("globex-rw", "GET", "/v1/sessions/" .. aw .. "/events")
      hh.check_ok(st, b, "globex read acme%1Fwork")
      assert.equal(0, #b.events)
      -- state is folded on the root store under the stored name: acme's ledger must stay out of reach
      st, b = gx("globex-rw", "GET", "/v1/sessions/" .. hh.enc("acme" .. SEP .. "ledger") .. "/state/count")
      assert_no_fold(st, b)
      st, b = gx("globex-rw", "GET", "/v1/sessions/" .. hh.enc("acme" .. SEP .. "ledger") .. "/state/count?at=2")
      hh.check_error(404, "NO_SUCH_EVENT", st, b, "globex state of acme%1Fledger at 2")
      st, b = gx("globex-admin", "POST", "/v1/sessions/" .. aw .. "/events/1/revive", {})
      not_found_event(st, b, "globex revive acme%1Fwork/1")
      st, b = gx("globex-rw", "POST", "/v1/sessions/" .. aw .. "/events", { events = { { type = "x", settled = true } } })
      hh.check_ok(st, b, "globex append to acme%1Fwork")
      assert.equal("acme" .. SEP .. "work", b.events[1].session)
      assert.equal(1, b.events[1].index)
      st, b = gx("globex-rw", "GET", "/v1/refs/" .. hh.enc("acme" .. SEP .. "main"))
      hh.check_error(404, "NOT_FOUND", st, b, "globex get_ref acme%1Fmain")
      st, b = gx("globex-admin", "PUT", "/v1/refs/" .. hh.enc("acme" .. SEP .. "main"), { session = "x" })
      hh.check_ok(st, b, "globex put_ref acme%1Fmain")
      st, b = gx("globex-rw", "PUT", "/v1/presence/" .. hh.enc("acme" .. SEP .. "room") .. "/alice",
        { values = { z = 1 }, ttl_ms = 3600000 })
      hh.check_ok(st, b, "globex presence acme%1Froom")
      st, b = gx("globex-rw", "GET", "/v1/presence/" .. hh.enc("acme" .. SEP .. "room"))
      assert.equal(1, #b.rows)
      assert.equal("z", b.rows[1].field)
      st, b = gx("globex-rw", "GET", "/v1/dead-letters?session=" .. aw)
      assert.equal(0, #b.events)
      st, b = gx("globex-rw", "GET", "/v1/sessions?prefix=" .. hh.enc("acme" .. SEP))
      assert.same({ "acme" .. SEP .. "work" }, helpers.pluck(b.sessions, "session"))
      assert.equal(before, acme_view())
      -- the root shows it under globex's prefix
      local _, root = hh.get(srv, ADMIN, "/v1/sessions/" .. hh.enc("globex" .. SEP .. "acme" .. SEP .. "work") .. "/head")
      assert.equal(1, root.head)
    end)

    it("the * token sees both tenants under their stored names", function()
      local st, b = hh.get(srv, ADMIN, "/v1/sessions?prefix=" .. hh.enc("acme" .. SEP))
      hh.check_ok(st, b, "root sessions")
      local names = helpers.pluck(b.sessions, "session")
      for _, n in ipairs({ "ledger", "orders", "work" }) do
        local found = false
        for _, x in ipairs(names) do found = found or x == "acme" .. SEP .. n end
        assert.is_true(found, "acme\\x1f" .. n .. " not in " .. shown(names))
      end
      local _, g = hh.get(srv, ADMIN, "/v1/sessions?prefix=" .. hh.enc("globex" .. SEP))
      assert.is_true(#g.sessions >= 1, shown(g))
      local _, evs = hh.get(srv, ADMIN, "/v1/sessions/" .. hh.enc("acme" .. SEP .. "work") .. "/events")
      assert.equal("acme" .. SEP .. "work", evs.events[1].session)
      assert.equal(SECRET, evs.events[1].payload.secret)
      local _, refs = hh.get(srv, ADMIN, "/v1/refs?limit=1000")
      local rnames = helpers.pluck(refs.refs, "name")
      local has = false
      for _, n in ipairs(rnames) do has = has or n == "acme" .. SEP .. "main" end
      assert.is_true(has, shown(rnames))
      local _, ref = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc("acme" .. SEP .. "main"))
      assert.equal("acme" .. SEP .. "orders", ref.session)
      local _, dl = hh.get(srv, ADMIN, "/v1/dead-letters")
      local dls = helpers.pluck(dl.events, "session")
      has = false
      for _, n in ipairs(dls) do has = has or n == "acme" .. SEP .. "work" end
      assert.is_true(has, shown(dls))
      local _, pr = hh.get(srv, ADMIN, "/v1/presence/" .. hh.enc("acme" .. SEP .. "room"))
      assert.equal(SECRET, pr.rows[1].value)
      local _, stats = hh.get(srv, ADMIN, "/v1/stats")
      local _, astats = hh.get(srv, "acme-read", "/v1/stats")
      local _, gstats = hh.get(srv, "globex-rw", "/v1/stats")
      assert.equal(astats.events + gstats.events, stats.events)
    end)
  end)
end
