-- Conformance: docs/contract.md §2 (errors: the error object, argument errors,
-- INVALID_ARGUMENT, TOO_LARGE, STORAGE, CLOSED, atomicity) and §3 opening
-- and closing a store. Runs once per backend URL (helpers.urls()).
--
-- NOT_FOUND is not tested: no call of §3.1-§3.6 requires an existing ref,
-- session or snapshot (an unknown session reads as empty), so the contract
-- gives no case for it before §3.7.
local eventstore = require("eventstore")
local helpers = require("helpers")

local expect_error = helpers.expect_error
local expect_arg_error = helpers.expect_arg_error

-- One call of every store method, for the CLOSED tests.
local every_call = {
  { "append", function(s) return s:append("s", { { type = "t" } }) end },
  { "append (empty batch)", function(s) return s:append("s", {}) end },
  { "read", function(s) return s:read("s") end },
  { "head", function(s) return s:head("s") end },
  { "read_all", function(s) return s:read_all({}) end },
  { "claim", function(s) return s:claim("s", { holder = "w", ttl_ms = 1000 }) end },
  { "claim_next", function(s) return s:claim_next({ holder = "w", ttl_ms = 1000 }) end },
  { "renew", function(s) return s:renew("s", { holder = "w", claims = { { index = 1, attempt = 1 } }, ttl_ms = 1000 }) end },
  { "complete", function(s) return s:complete("s", 1, 1, {}) end },
  { "complete_many", function(s) return s:complete_many({ { session = "s", index = 1, attempt = 1 } }) end },
  { "complete_many (empty list)", function(s) return s:complete_many({}) end },
  { "fail", function(s) return s:fail("s", 1, 1, { error = "x" }) end },
  { "revive", function(s) return s:revive("s", 1) end },
  { "settle", function(s) return s:settle("s", 1, "why") end },
  { "dead_letters", function(s) return s:dead_letters({}) end },
  { "read_state", function(s) return s:read_state("s", "r") end },
  { "put_snapshot", function(s) return s:put_snapshot("s", "r", 1, "x", "v") end },
  { "snapshots", function(s) return s:snapshots("s") end },
  { "sessions", function(s) return s:sessions({}) end },
  { "events_page", function(s) return s:events_page("s", {}) end },
  { "subscribe", function(s) return s:subscribe("s", function() end) end },
  { "subscribe (all)", function(s) return s:subscribe(nil, function() end) end },
  { "wait", function(s) return s:wait("s", 0, 10) end },
  { "stream", function(s) for _ in s:stream("s", { timeout_ms = 10 }) do end end },
  { "presence_set", function(s) return s:presence_set("ns", "p", { a = 1 }, { ttl_ms = 1000 }) end },
  { "presence_read", function(s) return s:presence_read("ns") end },
  { "presence_subscribe", function(s) return s:presence_subscribe("ns", function() end) end },
}

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    -- A store with a little of everything: events, a claim, a dead letter,
    -- a snapshot, presence.
    local function busy_store()
      local store, clock, full = new()
      store:append("s", { { id = "e1", type = "a" }, { id = "e2", type = "b", lane = "L" }, { type = "c", lane = "L" } })
      store:append("t", { { id = "t1", type = "x", payload = { n = 1 } } })
      local c = store:claim("s", { holder = "w", ttl_ms = 1000 })
      store:fail("s", 2, c.events[2].attempt, { error = "boom", max_failures = 1 })
      store:put_snapshot("s", "r", 1, "state", "v1")
      store:presence_set("ns", "p", { a = 1 }, { ttl_ms = 1000, at = 5 })
      return store, clock, full
    end

    local function whole_state(store)
      return helpers.dump({
        log = store:read_all({}),
        heads = { s = store:head("s"), t = store:head("t") },
        sessions = store:sessions({}),
        snaps = store:snapshots("s"),
        state = store:read_state("s", "r"),
        dead = store:dead_letters({}),
        presence = store:presence_read("ns"),
      })
    end

    -------------------------------------------------------------------------
    describe("the error object", function()
      it("is a table with code and message whose tostring is 'CODE: message'", function()
        local store = new()
        store:append("s", { { type = "a" } })
        local ok, err = pcall(store.append, store, "s", { { type = "b" } }, { expected = 0 })
        assert.is_false(ok)
        assert.equal("table", type(err))
        assert.equal("WRONG_EXPECTED_HEAD", err.code)
        assert.equal("string", type(err.message))
        assert.is_true(#err.message > 0)
        assert.equal("WRONG_EXPECTED_HEAD: " .. err.message, tostring(err))
      end)

      it("is recognised by eventstore.is_error(e, code), and only with its own code", function()
        local store = new()
        local _, err = pcall(store.append, store, "", { { type = "a" } })
        assert.is_true(eventstore.is_error(err, "INVALID_ARGUMENT"))
        assert.is_false(eventstore.is_error(err, "TOO_LARGE"))
        assert.is_false(eventstore.is_error("INVALID_ARGUMENT: text", "INVALID_ARGUMENT"))
        assert.is_false(eventstore.is_error(nil, "INVALID_ARGUMENT"))
        assert.is_false(eventstore.is_error({}, "INVALID_ARGUMENT"))
      end)
    end)

    -------------------------------------------------------------------------
    describe("argument errors are standard Lua 'bad argument' errors", function()
      local cases = {
        { "append: session not a string", function(s) return s:append({}, { { type = "a" } }) end },
        { "append: session missing", function(s) return s:append(nil, { { type = "a" } }) end },
        { "append: events not a table", function(s) return s:append("s", "events") end },
        { "append: events missing", function(s) return s:append("s") end },
        { "append: an event not a table", function(s) return s:append("s", { "event" }) end },
        { "append: type missing", function(s) return s:append("s", { { payload = 1 } }) end },
        { "append: type not a string", function(s) return s:append("s", { { type = true } }) end },
        { "append: opts not a table", function(s) return s:append("s", { { type = "a" } }, "opts") end },
        { "read: opts not a table", function(s) return s:read("s", "opts") end },
        { "head: session missing", function(s) return s:head() end },
        { "claim: opts missing", function(s) return s:claim("s") end },
        { "claim: holder missing", function(s) return s:claim("s", { ttl_ms = 1000 }) end },
        { "claim: holder not a string", function(s) return s:claim("s", { holder = {}, ttl_ms = 1000 }) end },
        { "claim: neither ttl_ms nor expires_at", function(s) return s:claim("s", { holder = "w" }) end },
        { "claim_next: holder missing", function(s) return s:claim_next({ ttl_ms = 1000 }) end },
        { "claim_next: ttl_ms missing", function(s) return s:claim_next({ holder = "w" }) end },
        { "renew: holder missing", function(s) return s:renew("s", { claims = {}, ttl_ms = 1000 }) end },
        { "complete: index not a number", function(s) return s:complete("s", "one", 1, {}) end },
        { "complete: attempt missing", function(s) return s:complete("s", 1, nil, {}) end },
        { "complete: events not a table", function(s) return s:complete("s", 1, 1, "events") end },
        { "fail: opts missing", function(s) return s:fail("s", 1, 1) end },
        { "fail: error missing", function(s) return s:fail("s", 1, 1, {}) end },
        { "revive: index missing", function(s) return s:revive("s") end },
        { "put_snapshot: state not a string", function(s) return s:put_snapshot("s", "r", 1, {}, "v") end },
        { "read_state: reducer missing", function(s) return s:read_state("s") end },
        { "subscribe: fn not a function", function(s) return s:subscribe("s", "fn") end },
        { "wait: after not a number", function(s) return s:wait("s", "zero", 10) end },
        { "presence_set: values not a table", function(s) return s:presence_set("ns", "p", "v", { ttl_ms = 1 }) end },
        { "presence_set: ttl_ms missing", function(s) return s:presence_set("ns", "p", { a = 1 }, {}) end },
        { "presence_subscribe: fn missing", function(s) return s:presence_subscribe("ns") end },
      }
      for _, case in ipairs(cases) do
        it(case[1], function()
          local store = new()
          store:append("s", { { type = "seed" } })
          local before = helpers.log_state(store)
          expect_arg_error(case[2], store)
          assert.equal(before, helpers.log_state(store))
        end)
      end
    end)

    -------------------------------------------------------------------------
    describe("INVALID_ARGUMENT", function()
      local function rejects_session(session)
        local store = new()
        expect_error("INVALID_ARGUMENT", function() return store:append(session, { { type = "a" } }) end)
        assert.same({}, store:read_all({}))
        assert.same({}, store:sessions({}).sessions)
      end

      it("for an empty session id", function() rejects_session("") end)
      it("for a session id of 256 bytes", function() rejects_session(string.rep("s", 256)) end)
      it("for a session id that is not valid UTF-8", function()
        rejects_session("bad\xff")
        rejects_session("\xc3\x28")
      end)

      it("accepts a session id of 255 bytes and any valid UTF-8", function()
        local store = new()
        local long = string.rep("s", 255)
        assert.equal(1, store:append(long, { { type = "a" } })[1].index)
        assert.equal(1, store:head(long))
        assert.equal(1, store:append("ünïcødé/😀", { { type = "a" } })[1].index)
        assert.equal("ünïcødé/😀", store:read("ünïcødé/😀")[1].session)
      end)

      it("for an empty type", function()
        local store = new()
        expect_error("INVALID_ARGUMENT", function() return store:append("s", { { type = "" } }) end)
        assert.equal(0, store:head("s"))
      end)

      it("for an empty holder", function()
        local store = new()
        store:append("s", { { type = "a" } })
        local before = helpers.log_state(store)
        expect_error("INVALID_ARGUMENT", function() return store:claim("s", { holder = "", ttl_ms = 1000 }) end)
        assert.equal(before, helpers.log_state(store))
      end)

      it("for an unknown URL scheme", function()
        expect_error("INVALID_ARGUMENT", function() return eventstore.open("nope:") end)
        expect_error("INVALID_ARGUMENT", function() return eventstore.open("nope:whatever") end)
      end)
    end)

    -------------------------------------------------------------------------
    describe("opening and closing", function()
      it("opens a memory store for a nil URL and for memory:", function()
        local a = eventstore.open(nil, { clock = helpers.manual_clock(helpers.T0) })
        assert.equal(1, a:append("s", { { type = "a" } })[1].index)
        assert.equal(helpers.T0, a:read("s")[1].created_at)
        a:close()
        local b = eventstore.open("memory:")
        assert.equal(0, b:head("s"))
        b:close()
        local c = eventstore.open()
        assert.equal(0, c:head("s"))
        c:close()
      end)

      it("raises CLOSED for calls after close(), and close() twice is harmless", function()
        local store = new()
        store:append("s", { { type = "a" } })
        store:close()
        store:close()
        expect_error("CLOSED", function() return store:head("s") end)
        store:close()
      end)

      for _, call in ipairs(every_call) do
        it("raises CLOSED from " .. call[1] .. " after close()", function()
          local store = new()
          store:append("s", { { type = "a" } })
          store:close()
          expect_error("CLOSED", call[2], store)
        end)
      end

      it("closes a <close> variable at the end of its scope", function()
        local captured
        do
          local store <close> = new()
          store:append("s", { { type = "a" } })
          captured = store
        end
        expect_error("CLOSED", function() return captured:read("s") end)
        captured:close()
      end)

      it("survives garbage collection of an unclosed store", function()
        do
          local store = eventstore.open(url == "memory:" and "memory:" or nil)
          store:append("s", { { type = "a" } })
        end
        collectgarbage("collect")
        collectgarbage("collect")
        local store = new()
        assert.equal(0, store:head("s"))
      end)

      if url:match("^sqlite:") then
        it("closing one handle leaves another on the same file open", function()
          local store, clock, full = new()
          local other = helpers.open_same(full, { clock = clock })
          store:append("s", { { type = "a" } })
          store:close()
          assert.equal(1, other:head("s"))
          other:append("s", { { type = "b" } })
          assert.equal(2, other:head("s"))
        end)

        it("keeps the log across close and reopen", function()
          local store, clock, full = new()
          store:append("s", { { id = "a", type = "t", payload = { n = 1 } } })
          local c = store:claim("s", { holder = "w", ttl_ms = 1000 })
          local before = helpers.log_state(store)
          assert.equal(1, c.events[1].attempt)
          store:close()
          local again = helpers.open_same(full, { clock = clock })
          assert.equal(before, helpers.log_state(again))
          assert.equal("busy", again:claim("s", { holder = "w2", ttl_ms = 1000 }).outcome)
        end)

        it("raises STORAGE when the database file cannot be opened", function()
          local dir = os.tmpname()
          os.remove(dir)
          -- a path under a directory that does not exist
          expect_error("STORAGE", function() return eventstore.open("sqlite:" .. dir .. "/no/such/dir/x.db") end)
        end)
      end
    end)

    -------------------------------------------------------------------------
    describe("a failed call changes nothing", function()
      local failing = {
        { "INVALID_ARGUMENT payload", "INVALID_ARGUMENT",
          function(s) return s:append("s", { { type = "x" }, { type = "y", payload = { f = print } } }) end },
        { "INVALID_ARGUMENT session", "INVALID_ARGUMENT", function(s) return s:append("", { { type = "x" } }) end },
        { "TOO_LARGE payload", "TOO_LARGE",
          function(s) return s:append("t", { { type = "x", payload = string.rep("x", 2 * 1024 * 1024) } }) end },
        { "WRONG_EXPECTED_HEAD", "WRONG_EXPECTED_HEAD",
          function(s) return s:append("s", { { type = "x" } }, { expected = 1 }) end },
        { "PARTIAL_DUPLICATE_BATCH", "PARTIAL_DUPLICATE_BATCH",
          function(s) return s:append("s", { { id = "e1", type = "a" }, { id = "fresh", type = "a" } }) end },
        { "PARTIAL_DUPLICATE_BATCH across sessions", "PARTIAL_DUPLICATE_BATCH",
          function(s) return s:append("t", { { id = "e1", type = "a" } }) end },
        { "ID_CONFLICT", "ID_CONFLICT", function(s) return s:append("t", { { id = "t1", type = "x", payload = { n = 2 } } }) end },
        { "SUPERSEDED_ATTEMPT", "SUPERSEDED_ATTEMPT",
          function(s) return s:append("s", { { type = "r", cause = { index = 2, attempt = 1 } } }) end },
        { "NO_SUCH_EVENT (cause)", "NO_SUCH_EVENT",
          function(s) return s:append("s", { { type = "r", cause = { index = 99, attempt = 1 } } }) end },
        { "NO_SUCH_EVENT (complete)", "NO_SUCH_EVENT", function(s) return s:complete("s", 99, 1, { { type = "r" } }) end },
        { "NO_SUCH_EVENT (fail)", "NO_SUCH_EVENT", function(s) return s:fail("s", 99, 1, { error = "x" }) end },
        { "NO_SUCH_EVENT (revive)", "NO_SUCH_EVENT", function(s) return s:revive("t", 5) end },
        { "PARTIAL_DUPLICATE_BATCH (complete)", "PARTIAL_DUPLICATE_BATCH",
          function(s) return s:complete("s", 1, 1, { { id = "t1", type = "x", payload = { n = 1 } } }) end },
        { "INVALID_ARGUMENT presence value", "INVALID_ARGUMENT",
          function(s) return s:presence_set("ns", "p", { a = 2, b = 0 / 0 }, { ttl_ms = 1000, at = 9 }) end },
      }
      for _, case in ipairs(failing) do
        it(case[1], function()
          local store = busy_store()
          local before = whole_state(store)
          expect_error(case[2], case[3], store)
          assert.equal(before, whole_state(store))
        end)
      end
    end)
  end)
end
