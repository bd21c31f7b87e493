-- Conformance: docs/contract.md §3.1, a payload reads back exactly as
-- stored, whatever its length and whatever happened to its event since
-- (claims, completions, failures, dead letters, forks, truncation). On
-- sqlite: a payload over 512 bytes is kept apart from its row (docs/sqlite.md
-- "Long payloads apart", schema version 13), so these cases cross that line
-- both ways; a file of schema version 12, whose long payloads are in their
-- rows, is migrated at open and read the same, unless it holds a `payloads`
-- table of its own (then it is left at version 12, and the error says why).
local helpers = require("helpers")

-- {"text":"xxx..."}: k + 11 bytes of canonical JSON
local function sized(k, c) return { text = string.rep(c or "x", k) } end
-- 511, 512 and 513 bytes, then long ones
local SIZES = { 500, 501, 502, 3000, 100000 }

local function payload_texts(events)
  local out = {}
  for i, e in ipairs(events) do out[i] = e.payload and e.payload.text end
  return out
end

local function expected_texts(from, to)
  local out = {}
  for i = from, to do out[#out + 1] = string.rep(string.char(96 + i), SIZES[i]) end
  return out
end

local function append_sized(store, session, settled)
  local evs = {}
  for i, k in ipairs(SIZES) do evs[i] = { type = "t", payload = sized(k, string.char(96 + i)), settled = settled } end
  store:append(session, evs)
end

local function sqlite3(path, sql) return (helpers.sqlite3(path, sql):gsub("%s+$", "")) end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    it("payloads on both sides of 512 bytes read back exactly through every read", function()
      local store = helpers.new(url)
      append_sized(store, "s")
      local want = expected_texts(1, #SIZES)
      assert.same(want, payload_texts(store:read("s")))
      assert.same(want, payload_texts(store:read_all({})))
      assert.same(want, payload_texts(store:events_page("s", {}).events))
      assert.same(want, payload_texts(store:read_state("s", "r").events))
    end)

    it("a long payload stays whole through claims, failures, dead letters and completions", function()
      local store = helpers.new(url)
      append_sized(store, "s")
      local want = expected_texts(1, #SIZES)
      local got = helpers.claim(store, "s", { holder = "w", ttl_ms = 60000, limit = 5 })
      assert.equal("claimed", got.outcome)
      assert.same(want, payload_texts(got.events))
      -- 1, 2: completed (one with a long result); 3: failed, retried, then
      -- completed; 4: dead-lettered; 5: still claimed
      store:complete("s", 1, got.events[1].attempt)
      store:complete("s", 2, got.events[2].attempt, { { type = "r", payload = sized(4000, "r") } })
      store:fail("s", 3, got.events[3].attempt, { error = "x" })
      assert.equal("dead_lettered", store:fail("s", 4, got.events[4].attempt, { error = "y", max_failures = 1 }).outcome)
      assert.same({ want[4] }, payload_texts(store:dead_letters({})))
      local again = store:claim_next({ holder = "w", ttl_ms = 60000, limit = 5, types = { "t" } })
      assert.same({ want[3] }, payload_texts(again))
      store:complete("s", 3, again[1].attempt)
      local all = store:read("s")
      assert.same({ "processed", "processed", "processed", "dead", "pending", "pending" },
        (function()
          local st = {}
          for i, e in ipairs(all) do st[i] = e.status end
          return st
        end)())
      local texts = payload_texts(all)
      assert.same(want, { texts[1], texts[2], texts[3], texts[4], texts[5] })
      assert.equal(string.rep("r", 4000), texts[6])
      local revived = store:revive("s", 4)
      assert.equal(want[4], revived.payload.text)
    end)

    it("a long meta reads back exactly, beside a short payload or a long one, through dispatch and forks", function()
      local store = helpers.new(url)
      local meta = { note = string.rep("m", 3000) }
      store:append("m", {
        { type = "t", payload = { n = 1 }, meta = meta },
        { type = "t", payload = sized(2000, "p"), meta = meta },
        { type = "t", payload = sized(2000, "q"), meta = { short = true } },
      })
      local function check(events)
        assert.same({ { n = 1 }, sized(2000, "p"), sized(2000, "q") },
          { events[1].payload, events[2].payload, events[3].payload })
        assert.same({ meta, meta, { short = true } }, { events[1].meta, events[2].meta, events[3].meta })
      end
      check(store:read("m"))
      local got = helpers.claim(store, "m", { holder = "w", ttl_ms = 60000, limit = 3 })
      check(got.events)
      for _, e in ipairs(got.events) do store:complete("m", e.index, e.attempt) end
      check(store:read("m"))
      store:fork("m", 3, "m2")
      check(store:read("m2"))
    end)

    it("a fork copies long payloads, and truncating the source leaves the copies whole", function()
      local store = helpers.new(url)
      append_sized(store, "src", true)
      store:fork("src", 4, "copy")
      assert.same(expected_texts(1, 4), payload_texts(store:read("copy")))
      store:truncate("src", 5)
      assert.same({}, store:read("src", { after = 5 }))
      assert.same(expected_texts(1, 4), payload_texts(store:read("copy")))
      -- and the store takes new long payloads after the removal
      append_sized(store, "src", true)
      assert.same(expected_texts(1, #SIZES), payload_texts(store:read("src", { after = 5 })))
    end)
  end)
end

describe("sqlite: long payloads apart from their rows", function()
  after_each(helpers.cleanup)

  it("keeps a payload over 512 bytes out of the row that claims and completions rewrite", function()
    local store, _, url = helpers.new("sqlite:")
    local path = url:match("^sqlite:(.*)$")
    append_sized(store, "s")
    append_sized(store, "gone", true)
    store:append("meta", { { type = "t", payload = { n = 1 }, meta = { note = string.rep("m", 600) }, settled = true } })
    store:close()
    -- a long meta beside a short payload: the meta apart, the payload in the row
    assert.equal("1|0|1", sqlite3(path, "SELECT p.payload IS NULL, e.payload IS NULL, e.meta IS NULL"
      .. " FROM events e JOIN payloads p ON p.position = e.position WHERE e.session = 'meta'"))
    store = helpers.open_same(url)
    assert.same({ note = string.rep("m", 600) }, store:read("meta")[1].meta)
    store:truncate("meta", 1)
    store:close()
    -- 513 bytes and more apart; 511 and 512 in the row
    assert.equal("3|3", sqlite3(path, "SELECT count(*), sum(length(payload) > 512) FROM payloads"
      .. " WHERE position IN (SELECT position FROM events WHERE session = 's')"))
    assert.equal("2", sqlite3(path, "SELECT count(*) FROM events WHERE session = 's' AND payload IS NOT NULL"))
    assert.equal("0", sqlite3(path, "SELECT count(*) FROM events WHERE length(payload) > 512"))
    store = helpers.open_same(url)
    local got = helpers.claim(store, "s", { holder = "w", ttl_ms = 60000, limit = 5 })
    for _, e in ipairs(got.events) do store:complete("s", e.index, e.attempt) end
    assert.same(expected_texts(1, #SIZES), payload_texts(store:read("s")))
    -- truncation removes the payloads of the rows it removes, and only those
    store:truncate("gone", 5)
    store:close()
    assert.equal("3", sqlite3(path, "SELECT count(*) FROM payloads"))
    assert.equal("0", sqlite3(path, "SELECT count(*) FROM payloads"
      .. " WHERE position NOT IN (SELECT position FROM events)"))
  end)
end)

-- A file written at schema version 12 (spec/fixtures/sqlite_schema_v12.sql,
-- by spec/support/payload_store_writer.lua): orders 1 (short, completed),
-- 2 (600 bytes, claimed until T + 60 s), 3 (5,000 bytes, ready), 4 (2,000
-- bytes, settled); dead 1 (1,500 bytes, dead-lettered). Every payload is in
-- its row.
describe("sqlite: a file of schema version 12 with long payloads in their rows", function()
  after_each(helpers.cleanup)

  it("is migrated at open: the old rows read the same, dispatch goes on, new long payloads go apart", function()
    local T = 1700000000000
    local url, path = helpers.sqlite_fixture("sqlite_schema_v12.sql")
    local clock = helpers.manual_clock(T)
    local store = helpers.open_same(url, { clock = clock })
    local function text(tag, bytes) return { tag = tag, text = string.rep(tag:sub(1, 1), bytes) } end
    local orders = store:read("orders")
    assert.same({ { n = 1 }, text("medium", 600), text("large", 5000), text("history", 2000) },
      { orders[1].payload, orders[2].payload, orders[3].payload, orders[4].payload })
    assert.same({ "processed", "pending", "pending", "processed" },
      { orders[1].status, orders[2].status, orders[3].status, orders[4].status })
    assert.same(text("dead", 1500), store:dead_letters({})[1].payload)
    -- 3 is ready; 2 is claimed until T + 60 s
    local got = store:claim_next({ holder = "w2", ttl_ms = 60000, limit = 10 })
    assert.equal(1, #got)
    assert.same(text("large", 5000), got[1].payload)
    store:complete("orders", 3, got[1].attempt, { { type = "r", payload = text("result", 900) } })
    clock:set(T + 60000)
    got = store:claim_next({ holder = "w2", ttl_ms = 60000, limit = 10, types = { "order" } })
    assert.same({ 2 }, { got[1] and got[1].index })
    assert.same(text("medium", 600), got[1].payload)
    store:complete("orders", 2, got[1].attempt)
    assert.same(text("result", 900), store:read("orders", { after = 4 })[1].payload)
    store:close()
    assert.equal(helpers.SQLITE_SCHEMA, helpers.sqlite_version(path))
    -- the old rows kept theirs in place; the new long one is apart
    assert.equal("1", sqlite3(path, "SELECT count(*) FROM payloads"))
    assert.equal("0", sqlite3(path, "SELECT count(*) FROM events WHERE payload IS NULL AND position <= 5"))
    store = helpers.open_same(url, { clock = clock })
    local r = helpers.claim(store, "orders", { holder = "w2", ttl_ms = 60000 })
    store:complete("orders", 5, r.events[1].attempt)
    store:truncate("orders", 5)
    assert.same({}, store:read("orders", { after = 5 }))
    assert.same(text("dead", 1500), store:dead_letters({})[1].payload)
    store:close()
    assert.equal("0", sqlite3(path, "SELECT count(*) FROM payloads"))
    helpers.remove_db(path)
  end)

  -- A table a user added under the name a migration creates is not ours
  -- (version 13: payloads; version 14, §3.8 fence floors: fence_floors):
  -- the migrations fail, all of them rolled back, and say why.
  for _, case in ipairs({ { "payloads", "12 to 13" }, { "fence_floors", "13 to 14" } }) do
    local name, step = case[1], case[2]
    it("is left at version 12, and says why, when it already holds a table named " .. name, function()
      local url, path = helpers.sqlite_fixture("sqlite_schema_v12.sql")
      sqlite3(path, ("CREATE TABLE %s(x); INSERT INTO %s VALUES ('a user''s row')"):format(name, name))
      local ok, err = pcall(helpers.open_same, url)
      assert.is_false(ok)
      assert.matches("migrating schema " .. step .. " failed", tostring(err), 1, true)
      assert.matches(name .. " already exists", tostring(err), 1, true)
      -- nothing of the migrations stayed: the file is as it was
      assert.equal("12", helpers.sqlite_version(path))
      assert.equal("a user's row", sqlite3(path, "SELECT x FROM " .. name))
      if name ~= "payloads" then
        assert.equal("0", sqlite3(path, "SELECT count(*) FROM sqlite_master WHERE name = 'payloads'"))
      end
      -- once the table has another name the migrations go through
      sqlite3(path, ("ALTER TABLE %s RENAME TO my_%s"):format(name, name))
      local store = helpers.open_same(url)
      assert.same({ n = 1 }, store:read("orders")[1].payload)
      assert.equal(1, store:fence("orders"))
      store:close()
      assert.equal(helpers.SQLITE_SCHEMA, helpers.sqlite_version(path))
      helpers.remove_db(path)
    end)
  end
end)
