-- Upcasters (docs/contract.md §7, docs/upcasting.md): scripts/upcasters/
-- <type>.lua chains run in the engine's states before a handler, a reducer
-- or engine:read sees an event; renames go on with the new type's file;
-- loops, long chains, raising steps and budget trips are errors naming the
-- upcaster and the event; stored bytes never change; dispatch is by the
-- upcast type; events the engine writes get their type's current; an
-- edited upcaster invalidates reducer snapshots. Runs once per backend URL
-- (helpers.urls()).
local helpers = require("helpers")
local eh = require("engine_helpers")
local eventstore = require("eventstore")

local json = eventstore.json

local function upcaster(t, event_type, source)
  os.execute("mkdir -p " .. eh.sh_quote(t.dir .. "/upcasters"))
  eh.write_script(t.dir .. "/upcasters/" .. event_type .. ".lua", source)
end

-- order.placed: 1 -> 2 (amount in cents), 2 -> 3 renamed to order.created,
-- which starts at its revision 1 and has a step of its own (1 -> 2: a
-- currency), so a chain from order.placed 1 is three steps over two files.
local PLACED = [[
return { current = 3,
  [1] = function(p) return {cents = p.amount * 100, sku = p.sku} end,
  [2] = function(p) return p, "order.created" end }]]
local CREATED = [[
return { current = 2,
  [1] = function(p) p.currency = p.currency or "EUR"; return p end }]]

local function chain(t)
  upcaster(t, "order.placed", PLACED)
  upcaster(t, "order.created", CREATED)
end

local function contains(s, needle) return type(s) == "string" and s:find(needle, 1, true) ~= nil end

for _, url in ipairs(helpers.urls()) do
  describe(url .. " engine upcasters", function()
    after_each(eh.cleanup)

    it("reads a 1 -> 2 -> 3 chain with a rename as the current type; stored bytes never change", function()
      local t = eh.setup(url)
      chain(t)
      local stored = t.store:append("o1", {
        { type = "order.placed", payload = { amount = 3, sku = "A" } },                 -- revision 1
        { type = "order.placed", payload = { cents = 500, sku = "B" }, revision = 2 },
        { type = "order.created", payload = { cents = 700, sku = "C" } },               -- created's 1
        { type = "order.created", payload = { cents = 900, sku = "D", currency = "USD" }, revision = 2 },
      })
      local e = t.engine()
      local got = e:read("o1")
      assert.are.same({ "order.created", "order.created", "order.created", "order.created" },
        helpers.pluck(got, "type"))
      assert.are.same({ 2, 2, 2, 2 }, helpers.pluck(got, "revision"))
      assert.are.same({ cents = 300, sku = "A", currency = "EUR" }, got[1].payload)
      assert.are.same({ cents = 500, sku = "B", currency = "EUR" }, got[2].payload)
      assert.are.same({ cents = 700, sku = "C", currency = "EUR" }, got[3].payload)
      assert.are.same({ cents = 900, sku = "D", currency = "USD" }, got[4].payload)
      assert.are.same(helpers.pluck(stored, "id"), helpers.pluck(got, "id"))
      -- opts pass through as store:read's
      assert.are.same({ 2 }, helpers.pluck(e:read("o1", { after = 1, limit = 1 }), "index"))
      -- the store's own read is the stored bytes
      local raw = t.store:read("o1")
      assert.are.same({ "order.placed", "order.placed", "order.created", "order.created" }, helpers.pluck(raw, "type"))
      assert.are.same({ 1, 2, 1, 2 }, helpers.pluck(raw, "revision"))
      assert.are.equal(json.encode({ amount = 3, sku = "A" }), json.encode(raw[1].payload))
    end)

    it("dispatches by the upcast type, claims stored types whose chains end at a handler, and leaves the stored events as they were", function()
      local t = eh.setup(url)
      chain(t)
      t.handler("order.created", [[
return function(ev, ctx)
  return {{type = "seen", payload = {type = ev.type, revision = ev.revision, cents = ev.payload.cents,
                                     before = ctx.state("total").cents}}}
end]])
      t.reducer("total", [[return {["order.created"] = function(s, e) s.cents = (s.cents or 0) + e.payload.cents end}]])
      t.store:append("o1", { { type = "order.placed", payload = { amount = 1, sku = "Z" }, settled = true } })
      t.store:append("o1", { { type = "order.placed", payload = { amount = 2, sku = "A" } } })
      local e = t.engine()
      local r = e:run({ until_idle = true })
      assert.are.same({ handled = 1, failed = 0, dead = 0 }, eh.counts(r))
      assert.are.equal(0, r.unhandled)
      local evs = t.store:read("o1", { after = 1 })
      assert.are.equal("processed", evs[1].status)
      assert.are.equal("order.placed", evs[1].type)
      assert.are.equal(1, evs[1].revision)
      assert.are.equal(json.encode({ amount = 2, sku = "A" }), json.encode(evs[1].payload))
      -- ctx.state folds upcast events too: the settled order before it
      assert.are.same({ type = "order.created", revision = 2, cents = 200, before = 100 }, evs[2].payload)
    end)

    it("leaves events whose chain ends at a type with no handler here pending, unclaimed by this engine", function()
      local t = eh.setup(url)
      chain(t)
      t.handler("other", "return function() end")
      t.store:append("o1", { { type = "order.placed", payload = { amount = 2, sku = "A" } } })
      local r = t.engine():run({ until_idle = true })
      assert.are.equal(0, r.handled)
      assert.are.equal(1, r.unhandled)
      local ev = t.store:read("o1")[1]
      assert.are.equal("pending", ev.status)
      assert.are.equal(0, ev.failures)
    end)

    it("gives events the engine writes without a revision their type's current (1 with no file)", function()
      local t = eh.setup(url)
      chain(t)
      t.handler("go", [[
return function() return {{type = "order.created", payload = {cents = 1}}, {type = "plain", payload = {}},
                          {type = "order.created", payload = {cents = 2}, revision = 1}} end]])
      local e = t.engine()
      local out = e:append("s", { { type = "order.created", payload = { cents = 5 } }, { type = "go", payload = {} } })
      assert.are.same({ 2, 1 }, helpers.pluck(out, "revision"))
      eh.run(e)
      local evs = t.store:read("s", { after = 2 })
      assert.are.same({ "order.created", "plain", "order.created" }, helpers.pluck(evs, "type"))
      assert.are.same({ 2, 1, 1 }, helpers.pluck(evs, "revision"))
    end)

    it("folds reducers over upcast events and refolds when an upcaster is edited (snapshots invalidated)", function()
      local t = eh.setup(url)
      chain(t)
      t.reducer("total", [[return {["order.created"] = function(s, e) s.cents = (s.cents or 0) + e.payload.cents; s.cur = e.payload.currency end}]])
      t.store:append("o1", {
        { type = "order.placed", payload = { amount = 1, sku = "A" } },
        { type = "order.created", payload = { cents = 50, sku = "B" } },
      })
      local e = t.engine({ snapshot_every = 1 })
      assert.are.same({ cents = 150, cur = "EUR" }, e:state("o1", "total"))
      local snaps = t.store:snapshots("o1")
      assert.are.equal(1, #snaps)
      local before = snaps[1].version
      upcaster(t, "order.created", [[
return { current = 2,
  [1] = function(p) p.currency = "GBP"; return p end }]])
      assert.are.same({ cents = 150, cur = "GBP" }, e:state("o1", "total"))
      snaps = t.store:snapshots("o1")
      assert.are_not.equal(before, snaps[1].version)
    end)

    it("fails the attempt, the fold and engine:read on a loop, naming the types", function()
      local t = eh.setup(url)
      upcaster(t, "a", [[return {current = 2, [1] = function(p) return p, "b" end}]])
      upcaster(t, "b", [[return {current = 2, [1] = function(p) return p, "a" end}]])
      t.handler("a", "return function() end")
      t.reducer("r", [[return {a = function(s) s.n = 1 end}]])
      local stored = t.store:append("s", { { type = "a", payload = {} } })
      local e = t.engine({ max_failures = 1 })
      local err = helpers.expect_error("INVALID_ARGUMENT", function() e:read("s") end)
      assert.is_true(contains(tostring(err), "loop: a -> b -> a"), tostring(err))
      assert.is_true(contains(tostring(err), "upcasters/a.lua"), tostring(err))
      assert.is_true(contains(tostring(err), stored[1].id), tostring(err))
      err = helpers.expect_error("INVALID_ARGUMENT", function() e:state("s", "r") end)
      assert.is_true(contains(tostring(err), "loop: a -> b -> a"), tostring(err))
      eh.run(e)
      local ev = t.store:read("s")[1]
      assert.are.equal("dead", ev.status)
      assert.is_true(contains(ev.last_error, "loop: a -> b -> a"), ev.last_error)
    end)

    it("refuses a chain longer than 32 steps and an event newer than current", function()
      local t = eh.setup(url)
      upcaster(t, "long", [[
local t = {current = 40}
for i = 1, 39 do t[i] = function(p) return p end end
return t]])
      upcaster(t, "short", [[return {current = 2, [1] = function(p) return p end}]])
      t.store:append("s", { { type = "long", payload = {} }, { type = "short", payload = {}, revision = 5 } })
      local e = t.engine()
      local err = helpers.expect_error("INVALID_ARGUMENT", function() e:read("s", { limit = 1 }) end)
      assert.is_true(contains(tostring(err), "longer than 32 steps"), tostring(err))
      err = helpers.expect_error("INVALID_ARGUMENT", function() e:read("s", { after = 1 }) end)
      assert.is_true(contains(tostring(err), "revision 5"), tostring(err))
      assert.is_true(contains(tostring(err), "newer than current (2)"), tostring(err))
    end)

    it("fails the attempt and the fold when a step raises, naming the file, type, revision and event", function()
      local t = eh.setup(url)
      upcaster(t, "x", [[return {current = 3, [1] = function(p) return p end,
        [2] = function(p) error("cannot read this one") end}]])
      t.handler("x", "return function() end")
      t.reducer("r", [[return {x = function(s) s.n = 1 end}]])
      local stored = t.store:append("s", { { type = "x", payload = {} } })
      local e = t.engine({ max_failures = 1 })
      eh.run(e)
      local ev = t.store:read("s")[1]
      assert.are.equal("dead", ev.status)
      for _, want in ipairs({ "upcasters/x.lua", "type 'x', revision 2", stored[1].id, "s #1", "cannot read this one" }) do
        assert.is_true(contains(ev.last_error, want), want .. " in " .. tostring(ev.last_error))
      end
      local err = helpers.expect_error("INVALID_ARGUMENT", function() e:state("s", "r") end)
      assert.is_true(contains(tostring(err), "type 'x', revision 2"), tostring(err))
      assert.is_true(contains(tostring(err), "cannot read this one"), tostring(err))
    end)

    it("runs steps under the instruction budget: a step that loops trips it and names the upcaster", function()
      local t = eh.setup(url)
      upcaster(t, "x", [[return {current = 2, [1] = function(p) while true do pcall(function() while true do end end) end end}]])
      t.handler("x", "return function() end")
      t.store:append("s", { { type = "x", payload = {} } })
      local e = t.engine({ max_failures = 1, instruction_budget = 100000 })
      eh.run(e)
      local ev = t.store:read("s")[1]
      assert.are.equal("dead", ev.status)
      assert.is_true(contains(ev.last_error, "instruction budget exceeded"), ev.last_error)
      assert.is_true(contains(ev.last_error, "upcasters/x.lua"), ev.last_error)
      local err = helpers.expect_error("INVALID_ARGUMENT", function() e:read("s") end)
      assert.is_true(contains(tostring(err), "instruction budget exceeded"), tostring(err))
    end)

    it("loads every upcaster at engine start: a bad file is an error naming it", function()
      local t = eh.setup(url)
      upcaster(t, "x", [[return {Current = 2, [1] = function(p) return p end}]])
      local err = helpers.expect_error("INVALID_ARGUMENT", function() t.engine() end)
      assert.is_true(contains(tostring(err), "upcasters/x.lua"), tostring(err))
      assert.is_true(contains(tostring(err), "current must be an integer"), tostring(err))
    end)

    it("projections fold upcast events (by their upcast type), are rebuilt when an upcaster changes, and stop at a raising one", function()
      local t = eh.setup(url)
      chain(t)
      os.execute("mkdir -p " .. eh.sh_quote(t.dir .. "/projections"))
      eh.write_script(t.dir .. "/projections/cents.lua", [[
return { key = function(e) return e.payload.sku end,
         ["order.created"] = function(s, e) s.cents = (s.cents or 0) + e.payload.cents; s.cur = e.payload.currency end }]])
      t.store:append("o1", {
        { type = "order.placed", payload = { amount = 3, sku = "A" }, settled = true },      -- revision 1
        { type = "order.created", payload = { cents = 50, sku = "A" }, settled = true },
      })
      local e = t.engine()
      eh.run(e)
      local state, info = t.store:projection("cents", "A")
      assert.are.same({ cents = 350, cur = "EUR" }, state)
      local v1 = info.version
      -- an edited upcaster is a new version: a new generation, folded by the new chain
      upcaster(t, "order.created", [[
return { current = 2, [1] = function(p) p.currency = "SEK"; return p end }]])
      e:close()
      e = t.engine()
      eh.run(e)
      state, info = t.store:projection("cents", "A")
      assert.are.same({ cents = 350, cur = "SEK" }, state)
      assert.are_not.equal(v1, info.version)
      assert.are.equal(2, info.generation)
      -- a raising upcaster stops the projection at that event, naming it
      upcaster(t, "order.created", [[
return { current = 2, [1] = function(p) if p.sku == "B" then error("no B") end return p end }]])
      local bad = t.store:append("o2", { { type = "order.placed", payload = { amount = 1, sku = "B" }, settled = true } })
      e:close()
      e = t.engine()
      eh.run(e)
      local row
      for _, r in ipairs(e:projections()) do if r.name == "cents" then row = r end end
      assert.are.equal("failed", row.status)
      assert.is_true(contains(row.error, "no B"), row.error)
      assert.is_true(contains(row.error, bad[1].id), row.error)
    end)
  end)
end

-- The sample app's upcaster (scripts/upcasters/order.placed.lua): a
-- first-release order.placed (one flat line) goes through today's handler
-- and reducer as a basket.
for _, url in ipairs(helpers.urls()) do
  describe(url .. " the sample app's order.placed upcaster", function()
    after_each(eh.cleanup)

    it("handles and folds a revision-1 order as a revision-2 basket", function()
      local store = helpers.new(url)
      store:append("order-7", { { type = "order.placed", revision = 1,
        payload = { customer = "ada", card = "tok_visa", sku = "MUG-02", qty = 2 } } })
      local e = eh.engine({ store = store, scripts = "scripts" })
      local seen = e:read("order-7")[1]
      assert.are.equal(2, seen.revision)
      assert.are.same({ customer = "ada", card = "tok_visa", items = { { sku = "MUG-02", qty = 2 } } }, seen.payload)
      e:run({ until_idle = true })
      local order = e:state("order-7", "order")
      assert.are.equal("paid", order.status)
      assert.are.equal(2400, order.total_cents)
      assert.are.same({ { sku = "MUG-02", qty = 2, price_cents = 1200 } }, order.lines)
      -- stored as it was written
      local raw = store:read("order-7")[1]
      assert.are.equal(1, raw.revision)
      assert.are.equal("MUG-02", raw.payload.sku)
      -- what the engine writes now is revision 2, and a writer that gave no
      -- revision to today's shape is read as it is
      local out = e:append("order-8", { { type = "order.placed",
        payload = { customer = "bo", card = "tok_visa", items = { { sku = "TEA-01", qty = 1 } } } } })
      assert.are.equal(2, out[1].revision)
      store:append("order-9", { { type = "order.placed",
        payload = { customer = "cy", card = "tok_visa", items = { { sku = "TEA-01", qty = 3 } } } } })
      assert.are.same({ { sku = "TEA-01", qty = 3 } }, e:read("order-9")[1].payload.items)
    end)
  end)
end

-- §9 with §7: a replay reads the stored events and its own through the
-- upcasters of the scripts under test, so history written in an old shape
-- replays identical to what happened.
describe("replay with upcasters", function()
  after_each(eh.cleanup)

  it("replays a session stored in an old revision as identical, and fails a session whose upcaster raises", function()
    local store, clock = helpers.new("memory:")
    store:append("order-1", { { type = "order.placed", revision = 1,
      payload = { customer = "ada", card = "tok_visa", sku = "TEA-01", qty = 1 } } })
    local live = eh.engine({ store = store, scripts = "scripts" })
    live:run({ until_idle = true })
    clock:advance(1000) -- the pick-and-pack timer (300 ms) falls due, as in the replay
    live:run({ until_idle = true })
    assert.are.equal("shipped", live:state("order-1", "order").status)
    local report = eventstore.replay({ store = store, scripts = "scripts", sessions = "order-1" })
    assert.are.equal(1, report.summary.replayed)
    assert.are.equal(1, report.summary.identical, helpers.dump(report.sessions[1]))
    -- the same history under scripts whose upcaster raises fails the session
    local dir = eh.scripts_dir()
    os.execute("cp -r scripts/handlers scripts/reducers " .. eh.sh_quote(dir) .. " && mkdir -p " .. eh.sh_quote(dir .. "/upcasters"))
    eh.write_script(dir .. "/upcasters/order.placed.lua", [[return {current = 2, [1] = function() error("no old orders") end}]])
    report = eventstore.replay({ store = store, scripts = dir, sessions = "order-1" })
    assert.are.equal(1, report.summary.failed)
    assert.is_true(tostring(report.sessions[1].failure):find("no old orders", 1, true) ~= nil,
      tostring(report.sessions[1].failure))
  end)

  -- A reducer-only replay upcasts many sessions' events in one call per
  -- side (replay.lua, upcast_chunk): an upcaster that raises on one
  -- session's event still fails that session alone.
  it("with reducers_only reads an upcasters folder that is a symlink, as the engine does", function()
    local store = helpers.new("memory:")
    store:append("order-1", { { type = "order.placed", revision = 1,
      payload = { customer = "ada", card = "tok_visa", sku = "TEA-01", qty = 1 } } })
    local dir, ups = eh.scripts_dir(), eh.scripts_dir()
    os.execute("cp -r scripts/handlers scripts/reducers " .. eh.sh_quote(dir))
    eh.write_script(ups .. "/order.placed.lua", [[
return { current = 2, [1] = function(p) return { customer = "renamed", card = p.card, items = {} } end }]])
    assert(os.execute("ln -s " .. eh.sh_quote(ups) .. " " .. eh.sh_quote(dir .. "/upcasters")))
    local report = eventstore.replay({ store = store, scripts = dir, baseline = "scripts", reducers_only = true })
    local s = report.sessions[1]
    -- NEW's upcaster renames the customer: the order reducer's state differs there
    assert.are.equal("diverged", s.status, helpers.dump(s))
    assert.same({ { path = "$.customer", baseline = "ada", replayed = "renamed" } }, s.states.order)
  end)

  it("with reducers_only fails only the session whose upcaster raises, and compares the others", function()
    local store = helpers.new("memory:")
    for i, customer in ipairs({ "ada", "bob", "cy" }) do
      store:append("order-" .. i, { { type = "order.placed", revision = 1,
        payload = { customer = customer, card = "tok_visa", sku = "TEA-01", qty = i } } })
    end
    local dir = eh.scripts_dir()
    os.execute("cp -r scripts/handlers scripts/reducers scripts/upcasters " .. eh.sh_quote(dir))
    eh.write_script(dir .. "/upcasters/order.placed.lua", [[
return { current = 2, [1] = function(p)
  if p.customer == "bob" then error("no orders from bob") end
  return { customer = p.customer, card = p.card, items = { { sku = p.sku, qty = p.qty } } }
end }]])
    local report = eventstore.replay({ store = store, scripts = dir, baseline = "scripts", reducers_only = true })
    local by = {}
    for _, s in ipairs(report.sessions) do by[s.session] = s end
    assert.are.equal("failed", by["order-2"].status, helpers.dump(by["order-2"]))
    assert.truthy(tostring(by["order-2"].failure):find("no orders from bob", 1, true), tostring(by["order-2"].failure))
    for _, name in ipairs({ "order-1", "order-3" }) do
      assert.are.equal("identical", by[name].status, helpers.dump(by[name]))
    end
  end)
end)
