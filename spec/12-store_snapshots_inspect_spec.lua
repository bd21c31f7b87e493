-- Conformance: CONTRACT §3.3 (snapshots) and §3.4 (inspection: sessions,
-- events_page). Runs once per backend URL (helpers.urls()).
local eventstore = require("eventstore")
-- spec/.busted puts spec/ on the path; also work when busted is started
-- without it (e.g. `busted spec` from the repository root).
if not package.searchpath("helpers", package.path) then
  local dir = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
  package.path = dir .. "?.lua;" .. package.path
end
local helpers = require("helpers")

local T0 = helpers.T0
local indexes = helpers.indexes
local pluck = helpers.pluck

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    local function append_n(store, session, n)
      local batch = {}
      for i = 1, n do batch[i] = { type = "t" .. i, payload = { i = i } } end
      return store:append(session, batch)
    end

    -------------------------------------------------------------------------
    describe("§3.3 snapshots", function()
      it("read_state without a snapshot returns every event", function()
        local store = new()
        append_n(store, "s", 3)
        local r = store:read_state("s", "counter")
        assert.is_nil(r.snapshot)
        assert.same({ 1, 2, 3 }, indexes(r.events))
        assert.same({ i = 2 }, r.events[2].payload)
        assert.equal("t3", r.events[3].type)
      end)

      it("read_state of an unknown session is no snapshot and no events", function()
        local store = new()
        local r = store:read_state("nobody", "counter")
        assert.is_nil(r.snapshot)
        assert.same({}, r.events)
      end)

      it("read_state returns the snapshot and only the events after it", function()
        local store = new()
        append_n(store, "s", 5)
        assert.is_true(store:put_snapshot("s", "counter", 3, "state@3", "v1"))
        local r = store:read_state("s", "counter")
        assert.same({ index = 3, state = "state@3", version = "v1" },
          { index = r.snapshot.index, state = r.snapshot.state, version = r.snapshot.version })
        assert.same({ 4, 5 }, indexes(r.events))
        append_n(store, "s", 1)
        assert.same({ 4, 5, 6 }, indexes(store:read_state("s", "counter").events))
      end)

      it("a snapshot at the head leaves no events to fold", function()
        local store = new()
        append_n(store, "s", 2)
        store:put_snapshot("s", "r", 2, "x", "v")
        local r = store:read_state("s", "r")
        assert.equal(2, r.snapshot.index)
        assert.same({}, r.events)
      end)

      it("keeps snapshots per reducer and per session", function()
        local store = new()
        append_n(store, "s", 4)
        append_n(store, "t", 4)
        store:put_snapshot("s", "a", 1, "s-a", "v")
        store:put_snapshot("s", "b", 3, "s-b", "v")
        store:put_snapshot("t", "a", 2, "t-a", "v")
        assert.equal("s-a", store:read_state("s", "a").snapshot.state)
        assert.same({ 2, 3, 4 }, indexes(store:read_state("s", "a").events))
        assert.equal("s-b", store:read_state("s", "b").snapshot.state)
        assert.same({ 4 }, indexes(store:read_state("s", "b").events))
        assert.equal("t-a", store:read_state("t", "a").snapshot.state)
        assert.is_nil(store:read_state("t", "b").snapshot)
        assert.is_nil(store:read_state("s", "c").snapshot)
      end)

      it("never replaces a snapshot with one of a lower index", function()
        local store = new()
        append_n(store, "s", 5)
        assert.is_true(store:put_snapshot("s", "r", 4, "at-4", "v1"))
        assert.is_false(store:put_snapshot("s", "r", 2, "at-2", "v2"))
        local r = store:read_state("s", "r")
        assert.equal(4, r.snapshot.index)
        assert.equal("at-4", r.snapshot.state)
        assert.equal("v1", r.snapshot.version)
        assert.same({ 5 }, indexes(r.events))
      end)

      it("an equal index replaces: a new reducer version lands", function()
        local store, clock = new()
        append_n(store, "s", 3)
        store:put_snapshot("s", "r", 3, "old", "v1")
        clock:advance(10)
        assert.is_true(store:put_snapshot("s", "r", 3, "new", "v2"))
        local r = store:read_state("s", "r")
        assert.equal(3, r.snapshot.index)
        assert.equal("new", r.snapshot.state)
        assert.equal("v2", r.snapshot.version)
        local list = store:snapshots("s")
        assert.equal(1, #list)
        assert.equal("v2", list[1].version)
        assert.equal(T0 + 10, list[1].updated_at)
      end)

      it("a higher index replaces", function()
        local store = new()
        append_n(store, "s", 4)
        store:put_snapshot("s", "r", 1, "one", "v1")
        assert.is_true(store:put_snapshot("s", "r", 4, "four", "v1"))
        local r = store:read_state("s", "r")
        assert.equal(4, r.snapshot.index)
        assert.equal("four", r.snapshot.state)
      end)

      it("keeps state bytes exactly (NUL, 0xFF, invalid UTF-8, empty)", function()
        local store = new()
        append_n(store, "s", 2)
        local bytes = {}
        for b = 0, 255 do bytes[#bytes + 1] = string.char(b) end
        local all = table.concat(bytes) .. "\0\255\0"
        store:put_snapshot("s", "bin", 1, all, "v")
        local got = store:read_state("s", "bin").snapshot.state
        assert.equal(#all, #got)
        assert.equal(all, got)
        store:put_snapshot("s", "empty", 2, "", "v")
        assert.equal("", store:read_state("s", "empty").snapshot.state)
      end)

      it("snapshots(session) lists reducer, index, version and updated_at by reducer name", function()
        local store, clock = new()
        append_n(store, "s", 5)
        clock:set(T0 + 1)
        store:put_snapshot("s", "zeta", 5, "z", "vz")
        clock:set(T0 + 2)
        store:put_snapshot("s", "alpha", 2, "a", "va")
        clock:set(T0 + 3)
        store:put_snapshot("s", "Beta", 3, "b", "vb")
        clock:set(T0 + 4)
        store:put_snapshot("s", "beta", 4, "b", "vb2")
        append_n(store, "other", 1)
        store:put_snapshot("other", "aaa", 1, "o", "v")
        local list = store:snapshots("s")
        assert.same({ "Beta", "alpha", "beta", "zeta" }, pluck(list, "reducer"))
        assert.same({ 3, 2, 4, 5 }, pluck(list, "index"))
        assert.same({ "vb", "va", "vb2", "vz" }, pluck(list, "version"))
        assert.same({ T0 + 3, T0 + 2, T0 + 4, T0 + 1 }, pluck(list, "updated_at"))
      end)

      it("snapshots of a session without any is {}", function()
        local store = new()
        append_n(store, "s", 1)
        assert.same({}, store:snapshots("s"))
        assert.same({}, store:snapshots("nobody"))
      end)

      it("a refused lower snapshot does not touch updated_at", function()
        local store, clock = new()
        append_n(store, "s", 3)
        store:put_snapshot("s", "r", 3, "x", "v")
        clock:advance(99)
        store:put_snapshot("s", "r", 1, "y", "v")
        assert.equal(T0, store:snapshots("s")[1].updated_at)
        assert.equal(3, store:snapshots("s")[1].index)
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.4 sessions", function()
      local function by_name(page)
        local out = {}
        for _, s in ipairs(page.sessions) do out[s.session] = s end
        return out
      end

      it("lists sessions with their counts", function()
        local store, clock = new()
        store:append("s", { { type = "done", settled = true }, { type = "a" }, { type = "b" }, { type = "c" } })
        clock:set(T0 + 10)
        local c = store:claim("s", { holder = "w", ttl_ms = 1000 })
        assert.same({ 2, 3, 4 }, indexes(c.events))
        clock:set(T0 + 20)
        store:complete("s", 2, 1, {})
        clock:set(T0 + 30)
        store:fail("s", 3, 1, { error = "boom", max_failures = 1 })
        local page = store:sessions({})
        assert.equal(1, #page.sessions)
        local info = page.sessions[1]
        assert.equal("s", info.session)
        assert.equal(4, info.events)
        assert.equal(1, info.pending) -- event 4 (claimed, still pending)
        assert.equal(1, info.dead)
        assert.equal(3, info.attempts)
        assert.equal(1, info.failures)
        assert.equal(T0, info.first_at)
        assert.is_true(info.updated_at >= T0 and info.updated_at <= T0 + 30)
        assert.is_nil(page.cursor)
      end)

      it("counts attempts and failures across retries", function()
        local store = new()
        store:append("s", { { type = "a" } })
        for attempt = 1, 3 do
          store:claim("s", { holder = "w", ttl_ms = 1000 })
          store:fail("s", 1, attempt, { error = "x", max_failures = 10 })
        end
        local info = store:sessions({}).sessions[1]
        assert.equal(3, info.attempts)
        assert.equal(3, info.failures)
        assert.equal(1, info.pending)
        assert.equal(0, info.dead)
      end)

      it("first_at is the first event's time, updated_at the last append's", function()
        local store, clock = new()
        clock:set(T0 + 5)
        store:append("s", { { type = "a", settled = true } })
        clock:set(T0 + 50)
        store:append("s", { { type = "b", settled = true } })
        local info = store:sessions({}).sessions[1]
        assert.equal(T0 + 5, info.first_at)
        assert.equal(T0 + 50, info.updated_at)
        assert.equal(2, info.events)
        assert.equal(0, info.pending)
        assert.equal(0, info.dead)
        assert.equal(0, info.attempts)
        assert.equal(0, info.failures)
      end)

      it("lists nothing for an empty store", function()
        local store = new()
        local page = store:sessions({})
        assert.same({}, page.sessions)
        assert.is_nil(page.cursor)
      end)

      it("orders sessions by bytes, not by locale", function()
        local store = new()
        for _, s in ipairs({ "é", "a", "Z", "B", "b", "aa", "A-1", "ß" }) do
          store:append(s, { { type = "t" } })
        end
        local names = pluck(store:sessions({}).sessions, "session")
        assert.same({ "A-1", "B", "Z", "a", "aa", "b", "ß", "é" }, names)
      end)

      it("filters by prefix", function()
        local store = new()
        for _, s in ipairs({ "user/2", "order/1", "user/1", "users", "use", "order/2" }) do
          store:append(s, { { type = "t" } })
        end
        assert.same({ "user/1", "user/2" }, pluck(store:sessions({ prefix = "user/" }).sessions, "session"))
        assert.same({ "use", "user/1", "user/2", "users" }, pluck(store:sessions({ prefix = "use" }).sessions, "session"))
        assert.same({}, store:sessions({ prefix = "zzz" }).sessions)
        assert.equal(6, #store:sessions({ prefix = "" }).sessions)
      end)

      it("treats the prefix literally (no wildcards)", function()
        local store = new()
        for _, s in ipairs({ "a_b", "axb", "a%b", "a%c" }) do
          store:append(s, { { type = "t" } })
        end
        assert.same({ "a_b" }, pluck(store:sessions({ prefix = "a_" }).sessions, "session"))
        assert.same({ "a%b", "a%c" }, pluck(store:sessions({ prefix = "a%" }).sessions, "session"))
      end)

      it("pages with limit and cursor; the cursor is nil on the last page", function()
        local store = new()
        for _, s in ipairs({ "e", "c", "a", "d", "b" }) do store:append(s, { { type = "t" } }) end
        local p1 = store:sessions({ limit = 2 })
        assert.same({ "a", "b" }, pluck(p1.sessions, "session"))
        assert.equal("b", p1.cursor)
        local p2 = store:sessions({ limit = 2, after = p1.cursor })
        assert.same({ "c", "d" }, pluck(p2.sessions, "session"))
        assert.equal("d", p2.cursor)
        local p3 = store:sessions({ limit = 2, after = p2.cursor })
        assert.same({ "e" }, pluck(p3.sessions, "session"))
        assert.is_nil(p3.cursor)
      end)

      it("a page that ends exactly at the last session has no cursor", function()
        local store = new()
        for _, s in ipairs({ "a", "b", "c", "d" }) do store:append(s, { { type = "t" } }) end
        local p1 = store:sessions({ limit = 2 })
        assert.equal("b", p1.cursor)
        local p2 = store:sessions({ limit = 2, after = p1.cursor })
        assert.same({ "c", "d" }, pluck(p2.sessions, "session"))
        assert.is_nil(p2.cursor)
        local whole = store:sessions({ limit = 4 })
        assert.equal(4, #whole.sessions)
        assert.is_nil(whole.cursor)
      end)

      it("after is exclusive and needs not name an existing session", function()
        local store = new()
        for _, s in ipairs({ "a", "b", "c" }) do store:append(s, { { type = "t" } }) end
        assert.same({ "b", "c" }, pluck(store:sessions({ after = "a" }).sessions, "session"))
        assert.same({ "c" }, pluck(store:sessions({ after = "bb" }).sessions, "session"))
        assert.same({}, store:sessions({ after = "c" }).sessions)
      end)

      it("combines prefix and paging", function()
        local store = new()
        for _, s in ipairs({ "x1", "p/1", "p/2", "p/3", "q" }) do store:append(s, { { type = "t" } }) end
        local p1 = store:sessions({ prefix = "p/", limit = 2 })
        assert.same({ "p/1", "p/2" }, pluck(p1.sessions, "session"))
        assert.equal("p/2", p1.cursor)
        local p2 = store:sessions({ prefix = "p/", limit = 2, after = p1.cursor })
        assert.same({ "p/3" }, pluck(p2.sessions, "session"))
        assert.is_nil(p2.cursor)
      end)

      it("defaults limit to 100", function()
        local store = new()
        for i = 1, 101 do store:append(("s%03d"):format(i), { { type = "t", settled = true } }) end
        local p1 = store:sessions({})
        assert.equal(100, #p1.sessions)
        assert.equal("s100", p1.cursor)
        local p2 = store:sessions({ after = p1.cursor })
        assert.same({ "s101" }, pluck(p2.sessions, "session"))
        assert.is_nil(p2.cursor)
      end)

      it("counts each session separately", function()
        local store = new()
        store:append("a", { { type = "x" }, { type = "y" } })
        store:append("b", { { type = "x", settled = true } })
        local info = by_name(store:sessions({}))
        assert.equal(2, info.a.events)
        assert.equal(2, info.a.pending)
        assert.equal(1, info.b.events)
        assert.equal(0, info.b.pending)
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.4 events_page", function()
      it("pins through at the first page so paging is stable while the session grows", function()
        local store = new()
        append_n(store, "s", 5)
        local p1 = store:events_page("s", { limit = 2 })
        assert.same({ 1, 2 }, indexes(p1.events))
        assert.equal(5, p1.through)
        append_n(store, "s", 3) -- head is now 8
        local p2 = store:events_page("s", { after = 2, through = p1.through, limit = 2 })
        assert.same({ 3, 4 }, indexes(p2.events))
        assert.equal(5, p2.through)
        local p3 = store:events_page("s", { after = 4, through = p1.through, limit = 2 })
        assert.same({ 5 }, indexes(p3.events))
        assert.equal(5, p3.through)
        local p4 = store:events_page("s", { after = 5, through = p1.through, limit = 2 })
        assert.same({}, p4.events)
      end)

      it("pins the current head when through is not given", function()
        local store = new()
        append_n(store, "s", 3)
        local p = store:events_page("s", { after = 1 })
        assert.same({ 2, 3 }, indexes(p.events))
        assert.equal(3, p.through)
      end)

      it("returns full stored events", function()
        local store = new()
        store:append("s", { { id = "e1", type = "a", payload = { k = "v" }, lane = "L" } })
        local e = store:events_page("s", {}).events[1]
        assert.equal("e1", e.id)
        assert.equal("a", e.type)
        assert.same({ k = "v" }, e.payload)
        assert.equal("L", e.lane)
        assert.equal("pending", e.status)
        assert.equal(T0, e.created_at)
        assert.equal(helpers.dump(store:read("s")[1]), helpers.dump(e))
      end)

      it("defaults limit to 100", function()
        local store = new()
        append_n(store, "s", 150)
        local p = store:events_page("s", {})
        assert.equal(100, #p.events)
        assert.equal(150, p.through)
        assert.equal(100, p.events[100].index)
      end)

      it("is empty for an unknown session", function()
        local store = new()
        local p = store:events_page("nobody", {})
        assert.same({}, p.events)
        assert.equal(0, p.through)
      end)
    end)
  end)
end
