-- Engine: what a reducer step sees. The fold builds its event tables and
-- decodes payloads itself (core/engine/fold.c, docs/engine.md "Folds"), so
-- these tests pin it to store:read's events field by field: every dispatch
-- state (settled, pending, dead, handled with results, laned, timers, forked
-- copies, sealed and shredded payloads), payload values with their exact
-- subtypes and array marks, and payloads a reducer changes and keeps.
-- Runs once per backend URL (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local json = eventstore.json
local q = helpers.sh_quote

-- Keeps every event it is given, whole: the state codec carries subtypes,
-- json.null and array marks, so the events come back as the step saw them.
local KEEP = [[
local function keep(state, event) state[#state + 1] = event end
return setmetatable({ init = function() return {} end }, {
  __index = function(_, type) return keep end,
})
]]

-- Deep equality that also compares integer vs float and array marks.
local function same_exactly(a, b, path)
  path = path or "event"
  if type(a) ~= type(b) then return false, path .. ": " .. type(a) .. " vs " .. type(b) end
  if type(a) == "number" then
    if math.type(a) ~= math.type(b) then return false, path .. ": " .. math.type(a) .. " vs " .. math.type(b) end
    if a ~= b and not (a ~= a and b ~= b) then return false, path .. ": " .. tostring(a) .. " vs " .. tostring(b) end
    return true
  end
  if type(a) ~= "table" then
    if a ~= b then return false, path .. ": " .. tostring(a) .. " vs " .. tostring(b) end
    return true
  end
  if json.is_array(a) ~= json.is_array(b) then return false, path .. ": array mark differs" end
  for k, v in pairs(a) do
    local ok, why = same_exactly(v, b[k], path .. "." .. tostring(k))
    if not ok then return false, why end
  end
  for k in pairs(b) do
    if a[k] == nil then return false, path .. "." .. tostring(k) .. ": missing on the left" end
  end
  return true
end

local function assert_same_events(read, seen)
  assert.equal(#read, #seen)
  for i = 1, #read do
    local ok, why = same_exactly(read[i], seen[i], "event " .. i)
    assert(ok, why)
  end
end

local key_files = {}
local function key_path()
  local reserved = os.tmpname()
  key_files[#key_files + 1] = reserved
  key_files[#key_files + 1] = reserved .. ".key"
  return reserved .. ".key"
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(function()
      eh.cleanup()
      for i = #key_files, 1, -1 do
        os.execute("rm -rf " .. q(key_files[i]))
        key_files[i] = nil
      end
    end)

    it("a step gets each event exactly as store:read returns it, in every dispatch state", function()
      local store, clock = helpers.new(url, { keys = key_path() })
      local dir = eh.scripts_dir()
      eh.reducer(dir, "keep", KEEP)
      eh.handler(dir, "job", [[
return function(event, ctx)
  if event.payload.fail then error("refused " .. event.index) end
  return { { type = "job.done", payload = { of = event.index, list = { 1, 2.5, json_null } } } }
end
]])
      local engine = eh.engine({ store = store, scripts = dir, max_failures = 1, snapshot_every = 0 })
      store:append("s", {
        { type = "note", payload = { a = 1, f = 3.0, big = math.maxinteger, small = math.mininteger }, settled = true },
        { type = "job", payload = { n = 1 } },
        { type = "job", payload = { fail = true } },
        { type = "job", payload = { n = 2 }, lane = "L" },
      })
      engine:run({ until_idle = true }) -- handled (with a result), dead
      store:append("s", { { type = "claimed", payload = { c = 1 }, lane = "C" } })
      assert.equal(1, #store:claim("s", { holder = "someone", ttl_ms = 1000, limit = 1 }).events) -- a live claim
      store:append("s", {
        { type = "later", payload = json.array({}), not_before = clock:now() + 60000 },
        { type = "laned", payload = {}, lane = "M" },
        { type = "sealed", payload = { secret = "x", list = json.array({ 1, json.null }) }, key = "k1" },
        { type = "sealed", payload = { secret = "y" }, key = "k2" },
        { type = "empty" }, -- no payload: null
        { type = "traced", payload = {}, revision = 3, meta = { correlation = "c-1", list = json.array({ 1 }) } },
        { type = "reminder", payload = {}, not_before = clock:now() + 60000 },
      })
      store:cancel("s", store:head("s"), { reason = "paid" })
      assert.is_true(store:shred("k2"))
      store:fork("s", store:head("s"), "copy")
      store:append("copy", { { type = "after.fork", payload = { u = "\u{e9}\0z" } } })
      for _, session in ipairs({ "s", "copy" }) do
        local seen = engine:state(session, "keep")
        assert_same_events(store:read(session), seen)
      end
      local seen = engine:state("s", "keep")
      -- The cases above are really there.
      local has = {}
      for _, e in ipairs(seen) do
        if e.cause then has.cause = true end
        if e.status == "dead" then has.dead = true end
        if e.lane then has.lane = true end
        if e.not_before then has.not_before = true end
        if e.key then has.key = true end
        if e.shredded then has.shredded = true end
        if e.processed_by_attempt then has.processed_by_attempt = true end
        if e.claim_holder then has.claim_holder = true end
        if e.meta then has.meta = true end
        if e.revision == 3 then has.revision = true end
        if e.cancelled then has.cancelled = true end
      end
      assert.same({ cause = true, dead = true, lane = true, not_before = true, key = true, shredded = true,
        processed_by_attempt = true, claim_holder = true, meta = true, revision = true, cancelled = true }, has)
      assert.truthy(engine:state("copy", "keep")[1].origin)
    end)

    it("payload values keep their subtypes, nulls, array marks and nesting; long objects and arrays too", function()
      local t = eh.setup(url)
      t.reducer("keep", KEEP)
      local engine = t.engine({ snapshot_every = 0 })
      local long_object, long_array = {}, {}
      for i = 1, 100 do
        long_object[string.format("k%03d", i)] = i % 3 == 0 and i / 4 or i
        long_array[i] = i % 2 == 0 and { i } or tostring(i)
      end
      local payloads = {
        { i = 3, f = 3.0, neg = -0.0, max = math.maxinteger, min = math.mininteger, beyond = 2 ^ 63, tiny = 5e-324 },
        { null = json.null, list = { json.null, 1, json.null }, empty_list = json.array({}), empty_obj = {} },
        { deep = { a = { b = { c = { d = { e = { 1, { 2, { 3 } } } } } } } } },
        { text = "quote \" backslash \\ nl \n nul \0 e\u{301} \u{1F600}", ["key with spaces"] = true },
        long_object,
        long_array,
        json.array({ 1, "two", { three = 3 } }),
        "just a string",
        42,
        false,
      }
      local batch = {}
      for i, p in ipairs(payloads) do batch[i] = { type = "p", payload = p } end
      engine:append("s", batch)
      local seen = engine:state("s", "keep")
      assert_same_events(t.store:read("s"), seen)
      for i, p in ipairs(payloads) do
        assert.equal(json.encode(p), json.encode(seen[i].payload))
      end
      assert.equal("float", math.type(seen[1].payload.f))
      assert.equal("integer", math.type(seen[1].payload.max))
      assert.equal("float", math.type(seen[1].payload.beyond))
      assert.equal(json.null, seen[2].payload.null)
      assert.is_true(json.is_array(seen[6].payload))
      assert.is_false(json.is_array(seen[5].payload))
    end)

    it("a step may change the payload it is given and keep it in its state", function()
      local t = eh.setup(url)
      t.reducer("edit", [[
return {
  init = function() return { kept = {} } end,
  order = function(state, event)
    local p = event.payload
    p.items[#p.items + 1] = { sku = "extra", qty = 1 }
    table.insert(p.items, 1, { sku = "first", qty = 0 })
    p.note = nil
    p.total = 0
    for _, item in ipairs(p.items) do p.total = p.total + item.qty end
    event.payload = p
    state.kept[#state.kept + 1] = p
  end,
}
]])
      for _, every in ipairs({ 0, 1 }) do
        local engine = t.engine({ snapshot_every = every })
        engine:append("s" .. every, {
          { type = "order", payload = { items = { { sku = "a", qty = 2 } }, note = "n" } },
          { type = "order", payload = { items = { { sku = "b", qty = 3 }, { sku = "c", qty = 4 } } } },
        })
        local st = engine:state("s" .. every, "edit")
        assert.same({
          { items = { { sku = "first", qty = 0 }, { sku = "a", qty = 2 }, { sku = "extra", qty = 1 } }, total = 3 },
          { items = { { sku = "first", qty = 0 }, { sku = "b", qty = 3 }, { sku = "c", qty = 4 },
            { sku = "extra", qty = 1 } }, total = 8 },
        }, st.kept)
        assert.is_true(json.is_array(st.kept[1].items))
        -- The stored events are untouched.
        assert.same({ items = { { sku = "a", qty = 2 } }, note = "n" }, t.store:read("s" .. every)[1].payload)
        -- With snapshots, the next fold starts from the kept state.
        assert.same(st, engine:state("s" .. every, "edit"))
      end
    end)

    it("a reducer that replaces its step functions while folding is followed event by event", function()
      local t = eh.setup(url)
      t.reducer("swap", [[
local M = { init = function() return { seen = {} } end }
M.a = function(state, event)
  state.seen[#state.seen + 1] = "a" .. event.index
  M.a = function(s, e) s.seen[#s.seen + 1] = "A" .. e.index end
end
return M
]])
      local engine = t.engine({ snapshot_every = 0 })
      engine:append("s", { { type = "a" }, { type = "a" }, { type = "b" }, { type = "a" } })
      assert.same({ seen = { "a1", "A2", "A4" } }, engine:state("s", "swap"))
    end)
  end)
end
