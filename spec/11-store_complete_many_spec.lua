-- Conformance: docs/contract.md §3.2, store:complete_many(list): many
-- completions in one call (one transaction on a core store), each item
-- answered as store:complete would have answered it alone; what reading
-- the list refuses raises and writes nothing (docs/store.md "Many
-- completions in one call"). Runs once per backend URL and on shards:
-- (helpers.urls_and_shards()), and through a tenant view.
local eventstore = require("eventstore")
local helpers = require("helpers")

local expect_error = helpers.expect_error
local expect_arg_error = helpers.expect_arg_error

for _, url in ipairs(helpers.urls_and_shards()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    -- n events of type "job" in each session; claims them all (holder w1,
    -- ttl 1000 ms); returns the claimed events in claim order.
    local function claimed_jobs(store, sessions, n)
      for _, s in ipairs(sessions) do
        local batch = {}
        for i = 1, n do batch[i] = { type = "job", payload = { s = s, i = i } } end
        store:append(s, batch)
      end
      local got = store:claim_next({ holder = "w1", ttl_ms = 1000, limit = 1000 })
      assert.equal(#sessions * n, #got)
      return got
    end

    -- The completion of claimed event e with one result event whose id
    -- is fixed (so a replay is recognised), plus extra fields.
    local function item(e, extra)
      local it = {
        session = e.session, index = e.index, attempt = e.attempt,
        events = { { type = "done", id = ("r-%s-%d"):format(e.session, e.index), payload = { of = e.index } } },
      }
      for k, v in pairs(extra or {}) do it[k] = v end
      return it
    end

    local function outcomes(r)
      local out = {}
      for i, x in ipairs(r) do
        out[i] = x.outcome or ("error " .. tostring(x.error and x.error.code))
      end
      return out
    end

    -- The result events in the store: {["session/index"] = count}.
    local function results(store)
      local count = {}
      for _, e in ipairs(store:read_all({ limit = 100000 })) do
        if e.type == "done" then
          assert.is_table(e.cause, "a result carries its cause")
          local k = e.session .. "/" .. e.cause.index
          count[k] = (count[k] or 0) + 1
        end
      end
      return count
    end

    it("completes every item in one call: each processed, each result appended once", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a", "b", "c" }, 4)
      local list = {}
      for i, e in ipairs(jobs) do list[i] = item(e) end
      local r = store:complete_many(list)
      assert.equal(#list, #r)
      for i, x in ipairs(r) do
        assert.same({ outcome = "completed" }, x, "item " .. i)
      end
      for _, e in ipairs(jobs) do
        local now = helpers.event(store, e.session, e.index)
        assert.equal("processed", now.status)
        assert.equal(e.attempt, now.processed_by_attempt)
      end
      local count = results(store)
      for _, e in ipairs(jobs) do assert.equal(1, count[e.session .. "/" .. e.index]) end
      -- the results are appended after the jobs, in their sessions, with
      -- their cause and payload
      local got = store:read("b", { after = 4 })
      assert.equal(4, #got)
      for _, ev in ipairs(got) do
        assert.equal("done", ev.type)
        assert.equal(ev.cause.index, ev.payload.of)
      end
      assert.same({}, store:claim_next({ holder = "w1", ttl_ms = 1000, limit = 1000, types = { "job" } }))
    end)

    it("answers each item as complete would alone (the same store afterwards)", function()
      -- the same work done with complete, one by one, and with complete_many
      local function scenario(batched)
        local store, clock = new({ ids = eventstore.counter_ids("e-") }) -- the same ids both times
        local jobs = claimed_jobs(store, { "a", "b" }, 3)
        store:append("a", { { type = "later" } }) -- index 4, cancelled below
        clock:advance(5)
        local list = {
          item(jobs[1]),
          item(jobs[2], { events = {} }),
          item(jobs[3], { cancel = { 4, 1, 99 } }),
          item(jobs[4], { index = 99 }),
          item(jobs[5], { attempt = jobs[5].attempt + 1 }),
          item(jobs[6]),
        }
        local answers = {}
        if batched then
          answers = store:complete_many(list)
        else
          for i, it in ipairs(list) do
            local ok, res = pcall(store.complete, store, it.session, it.index, it.attempt, it.events,
              { fence = it.fence, cancel = it.cancel })
            if ok then
              res.events = nil
              answers[i] = res
            else
              answers[i] = { error = res }
            end
          end
        end
        return helpers.log_state(store), answers
      end
      local log1, one_by_one = scenario(false)
      local log2, many = scenario(true)
      assert.equal(log1, log2)
      assert.equal(#one_by_one, #many)
      for i = 1, #many do
        if one_by_one[i].error then
          assert.equal(one_by_one[i].error.code, many[i].error.code, "item " .. i)
          assert.equal(one_by_one[i].error.message, many[i].error.message, "item " .. i)
        else
          assert.same(one_by_one[i], many[i], "item " .. i)
        end
      end
      assert.same({ "completed", "completed", "completed", "error NO_SUCH_EVENT", "superseded", "completed" },
        outcomes(many))
      assert.same({ 1, 99 }, many[3].not_cancelled)
    end)

    it("a stale attempt is superseded while the other items complete", function()
      local store, clock = new()
      local jobs = claimed_jobs(store, { "a" }, 3)
      clock:advance(2000) -- the claims expire
      local again = store:claim("a", { holder = "w2", ttl_ms = 1000, limit = 1 })
      assert.equal("claimed", again.outcome)
      assert.equal(1, again.events[1].index)
      assert.equal(2, again.events[1].attempt)
      -- the late attempts of 2 and 3 still own their events (nobody took them)
      local r = store:complete_many({ item(jobs[1]), item(jobs[2]), item(jobs[3]) })
      assert.same({ "superseded", "completed", "completed" }, outcomes(r))
      local e1 = helpers.event(store, "a", 1)
      assert.equal("pending", e1.status)
      assert.equal(2, e1.attempts)
      assert.equal("w2", e1.claim_holder)
      assert.is_nil(results(store)["a/1"])
      -- the new attempt completes as usual
      assert.same({ "completed" }, outcomes(store:complete_many({ item(again.events[1]) })))
      assert.equal(1, results(store)["a/1"])
    end)

    it("an item's own failure is its error; the others still complete", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a", "sealed", "fenced" }, 1)
      local by = {}
      for _, e in ipairs(jobs) do by[e.session] = e end
      store:seal("sealed")
      local token = store:fence("fenced")
      store:fence("fenced") -- token is stale now
      local r = store:complete_many({
        item(by.sealed),                                 -- appends to a sealed session
        item(by.a),
        item(by.fenced, { fence = token }),              -- a stale fence
        { session = "a", index = math.maxinteger, attempt = 1 }, -- no such event
        { session = "nobody", index = 1, attempt = 1 },  -- nor a session
        item(by.a, { attempt = by.a.attempt, events = { { type = "done", id = "other" } } }),
      })
      assert.equal(6, #r)
      for i, code in pairs({ [1] = "SEALED", [3] = "STALE_FENCE", [4] = "NO_SUCH_EVENT", [5] = "NO_SUCH_EVENT",
        [6] = "PARTIAL_DUPLICATE_BATCH" }) do
        assert.is_nil(r[i].outcome, "item " .. i)
        assert.is_true(eventstore.is_error(r[i].error, code), ("item %d: %s"):format(i, tostring(r[i].error)))
        assert.equal(code .. ": " .. r[i].error.message, tostring(r[i].error))
      end
      assert.same({ outcome = "completed" }, r[2])
      assert.equal("processed", helpers.event(store, "a", 1).status)
      assert.equal(1, results(store)["a/1"])
      assert.equal("pending", helpers.event(store, "sealed", 1).status)
      assert.equal("pending", helpers.event(store, "fenced", 1).status)
      -- a sealed session's work still finishes without events, as complete
      assert.same({ "completed" }, outcomes(store:complete_many({ item(by.sealed, { events = {} }) })))
      assert.equal("processed", helpers.event(store, "sealed", 1).status)
    end)

    it("what the store checks in an item's events is that item's error, as complete raises it", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a" }, 3)
      local long = { { type = ("x"):rep(300) } }
      local twice = { { type = "done", id = "d" }, { type = "done", id = "d" } }
      local r = store:complete_many({ item(jobs[1], { events = long }), item(jobs[2]), item(jobs[3], { events = twice }) })
      local ok, alone = pcall(store.complete, store, "a", jobs[1].index, jobs[1].attempt, long)
      assert.is_false(ok)
      assert.equal(tostring(alone), tostring(r[1].error))
      assert.is_true(eventstore.is_error(r[1].error, "INVALID_ARGUMENT"))
      assert.same({ outcome = "completed" }, r[2])
      assert.is_true(eventstore.is_error(r[3].error, "PARTIAL_DUPLICATE_BATCH"))
      assert.equal("pending", helpers.event(store, "a", 1).status)
      assert.equal("pending", helpers.event(store, "a", 3).status)
      -- more cancels than a batch may hold: TOO_LARGE, for complete and for the item
      local many = {}
      for i = 1, 10001 do many[i] = 1000 + i end
      ok, alone = pcall(store.complete, store, "a", jobs[1].index, jobs[1].attempt, {}, { cancel = many })
      assert.is_false(ok)
      assert.is_true(eventstore.is_error(alone, "TOO_LARGE"), tostring(alone))
      r = store:complete_many({ item(jobs[1], { events = {}, cancel = many }), item(jobs[3]) })
      assert.equal(tostring(alone), tostring(r[1].error))
      assert.same({ outcome = "completed" }, r[2])
      assert.equal("pending", helpers.event(store, "a", 1).status)
    end)

    it("cancels inside an item, in that completion's step", function()
      local store, clock = new()
      store:append("o", { { type = "job" } })
      store:append("o", { { type = "reminder", not_before = helpers.T0 + 60000 }, { type = "job" } })
      local jobs = store:claim_next({ holder = "w1", ttl_ms = 1000, limit = 10 })
      assert.same({ 1, 3 }, helpers.indexes(jobs))
      clock:advance(1)
      local r = store:complete_many({
        item(jobs[1], { cancel = { { index = 2, reason = "paid" }, 3, 7 } }),
        item(jobs[2], { cancel = { 2 } }),
      })
      assert.same({ outcome = "completed", not_cancelled = { 3, 7 } }, r[1])
      -- 2 was cancelled by the item before: cancelling it again changes
      -- nothing and counts as cancelled (as store:cancel)
      assert.same({ outcome = "completed", not_cancelled = {} }, r[2])
      local two = helpers.event(store, "o", 2)
      assert.equal("processed", two.status)
      assert.equal("paid", two.cancelled)
      assert.equal("processed", helpers.event(store, "o", 3).status)
      -- a superseded item cancels nothing
      store:append("o", { { type = "job" }, { type = "later" } })
      local j = store:claim("o", { holder = "w1", ttl_ms = 1000, limit = 1 }).events[1]
      r = store:complete_many({ item(j, { attempt = j.attempt + 5, cancel = { 7 } }) })
      assert.same({ outcome = "superseded" }, r[1])
      assert.equal("pending", helpers.event(store, "o", 7).status)
    end)

    it("the same list again is a replay: answered completed, nothing appended twice", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a", "b" }, 3)
      local list = {}
      for i, e in ipairs(jobs) do list[i] = item(e, { cancel = { 1 } }) end
      local first = store:complete_many(list)
      local log = helpers.log_state(store)
      local again = store:complete_many(list)
      assert.equal(log, helpers.log_state(store))
      for i = 1, #list do
        assert.equal("completed", again[i].outcome)
        -- as complete: a replay cancels nothing again, so lists every index
        assert.same({ 1 }, again[i].not_cancelled)
      end
      assert.same({ "completed", "completed", "completed", "completed", "completed", "completed" }, outcomes(first))
      for _, n in pairs(results(store)) do assert.equal(1, n) end
      -- results without ids cannot be recognised: as complete, the second
      -- time is PARTIAL_DUPLICATE_BATCH (the first stays as it was)
      store:append("c", { { type = "job" } })
      local e = store:claim("c", { holder = "w1", ttl_ms = 1000 }).events[1]
      local no_ids = { { session = "c", index = e.index, attempt = e.attempt, events = { { type = "done" } } } }
      assert.same({ "completed" }, outcomes(store:complete_many(no_ids)))
      assert.same({ "error PARTIAL_DUPLICATE_BATCH" }, outcomes(store:complete_many(no_ids)))
      assert.equal(1, results(store)["c/1"])
    end)

    it("an empty list completes nothing and answers an empty list", function()
      local store = new()
      claimed_jobs(store, { "a" }, 1)
      local before = helpers.world(store)
      assert.same({}, store:complete_many({}))
      assert.equal(before, helpers.world(store))
    end)

    it("1000 items in one call; 1001 is TOO_LARGE and writes nothing", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a" }, 1000)
      local list = {}
      for i, e in ipairs(jobs) do list[i] = { session = e.session, index = e.index, attempt = e.attempt } end
      list[1001] = list[1]
      local err = helpers.refused(store, "TOO_LARGE", function() return store:complete_many(list) end)
      assert.matches("1001 completions, over the limit of 1000", err.message, 1, true)
      list[1001] = nil
      local r = store:complete_many(list)
      assert.equal(1000, #r)
      for i = 1, 1000 do assert.equal("completed", r[i].outcome) end
      assert.equal(0, #store:dead_letters({}))
      assert.same({}, store:claim_next({ holder = "w1", ttl_ms = 1000 }))
    end)

    it("more than 10,000 result events in one call is TOO_LARGE naming the item, nothing written", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a" }, 3)
      local big = {}
      for i = 1, 5000 do big[i] = { type = "done" } end
      local list = {}
      for i, e in ipairs(jobs) do list[i] = { session = "a", index = e.index, attempt = e.attempt, events = big } end
      local err = helpers.refused(store, "TOO_LARGE", function() return store:complete_many(list) end)
      assert.matches("list[3]", err.message, 1, true)
    end)

    describe("refused lists raise, naming the item, and change nothing", function()
      -- each: the item at 2 (after a valid one), what the message must hold,
      -- and the code of the error object (nil: a Lua argument error)
      local cases = {
        { "not a table", 5, "list[2]: must be a table" },
        { "session missing", { index = 1, attempt = 1 }, "list[2]: field 'session' must be a string, got nil" },
        { "session a number", { session = 7, index = 1, attempt = 1 }, "field 'session' must be a string" },
        { "session with NUL", { session = "a\0b", index = 1, attempt = 1 }, "list[2]: session must not contain a NUL byte", "INVALID_ARGUMENT" },
        { "session empty", { session = "", index = 1, attempt = 1 }, "list[2]: session", "INVALID_ARGUMENT" },
        { "index missing", { session = "a", attempt = 1 }, "list[2]: field 'index' must be an integer, got nil" },
        { "index 3.5", { session = "a", index = 3.5, attempt = 1 }, "field 'index' must be an integer, got a number without an integer value" },
        { "index a string", { session = "a", index = "1", attempt = 1 }, "field 'index' must be an integer, got string" },
        { "index 2^63", { session = "a", index = 2 ^ 63, attempt = 1 }, "field 'index' must be an integer" },
        { "attempt missing", { session = "a", index = 1 }, "list[2]: field 'attempt' must be an integer, got nil" },
        { "events not a table", { session = "a", index = 1, attempt = 1, events = "x" }, "list[2]: field 'events' must be a list of events, got string" },
        { "one event, unwrapped", { session = "a", index = 1, attempt = 1, events = { type = "x" } }, "list[2]: events must be a list of events, not one event" },
        { "event without type", { session = "a", index = 1, attempt = 1, events = { {} } }, "list[2]: events[1].type is required" },
        { "event type with NUL", { session = "a", index = 1, attempt = 1, events = { { type = "x\0" } } }, "list[2]: events[1].type must not contain a NUL byte", "INVALID_ARGUMENT" },
        { "payload JSON cannot carry", { session = "a", index = 1, attempt = 1, events = { { type = "x", payload = { f = print } } } }, "list[2]: events[1].payload", "INVALID_ARGUMENT" },
        { "fence 0", { session = "a", index = 1, attempt = 1, fence = 0 }, "list[2]: fence must be >= 1", "INVALID_ARGUMENT" },
        { "fence math.mininteger", { session = "a", index = 1, attempt = 1, fence = math.mininteger }, "list[2]: fence is out of range", "INVALID_ARGUMENT" },
        { "fence a string", { session = "a", index = 1, attempt = 1, fence = "1" }, "list[2]: field 'fence' must be an integer" },
        { "cancel not a table", { session = "a", index = 1, attempt = 1, cancel = 3 }, "list[2]: 'cancel' must be a list of indexes" },
        { "cancel index 0", { session = "a", index = 1, attempt = 1, cancel = { 0 } }, "list[2]: cancel must list event indexes" },
        { "cancel reason a number", { session = "a", index = 1, attempt = 1, cancel = { { index = 1, reason = 5 } } }, "list[2]: cancel[i].reason must be a string" },
        { "cancel with a hole", { session = "a", index = 1, attempt = 1, cancel = { 1, nil, 3 } }, "list[2]: cancel is not a sequence" },
      }
      for _, case in ipairs(cases) do
        it(case[1], function()
          local store = new()
          local jobs = claimed_jobs(store, { "a" }, 2)
          local list = { item(jobs[1]), case[2] }
          local before = helpers.world(store)
          local err
          if case[4] then
            err = expect_error(case[4], function() return store:complete_many(list) end).message
          else
            err = expect_arg_error(function() return store:complete_many(list) end)
            assert.matches("'complete_many'", err, 1, true)
          end
          assert.matches(case[3], err, 1, true)
          assert.equal(before, helpers.world(store))
        end)
      end

      it("a list that is not one", function()
        local store = new()
        local jobs = claimed_jobs(store, { "a" }, 2)
        local before = helpers.world(store)
        local one = item(jobs[1])
        expect_arg_error(function() return store:complete_many(one) end) -- an item without its list
        expect_arg_error(function() return store:complete_many({ one, nil, item(jobs[2]) }) end)
        expect_arg_error(function() return store:complete_many({ one, x = 1 }) end)
        expect_arg_error(function() return store:complete_many({ [1] = one, [2] = one, [4] = one, [8] = one }) end)
        expect_arg_error(function() return store:complete_many("x") end)
        expect_arg_error(function() return store:complete_many() end)
        expect_arg_error(function() return store:complete_many({ one }, {}) end)
        -- a length that lies (a border far beyond the elements): refused at once
        local liar = { one, one }
        local k = 4
        while k < 2 ^ 62 do liar[k] = one; k = k * 2 end
        expect_arg_error(function() return store:complete_many(liar) end)
        assert.equal(before, helpers.world(store))
      end)
    end)

    it("metatables: an item's fields may come from __index; the list is read raw", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a" }, 2)
      local proto = { session = "a", attempt = jobs[1].attempt }
      local via_index = setmetatable({ index = 1 }, { __index = proto })
      local list = setmetatable({ via_index }, { __index = function() return item(jobs[2]) end, __len = function() return 2 end })
      local r = store:complete_many(list)
      assert.same({ { outcome = "completed" } }, r)
      assert.equal("pending", helpers.event(store, "a", 2).status)
      -- an __index that raises: the error goes through, naming nothing was written
      local before = helpers.world(store)
      local boom = setmetatable({ session = "a", index = 2 }, { __index = function() error("boom", 0) end })
      local ok, err = pcall(store.complete_many, store, { boom })
      assert.is_false(ok)
      assert.equal("boom", err)
      assert.equal(before, helpers.world(store))
    end)

    it("a Lua clock that empties the list during the call frees nothing the call reads", function()
      local list
      local store = helpers.open(url, { clock = function()
        if list then
          for i = 1, #list do
            list[i].session, list[i].events, list[i].cancel = nil, nil, nil
            list[i] = nil
          end
          collectgarbage("collect")
        end
        return helpers.T0
      end })
      local jobs = claimed_jobs(store, { "a" }, 3)
      list = {}
      for i, e in ipairs(jobs) do
        list[i] = item(e, {
          session = ("a%s"):format(""), -- a string the list alone holds
          cancel = { { index = 3, reason = ("reason %d"):format(i) } },
        })
      end
      local r = store:complete_many(list)
      assert.same({ "completed", "completed", "completed" }, outcomes(r))
      list = nil
      for _, e in ipairs(jobs) do assert.equal("processed", helpers.event(store, "a", e.index).status) end
      local count = results(store)
      for _, e in ipairs(jobs) do assert.equal(1, count["a/" .. e.index]) end
    end)

    it("works on a tenant view, within the tenant", function()
      local root = new()
      local t = root:tenant("acme")
      local jobs = claimed_jobs(t, { "a", "b" }, 2)
      local list = {}
      for i, e in ipairs(jobs) do list[i] = item(e) end
      list[#list + 1] = { session = "nothing-here", index = 1, attempt = 1 }
      local r = t:complete_many(list)
      assert.same({ "completed", "completed", "completed", "completed", "error NO_SUCH_EVENT" }, outcomes(r))
      assert.equal(4, #t:read_all({}) - 4)
      for _, e in ipairs(t:read_all({})) do assert.is_nil(e.session:find("acme", 1, true)) end
      assert.same({ 1, 1, 1, 1 }, (function()
        local c, out = results(t), {}
        for _, e in ipairs(jobs) do out[#out + 1] = c[e.session .. "/" .. e.index] end
        return out
      end)())
      -- the root sees the tenant's sessions under its prefix, none of its own
      assert.equal(0, root:head("a"))
    end)

    it("a closed store raises CLOSED", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a" }, 1)
      store:close()
      expect_error("CLOSED", function() return store:complete_many({ item(jobs[1]) }) end)
      expect_error("CLOSED", function() return store:complete_many({}) end)
    end)

    it("is counted in stats() as one complete_many call", function()
      local store = new()
      local jobs = claimed_jobs(store, { "a" }, 3)
      local list = {}
      for i, e in ipairs(jobs) do list[i] = item(e) end
      store:complete_many(list)
      local calls = store:stats().calls
      local found
      for k, v in pairs(calls) do
        if (type(v) == "table" and v.op == "complete_many") or k == "complete_many" then found = v end
      end
      assert.is_not_nil(found, "stats().calls has complete_many")
    end)
  end)
end
