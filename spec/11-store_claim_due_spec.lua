-- Conformance: docs/contract.md §3.2, the due time of a claimed event: a
-- live claim is ready again when it ends, whatever else waits beside it and
-- whichever way the clock moved since the claim. On sqlite: a claim keeps
-- its due time apart from the row's due_at (docs/sqlite.md "Claims in
-- place"); these are the cases where the two differ. Runs once per backend
-- URL (helpers.urls()), and on sqlite: a file of schema version 10 with
-- live claims, migrated at open.
local helpers = require("helpers")

local T0 = helpers.T0
local indexes = helpers.indexes

local function claimed(store, session, opts)
  local r = helpers.claim(store, session, opts)
  assert.equal("claimed", r.outcome)
  return r.events
end

local function busy(store, session, opts)
  local r = helpers.claim(store, session, opts)
  assert.equal("busy", r.outcome)
  return r.retry_at
end

local function claims(events)
  local out = {}
  for i, e in ipairs(events) do out[i] = ("%s:%d@%d"):format(e.session, e.index, e.attempt) end
  return out
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    it("a session's next due time is the earlier of a live claim's end and a timer", function()
      local store = helpers.new(url)
      store:append("s", { { type = "a" }, { type = "t", not_before = T0 + 500 } })
      claimed(store, "s", { ttl_ms = 1000, limit = 1 })
      assert.equal(T0 + 500, busy(store, "s"))
      local other = helpers.new(url)
      other:append("s", { { type = "a" }, { type = "t", not_before = T0 + 5000 } })
      claimed(other, "s", { ttl_ms = 1000, limit = 1 })
      assert.equal(T0 + 1000, busy(other, "s"))
    end)

    it("claim_next: an expired claim comes after events that became ready before it ended", function()
      local store, clock = helpers.new(url)
      store:append("a", { { type = "x" } })
      assert.same({ "a:1@1" }, claims(store:claim_next({ holder = "w", ttl_ms = 1000 })))
      clock:set(T0 + 400)
      store:append("b", { { type = "x" } })
      clock:set(T0 + 2000)
      local got = store:claim_next({ holder = "w", ttl_ms = 1000, limit = 5 })
      assert.same({ "b:1@1", "a:1@2" }, claims(got))
      -- and the same order within one type
      clock:set(T0 + 2100)
      store:append("c", { { type = "x" } })
      clock:set(T0 + 4000)
      got = store:claim_next({ holder = "w", ttl_ms = 1000, limit = 5, types = { "x" } })
      assert.same({ "c:1@1", "a:1@3", "b:1@2" }, claims(got)) -- a and b: one end, by position
    end)

    it("a renewal after the clock went back ends the claim at the new, earlier time", function()
      local store, clock = helpers.new(url)
      store:append("s", { { type = "a" } })
      local e = claimed(store, "s", { ttl_ms = 1000 })[1]
      clock:set(T0 - 10000)
      local r = store:renew("s", { holder = "w1", claims = { { index = 1, attempt = e.attempt } }, ttl_ms = 500 })
      assert.same({ 1 }, r.renewed)
      assert.equal(T0 - 9500, busy(store, "s", { holder = "w2" }))
      local _, retry_at = store:claim_next({ holder = "w2", ttl_ms = 100 })
      assert.equal(T0 - 9500, retry_at)
      clock:set(T0 - 9500)
      assert.same({ "s:1@2" }, claims(store:claim_next({ holder = "w2", ttl_ms = 100 })))
    end)

    it("a claim renewed after the clock went back is found behind many timers when it ends", function()
      local store, clock = helpers.new(url)
      local evs = {}
      for i = 1, 70 do evs[i] = { type = "t", not_before = T0 + 100000 } end
      evs[71] = { type = "a" }
      store:append("s", evs)
      local e = claimed(store, "s", { ttl_ms = 1000, limit = 1 })[1]
      assert.equal(71, e.index)
      clock:set(T0 - 10000)
      store:renew("s", { holder = "w1", claims = { { index = 71, attempt = e.attempt } }, ttl_ms = 500 })
      assert.equal(T0 - 9500, busy(store, "s", { holder = "w2", limit = 1 }))
      clock:set(T0 - 9500)
      assert.same({ 71 }, indexes(claimed(store, "s", { holder = "w2", limit = 1 })))
    end)

    it("a claim renewed many times, then failed, is due at its backoff", function()
      local store, clock = helpers.new(url)
      store:append("s", { { type = "a" } })
      local e = claimed(store, "s", { ttl_ms = 100 })[1]
      for i = 1, 5 do
        clock:set(T0 + i * 50)
        store:renew("s", { holder = "w1", claims = { { index = 1, attempt = e.attempt } }, ttl_ms = 100 })
      end
      assert.equal(T0 + 350, busy(store, "s", { holder = "w2" }))
      store:fail("s", 1, e.attempt, { error = "x", retry_after_ms = 1000 })
      assert.equal(T0 + 1250, busy(store, "s", { holder = "w2" }))
      local _, retry_at = store:claim_next({ holder = "w2", ttl_ms = 100 })
      assert.equal(T0 + 1250, retry_at)
    end)
  end)
end

-- A file written at schema version 10 (spec/fixtures/sqlite_schema_v10.sql,
-- by spec/support/claimed_store_writer.lua): jobs 1 and 2 claimed until
-- T + 60 s, jobs 3 and 4 ready, job 5 a timer at T + 30 s, mail 1 failed
-- and retried at T + 10 s.
describe("sqlite: a file of schema version 10 with live claims", function()
  after_each(helpers.cleanup)

  it("is migrated at open, its claims still live until they end", function()
    local T = 1700000000000
    local url, path = helpers.sqlite_fixture("sqlite_schema_v10.sql")
    local clock = helpers.manual_clock(T)
    local store = helpers.open_same(url, { clock = clock })
    assert.same({ 3, 4 }, indexes(claimed(store, "jobs", { holder = "w2", ttl_ms = 120000 })))
    assert.equal(T + 30000, busy(store, "jobs", { holder = "w2" }))
    local got, retry_at = store:claim_next({ holder = "w2", ttl_ms = 60000, limit = 10 })
    assert.same({}, got)
    assert.equal(T + 10000, retry_at)
    clock:set(T + 30000)
    got = store:claim_next({ holder = "w2", ttl_ms = 60000, limit = 10 })
    assert.same({ "mail:1@2", "jobs:5@1" }, claims(got))
    clock:set(T + 60000)
    got = store:claim_next({ holder = "w2", ttl_ms = 60000, limit = 10 })
    assert.same({ "jobs:1@2", "jobs:2@2" }, claims(got))
    store:close()
    assert.equal(helpers.SQLITE_SCHEMA, helpers.sqlite_version(path))
    helpers.remove_db(path)
  end)
end)
