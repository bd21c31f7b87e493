-- Conformance: docs/contract.md §3.6 (presence: per-field last-writer-wins by `at`,
-- tombstones, TTL by the store's clock, patches). Runs once per backend URL
-- (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")

local json = eventstore.json
local T0 = helpers.T0

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    -- presence_read sorted by participant, then field (the contract fixes no order).
    local function rows(store, ns)
      local list = store:presence_read(ns)
      local out = {}
      for i, r in ipairs(list) do out[i] = r end
      table.sort(out, function(a, b)
        if a.participant ~= b.participant then return a.participant < b.participant end
        return a.field < b.field
      end)
      return out
    end

    -- participant -> field -> value, from presence_read.
    local function view(store, ns)
      local out = {}
      for _, r in ipairs(store:presence_read(ns)) do
        out[r.participant] = out[r.participant] or {}
        assert.is_nil(out[r.participant][r.field], "a field is listed twice: " .. r.field)
        out[r.participant][r.field] = r.value
      end
      return out
    end

    local function set(store, ns, p, values, opts)
      opts = opts or {}
      opts.ttl_ms = opts.ttl_ms or 10000
      return store:presence_set(ns, p, values, opts)
    end

    -------------------------------------------------------------------------
    describe("presence_set and presence_read", function()
      it("stores fields with at = now, seen = 0 and expires_at = now + ttl_ms by default", function()
        local store = new()
        store:presence_set("room", "ann", { cursor = 5, name = "Ann" }, { ttl_ms = 1000 })
        local r = rows(store, "room")
        assert.equal(2, #r)
        assert.same({ participant = "ann", field = "cursor", value = 5, seen = 0, at = T0, expires_at = T0 + 1000 }, {
          participant = r[1].participant, field = r[1].field, value = r[1].value,
          seen = r[1].seen, at = r[1].at, expires_at = r[1].expires_at,
        })
        assert.equal("name", r[2].field)
        assert.equal("Ann", r[2].value)
        assert.equal(T0, r[2].at)
        assert.equal(T0 + 1000, r[2].expires_at)
      end)

      it("stores the given at and seen", function()
        local store = new()
        store:presence_set("room", "ann", { x = 1 }, { ttl_ms = 1000, at = 77, seen = 12 })
        local r = rows(store, "room")[1]
        assert.equal(77, r.at)
        assert.equal(12, r.seen)
        assert.equal(T0 + 1000, r.expires_at)
      end)

      it("keeps values as exact JSON", function()
        local store = new()
        local v = { n = math.maxinteger, f = 3.0, list = json.array({ 1, json.null }), e = json.array({}), o = {} }
        set(store, "room", "ann", { state = v, flag = false, text = "a\0b" })
        local got = view(store, "room").ann
        assert.equal(json.encode(v), json.encode(got.state))
        assert.equal("float", math.type(got.state.f))
        assert.equal(false, got.flag)
        assert.equal("a\0b", got.text)
      end)

      it("keeps participants and namespaces apart", function()
        local store = new()
        set(store, "room", "ann", { x = 1 })
        set(store, "room", "bob", { x = 2 })
        set(store, "hall", "ann", { x = 3 })
        assert.same({ ann = { x = 1 }, bob = { x = 2 } }, view(store, "room"))
        assert.same({ ann = { x = 3 } }, view(store, "hall"))
        assert.same({}, store:presence_read("nowhere"))
      end)

      it("a later write updates a field and keeps the others", function()
        local store, clock = new()
        set(store, "room", "ann", { x = 1, y = 1 })
        clock:advance(10)
        set(store, "room", "ann", { x = 2 })
        assert.same({ ann = { x = 2, y = 1 } }, view(store, "room"))
      end)

      it("last writer wins per field by at: an older write loses that field only", function()
        local store = new()
        set(store, "room", "ann", { a = "new" }, { at = 10 })
        set(store, "room", "ann", { b = "old" }, { at = 3 })
        set(store, "room", "ann", { a = "stale", b = "mid" }, { at = 5 })
        assert.same({ ann = { a = "new", b = "mid" } }, view(store, "room"))
        for _, r in ipairs(rows(store, "room")) do
          if r.field == "a" then assert.equal(10, r.at) else assert.equal(5, r.at) end
        end
      end)

      it("a tie in at goes to the incoming write", function()
        local store = new()
        set(store, "room", "ann", { a = 1 }, { at = 10 })
        set(store, "room", "ann", { a = 2 }, { at = 10 })
        assert.same({ ann = { a = 2 } }, view(store, "room"))
      end)

      it("orders by at, not by arrival or the store's clock", function()
        local store, clock = new()
        set(store, "room", "ann", { a = "first" }, { at = T0 + 500 })
        clock:advance(1000)
        set(store, "room", "ann", { a = "second" }, { at = T0 + 400 })
        assert.same({ ann = { a = "first" } }, view(store, "room"))
      end)

      it("json.null deletes a field and read never returns the tombstone", function()
        local store = new()
        set(store, "room", "ann", { a = 1, b = 2 }, { at = 10 })
        set(store, "room", "ann", { a = json.null }, { at = 11 })
        assert.same({ ann = { b = 2 } }, view(store, "room"))
        for _, r in ipairs(store:presence_read("room")) do
          assert.not_equal("a", r.field)
        end
        set(store, "room", "ann", { b = json.null }, { at = 12 })
        assert.same({}, store:presence_read("room"))
      end)

      it("a tombstone stops an older write from bringing the field back", function()
        local store = new()
        set(store, "room", "ann", { a = 1 }, { at = 10 })
        set(store, "room", "ann", { a = json.null }, { at = 20 })
        set(store, "room", "ann", { a = "zombie", b = "ok" }, { at = 15 })
        assert.same({ ann = { b = "ok" } }, view(store, "room"))
        set(store, "room", "ann", { a = "back" }, { at = 21 })
        assert.same({ ann = { a = "back", b = "ok" } }, view(store, "room"))
      end)

      it("deleting a field that never existed leaves a tombstone too", function()
        local store = new()
        set(store, "room", "ann", { a = json.null }, { at = 20 })
        set(store, "room", "ann", { a = "old" }, { at = 10 })
        assert.same({}, store:presence_read("room"))
      end)

      it("a tombstone lasts until its TTL ends", function()
        local store, clock = new()
        set(store, "room", "ann", { a = 1 }, { at = 10, ttl_ms = 1000 })
        set(store, "room", "ann", { a = json.null }, { at = 20, ttl_ms = 100 })
        clock:advance(99)
        set(store, "room", "ann", { a = "old" }, { at = 15 })
        assert.same({}, store:presence_read("room"))
        clock:advance(1)
        set(store, "room", "ann", { a = "old" }, { at = 15 })
        assert.same({ ann = { a = "old" } }, view(store, "room"))
      end)

      it("counts TTL from the store's clock, never from at; gone when now >= expires_at", function()
        local store, clock = new()
        set(store, "room", "ann", { a = 1 }, { at = 1, ttl_ms = 1000 })       -- ancient at
        set(store, "room", "bob", { a = 2 }, { at = T0 + 1000000000, ttl_ms = 1000 }) -- future at
        local r = rows(store, "room")
        assert.equal(2, #r)
        assert.equal(T0 + 1000, r[1].expires_at)
        assert.equal(T0 + 1000, r[2].expires_at)
        clock:set(T0 + 999)
        assert.equal(2, #store:presence_read("room"))
        clock:set(T0 + 1000)
        assert.same({}, store:presence_read("room"))
      end)

      it("expires fields one by one", function()
        local store, clock = new()
        set(store, "room", "ann", { short = 1 }, { ttl_ms = 100 })
        set(store, "room", "ann", { long = 2 }, { ttl_ms = 500 })
        clock:set(T0 + 100)
        assert.same({ ann = { long = 2 } }, view(store, "room"))
        clock:set(T0 + 500)
        assert.same({}, store:presence_read("room"))
      end)

      it("a new write refreshes expires_at", function()
        local store, clock = new()
        set(store, "room", "ann", { a = 1 }, { ttl_ms = 1000 })
        clock:set(T0 + 800)
        set(store, "room", "ann", { a = 2 }, { ttl_ms = 1000 })
        clock:set(T0 + 1500)
        local r = rows(store, "room")
        assert.equal(1, #r)
        assert.equal(2, r[1].value)
        assert.equal(T0 + 1800, r[1].expires_at)
      end)

      it("an expired field no longer beats an older write", function()
        local store, clock = new()
        set(store, "room", "ann", { a = "new" }, { at = 100, ttl_ms = 50 })
        clock:advance(50)
        set(store, "room", "ann", { a = "older" }, { at = 10 })
        assert.same({ ann = { a = "older" } }, view(store, "room"))
      end)

      it("rejects a value JSON cannot carry with INVALID_ARGUMENT, changing nothing", function()
        local store = new()
        set(store, "room", "ann", { a = 1 }, { at = 1 })
        local before = helpers.dump(rows(store, "room"))
        helpers.expect_error("INVALID_ARGUMENT", function()
          return set(store, "room", "ann", { a = 2, b = function() end }, { at = 2 })
        end)
        helpers.expect_error("INVALID_ARGUMENT", function()
          return set(store, "room", "ann", { a = 0 / 0 }, { at = 2 })
        end)
        assert.equal(before, helpers.dump(rows(store, "room")))
      end)

      it("requires ttl_ms (a standard argument error)", function()
        local store = new()
        helpers.expect_arg_error(function() return store:presence_set("room", "ann", { a = 1 }, {}) end)
        helpers.expect_arg_error(function() return store:presence_set("room", "ann", { a = 1 }, { at = 5 }) end)
        helpers.expect_arg_error(function() return store:presence_set("room", "ann", { a = 1 }) end)
        assert.same({}, store:presence_read("room"))
      end)
    end)

    -------------------------------------------------------------------------
    describe("presence_subscribe", function()
      it("sends a patch with the applied fields, participant, seen and at", function()
        local store = new()
        local patches = {}
        local unsubscribe = store:presence_subscribe("room", function(p) patches[#patches + 1] = p end)
        assert.equal("function", type(unsubscribe))
        store:presence_set("room", "ann", { a = 1, b = "x" }, { ttl_ms = 1000, at = 10, seen = 4 })
        assert.equal(1, #patches)
        local p = patches[1]
        assert.equal("ann", p.participant)
        assert.same({ a = 1, b = "x" }, p.values)
        assert.equal(4, p.seen)
        assert.equal(10, p.at)
      end)

      it("holds only the fields the write won", function()
        local store = new()
        set(store, "room", "ann", { a = 1 }, { at = 10 })
        set(store, "room", "ann", { b = 1 }, { at = 3 })
        local patches = {}
        store:presence_subscribe("room", function(p) patches[#patches + 1] = p end)
        set(store, "room", "ann", { a = 2, b = 2, c = 2 }, { at = 5 })
        assert.equal(1, #patches)
        assert.same({ b = 2, c = 2 }, patches[1].values)
        assert.equal(5, patches[1].at)
      end)

      it("sends a deletion as json.null", function()
        local store = new()
        set(store, "room", "ann", { a = 1, b = 1 }, { at = 1 })
        local patches = {}
        store:presence_subscribe("room", function(p) patches[#patches + 1] = p end)
        set(store, "room", "ann", { a = json.null }, { at = 2 })
        assert.equal(1, #patches)
        assert.is_true(rawequal(json.null, patches[1].values.a))
        assert.is_nil(patches[1].values.b)
      end)

      it("sends nothing for a write that loses every field", function()
        local store = new()
        set(store, "room", "ann", { a = 1, b = 1 }, { at = 10 })
        set(store, "room", "ann", { c = json.null }, { at = 10 })
        local patches = {}
        store:presence_subscribe("room", function(p) patches[#patches + 1] = p end)
        set(store, "room", "ann", { a = 2, b = 2 }, { at = 9 })
        set(store, "room", "ann", { c = "zombie" }, { at = 9 })
        assert.same({}, patches)
        assert.same({ ann = { a = 1, b = 1 } }, view(store, "room"))
      end)

      it("only sees its namespace, and unsubscribe stops it", function()
        local store = new()
        local patches = {}
        local unsubscribe = store:presence_subscribe("room", function(p) patches[#patches + 1] = p end)
        set(store, "hall", "ann", { a = 1 })
        set(store, "room", "bob", { a = 1 })
        unsubscribe()
        set(store, "room", "bob", { a = 2 })
        assert.equal(1, #patches)
        assert.equal("bob", patches[1].participant)
        assert.same({ a = 1 }, patches[1].values)
      end)

      it("sends the store clock as at when the write gives none", function()
        local store, clock = new()
        clock:set(T0 + 33)
        local patches = {}
        store:presence_subscribe("room", function(p) patches[#patches + 1] = p end)
        store:presence_set("room", "ann", { a = 1 }, { ttl_ms = 100 })
        assert.equal(T0 + 33, patches[1].at)
        assert.equal(0, patches[1].seen)
      end)
    end)
  end)
end
