-- The Lua binding's event tables and event arguments (core/bridge/events.c):
-- every returned event holds exactly the fields that are set, under their
-- documented names (README "An event as every call returns it"), with
-- integers as integers; strings that repeat across the events of one
-- result (session, type, lane, holder) are right for each event; the
-- payloads of one batch keep their own bytes and their own size limit.
-- Runs once per backend URL (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")

local json = eventstore.json
local T0 = helpers.T0
local expect_error = helpers.expect_error

-- Every name an event table may hold, and the Lua type of its value.
local FIELD_TYPES = {
  id = "string", type = "string", payload = "any", key = "string", shredded = "boolean",
  index = "integer", session = "string", position = "integer", created_at = "integer",
  cause = "table", lane = "string", not_before = "integer", status = "string",
  attempts = "integer", failures = "integer", last_error = "string", processed_at = "integer",
  claim_holder = "string", claim_expires_at = "integer", retry_at = "integer",
  first_claimed_at = "integer", last_claimed_at = "integer", failed_at = "integer",
  processed_by_attempt = "integer", origin = "table", attempt = "integer",
  revision = "integer", meta = "table",
}

-- The sorted names of e's fields, after checking each one's type.
local function fields_of(e)
  local names = {}
  for k, v in pairs(e) do
    local want = FIELD_TYPES[k]
    assert(want ~= nil, "unexpected field " .. tostring(k))
    if want == "integer" then
      assert.equal("integer", math.type(v), k)
    elseif want ~= "any" then
      assert.equal(want, type(v), k)
    end
    names[#names + 1] = k
  end
  table.sort(names)
  return table.concat(names, " ")
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    it("returns exactly the fields that are set, integers as integers", function()
      local store, clock = new()
      local stored = store:append("s", {
        { type = "settled.one", payload = { n = 1 }, settled = true },
        { type = "pending.one", lane = "L", not_before = T0 },
        { type = "no.payload" },
        { type = "with.meta", revision = 2, meta = { k = 1 } },
      })
      -- revision is always set (1 by default), meta only when given
      local base = "attempts created_at failures id index position revision session status type"
      assert.equal("attempts created_at failures id index payload position processed_at revision session status type",
        fields_of(stored[1]))
      assert.equal("attempts created_at failures id index lane not_before position revision session status type",
        fields_of(stored[2]))
      assert.equal(base, fields_of(stored[3]))
      assert.equal("attempts created_at failures id index meta position revision session status type",
        fields_of(stored[4]))
      assert.equal("processed", stored[1].status)
      assert.equal("pending", stored[2].status)
      -- a read returns the same tables' worth of fields
      local read = store:read("s")
      for i = 1, 4 do assert.equal(fields_of(stored[i]), fields_of(read[i])) end

      -- claimed: the claim's record, and `attempt` on the claimed copy only
      local ev = helpers.claimed(store, "s", { holder = "w9", ttl_ms = 500 })[1]
      assert.equal(2, ev.index)
      assert.equal(1, ev.attempt)
      assert.equal("w9", ev.claim_holder)
      assert.equal(T0 + 500, ev.claim_expires_at)
      assert.equal("attempt attempts claim_expires_at claim_holder created_at failures first_claimed_at id index "
        .. "lane last_claimed_at not_before position revision session status type", fields_of(ev))
      assert.is_nil(store:read("s", { after = 1, limit = 1 })[1].attempt)

      -- failed: last_error, failed_at, retry_at
      store:fail("s", 2, 1, { error = "boom", retry_after_ms = 10 })
      local failed = store:read("s", { after = 1, limit = 1 })[1]
      assert.equal("boom", failed.last_error)
      assert.equal(1, failed.failures)
      assert.equal("integer", math.type(failed.failed_at))
      assert.equal("integer", math.type(failed.retry_at))
      fields_of(failed)

      -- a completion's result: cause {index, attempt}
      clock:advance(10)
      local again = helpers.claimed(store, "s", { holder = "w9", ttl_ms = 500 })[1]
      local done = store:complete("s", again.index, again.attempt, { { type = "result", payload = { ok = true } } })
      assert.equal("completed", done.outcome)
      local result = done.events[1]
      assert.same({ index = 2, attempt = 2 }, result.cause)
      assert.equal("integer", math.type(result.cause.index))
      local processed = store:read("s", { after = 1, limit = 1 })[1]
      assert.equal(2, processed.processed_by_attempt)
      fields_of(processed)

      -- a fork's copy: origin {session, index}
      store:fork("s", 1, "f")
      local copy = store:read("f")[1]
      assert.same({ session = "s", index = 1 }, copy.origin)
      assert.equal("integer", math.type(copy.origin.index))
      fields_of(copy)
    end)

    it("gives each event of a result its own session, type, lane and holder", function()
      local store = new()
      local types = { "a", "a", "b", "a", "bb", "b", "a" }
      local lanes = { false, "x", "x", false, "y", "x", "xy" }
      for round = 1, 2 do
        local batch = {}
        for i, t in ipairs(types) do
          batch[i] = { type = t .. round, lane = lanes[i] or nil, payload = i }
        end
        -- sessions interleaved in position order, for read_all
        store:append(round == 1 and "s1" or "s2", batch)
        store:append("s" .. (3 - round), { { type = "other" } })
      end
      -- s1: its batch, then "other"; s2: "other", then its batch
      for round, list in ipairs({ store:read("s1"), store:read("s2") }) do
        local first = round == 1 and 0 or 1
        for i, t in ipairs(types) do
          local e = list[first + i]
          assert.equal("s" .. round, e.session)
          assert.equal(t .. round, e.type)
          assert.equal(lanes[i] or nil, e.lane)
          assert.equal(i, e.payload)
        end
        assert.equal("other", list[round == 1 and 8 or 1].type)
      end
      local all = store:read_all({})
      local seen = {}
      for _, e in ipairs(all) do
        assert.equal(e.session == "s1" and "s1" or "s2", e.session)
        seen[e.session] = (seen[e.session] or 0) + 1
        local own = store:read(e.session, { after = e.index - 1, limit = 1 })[1]
        assert.equal(own.type, e.type)
        assert.equal(own.lane, e.lane)
        assert.equal(own.id, e.id)
      end
      assert.same({ s1 = 8, s2 = 8 }, seen)
      -- claims by two holders in one read: each event keeps its own
      local ttl = { ttl_ms = 1000 }
      local a = store:claim_next({ holder = "h-one", ttl_ms = ttl.ttl_ms, limit = 1 })[1]
      local b = store:claim_next({ holder = "h-two", ttl_ms = ttl.ttl_ms, limit = 1 })[1]
      assert.is_not_nil(a)
      assert.is_not_nil(b)
      local holders = {}
      for _, e in ipairs(store:read_all({})) do
        if e.claim_holder then holders[e.claim_holder] = (holders[e.claim_holder] or 0) + 1 end
      end
      assert.same({ ["h-one"] = 1, ["h-two"] = 1 }, holders)
    end)

    it("keeps every payload of a batch exact, with and without payloads between them", function()
      local store = new()
      local payloads = {
        { big = string.rep("b", 5000) }, nil, "x", { json.null, 1.5, { k = "v" } }, 0, nil,
        string.rep("é", 300), {}, json.array({}), false,
      }
      local batch = {}
      for i = 1, 10 do batch[i] = { type = "t", payload = payloads[i] } end
      local stored = store:append("p", batch)
      local read = store:read("p")
      for i = 1, 10 do
        assert.same(payloads[i], stored[i].payload)
        assert.same(payloads[i], read[i].payload)
        assert.equal(json.encode(payloads[i]), json.encode(read[i].payload))
      end
      assert.is_true(json.is_array(read[9].payload))
      assert.is_false(json.is_array(read[8].payload))
    end)

    it("applies max_payload_bytes to each payload of a batch, not to the batch", function()
      local store = new({ max_payload_bytes = 100 })
      -- canonical texts of exactly 100 bytes each: 1,000 bytes in all
      local batch = {}
      for i = 1, 10 do batch[i] = { type = "t", payload = string.rep(tostring(i % 10), 98) } end
      local stored = store:append("p", batch)
      assert.equal(10, #stored)
      for i = 1, 10 do assert.equal(string.rep(tostring(i % 10), 98), store:read("p")[i].payload) end
      -- a short one, then one a byte over: the second is refused, nothing is written
      local err = expect_error("TOO_LARGE", function()
        return store:append("p", {
          { type = "t", payload = string.rep("a", 98) },
          { type = "t", payload = "short" },
          { type = "t", payload = string.rep("c", 99) },
        })
      end)
      assert.truthy(err.message:find("events[3].payload is over the limit of 100 bytes", 1, true), err.message)
      assert.equal(10, store:head("p"))
    end)

    it("names the event of a bad payload by its position, past 9 and 99", function()
      local store = new()
      for _, at in ipairs({ 1, 12, 100 }) do
        local batch = {}
        for i = 1, at do batch[i] = { type = "t", payload = { i = i } } end
        batch[at].payload = { f = print }
        local err = expect_error("INVALID_ARGUMENT", function() return store:append("p", batch) end)
        assert.truthy(err.message:find("events[" .. at .. "].payload.f", 1, true), err.message)
      end
      assert.equal(0, store:head("p"))
    end)

    -- The payloads of a list are decoded with a cache of recent short
    -- strings (core/bridge/json_lua.c): strings that share their length and
    -- first, middle and last bytes share a slot, so these keep evicting
    -- each other, and a hit must still be the exact string.
    it("decodes the payloads of a list exactly when short strings repeat, collide and change", function()
      local store = new()
      local function word(n, i) -- n bytes, same first, middle and last byte for every i
        local mid = string.format("%0" .. math.max(n - 2, 0) .. "d", i):sub(1, math.max(n - 2, 0))
        local s = "k" .. mid .. "z"
        return s:sub(1, n)
      end
      local payloads = {}
      for i = 1, 150 do
        local p = { common = "same", ["k" .. (i % 7)] = word(8, i), [word(12, i % 90)] = i,
          list = json.array({ word(40, i), word(41, i), "\u{e9}t\u{e9}", "" }), esc = "a\"b\\c\n" .. (i % 3) }
        payloads[i] = p
      end
      local batch = {}
      for i, p in ipairs(payloads) do batch[i] = { type = "t", payload = p } end
      local stored = store:append("c", batch)
      local read, all = store:read("c"), store:read_all({})
      for i = 1, 150 do
        assert.same(payloads[i], stored[i].payload)
        assert.same(payloads[i], read[i].payload)
        assert.same(payloads[i], all[i].payload)
        assert.is_true(json.is_array(read[i].payload.list))
      end
    end)
  end)
end

-- A stored payload that is not JSON (written behind the store's back) fails
-- a read of the list that holds it with the codec's error, as json.decode
-- of that text; the events before it and the store stay usable.
describe("sqlite: a stored payload that is not JSON", function()
  it("fails the read of a list with the decoder's INVALID_ARGUMENT", function()
    local reserved = os.tmpname()
    local path = reserved .. ".db"
    finally(function()
      for _, f in ipairs({ reserved, path, path .. "-wal", path .. "-shm" }) do os.remove(f) end
    end)
    local store = eventstore.open("sqlite:" .. path)
    local batch = {}
    for i = 1, 5 do batch[i] = { type = "t", payload = { customer = "c-1", n = i } } end
    store:append("s", batch)
    store:close()
    local bad = '{"customer":"c-1","n":3,}'
    local sql = "UPDATE events SET payload = '" .. bad .. "' WHERE session = 's' AND idx = 3"
    assert(os.execute("sqlite3 " .. helpers.sh_quote(path) .. " " .. helpers.sh_quote(sql) .. " >/dev/null") == true,
      "the sqlite3 shell is needed (make deps installs it)")
    store = eventstore.open("sqlite:" .. path)
    local want = expect_error("INVALID_ARGUMENT", function() return json.decode(bad) end)
    for _ = 1, 3 do
      local err = expect_error("INVALID_ARGUMENT", function() return store:read("s") end)
      assert.equal(want.message, err.message)
    end
    assert.same({ customer = "c-1", n = 2 }, store:read("s", { limit = 2 })[2].payload)
    assert.same({ customer = "c-1", n = 5 }, store:read("s", { after = 3 })[2].payload)
    store:close()
  end)
end)
