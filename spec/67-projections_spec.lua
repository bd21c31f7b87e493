-- spec/67: projections (docs/contract.md §8, docs/projections.md) on every
-- backend: the fold in position order with keys and a session prefix, the
-- states against a fold from scratch, reads and key pages, blue/green
-- generations (an edit or a rebuild never shows a half-built model), a
-- raising step that stops only its projection (retry, skip), tenants, and
-- a store written by the previous schema, migrated at open.
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local PER_CUSTOMER = [[
return {
  init = function(key) return {orders = 0, total = 0, key = key} end,
  key = function(e) return e.payload.customer end,
  sessions = "order-",
  ["order.placed"] = function(s, e) s.orders = s.orders + 1; s.total = s.total + e.payload.amount end,
  ["order.cancelled"] = function(s, e, ctx)
    s.orders = s.orders - 1
    s.total = s.total - e.payload.amount
    return s
  end,
}
]]

local TOTALS = [[
return {
  ["order.placed"] = function(s, e) s.n = (s.n or 0) + 1; s.sum = (s.sum or 0) + e.payload.amount end,
}
]]

local function projection(t, name, source) eh.write_script(t.dir .. "/projections/" .. name .. ".lua", source) end

local function setup(url)
  local t = eh.setup(url)
  assert(os.execute("mkdir -p " .. eh.sh_quote(t.dir .. "/projections")))
  return t
end

-- n orders over 7 sessions and 3 customers, settled (nothing to dispatch),
-- and one event outside the prefix that must not count.
local function orders(store, n, from)
  for i = from or 1, (from or 1) + n - 1 do
    store:append("order-" .. (i % 7), { { type = "order.placed", settled = true,
      payload = { customer = "c" .. (i % 3), amount = i } } })
  end
  store:append("other", { { type = "order.placed", settled = true, payload = { customer = "c1", amount = 1000 } } })
end

-- The states a fold from scratch gives, from store:read_all.
local function from_scratch(store)
  local per, totals = {}, { n = 0, sum = 0 }
  for _, e in ipairs(store:read_all({ after = 0, limit = 100000 })) do
    if e.type == "order.placed" then
      totals.n, totals.sum = totals.n + 1, totals.sum + e.payload.amount
      if e.session:sub(1, 6) == "order-" then
        local c = e.payload.customer
        per[c] = per[c] or { orders = 0, total = 0, key = c }
        per[c].orders, per[c].total = per[c].orders + 1, per[c].total + e.payload.amount
      end
    end
  end
  return per, totals
end

for _, url in ipairs(helpers.urls()) do
  describe("projections on " .. url, function()
    after_each(eh.cleanup)

    it("fold every event in position order into keyed states, exactly as a fold from scratch", function()
      local t = setup(url)
      projection(t, "per_customer", PER_CUSTOMER)
      projection(t, "totals", TOTALS)
      orders(t.store, 1200) -- over two batches
      local e = t.engine()
      eh.run(e)
      local per, totals = from_scratch(t.store)
      for c, want in pairs(per) do
        local got, info = t.store:projection("per_customer", c)
        assert.same(want, got)
        assert.equal(1201, info.position)
        assert.equal(1, info.generation)
        assert.is_string(info.version)
      end
      assert.same(totals, (t.store:projection("totals", "")))
      assert.is_nil(t.store:projection("per_customer", "nobody"))
      assert.is_nil(t.store:projection("unknown", "c1"))
      -- more events: only they are folded (a second fold would double them)
      orders(t.store, 10, 5000)
      eh.run(e)
      per, totals = from_scratch(t.store)
      assert.same(per.c2, (t.store:projection("per_customer", "c2")))
      assert.same(totals, (t.store:projection("totals", "")))
    end)

    it("gives each step its state's key as ctx.key, keys interleaved in one batch", function()
      local t = setup(url)
      projection(t, "keys_seen", [[
return { key = function(e) return e.payload.k end,
         ["x"] = function(s, e, ctx) s.seen = s.seen or {}; s.seen[#s.seen + 1] = ctx.key end }
]])
      for i = 1, 30 do t.store:append("s", { { type = "x", settled = true, payload = { k = "k" .. (i % 3) } } }) end
      eh.run(t.engine())
      for k = 0, 2 do
        local st = t.store:projection("keys_seen", "k" .. k)
        assert.equal(10, #st.seen)
        for _, seen in ipairs(st.seen) do assert.equal("k" .. k, seen) end
      end
    end)

    it("a projection that does not load is an error at eventstore.engine, naming the file", function()
      local t = setup(url)
      projection(t, "broken", "return { x = \n")
      local ok, err = pcall(t.engine)
      assert.is_false(ok)
      assert.equal("INVALID_ARGUMENT", err.code)
      assert.matches("projections/broken.lua:2", err.message, 1, true)
    end)

    it("a run gives its leases back at its end: the next engine's run folds at once", function()
      local t = setup(url)
      projection(t, "totals", TOTALS)
      orders(t.store, 3)
      local a = t.engine({ holder = "a", ttl_ms = 3600000 })
      eh.run(a)
      assert.is_nil(t.store:projections("totals")[1].holder)
      orders(t.store, 2, 100)
      -- another holder, within what would have been a's lease
      eh.run(t.engine({ holder = "b", ttl_ms = 3600000 }))
      assert.equal(7, t.store:projection("totals", "").n) -- 5 orders, 2 outside the prefix (totals has none)
    end)

    it("pages keys by prefix and cursor", function()
      local t = setup(url)
      projection(t, "by_key", [[
return { key = function(e) return e.payload.k end,
         ["x"] = function(s, e) s.n = (s.n or 0) + 1 end }
]])
      for i = 1, 25 do t.store:append("s" .. i, { { type = "x", settled = true, payload = { k = ("k%02d"):format(i) } } }) end
      t.store:append("s0", { { type = "x", settled = true, payload = { k = "other" } } })
      eh.run(t.engine())
      local page = t.store:projection_keys("by_key", { prefix = "k", limit = 10 })
      assert.equal(10, #page.keys)
      assert.equal("k01", page.keys[1])
      assert.equal("k10", page.cursor)
      local seen = {}
      local after
      repeat
        page = t.store:projection_keys("by_key", { prefix = "k", after = after, limit = 10 })
        for _, k in ipairs(page.keys) do seen[#seen + 1] = k end
        after = page.cursor
      until not after
      assert.equal(25, #seen)
      assert.equal("k25", seen[25])
      assert.same({ "other" }, t.store:projection_keys("by_key", { prefix = "o" }).keys)
      helpers.expect_error("INVALID_ARGUMENT", function() t.store:projection_keys("by_key", { limit = 0 }) end)
    end)

    it("states round-trip as reducer states do; a nil key skips the event", function()
      local t = setup(url)
      projection(t, "shapes", [[
return { key = function(e) return e.payload.k end,
         ["x"] = function(s, e) s.i = 3; s.f = 3.0; s.nested = {a = {1, 2}}; s.bin = "\0\255" end }
]])
      t.store:append("a", { { type = "x", settled = true, payload = { k = "one" } }, { type = "x", settled = true, payload = {} } })
      eh.run(t.engine())
      local s = t.store:projection("shapes", "one")
      assert.equal(math.type(3), math.type(s.i))
      assert.equal("float", math.type(s.f))
      assert.same({ a = { 1, 2 } }, s.nested)
      assert.equal("\0\255", s.bin)
      assert.same({ "one" }, t.store:projection_keys("shapes").keys)
    end)

    it("an edited projection is rebuilt beside the old one, which answers until the new one is whole", function()
      local t = setup(url)
      projection(t, "totals", TOTALS)
      orders(t.store, 30)
      local e = t.engine()
      eh.run(e)
      local before, info1 = t.store:projection("totals", "")
      -- the new version raises half way: its generation is never swapped in
      projection(t, "totals", [[
return { ["order.placed"] = function(s, e)
  if e.payload.amount == 20 then error("boom") end
  s.n = (s.n or 0) + 10 end }
]])
      eh.run(e)
      local now, info2 = t.store:projection("totals", "")
      assert.same(before, now)
      assert.equal(info1.generation, info2.generation)
      assert.equal(info1.version, info2.version)
      local row = e:projections()[1]
      assert.equal("failed", row.status)
      assert.is_true(row.rebuilding)
      -- fixed: the new generation catches up and then answers
      projection(t, "totals", [[
return { ["order.placed"] = function(s, e) s.n = (s.n or 0) + 10 end }
]])
      eh.run(e)
      local after, info3 = t.store:projection("totals", "")
      assert.equal(310, after.n)
      assert.is_true(info3.generation > info1.generation)
      assert.are_not.equal(info1.version, info3.version)
      -- a forced rebuild gives the same states in a new generation
      t.store:projection_control("totals", "rebuild")
      eh.run(e)
      local again, info4 = t.store:projection("totals", "")
      assert.same(after, again)
      assert.equal(info3.generation + 1, info4.generation)
    end)

    it("a raising step stops only that projection, names the event, and retry and skip go on", function()
      local t = setup(url)
      projection(t, "totals", TOTALS)
      projection(t, "picky", [[
return { ["order.placed"] = function(s, e)
  -- changes its state in place, then raises: nothing of it may stay
  s.n = (s.n or 0) + 1; s.seen = (s.seen or 0) + e.payload.amount
  if e.payload.amount == 5 and not os.getenv("NEVER_SET") then error("amount 5 refused") end
end }
]])
      orders(t.store, 9)
      local bad = t.store:read_all({ after = 0, limit = 100 })[5]
      assert.equal(5, bad.payload.amount)
      local e = t.engine()
      eh.run(e)
      local rows = {}
      for _, r in ipairs(e:projections()) do rows[r.name] = r end
      assert.equal("running", rows.totals.status)
      assert.equal(0, rows.totals.lag)
      assert.equal("failed", rows.picky.status)
      assert.equal(bad.position, rows.picky.error_position)
      assert.equal(bad.id, rows.picky.error_id)
      assert.matches("amount 5 refused", rows.picky.error)
      assert.matches(bad.id, rows.picky.error, 1, true)
      assert.equal(4, rows.picky.position)
      assert.is_true(rows.picky.lag > 0)
      -- the generation was never caught up: nothing answers yet
      assert.is_nil(t.store:projection("picky", ""))
      -- retry folds the same event again: it fails again
      t.store:projection_control("picky", "retry")
      eh.run(e)
      assert.equal("failed", e:projections()[1].status)
      helpers.expect_error("INVALID_ARGUMENT", function() t.store:projection_control("totals", "skip") end)
      helpers.expect_error("NOT_FOUND", function() t.store:projection_control("nope", "retry") end)
      -- skip records the event as skipped and goes on
      local rec = t.store:projection_control("picky", "skip")
      assert.equal(1, rec.skipped)
      eh.run(e)
      local s = t.store:projection("picky", "")
      assert.equal(9, s.n) -- ten placed (one outside order-), one skipped
      assert.equal(45 + 1000 - 5, s.seen)
    end)

    it("budgets apply to key() and to each step: a runaway one stops its projection, named", function()
      local t = setup(url)
      projection(t, "totals", TOTALS)
      projection(t, "spin_key", [[
return { key = function(e) if e.payload.amount == 3 then while true do end end return "k" end,
         ["order.placed"] = function(s, e) s.n = (s.n or 0) + 1 end }
]])
      projection(t, "spin_step", [[
return { key = function(e) return e.payload.customer end,
         ["order.placed"] = function(s, e)
           s.n = (s.n or 0) + 1
           if e.payload.amount == 4 then while true do end end
         end }
]])
      projection(t, "bad_key", [[
return { key = function(e) return e.payload.amount == 2 and {} or "k" end,
         ["order.placed"] = function(s, e) s.n = (s.n or 0) + 1 end }
]])
      orders(t.store, 9)
      local all = t.store:read_all({ after = 0, limit = 100 })
      local e = t.engine({ instruction_budget = 100000 })
      eh.run(e)
      local rows = {}
      for _, r in ipairs(e:projections()) do rows[r.name] = r end
      assert.equal("running", rows.totals.status)
      assert.equal(0, rows.totals.lag)
      for name, at in pairs({ spin_key = 3, spin_step = 4, bad_key = 2 }) do
        assert.equal("failed", rows[name].status, name)
        assert.equal(all[at].position, rows[name].error_position, name)
        assert.equal(at - 1, rows[name].position, name)
      end
      assert.matches("key(): ", rows.spin_key.error, 1, true)
      assert.matches("instruction budget exceeded", rows.spin_key.error, 1, true)
      assert.matches("the step: ", rows.spin_step.error, 1, true)
      assert.matches("instruction budget exceeded", rows.spin_step.error, 1, true)
      assert.matches("key() must return a string, a number or nil", rows.bad_key.error, 1, true)
      -- a retry runs the runaway code again, and the budget stops it again
      t.store:projection_control("spin_step", "retry")
      eh.run(e)
      for _, r in ipairs(e:projections()) do rows[r.name] = r end
      assert.equal("failed", rows.spin_step.status)
      assert.equal(all[4].position, rows.spin_step.error_position)
    end)

    -- Keys are names: stored as C strings, "a\0b" would be "a", and the
    -- two keys' states would overwrite each other. So a key() that returns
    -- one fails its projection at that event (what came before stays),
    -- and a read of such a key is refused, never answered with "a"'s.
    it("a key with a NUL byte fails the projection at its event; reading one is INVALID_ARGUMENT", function()
      local t = setup(url)
      projection(t, "by_k", [[
return { key = function(e) return e.payload.k end,
         ["x"] = function(s, e) s.n = (s.n or 0) + 1 end }
]])
      t.store:append("s", { { type = "x", settled = true, payload = { k = "a" } },
        { type = "x", settled = true, payload = { k = "a" } } })
      local e = t.engine()
      eh.run(e)
      assert.same({ n = 2 }, (t.store:projection("by_k", "a")))
      local bad = t.store:append("s", { { type = "x", settled = true, payload = { k = "a\0b" } },
        { type = "x", settled = true, payload = { k = "a" } } })[1]
      eh.run(e)
      local row = e:projections()[1]
      assert.equal("failed", row.status)
      assert.equal(bad.position, row.error_position)
      assert.equal(bad.id, row.error_id)
      assert.matches("NUL", row.error, 1, true)
      assert.same({ n = 2 }, (t.store:projection("by_k", "a"))) -- neither the bad event nor the one after it
      assert.same({ "a" }, t.store:projection_keys("by_k").keys)
      helpers.expect_error("INVALID_ARGUMENT", t.store.projection, t.store, "by_k", "a\0zzz")
    end)

    it("tenants: each handle reads only its own keys; key() sees the session as its tenant names it", function()
      local t = setup(url)
      projection(t, "by_session", [[
return { key = function(e) return e.session end,
         ["x"] = function(s, e) s.n = (s.n or 0) + 1 end }
]])
      local acme, globex = t.store:tenant("acme"), t.store:tenant("globex")
      acme:append("s1", { { type = "x", settled = true, payload = {} }, { type = "x", settled = true, payload = {} } })
      globex:append("s1", { { type = "x", settled = true, payload = {} } })
      t.store:append("s1", { { type = "x", settled = true, payload = {} } })
      eh.run(t.engine())
      assert.equal(2, acme:projection("by_session", "s1").n)
      assert.equal(1, globex:projection("by_session", "s1").n)
      assert.equal(1, t.store:projection("by_session", "s1").n)
      assert.same({ "s1" }, acme:projection_keys("by_session").keys)
      assert.same({ "s1" }, t.store:projection_keys("by_session").keys)
      assert.is_nil(acme:projection("by_session", "s2"))
      helpers.expect_error("INVALID_ARGUMENT", function() acme:projection_control("by_session", "rebuild") end)
      helpers.expect_error("INVALID_ARGUMENT", function() t.store:projection("by_session", "acme\31s1") end)
    end)
  end)
end

describe("projections on a sharded store", function()
  after_each(eh.cleanup)

  it("fold every shard's events into states in the catalog, the checkpoint a cursor", function()
    local urls = {}
    for i = 1, 3 do
      local _, _, u = helpers.new("sqlite:")
      urls[i] = u
    end
    local store = eventstore.open("shards:", { catalog = urls[1],
      plan = { version = 1, shards = { a = urls[2], b = urls[3] } } })
    local t = setup("memory:")
    projection(t, "per_customer", PER_CUSTOMER)
    projection(t, "totals", TOTALS)
    orders(store, 300)
    eh.run(eh.engine({ store = store, scripts = t.dir }))
    local per, totals = {}, { n = 0, sum = 0 }
    local after = 0
    repeat -- every shard's events, by cursor
      local page = store:read_all({ after = after, limit = 100 })
      for _, e in ipairs(page) do
        totals.n, totals.sum = totals.n + 1, totals.sum + e.payload.amount
        if e.session:sub(1, 6) == "order-" then
          local c = e.payload.customer
          per[c] = per[c] or { orders = 0, total = 0, key = c }
          per[c].orders, per[c].total = per[c].orders + 1, per[c].total + e.payload.amount
        end
        after = e.cursor
      end
    until #page < 100
    for c, want in pairs(per) do assert.same(want, (store:projection("per_customer", c))) end
    assert.same(totals, (store:projection("totals", "")))
    local rec = store:projections("totals")[1]
    assert.is_string(rec.cursor)
    assert.equal(0, rec.lag)
    store:close()
  end)
end)

describe("a store of the previous schema gets projections at open", function()
  after_each(eh.cleanup)

  it("sqlite: a version 9 file (no projections table) is migrated to 10", function()
    local _, _, url = helpers.new("sqlite:")
    local path = url:match("^sqlite:(.*)$")
    local store = helpers.open_same(url)
    store:append("order-1", { { type = "order.placed", settled = true, payload = { customer = "c1", amount = 3 } } })
    store:close()
    -- what schema 9 wrote: everything but the projections table
    local p = assert(io.popen(("sqlite3 %s"):format(helpers.sh_quote(path)), "w"))
    p:write(helpers.SQLITE_BACK_TO_10 .. " DROP TABLE projections; PRAGMA user_version = 9;\n")
    assert(p:close())
    local t = setup(url)
    t.store = helpers.open_same(url)
    projection(t, "per_customer", PER_CUSTOMER)
    eh.run(eh.engine({ store = t.store, scripts = t.dir }))
    assert.same({ orders = 1, total = 3, key = "c1" }, (t.store:projection("per_customer", "c1")))
    assert.equal(helpers.SQLITE_SCHEMA, helpers.sqlite_version(path))
  end)

  local template = helpers.pg_url()
  if template then
    it("postgres: a version 4 schema (no projections table) is migrated to 5", function()
      local url = helpers.pg_fresh_url(template)
      local schema = url:match("schema=([%w_]+)")
      local base = url:gsub("[?&]schema=[%w_]*", "")
      local store = helpers.open_same(url)
      store:append("order-1", { { type = "order.placed", settled = true, payload = { customer = "c1", amount = 3 } } })
      store:close()
      local sql = ("DROP TABLE %s.projections; UPDATE %s.meta SET value = '4' WHERE key = 'schema_version';"):format(schema, schema)
      assert(os.execute(("psql %s -v ON_ERROR_STOP=1 -Xqc %s >/dev/null"):format(helpers.sh_quote(base), helpers.sh_quote(sql))))
      local t = setup(url)
      t.store = helpers.open_same(url)
      projection(t, "per_customer", PER_CUSTOMER)
      eh.run(eh.engine({ store = t.store, scripts = t.dir }))
      assert.same({ orders = 1, total = 3, key = "c1" }, (t.store:projection("per_customer", "c1")))
      local v = io.popen(("psql %s -XAtqc %s"):format(helpers.sh_quote(base),
        helpers.sh_quote(("SELECT value FROM %s.meta WHERE key = 'schema_version'"):format(schema)))):read("a")
      assert.equal(helpers.PG_SCHEMA, (v:gsub("%s", "")))
    end)
  end
end)
