-- Conformance: docs/contract.md §3.7 (branches: fork, lineage, children, refs,
-- promote), with the decisions of docs where the contract is silent (fork's
-- copies are processed with processed_at = the fork's time and attempts 0;
-- NOT_FOUND for a `from` without a row; a second fork into the same `to`
-- is INVALID_ARGUMENT; put_ref takes any session name; delete_ref answers
-- whether the ref existed; REF_CONFLICT carries `expected` and `actual`).
-- And (sqlite:) that refs, lineage, fence tokens, leases and seals survive
-- closing and reopening the file. Runs once per backend URL
-- (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")

local json = eventstore.json
local T0 = helpers.T0
local expect_error = helpers.expect_error
local expect_arg_error = helpers.expect_arg_error
local indexes = helpers.indexes
local pluck = helpers.pluck

-- Names in byte order (never locale order): upper case before lower case,
-- "ß" (C3 9F) before "é" (C3 A9), both after every ASCII name, "😀" (F0 ...)
-- last.
local BYTE_ORDER = { "B", "a", "aa", "e", "z", "ß", "é", "😀" }
local SHUFFLED = { "é", "z", "😀", "B", "aa", "ß", "e", "a" }

-- Every name of a listing read in pages of 3, each page after the last
-- name of the one before: names(opts) lists one page.
local function all_pages(names)
  local all, after = {}, nil
  repeat
    local page = names({ after = after, limit = 3 })
    for _, n in ipairs(page) do all[#all + 1] = n end
    after = page[#page]
  until #page < 3
  return all
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    local claim = helpers.claim

    local function append_n(store, session, n)
      local batch = {}
      for i = 1, n do batch[i] = { type = "t" .. i, payload = { i = i } } end
      return store:append(session, batch)
    end

    -- Everything a branch call could change, as text: the log with every
    -- dispatch record, the session rows, the refs, and the lineage and
    -- snapshots of the named sessions.
    local function world(store, names)
      local per = {}
      for _, n in ipairs(names or {}) do
        per[n] = {
          head = store:head(n),
          lineage = store:lineage(n) or false,
          children = store:children(n, { limit = 1000 }),
          snapshots = store:snapshots(n),
        }
      end
      return helpers.dump({
        log = store:read_all({}),
        sessions = store:sessions({ limit = 1000 }),
        refs = store:list_refs({ limit = 1000 }),
        per = per,
      })
    end

    local session_row = helpers.session_row

    -- A source session with a bit of everything: a settled laned event, a
    -- completed event and the event its completion appended (with a
    -- cause), a timer, a pending event; appended at different times.
    local function source(store, clock)
      clock:set(T0 + 1)
      store:append("src", { { id = "s1", type = "note", payload = { n = 1 }, lane = "L", settled = true } })
      clock:set(T0 + 2)
      store:append("src", { { id = "s2", type = "work", payload = json.array({ 1, 2.5, "x" }) } })
      local c = claim(store, "src")
      assert.equal("claimed", c.outcome)
      clock:set(T0 + 3)
      store:complete("src", 2, c.events[1].attempt,
        { { id = "s3", type = "result", payload = { ok = true }, settled = true } })
      clock:set(T0 + 4)
      store:append("src", { { id = "s4", type = "timer", payload = "later", not_before = T0 + 99999 } })
      clock:set(T0 + 5)
      store:append("src", { { id = "s5", type = "work", payload = json.null, lane = "M" } })
      return store:read("src")
    end

    -------------------------------------------------------------------------
    describe("§3.7 fork", function()
      it("copies events 1..at with the same type, payload, lane, cause, created_at, not_before and index", function()
        local store, clock = new()
        local src = source(store, clock)
        clock:set(T0 + 100)
        local r = store:fork("src", 4, "dst")
        assert.same({ session = "dst", parent = "src", at = 4, created_at = T0 + 100 }, r)
        local dst = store:read("dst")
        assert.same({ 1, 2, 3, 4 }, indexes(dst))
        for i = 1, 4 do
          local a, b = src[i], dst[i]
          assert.equal("dst", b.session)
          assert.equal(i, b.index)
          assert.equal(a.type, b.type)
          assert.equal(json.encode(a.payload), json.encode(b.payload))
          assert.equal(a.lane, b.lane)
          assert.same(a.cause, b.cause)
          assert.equal(a.created_at, b.created_at)
          assert.equal(a.not_before, b.not_before)
        end
        assert.same({ index = 2, attempt = 1 }, dst[3].cause)
        assert.equal("L", dst[1].lane)
        assert.equal(T0 + 99999, dst[4].not_before)
        assert.equal(T0 + 1, dst[1].created_at)
        assert.equal(T0 + 4, dst[4].created_at)
        assert.equal(4, store:head("dst"))
      end)

      it("gives every copy a fresh id and its origin {session, index}", function()
        local store, clock = new()
        local src = source(store, clock)
        store:fork("src", 5, "dst")
        local seen = {}
        for _, e in ipairs(src) do seen[e.id] = true end
        for i, e in ipairs(store:read("dst")) do
          assert.is_string(e.id)
          assert.is_nil(seen[e.id], "copy " .. i .. " reuses id " .. e.id)
          seen[e.id] = true
          assert.same({ session = "src", index = i }, e.origin)
        end
        for _, e in ipairs(store:read("src")) do assert.is_nil(e.origin) end
      end)

      it("stores every copy processed (processed_at = the fork's time, attempts 0), never claimable", function()
        local store, clock = new()
        source(store, clock)
        clock:set(T0 + 100)
        store:fork("src", 5, "dst") -- events 4 (a timer) and 5 are pending in src
        for _, e in ipairs(store:read("dst")) do
          assert.equal("processed", e.status)
          assert.equal(T0 + 100, e.processed_at)
          assert.equal(0, e.attempts)
          assert.equal(0, e.failures)
          assert.is_nil(e.claim_holder)
          assert.is_nil(e.processed_by_attempt)
        end
        clock:set(T0 + 200000) -- past the timer's not_before
        assert.equal("settled", claim(store, "dst").outcome)
        local got = store:claim_next({ holder = "w", ttl_ms = 1000, limit = 100 })
        for _, e in ipairs(got) do assert.equal("src", e.session) end
        assert.same({ 4, 5 }, helpers.sorted(indexes(got)))
        local row = session_row(store, "dst")
        assert.equal(5, row.events)
        assert.equal(0, row.pending)
        assert.equal(0, row.dead)
      end)

      it("does not change `from`: its events, dispatch records, snapshots and head", function()
        local store, clock = new()
        source(store, clock)
        store:put_snapshot("src", "r", 2, "state@2", "v1")
        local before = helpers.dump({ store:read("src"), store:snapshots("src"), store:head("src"),
          store:read_state("src", "r") })
        clock:advance(50)
        store:fork("src", 3, "dst")
        local after = helpers.dump({ store:read("src"), store:snapshots("src"), store:head("src"),
          store:read_state("src", "r") })
        assert.equal(before, after)
        -- and src still dispatches as before: its pending events are claimable
        clock:set(T0 + 200000)
        assert.same({ 4, 5 }, indexes(claim(store, "src").events))
      end)

      it("gives the copies positions after every existing one, in index order", function()
        local store, clock = new()
        source(store, clock)
        append_n(store, "other", 2)
        local last = 0
        for _, e in ipairs(store:read_all({})) do last = math.max(last, e.position) end
        store:fork("src", 5, "dst")
        local dst = store:read("dst")
        assert.is_true(dst[1].position > last)
        for i = 2, #dst do assert.is_true(dst[i].position > dst[i - 1].position) end
        local tail = store:read_all({ after = last })
        assert.same({ "dst", "dst", "dst", "dst", "dst" }, pluck(tail, "session"))
        assert.same({ 1, 2, 3, 4, 5 }, indexes(tail))
        -- and later appends come after the copies
        local e = store:append("other", { { type = "late" } })[1]
        assert.is_true(e.position > dst[5].position)
      end)

      it("carries over the snapshots at index <= at, not those beyond: the fork's state is immediate", function()
        local store, clock = new()
        source(store, clock)
        store:put_snapshot("src", "low", 2, "L@2", "v-low")
        store:put_snapshot("src", "cut", 3, "C@3", "v-cut")
        store:put_snapshot("src", "high", 4, "H@4", "v-high")
        store:fork("src", 3, "dst")
        assert.same({ "cut", "low" }, pluck(store:snapshots("dst"), "reducer"))
        assert.same({ 3, 2 }, pluck(store:snapshots("dst"), "index"))
        assert.same({ "v-cut", "v-low" }, pluck(store:snapshots("dst"), "version"))
        local low = store:read_state("dst", "low")
        assert.same({ index = 2, state = "L@2", version = "v-low" }, low.snapshot)
        assert.same({ 3 }, indexes(low.events))
        local cut = store:read_state("dst", "cut")
        assert.equal("C@3", cut.snapshot.state)
        assert.same({}, cut.events)
        local high = store:read_state("dst", "high")
        assert.is_nil(high.snapshot)
        assert.same({ 1, 2, 3 }, indexes(high.events))
        -- the fork's own events fold on top of the carried snapshot
        store:append("dst", { { type = "more" } })
        assert.same({ 3, 4 }, indexes(store:read_state("dst", "low").events))
        assert.same({ 4 }, indexes(store:read_state("dst", "cut").events))
        -- the source's snapshots are still all there
        assert.same({ "cut", "high", "low" }, pluck(store:snapshots("src"), "reducer"))
      end)

      it("forks at 0: a session with no events, its lineage recorded, listed by sessions{}", function()
        local store, clock = new()
        source(store, clock)
        store:put_snapshot("src", "r", 1, "x", "v")
        clock:set(T0 + 70)
        local r = store:fork("src", 0, "empty")
        assert.same({ session = "empty", parent = "src", at = 0, created_at = T0 + 70 }, r)
        assert.equal(0, store:head("empty"))
        assert.same({}, store:read("empty"))
        assert.same({}, store:snapshots("empty"))
        assert.same(r, store:lineage("empty"))
        local row = session_row(store, "empty")
        assert.is_not_nil(row, "a fork at 0 is listed by sessions{}")
        assert.equal(0, row.events)
        assert.equal("src", row.parent)
        -- it takes events like any session, from index 1
        local e = store:append("empty", { { type = "first" } })[1]
        assert.equal(1, e.index)
        assert.equal("pending", e.status)
      end)

      it("forks at the head, and from a session that has a row but no events (fenced) at 0", function()
        local store, clock = new()
        source(store, clock)
        store:fork("src", 5, "all")
        assert.equal(5, store:head("all"))
        store:fence("bare")
        local r = store:fork("bare", 0, "bare-fork")
        assert.equal("bare", r.parent)
        assert.equal(0, r.at)
        expect_error("NO_SUCH_EVENT", function() return store:fork("bare", 1, "other") end)
      end)

      it("forks a fork: the copies' origin is the session forked from", function()
        local store, clock = new()
        source(store, clock)
        store:fork("src", 3, "child")
        store:append("child", { { type = "own", settled = true } })
        store:fork("child", 4, "grandchild")
        local g = store:read("grandchild")
        assert.same({ 1, 2, 3, 4 }, indexes(g))
        for i = 1, 4 do assert.same({ session = "child", index = i }, g[i].origin) end
        assert.equal("own", g[4].type)
        assert.equal("child", store:lineage("grandchild").parent)
        assert.same({ "child" }, pluck(store:children("src"), "session"))
        assert.same({ "grandchild" }, pluck(store:children("child"), "session"))
      end)

      it("the fork and its source go on independently", function()
        local store, clock = new()
        source(store, clock)
        store:fork("src", 2, "dst")
        store:append("dst", { { type = "only-in-dst" } })
        store:append("src", { { type = "only-in-src" } })
        assert.equal(3, store:head("dst"))
        assert.equal(6, store:head("src"))
        assert.equal("only-in-dst", store:read("dst")[3].type)
        assert.equal("only-in-src", store:read("src")[6].type)
        assert.equal(3, #store:read("dst"))
      end)

      describe("errors: each changes nothing", function()
        -- Runs fn, expecting code, and asserts the store is unchanged and
        -- `to` has no events and no lineage (unless it had them before).
        local function refused(store, code, names, fn)
          local before = world(store, names)
          local err = expect_error(code, fn)
          assert.equal(before, world(store, names))
          return err
        end

        it("`from` missing: NOT_FOUND (also at 0, also when a ref names it)", function()
          local store, clock = new()
          source(store, clock)
          store:put_ref("ghost-ref", "ghost")
          for _, at in ipairs({ 0, 1 }) do
            refused(store, "NOT_FOUND", { "ghost", "to" }, function() return store:fork("ghost", at, "to") end)
          end
          assert.is_nil(store:lineage("to"))
          assert.equal(0, store:head("to"))
          assert.is_nil(session_row(store, "to"))
        end)

        it("`to` already has events: INVALID_ARGUMENT", function()
          local store, clock = new()
          source(store, clock)
          store:append("to", { { type = "mine", settled = true } })
          refused(store, "INVALID_ARGUMENT", { "src", "to" }, function() return store:fork("src", 2, "to") end)
          refused(store, "INVALID_ARGUMENT", { "src", "to" }, function() return store:fork("src", 0, "to") end)
          assert.is_nil(store:lineage("to"))
          assert.same({ "mine" }, pluck(store:read("to"), "type"))
        end)

        it("`to` is already a fork (even one at 0, without events): INVALID_ARGUMENT, its lineage kept", function()
          local store, clock = new()
          source(store, clock)
          append_n(store, "other", 3)
          local first = store:fork("src", 0, "to")
          clock:advance(10)
          refused(store, "INVALID_ARGUMENT", { "src", "other", "to" }, function() return store:fork("src", 2, "to") end)
          refused(store, "INVALID_ARGUMENT", { "src", "other", "to" }, function() return store:fork("other", 3, "to") end)
          refused(store, "INVALID_ARGUMENT", { "src", "other", "to" }, function() return store:fork("src", 0, "to") end)
          assert.same(first, store:lineage("to"))
          assert.same({}, store:children("other"))
          assert.equal(0, store:head("to"))
        end)

        it("`at` beyond the head: NO_SUCH_EVENT", function()
          local store, clock = new()
          source(store, clock)
          for _, at in ipairs({ 6, 7, math.maxinteger }) do
            refused(store, "NO_SUCH_EVENT", { "src", "to" }, function() return store:fork("src", at, "to") end)
          end
          assert.is_nil(store:lineage("to"))
          assert.equal(0, store:head("to"))
          assert.same({}, store:children("src"))
        end)

        it("`at` negative: INVALID_ARGUMENT", function()
          local store, clock = new()
          source(store, clock)
          for _, at in ipairs({ -1, -5 }) do
            refused(store, "INVALID_ARGUMENT", { "src", "to" }, function() return store:fork("src", at, "to") end)
          end
          assert.is_nil(store:lineage("to"))
        end)

        it("`to` == `from`: INVALID_ARGUMENT", function()
          local store, clock = new()
          source(store, clock)
          for _, at in ipairs({ 0, 3, 5 }) do
            refused(store, "INVALID_ARGUMENT", { "src" }, function() return store:fork("src", at, "src") end)
          end
          assert.is_nil(store:lineage("src"))
          assert.equal(5, store:head("src"))
        end)

        it("`to` an ancestor of `from`: INVALID_ARGUMENT, the lineage stays a tree", function()
          local store = new()
          -- a session without events can have forks made at 0
          store:seal("a")
          store:fork("a", 0, "b")
          store:fork("b", 0, "c")
          for _, from in ipairs({ "b", "c" }) do
            local err = expect_error("INVALID_ARGUMENT", store.fork, store, from, 0, "a")
            assert.truthy(tostring(err):find("ancestor", 1, true), tostring(err))
          end
          assert.is_nil(store:lineage("a"))
          assert.equal("b", store:lineage("c").parent)
          -- a session that is not an ancestor may still be the target
          store:fork("c", 0, "d")
          assert.equal("c", store:lineage("d").parent)
        end)

        it("bad argument types are argument errors", function()
          local store, clock = new()
          source(store, clock)
          local before = world(store, { "src", "to" })
          expect_arg_error(function() return store:fork("src", 1.5, "to") end)
          expect_arg_error(function() return store:fork("src", "1", "to") end)
          expect_arg_error(function() return store:fork("src", nil, "to") end)
          expect_arg_error(function() return store:fork(nil, 1, "to") end)
          expect_arg_error(function() return store:fork({}, 1, "to") end)
          expect_arg_error(function() return store:fork("src", 1, nil) end)
          expect_arg_error(function() return store:fork("src", 1, true) end)
          assert.equal(before, world(store, { "src", "to" }))
        end)

        it("names that are not names (empty) are INVALID_ARGUMENT", function()
          local store, clock = new()
          source(store, clock)
          local before = world(store, { "src" })
          expect_error("INVALID_ARGUMENT", function() return store:fork("src", 1, "") end)
          expect_error("INVALID_ARGUMENT", function() return store:fork("", 0, "to") end)
          expect_error("INVALID_ARGUMENT", function() return store:fork("src", 1, ("x"):rep(256)) end)
          assert.equal(before, world(store, { "src" }))
        end)
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.7 lineage and children", function()
      it("lineage is {session, parent, at, created_at} for a fork, nil otherwise", function()
        local store, clock = new()
        append_n(store, "p", 3)
        clock:set(T0 + 40)
        store:fork("p", 2, "c")
        assert.same({ session = "c", parent = "p", at = 2, created_at = T0 + 40 }, store:lineage("c"))
        assert.is_nil(store:lineage("p"))
        assert.is_nil(store:lineage("nobody"))
      end)

      it("lineage is immutable: appends to the fork or its parent leave it as recorded", function()
        local store, clock = new()
        append_n(store, "p", 3)
        clock:set(T0 + 40)
        local rec = store:fork("p", 2, "c")
        clock:set(T0 + 90)
        append_n(store, "c", 4)
        append_n(store, "p", 4)
        store:fence("c")
        store:seal("c")
        assert.same(rec, store:lineage("c"))
        assert.same({ rec }, store:children("p"))
      end)

      it("children lists the sessions forked from one, by name in byte order, only direct ones", function()
        local store, clock = new()
        append_n(store, "p", 2)
        append_n(store, "q", 1)
        for i, name in ipairs(SHUFFLED) do
          clock:set(T0 + i)
          store:fork("p", i % 3, name)
        end
        store:fork("q", 1, "q-child")
        store:fork("a", 1, "grand") -- a fork of a fork is not p's child
        local list = store:children("p")
        assert.same(BYTE_ORDER, pluck(list, "session"))
        for _, rec in ipairs(list) do
          assert.equal("p", rec.parent)
          assert.same(rec, store:lineage(rec.session))
        end
        assert.equal(T0 + 1, list[7].created_at) -- "é" was forked first
        assert.equal(1, list[7].at)
        assert.same({ "q-child" }, pluck(store:children("q"), "session"))
        assert.same({ "grand" }, pluck(store:children("a"), "session"))
        assert.same({}, store:children("grand"))
        assert.same({}, store:children("nobody"))
      end)

      it("children: `after` is any string (byte order), limit pages", function()
        local store = new()
        append_n(store, "p", 1)
        for _, name in ipairs(SHUFFLED) do store:fork("p", 0, name) end
        local function names(opts) return pluck(store:children("p", opts), "session") end
        assert.same({ "aa", "e", "z", "ß", "é", "😀" }, names({ after = "a" }))
        assert.same({ "z", "ß", "é", "😀" }, names({ after = "f" })) -- no such child: still a bound
        assert.same({ "é", "😀" }, names({ after = "ß" }))
        assert.same({ "a", "aa", "e", "z", "ß", "é", "😀" }, names({ after = "B" }))
        assert.same(BYTE_ORDER, names({ after = "" }))
        assert.same({}, names({ after = "😀" }))
        assert.same({}, names({ after = "\xf4\x8f\xbf\xbf" }))
        assert.same({ "B", "a", "aa" }, names({ limit = 3 }))
        -- paging with after = the last of a page sees each child once
        assert.same(BYTE_ORDER, all_pages(names))
      end)

      it("children: limit defaults to 100", function()
        local store = new()
        append_n(store, "p", 1)
        for i = 1, 101 do store:fork("p", 0, ("c%03d"):format(i)) end
        local list = store:children("p")
        assert.equal(100, #list)
        assert.equal("c001", list[1].session)
        assert.equal("c100", list[100].session)
        assert.equal(101, #store:children("p", { limit = 1000 }))
      end)

      it("children: limit 0 or negative is INVALID_ARGUMENT; wrong types are argument errors", function()
        local store = new()
        append_n(store, "p", 1)
        store:fork("p", 0, "c")
        for _, limit in ipairs({ 0, -1, math.mininteger + 1 }) do
          expect_error("INVALID_ARGUMENT", function() return store:children("p", { limit = limit }) end)
        end
        expect_arg_error(function() return store:children("p", { limit = 1.5 }) end)
        expect_arg_error(function() return store:children("p", { limit = "10" }) end)
        expect_arg_error(function() return store:children("p", { after = {} }) end)
        expect_arg_error(function() return store:children("p", "c") end)
        expect_arg_error(function() return store:children(nil) end)
        expect_arg_error(function() return store:children({}) end)
        expect_arg_error(function() return store:lineage(nil) end)
        expect_arg_error(function() return store:lineage(true) end)
        assert.same({ "c" }, pluck(store:children("p", { limit = 1 }), "session"))
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.7 refs", function()
      it("put_ref creates a ref {name, session, head, created_at, updated_at}; get_ref reads it", function()
        local store, clock = new()
        append_n(store, "s", 2)
        clock:set(T0 + 7)
        local r = store:put_ref("main", "s")
        assert.same({ name = "main", session = "s", head = 2, created_at = T0 + 7, updated_at = T0 + 7 }, r)
        assert.same(r, store:get_ref("main"))
        assert.is_nil(store:get_ref("nope"))
      end)

      it("a ref may name a session without events (head 0)", function()
        local store = new()
        local r = store:put_ref("try/faster-prompt", "not-yet")
        assert.equal("not-yet", r.session)
        assert.equal(0, r.head)
        assert.equal(0, store:get_ref("try/faster-prompt").head)
        append_n(store, "not-yet", 3)
        assert.equal(3, store:get_ref("try/faster-prompt").head)
      end)

      it("head is the session's head now, never a stale copy (get_ref and list_refs)", function()
        local store = new()
        append_n(store, "s", 2)
        store:put_ref("main", "s")
        append_n(store, "s", 3)
        assert.equal(5, store:get_ref("main").head)
        assert.equal(5, store:list_refs({})[1].head)
        local c = claim(store, "s", { limit = 1 })
        store:complete("s", c.events[1].index, c.events[1].attempt, { { type = "r" } })
        assert.equal(6, store:get_ref("main").head)
        store:fork("s", 6, "f")
        store:put_ref("b", "f")
        append_n(store, "f", 1)
        assert.same({ 7, 6 }, pluck(store:list_refs({}), "head"))
      end)

      it("put_ref on an existing name moves it, keeps created_at, moves updated_at", function()
        local store, clock = new()
        append_n(store, "a", 1)
        append_n(store, "b", 4)
        store:put_ref("main", "a")
        clock:set(T0 + 500)
        local r = store:put_ref("main", "b")
        assert.same({ name = "main", session = "b", head = 4, created_at = T0, updated_at = T0 + 500 }, r)
        assert.same(r, store:get_ref("main"))
        clock:set(T0 + 600)
        store:put_ref("main", "b") -- the same session again: still an upsert
        assert.equal(T0, store:get_ref("main").created_at)
        assert.equal(T0 + 600, store:get_ref("main").updated_at)
        assert.equal(1, #store:list_refs({}))
      end)

      it("list_refs lists refs in byte order with all their fields", function()
        local store, clock = new()
        for i, name in ipairs(SHUFFLED) do
          clock:set(T0 + i)
          store:put_ref(name, "s-" .. i)
        end
        append_n(store, "s-1", 2)
        local list = store:list_refs({})
        assert.same(BYTE_ORDER, pluck(list, "name"))
        assert.same(store:get_ref("é"), list[7])
        assert.equal("s-1", list[7].session)
        assert.equal(2, list[7].head)
        assert.equal(T0 + 1, list[7].created_at)
        assert.same(list, store:list_refs())
      end)

      it("list_refs pages with `after` (any string) and limit", function()
        local store = new()
        for _, name in ipairs(SHUFFLED) do store:put_ref(name, "s") end
        local function names(opts) return pluck(store:list_refs(opts), "name") end
        assert.same({ "z", "ß", "é", "😀" }, names({ after = "f" }))
        assert.same({ "aa", "e" }, names({ after = "a", limit = 2 }))
        assert.same({}, names({ after = "😀" }))
        assert.same(BYTE_ORDER, all_pages(names))
      end)

      it("list_refs: limit defaults to 100; 0, negative are INVALID_ARGUMENT; wrong types argument errors", function()
        local store = new()
        for i = 1, 101 do store:put_ref(("r%03d"):format(i), "s") end
        local list = store:list_refs({})
        assert.equal(100, #list)
        assert.equal("r100", list[100].name)
        assert.equal(101, #store:list_refs({ limit = 101 }))
        assert.same({ "r101" }, pluck(store:list_refs({ after = "r100" }), "name"))
        for _, limit in ipairs({ 0, -1 }) do
          expect_error("INVALID_ARGUMENT", function() return store:list_refs({ limit = limit }) end)
        end
        expect_arg_error(function() return store:list_refs({ limit = 2.5 }) end)
        expect_arg_error(function() return store:list_refs({ limit = "2" }) end)
        expect_arg_error(function() return store:list_refs({ after = true }) end)
        expect_arg_error(function() return store:list_refs("r001") end)
      end)

      it("delete_ref removes a ref and says so; an absent ref is a no-op answering false", function()
        local store = new()
        store:put_ref("a", "s")
        store:put_ref("b", "s")
        assert.is_true(store:delete_ref("a"))
        assert.is_nil(store:get_ref("a"))
        assert.same({ "b" }, pluck(store:list_refs({}), "name"))
        local before = world(store, { "s" })
        assert.is_false(store:delete_ref("a"))
        assert.is_false(store:delete_ref("never"))
        assert.equal(before, world(store, { "s" }))
        -- a deleted name can be put again, as a new ref
        local r = store:put_ref("a", "t")
        assert.equal("t", r.session)
      end)

      it("a deleted and re-put ref has a new created_at", function()
        local store, clock = new()
        store:put_ref("a", "s")
        store:delete_ref("a")
        clock:set(T0 + 30)
        assert.equal(T0 + 30, store:put_ref("a", "s").created_at)
      end)

      it("refs do not touch the log or the sessions they name", function()
        local store = new()
        append_n(store, "s", 2)
        local before = helpers.dump({ store:read_all({}), store:sessions({}) })
        store:put_ref("main", "s")
        store:put_ref("other", "s")
        store:delete_ref("other")
        assert.equal(before, helpers.dump({ store:read_all({}), store:sessions({}) }))
      end)

      it("argument rules: names must be names", function()
        local store = new()
        expect_error("INVALID_ARGUMENT", function() return store:put_ref("", "s") end)
        expect_error("INVALID_ARGUMENT", function() return store:put_ref("main", "") end)
        expect_error("INVALID_ARGUMENT", function() return store:put_ref(("r"):rep(256), "s") end)
        expect_error("INVALID_ARGUMENT", function() return store:put_ref("bad\xff", "s") end)
        expect_arg_error(function() return store:put_ref(nil, "s") end)
        expect_arg_error(function() return store:put_ref("main", {}) end)
        expect_arg_error(function() return store:get_ref(nil) end)
        expect_arg_error(function() return store:delete_ref(false) end)
        assert.same({}, store:list_refs({}))
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.7 promote", function()
      -- refs: main -> "base", try -> "cand" (with 3 events), other -> "x".
      local function setup()
        local store, clock = new()
        append_n(store, "base", 1)
        append_n(store, "cand", 3)
        store:put_ref("main", "base")
        store:put_ref("try", "cand")
        store:put_ref("other", "x")
        clock:set(T0 + 100)
        return store, clock
      end

      it("without expect: last writer wins; returns the moved ref (created_at kept)", function()
        local store = setup()
        local r = store:promote("try", "main")
        assert.same({ name = "main", session = "cand", head = 3, created_at = T0, updated_at = T0 + 100 }, r)
        assert.same(r, store:get_ref("main"))
        -- the from ref is not touched
        assert.same({ name = "try", session = "cand", head = 3, created_at = T0, updated_at = T0 }, store:get_ref("try"))
        -- and another promote overwrites it
        store:promote("other", "main", {})
        assert.equal("x", store:get_ref("main").session)
      end)

      it("without expect: creates to_ref when it does not exist", function()
        local store = setup()
        local r = store:promote("try", "release")
        assert.same({ name = "release", session = "cand", head = 3, created_at = T0 + 100, updated_at = T0 + 100 }, r)
      end)

      it("expect = the session to_ref names: the compare-and-set succeeds", function()
        local store = setup()
        local r = store:promote("try", "main", { expect = "base" })
        assert.equal("cand", r.session)
        assert.equal("cand", store:get_ref("main").session)
        -- now main names cand: expecting base again loses
        expect_error("REF_CONFLICT", function() return store:promote("other", "main", { expect = "base" }) end)
        assert.equal("cand", store:get_ref("main").session)
        store:promote("other", "main", { expect = "cand" })
        assert.equal("x", store:get_ref("main").session)
      end)

      it("expect = another session: REF_CONFLICT with expected and actual, nothing moves", function()
        local store = setup()
        local before = world(store, { "base", "cand" })
        local err = expect_error("REF_CONFLICT", function()
          return store:promote("try", "main", { expect = "stale" })
        end)
        assert.equal("stale", err.expected)
        assert.equal("base", err.actual)
        assert.equal(before, world(store, { "base", "cand" }))
        assert.same({ name = "main", session = "base", head = 1, created_at = T0, updated_at = T0 }, store:get_ref("main"))
      end)

      it("expect = a session, to_ref missing: REF_CONFLICT with actual = false, nothing created", function()
        local store = setup()
        local before = world(store)
        local err = expect_error("REF_CONFLICT", function()
          return store:promote("try", "release", { expect = "base" })
        end)
        assert.equal("base", err.expected)
        assert.is_false(err.actual)
        assert.is_nil(store:get_ref("release"))
        assert.equal(before, world(store))
      end)

      it("expect = false: succeeds only while to_ref does not exist", function()
        local store = setup()
        local r = store:promote("try", "release", { expect = false })
        assert.equal("cand", r.session)
        assert.equal(T0 + 100, r.created_at)
        local before = world(store)
        local err = expect_error("REF_CONFLICT", function()
          return store:promote("other", "release", { expect = false })
        end)
        assert.is_false(err.expected)
        assert.equal("cand", err.actual)
        assert.equal(before, world(store))
        assert.equal("cand", store:get_ref("release").session)
        -- after delete_ref it is free again
        store:delete_ref("release")
        assert.equal("x", store:promote("other", "release", { expect = false }).session)
      end)

      it("from_ref missing: NOT_FOUND, nothing moves (with or without expect)", function()
        local store = setup()
        local before = world(store)
        expect_error("NOT_FOUND", function() return store:promote("ghost", "main") end)
        expect_error("NOT_FOUND", function() return store:promote("ghost", "main", { expect = "base" }) end)
        expect_error("NOT_FOUND", function() return store:promote("ghost", "new", { expect = false }) end)
        assert.equal(before, world(store))
        assert.is_nil(store:get_ref("new"))
      end)

      it("argument rules: expect must be a name or false", function()
        local store = setup()
        local before = world(store)
        expect_arg_error(function() return store:promote("try", "main", { expect = true }) end)
        expect_arg_error(function() return store:promote("try", "main", { expect = 5 }) end)
        expect_arg_error(function() return store:promote("try", "main", { expect = {} }) end)
        expect_arg_error(function() return store:promote("try", "main", "base") end)
        expect_arg_error(function() return store:promote(nil, "main") end)
        expect_arg_error(function() return store:promote("try", nil) end)
        expect_error("INVALID_ARGUMENT", function() return store:promote("try", "main", { expect = "" }) end)
        assert.equal(before, world(store))
      end)
    end)

    -------------------------------------------------------------------------
    describe("§2 CLOSED for the branch and lifecycle calls", function()
      it("every §3.7/§3.8 call on a closed store is CLOSED", function()
        local store = new()
        append_n(store, "s", 1)
        store:close()
        local calls = {
          function() return store:fork("s", 1, "t") end,
          function() return store:lineage("s") end,
          function() return store:children("s") end,
          function() return store:put_ref("r", "s") end,
          function() return store:get_ref("r") end,
          function() return store:list_refs({}) end,
          function() return store:delete_ref("r") end,
          function() return store:promote("r", "q") end,
          function() return store:fence("s") end,
          function() return store:lease("s", { holder = "h", ttl_ms = 10 }) end,
          function() return store:release("s", { holder = "h", token = 1 }) end,
          function() return store:seal("s") end,
          function() return store:read_states({ "s" }, "r") end,
          function() return store:now() end,
        }
        for _, call in ipairs(calls) do expect_error("CLOSED", call) end
      end)
    end)

    -------------------------------------------------------------------------
    if url:match("^sqlite") then
      describe("persistence (sqlite: close and reopen the file)", function()
        it("refs, lineage, children, fork copies, fence tokens, leases and seals survive a reopen", function()
          local store, clock, full = new()
          append_n(store, "src", 3)
          store:put_snapshot("src", "r", 2, "st", "v")
          clock:set(T0 + 10)
          local lin = store:fork("src", 2, "dst")
          store:fork("src", 0, "dst0")
          store:put_ref("main", "src")
          clock:set(T0 + 20)
          store:put_ref("main", "dst")
          store:put_ref("try/x", "dst0")
          assert.equal(1, store:fence("f"))
          assert.equal(2, store:fence("f"))
          local lease = store:lease("l", { holder = "A", ttl_ms = 10000 })
          assert.equal("acquired", lease.outcome)
          store:seal("sealed", { reason = "done here" })
          store:append("fenced-log", { { type = "a" } })
          store:fence("fenced-log")
          local tok = store:fence("fenced-log")
          local dst_before = store:read("dst")
          local refs_before = store:list_refs({})
          store:close()

          local again = helpers.open_same(full, { clock = clock })
          assert.same(refs_before, again:list_refs({}))
          assert.same({ name = "main", session = "dst", head = 2, created_at = T0 + 10, updated_at = T0 + 20,
            parent = lin.parent, at = lin.at }, again:get_ref("main"))
          assert.same(lin, again:lineage("dst"))
          assert.same({ "dst", "dst0" }, pluck(again:children("src"), "session"))
          assert.equal(0, again:lineage("dst0").at)
          assert.same(dst_before, again:read("dst"))
          assert.same({ session = "src", index = 2 }, again:read("dst")[2].origin)
          assert.equal("st", again:read_state("dst", "r").snapshot.state)
          -- fence tokens go on from where they were; old ones stay stale
          assert.equal(3, again:fence("f"))
          expect_error("STALE_FENCE", function() return again:append("f", { { type = "x" } }, { fence = 2 }) end)
          assert.equal(1, again:append("f", { { type = "x" } }, { fence = 3 })[1].index)
          expect_error("STALE_FENCE", function()
            return again:append("fenced-log", { { type = "b" } }, { fence = tok - 1 })
          end)
          -- the lease is still A's, with its token and expiry
          local held = again:lease("l", { holder = "B", ttl_ms = 10000 })
          assert.equal("held", held.outcome)
          assert.equal("A", held.holder)
          assert.equal(lease.expires_at, held.expires_at)
          local renewed = again:lease("l", { holder = "A", ttl_ms = 10000 })
          assert.equal(lease.token, renewed.token)
          -- the seal holds
          expect_error("SEALED", function() return again:append("sealed", { { type = "x" } }) end)
          local row = session_row(again, "sealed")
          assert.is_true(row.sealed)
          assert.equal("done here", row.seal_reason)
          assert.equal(0, row.events)
          assert.equal("src", session_row(again, "dst").parent)
          -- and lineage stays immutable: a fork into dst0 is still refused
          expect_error("INVALID_ARGUMENT", function() return again:fork("src", 1, "dst0") end)
        end)

        it("a second handle on the same file sees refs and promotes of the first at once", function()
          local store, clock, full = new()
          local other = helpers.open_same(full, { clock = clock })
          store:put_ref("main", "a")
          store:put_ref("try", "b")
          assert.equal("a", other:get_ref("main").session)
          other:promote("try", "main", { expect = "a" })
          local err = expect_error("REF_CONFLICT", function()
            return store:promote("try", "main", { expect = "a" })
          end)
          assert.equal("b", err.actual)
        end)
      end)
    end
  end)
end
