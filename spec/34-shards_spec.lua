-- Sharded stores (docs/contract.md §5, docs/sharding.md): eventstore.open("shards:",
-- {catalog = url, plan = {version, shards = {[name] = url}}}).
--
-- Run over several SQLite files, and over several PostgreSQL schemas of one
-- database when ES_TEST_URLS names a postgres:// template. Shards are
-- opened directly (not through shards:) to see where a session lives.
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local LUA = os.getenv("LUA") or "lua5.4"
local sh_quote = helpers.sh_quote

local function expect_error(code, fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected " .. code .. ", the call succeeded")
  assert(eventstore.is_error(err, code), "expected " .. code .. ", got " .. tostring(err))
  return err
end

-- The kinds of shard to run on: `url()` makes a fresh one.
local kinds = {}
local files = {}
kinds[1] = {
  name = "sqlite files",
  url = function()
    local base = os.tmpname()
    files[#files + 1] = base
    files[#files + 1] = base .. ".db"
    return "sqlite:" .. base .. ".db"
  end,
}
for _, u in ipairs(helpers.urls()) do
  if u:match("^postgres") then
    kinds[#kinds + 1] = { name = "postgres schemas", url = function() return helpers.pg_fresh_url(u) end }
  end
end

local opened = {}
local function track(store)
  opened[#opened + 1] = store
  return store
end

local function cleanup()
  for i = #opened, 1, -1 do
    pcall(function() opened[i]:close() end)
    opened[i] = nil
  end
  for i = #files, 1, -1 do
    helpers.remove_db(files[i])
    files[i] = nil
  end
end

-- The events of every session through the sharded store, by id.
local function all_ids(store)
  local ids, cursor = {}, nil
  repeat
    local page = store:sessions({ limit = 100, after = cursor })
    for _, si in ipairs(page.sessions) do
      for _, e in ipairs(store:read(si.session)) do
        ids[e.id] = (ids[e.id] or 0) + 1
      end
    end
    cursor = page.cursor
  until not cursor
  return ids
end

-- Which shard (by name) holds each session, opening each shard directly.
local function where(shards)
  local at = {}
  for name, url in pairs(shards) do
    local st = track(eventstore.open(url))
    local cursor
    repeat
      local page = st:sessions({ limit = 500, after = cursor })
      for _, si in ipairs(page.sessions) do
        assert(at[si.session] == nil, "session " .. si.session .. " listed by two shards")
        at[si.session] = name
      end
      cursor = page.cursor
    until not cursor
    st:close()
  end
  return at
end

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

describe("sharded store: plan hashing", function()
  after_each(cleanup)

  it("routes fixed names to fixed shards (rendezvous over FNV-1a 64 + splitmix64, docs/sharding.md)", function()
    local shards = { a = kinds[1].url(), b = kinds[1].url(), c = kinds[1].url() }
    local s = track(eventstore.open("shards:", { catalog = kinds[1].url(), plan = { version = 1, shards = shards } }))
    local pinned = { alpha = "a", beta = "b", gamma = "c", ["user-42"] = "b", ["order:1001"] = "b", ["é"] = "a" }
    for session in pairs(pinned) do s:append(session, { { type = "t" } }) end
    local at = where(shards)
    for session, shard in pairs(pinned) do
      assert.are.equal(shard, at[session], "session " .. session)
    end
  end)
end)

for _, kind in ipairs(kinds) do
describe("sharded store over " .. kind.name, function()
  after_each(function()
    eh.cleanup()
    cleanup()
  end)

  local function plan_of(n)
    local shards = {}
    for i = 1, n do shards["s" .. i] = kind.url() end
    return shards
  end

  local function open(shards, version, catalog)
    catalog = catalog or kind.url()
    local s = track(eventstore.open("shards:", { catalog = catalog, plan = { version = version or 1, shards = shards } }))
    return s, catalog
  end

  it("keeps each session on one shard and answers per-session calls as one store would", function()
    local shards = plan_of(3)
    local s = open(shards)
    for i = 1, 30 do
      local evs = s:append("sess-" .. i, { { type = "a", payload = { i = i } }, { type = "b", settled = true } })
      assert.are.equal(2, #evs)
      assert.are.equal(2, evs[2].index)
    end
    expect_error("WRONG_EXPECTED_HEAD", s.append, s, "sess-1", { { type = "c" } }, { expected = 5 })
    assert.are.equal(2, s:head("sess-7"))
    assert.are.same({ i = 7 }, s:read("sess-7")[1].payload)
    local at = where(shards)
    assert.are.equal(30, count(at))
    local used = {}
    for _, shard in pairs(at) do used[shard] = true end
    assert.are.equal(3, count(used), "30 sessions spread over all 3 shards")
    -- listings merge the shards, in name order, with working pages
    local names, cursor = {}, nil
    repeat
      local page = s:sessions({ limit = 7, after = cursor })
      for _, si in ipairs(page.sessions) do names[#names + 1] = si.session end
      cursor = page.cursor
    until not cursor
    assert.are.equal(30, #names)
    for i = 2, #names do assert.is_true(names[i - 1] < names[i]) end
    -- snapshots, fences, seals route too
    s:put_snapshot("sess-3", "r", 1, "state@1", "v1")
    assert.are.equal(1, #s:snapshots("sess-3"))
    local token = s:fence("sess-4")
    expect_error("STALE_FENCE", s.append, s, "sess-4", { { type = "x" } }, { fence = token + 5 })
    s:seal("sess-5")
    expect_error("SEALED", s.append, s, "sess-5", { { type = "x" } })
  end)

  it("claims, completes, fails and dead-letters across shards", function()
    local s = open(plan_of(3))
    for i = 1, 12 do s:append("w-" .. i, { { type = i % 2 == 0 and "even" or "odd", payload = i } }) end
    assert.are.same({ even = 6, odd = 6 }, s:pending_types())
    local claimed = s:claim_next({ holder = "h", ttl_ms = 60000, limit = 100 })
    assert.are.equal(12, #claimed)
    assert.are.equal(0, #s:claim_next({ holder = "h", ttl_ms = 60000, limit = 100 }))
    for _, e in ipairs(claimed) do
      if e.payload % 3 == 0 then
        s:fail(e.session, e.index, e.attempt, { error = "boom", max_failures = 1 })
      else
        s:complete(e.session, e.index, e.attempt, { { type = "done" } })
      end
    end
    local dead = s:dead_letters()
    assert.are.equal(4, #dead)
    s:revive(dead[1].session, dead[1].index)
    assert.are.equal(3, #s:dead_letters())
    assert.are.equal(1, #s:claim_next({ holder = "h", ttl_ms = 60000, limit = 100, types = { "even", "odd" } }))
    assert.are.equal(8, #s:claim_next({ holder = "h", ttl_ms = 60000, limit = 100, types = { "done" } }))
  end)

  it("runs the engine on a sharded store", function()
    local s = open(plan_of(2))
    local dir = eh.scripts_dir()
    eh.handler(dir, "ping", "return function(event, ctx) return {{type = 'pong', payload = event.payload}} end\n")
    for i = 1, 20 do s:append("e-" .. i, { { type = "ping", payload = i } }) end
    local engine = eh.engine({ store = s, scripts = dir })
    local r = eh.run(engine)
    assert.are.equal(20, r.handled)
    for i = 1, 20 do
      local evs = s:read("e-" .. i)
      assert.are.equal("pong", evs[2].type)
      assert.are.equal(i, evs[2].payload)
    end
  end)

  -- A sharded store over n shards with tenants acme and globex, m sessions
  -- "w-i" each (one event, type "a" or "b", payload i); and the set of
  -- shards acme's sessions landed on.
  local function two_tenants(n, m)
    local shards = plan_of(n)
    local s = open(shards)
    local A, B = s:tenant("acme"), s:tenant("globex")
    for i = 1, m do
      A:append("w-" .. i, { { type = "a", payload = i } })
      B:append("w-" .. i, { { type = "b", payload = i } })
    end
    local used = {}
    for session, shard in pairs(where(shards)) do
      if session:find("acme\31", 1, true) == 1 then used[shard] = true end
    end
    return s, A, B, used
  end

  it("makes tenant views of a sharded store that see only their own tenant (a view over the router)", function()
    local SEP = "\31"
    local s, A, B, used = two_tenants(3, 12)
    local function names(h)
      local out, cursor = {}, nil
      repeat
        local page = h:sessions({ limit = 5, after = cursor })
        for _, si in ipairs(page.sessions) do out[#out + 1] = si.session end
        cursor = page.cursor
      until not cursor
      return out
    end
    local an = names(A)
    assert.are.equal(12, #an)
    for _, n in ipairs(an) do assert.is_nil(n:find(SEP, 1, true), n) end
    assert.are.equal(24, #names(s))
    assert.is_true(count(used) > 1, "the tenant's sessions spread over the shards")
    -- cross-session calls see the tenant's own sessions only
    assert.are.same({ a = 12 }, A:pending_types())
    assert.are.same({ b = 12 }, B:pending_types())
    local claimed = A:claim_next({ holder = "h", ttl_ms = 60000, limit = 100 })
    assert.are.equal(12, #claimed)
    for _, e in ipairs(claimed) do
      assert.are.equal("a", e.type)
      assert.is_nil(e.session:find(SEP, 1, true))
    end
    -- generated ids are stored behind the tenant's prefix, and given back without it
    local raw = s:read("acme" .. SEP .. "w-1")[1]
    assert.are.equal(1, raw.id:find("acme" .. SEP, 1, true))
    assert.are.equal(raw.id:sub(#"acme" + 2), A:read("w-1")[1].id)
    for _, e in ipairs(claimed) do
      if e.payload % 4 == 0 then
        A:fail(e.session, e.index, e.attempt, { error = "boom", max_failures = 1 })
      else
        A:complete(e.session, e.index, e.attempt, { { type = "done" } })
      end
    end
    assert.are.equal(3, #A:dead_letters())
    assert.are.equal(0, #B:dead_letters())
    local all = A:read_all()
    assert.are.equal(12 + 9, #all)
    for _, e in ipairs(all) do assert.is_nil(e.session:find(SEP, 1, true)) end
    assert.are.equal(12, #B:read_all())
    assert.are.equal(12, #B:claim_next({ holder = "h", ttl_ms = 60000, limit = 100 }))
    -- a fork inside the tenant stays in it
    A:fork("w-1", 1, "f-1")
    assert.are.equal("w-1", A:lineage("f-1").parent)
    assert.is_nil(B:lineage("f-1"))
    assert.are.equal(13, #names(A))
    expect_error("INVALID_ARGUMENT", A.tenant, A, "nested")
  end)

  -- A tenant's capabilities are its base's: on a sharded store its
  -- read_all goes by cursors too (docs/sharding.md), and a client pages
  -- it exactly as it pages the store's.
  it("pages a tenant view's read_all with cursors: its own events once each, sessions unprefixed", function()
    local _, A, _, used = two_tenants(2, 6)
    assert.are.equal(2, count(used), "the tenant's sessions on both shards")
    local page = A:read_all({ limit = 2 })
    assert.are.equal(2, #page)
    for _, e in ipairs(page) do assert.is_string(e.cursor) end
    local rest = A:read_all({ after = page[2].cursor })
    assert.are.equal(4, #rest)
    local seen = {}
    for _, list in ipairs({ page, rest }) do
      for _, e in ipairs(list) do
        assert.are.equal("a", e.type)
        assert.are.equal("w-" .. e.payload, e.session) -- unprefixed
        assert.is_nil(seen[e.payload], "event " .. e.payload .. " read twice")
        seen[e.payload] = true
      end
    end
    assert.are.equal(6, count(seen))
    assert.are.equal(0, #A:read_all({ after = rest[#rest].cursor }))
  end)

  it("adding a shard moves about 1/(n+1) of the sessions, only those, to the new shard", function()
    local shards = plan_of(3)
    local s, catalog = open(shards)
    local N = 300
    for i = 1, N do s:append("m-" .. i, { { type = "t", id = "id-" .. i, payload = i }, { type = "u", settled = true } }) end
    local before = where(shards)
    local grown = {}
    for k, v in pairs(shards) do grown[k] = v end
    grown.s4 = kind.url()
    local r = s:set_plan({ version = 2, shards = grown })
    local after = where(grown)
    local changed = 0
    for session, shard in pairs(after) do
      if shard ~= before[session] then
        changed = changed + 1
        assert.are.equal("s4", shard, session .. " moved between two old shards")
      end
    end
    assert.are.equal(N, count(after))
    assert.are.equal(changed, r.moved)
    -- 1/4 of 300 = 75 expected; the bounds only catch a hash that moves
    -- nothing or far too much
    assert.is_true(r.moved > 40 and r.moved < 115, "moved " .. r.moved)
    assert.are.equal(2, s:plan().version)
    for i = 1, N do
      local evs = s:read("m-" .. i)
      assert.are.equal(2, #evs)
      assert.are.equal("id-" .. i, evs[1].id)
      assert.are.equal(i, evs[1].payload)
    end
    -- dispatch records moved with the events: each pending event once.
    -- claim_next skips a shard that fails this call (docs/sharding.md),
    -- which a loaded machine's PostgreSQL did once here: so ask until
    -- every event is claimed, each exactly once, or a call claims none.
    local claimed, calls = {}, 0
    repeat
      local got = s:claim_next({ holder = "h", ttl_ms = 60000, limit = 1000 })
      calls = calls + 1
      for _, e in ipairs(got) do
        assert.is_nil(claimed[e.id], e.id .. " claimed twice")
        claimed[e.id] = true
      end
    until #got == 0 or count(claimed) >= N or calls == 20
    assert.are.equal(N, count(claimed))
    -- a handle opened on the catalog alone routes by its plan
    local other = track(eventstore.open("shards:" .. catalog))
    assert.are.equal(2, other:plan().version)
    assert.are.equal(2, #other:read("m-17"))
  end)

  it("finds every acknowledged append exactly once after a move while another process appends", function()
    local shards = plan_of(2)
    local s, catalog = open(shards)
    local SESSIONS = 60
    for i = 1, SESSIONS do s:append("c-" .. i, { { type = "seed", id = "seed-" .. i, settled = true } }) end
    local base = os.tmpname()
    files[#files + 1] = base
    local script, acks, stop, done = base .. ".lua", base .. ".acks", base .. ".stop", base .. ".done"
    for _, f in ipairs({ script, acks, stop, done }) do files[#files + 1] = f end
    eh.write_file(script, [[
      local eventstore = require("eventstore")
      local catalog, acks, stop, done, sessions = arg[1], arg[2], arg[3], arg[4], tonumber(arg[5])
      local s = eventstore.open("shards:" .. catalog)
      local out = assert(io.open(acks, "w"))
      local n = 0
      while true do
        local f = io.open(stop, "r")
        if f then f:close() break end
        n = n + 1
        local id = "ack-" .. n
        local session = "c-" .. (n % sessions + 1)
        local ok, err = pcall(s.append, s, session, {{type = "x", id = id, payload = n}})
        if ok then out:write(id, " ", session, "\n") out:flush()
        else io.stderr:write(tostring(err), "\n") end
      end
      out:close()
      s:close()
      io.open(done, "w"):close()
    ]])
    local env = "LUA_PATH=" .. sh_quote(package.path) .. " LUA_CPATH=" .. sh_quote(package.cpath)
    os.execute(("%s %s %s %s %s %s %s %d >/dev/null 2>%s &"):format(env, LUA, sh_quote(script), sh_quote(catalog),
      sh_quote(acks), sh_quote(stop), sh_quote(done), SESSIONS, sh_quote(base .. ".err")))
    files[#files + 1] = base .. ".err"
    -- wait for the appender to be going
    local function lines()
      local f = io.open(acks, "r")
      if not f then return {} end
      local t = {}
      for l in f:lines() do t[#t + 1] = l end
      f:close()
      return t
    end
    helpers.wait_until(function() return #lines() >= 20 end, "20 appends before the move", nil, 0.05)
    local grown = {}
    for k, v in pairs(shards) do grown[k] = v end
    grown.s3 = kind.url()
    grown.s4 = kind.url()
    local r = s:set_plan({ version = 2, shards = grown })
    assert.is_true(r.moved > 0)
    local n_at_move = #lines()
    -- let it append a while more, through handles of the new plan too
    helpers.wait_until(function() return #lines() >= n_at_move + 20 end, "20 appends after the move", nil, 0.05)
    io.open(stop, "w"):close()
    helpers.wait_until(function() return helpers.read_file(done) end, "the appender to finish", nil, 0.05)
    local acked = lines()
    assert.is_true(#acked > n_at_move, "appends went on after the move")
    local ids = all_ids(s)
    for _, l in ipairs(acked) do
      local id, session = l:match("^(%S+) (%S+)$")
      assert.are.equal(1, ids[id], "acknowledged " .. id .. " found " .. tostring(ids[id]) .. " times")
      local evs = s:read(session)
      local seen = false
      for _, e in ipairs(evs) do seen = seen or e.id == id end
      assert.is_true(seen, id .. " is not in " .. session)
    end
    -- nothing else was written: every event is a seed or an ack
    assert.are.equal(SESSIONS + #acked, count(ids))
  end)

  it("finishes a move interrupted at any step, without losing or doubling anything", function()
    for _, crash_at in ipairs({ 1, 2, 4, 7, 15, 40 }) do
      cleanup()
      local shards = plan_of(2)
      local s, catalog = open(shards)
      for i = 1, 40 do s:append("r-" .. i, { { type = "t", id = "r-id-" .. i, lane = "l" }, { type = "t", id = "r-id2-" .. i, lane = "l" } }) end
      s:put_ref("ref-1", "r-1")
      local grown = {}
      for k, v in pairs(shards) do grown[k] = v end
      grown.s3 = kind.url()
      s:_crash_after(crash_at)
      expect_error("STORAGE", s.set_plan, s, { version = 2, shards = grown })
      s:close()
      -- another process would reopen: the catalog keeps the pending plan
      local again = track(eventstore.open("shards:" .. catalog))
      -- calls work in the middle of an interrupted move
      assert.are.equal(2, #again:read("r-2"))
      local r = again:set_plan({ version = 2, shards = grown })
      assert.are.equal(2, again:plan().version)
      local at = where(grown)
      assert.are.equal(40, count(at))
      -- the resumed call moves what the crashed one had not: sessions go
      -- to the new shard only, so at most every session s3 now holds
      local on_s3 = 0
      for _, shard in pairs(at) do if shard == "s3" then on_s3 = on_s3 + 1 end end
      assert.is_true(on_s3 > 0, "no session hashes to the new shard")
      assert.are.equal("integer", math.type(r.moved))
      assert.is_true(r.moved >= 0 and r.moved <= on_s3, ("moved %d, s3 holds %d"):format(r.moved, on_s3))
      local ids = all_ids(again)
      assert.are.equal(80, count(ids))
      for id, n in pairs(ids) do assert.are.equal(1, n, id) end
      assert.are.equal("r-1", again:get_ref("ref-1").session)
      assert.are.equal(40, #again:claim_next({ holder = "h", ttl_ms = 60000, limit = 1000 }),
        "each lane's head is claimable once (crash at step " .. crash_at .. ")")
    end
  end)

  it("resumes read_all from cursors across a move (moved events may come again: ids dedupe)", function()
    local shards = plan_of(2)
    local s = open(shards)
    for i = 1, 50 do s:append("rc-" .. i, { { type = "t", id = "rc-id-" .. i } }) end
    local first = s:read_all({ limit = 20 })
    assert.are.equal(20, #first)
    for _, e in ipairs(first) do assert.is_string(e.cursor) end
    local grown = {}
    for k, v in pairs(shards) do grown[k] = v end
    grown.s3 = kind.url()
    s:set_plan({ version = 2, shards = grown })
    for i = 51, 60 do s:append("rc-" .. i, { { type = "t", id = "rc-id-" .. i } }) end
    local seen = {}
    for _, e in ipairs(first) do seen[e.id] = true end
    local cursor = first[#first].cursor
    while true do
      local page = s:read_all({ after = cursor, limit = 7 })
      if #page == 0 then break end
      for _, e in ipairs(page) do seen[e.id] = true end
      cursor = page[#page].cursor
    end
    assert.are.equal(60, count(seen))
    -- the cursor of the last event reads nothing more
    assert.are.equal(0, #s:read_all({ after = cursor }))
  end)

  it("forks a session into sessions on other shards", function()
    local shards = plan_of(3)
    local s = open(shards)
    s:append("alpha", { { type = "a", payload = 1 }, { type = "b", payload = 2 }, { type = "c" } })
    s:put_snapshot("alpha", "r", 2, "state@2", "v1")
    for i = 1, 10 do
      local target = "fork-" .. i
      local l = s:fork("alpha", 2, target)
      assert.are.equal("alpha", l.parent)
      local evs = s:read(target)
      assert.are.equal(2, #evs)
      assert.are.equal(2, evs[2].payload)
      assert.are.same({ session = "alpha", index = 2 }, evs[2].origin)
      assert.are_not.equal(s:read("alpha")[2].id, evs[2].id)
      assert.are.equal("alpha", s:lineage(target).parent)
      assert.are.equal(1, #s:snapshots(target))
    end
    local at = where(shards)
    local elsewhere = 0
    for i = 1, 10 do
      if at["fork-" .. i] ~= at.alpha then elsewhere = elsewhere + 1 end
    end
    assert.is_true(elsewhere > 0, "some forks landed on another shard than alpha's")
    -- lineage stays a tree across shards; a fork of a fork works
    expect_error("INVALID_ARGUMENT", s.fork, s, "fork-1", 1, "alpha")
    s:fork("fork-1", 1, "fork-1-1")
    expect_error("INVALID_ARGUMENT", s.fork, s, "fork-1-1", 0, "alpha")
    expect_error("NOT_FOUND", s.fork, s, "nobody", 0, "fork-x")
    expect_error("NO_SUCH_EVENT", s.fork, s, "alpha", 9, "fork-y")
    local kids = s:children("alpha", { limit = 100 })
    assert.are.equal(10, #kids)
  end)

  it("refuses bad plans and cursors, changing nothing", function()
    local shards = plan_of(2)
    local s, catalog = open(shards)
    s:append("x", { { type = "t" } })
    local bad = {
      { version = 0, shards = shards },
      { version = -1, shards = shards },
      { version = 2.5, shards = shards },
      { version = "3", shards = shards },
      { version = 3, shards = {} },
      { version = 3, shards = { ["a\0b"] = kind.url() } },
      { version = 3, shards = { a = "shards:x" } },
      { version = 3, shards = { [""] = kind.url() } },
      { version = 3, shards = { a = "" } },
      { version = 3, shards = { [string.rep("n", 65)] = kind.url() } },
      { version = 3, shards = { a = 5 } },
      { version = 1, shards = { z = kind.url() } }, -- equal version, other shards
    }
    local many = {}
    for i = 1, 257 do many["m" .. i] = "memory:" end
    bad[#bad + 1] = { version = 3, shards = many }
    for i, p in ipairs(bad) do
      expect_error("INVALID_ARGUMENT", s.set_plan, s, p)
      assert.are.equal(1, s:plan().version, "bad plan " .. i .. " changed the plan")
    end
    expect_error("INVALID_ARGUMENT", eventstore.open, "shards:", { catalog = catalog, plan = { version = 1, shards = { q = kind.url() } } })
    expect_error("INVALID_ARGUMENT", eventstore.open, "shards:", { plan = { version = 1, shards = shards } })
    -- an older plan at open is ignored: the catalog's newer one wins
    local grown = {}
    for k, v in pairs(shards) do grown[k] = v end
    grown.s9 = kind.url()
    s:set_plan({ version = 2, shards = grown })
    local old = track(eventstore.open("shards:", { catalog = catalog, plan = { version = 1, shards = shards } }))
    assert.are.equal(2, old:plan().version)
    expect_error("INVALID_ARGUMENT", s.set_plan, s, { version = 1, shards = shards })
    for _, c in ipairs({ "x", "c1.zz-1", "c1.61-0", "c1.61-abc", "c1.6162", "c2", "c1.62-1.61-1", 7 }) do
      expect_error("INVALID_ARGUMENT", s.read_all, s, { after = c })
    end
    assert.are.equal(1, #s:read_all({ after = 0 }))
  end)

  it("answers a direct open of a shard about a session moved away with the shard it moved to", function()
    local shards = plan_of(1)
    local s = open(shards)
    for i = 1, 20 do s:append("d-" .. i, { { type = "t" } }) end
    local grown = { s1 = shards.s1, s2 = kind.url() }
    s:set_plan({ version = 2, shards = grown })
    local at = where(grown)
    local direct = track(eventstore.open(shards.s1))
    local moved
    for session, shard in pairs(at) do if shard == "s2" then moved = session end end
    assert.is_string(moved)
    local err = expect_error("STORAGE", direct.append, direct, moved, { { type = "t" } })
    assert.is_truthy(tostring(err):find("shard 's2'", 1, true))
    -- and the sharded store's listing never shows the tombstone
    assert.are.equal(20, #s:sessions({ limit = 100 }).sessions)
  end)

  -- Runs `body` (Lua source using arg[1] = the catalog url, arg[2..]) in
  -- another process; returns a function that waits for it and gives its
  -- stdout.
  local function spawn(body, ...)
    local base = os.tmpname()
    files[#files + 1] = base
    local script, out, done = base .. ".lua", base .. ".out", base .. ".done"
    for _, f in ipairs({ script, out, done, base .. ".err" }) do files[#files + 1] = f end
    eh.write_file(script, body)
    local args = {}
    for _, a in ipairs({ ... }) do args[#args + 1] = sh_quote(tostring(a)) end
    local env = "LUA_PATH=" .. sh_quote(package.path) .. " LUA_CPATH=" .. sh_quote(package.cpath)
    os.execute(("(%s %s %s %s >%s 2>%s; touch %s) &"):format(env, LUA, sh_quote(script), table.concat(args, " "),
      sh_quote(out), sh_quote(base .. ".err"), sh_quote(done)))
    return function()
      for _ = 1, 1200 do
        local f = io.open(done, "r")
        if f then f:close() break end
        helpers.sleep(0.05)
      end
      assert.is_truthy(io.open(done, "r"), "the other process did not finish")
      local f = io.open(out, "r")
      local text = f and f:read("a") or ""
      if f then f:close() end
      local ef = io.open(base .. ".err", "r")
      local etext = ef and ef:read("a") or ""
      if ef then ef:close() end
      return text, etext
    end
  end

  local function wait_file(path)
    for _ = 1, 1200 do
      local f = io.open(path, "r")
      if f then f:close() return true end
      helpers.sleep(0.05)
    end
    return false
  end

  it("never lets a slow mover of an older plan move a session after a newer plan (review bug 1)", function()
    local s1, s2 = kind.url(), kind.url()
    local s, catalog = open({ s1 = s1 })
    for i = 1, 40 do s:append("m-" .. i, { { type = "t", id = "m-id-" .. i } }) end
    local gate = os.tmpname()
    files[#files + 1] = gate
    files[#files + 1] = gate .. ".paused"
    os.remove(gate)
    -- the other process moves {s1} -> {s1, s2} and pauses before its 12th
    -- step: the plan is pending, records are written, a few sessions moved,
    -- the rest of its listing of s1 held in memory
    local wait = spawn([[
      local eventstore = require("eventstore")
      local s = eventstore.open("shards:" .. arg[1])
      s:_pause_after(12, arg[2])
      local ok, r = pcall(s.set_plan, s, { version = 2, shards = { s1 = arg[3], s2 = arg[4] } })
      print(ok and "ok" or tostring(r))
      s:close()
    ]], catalog, gate, s1, s2)
    assert.is_true(wait_file(gate .. ".paused"), "the mover did not pause")
    -- meanwhile this process finishes plan 2 and installs plan 3 = {s1}
    s:set_plan({ version = 3, shards = { s1 = s1 } })
    assert.are.equal(3, s:plan().version)
    io.open(gate, "w"):close()
    local out, errtext = wait()
    assert.is_truthy(out:match("^ok") or out:find("plan", 1, true), "mover said: " .. out .. errtext)
    -- every session on s1 (the only shard of plan 3), reachable, each event once
    local at = where({ s1 = s1, s2 = s2 })
    assert.are.equal(40, count(at))
    for session, shard in pairs(at) do assert.are.equal("s1", shard, session .. " is on " .. shard) end
    local fresh = track(eventstore.open("shards:" .. catalog))
    assert.are.equal(3, fresh:plan().version)
    local ids = all_ids(fresh)
    assert.are.equal(40, count(ids))
    for id, n in pairs(ids) do assert.are.equal(1, n, id) end
    for i = 1, 40 do assert.are.equal(1, fresh:head("m-" .. i)) end
    assert.are.equal(40, #fresh:claim_next({ holder = "h", ttl_ms = 60000, limit = 1000 }))
  end)

  it("refuses a catalog that is one of the shards, and the catalog's session name (review bug 2)", function()
    local a, b = kind.url(), kind.url()
    expect_error("INVALID_ARGUMENT", eventstore.open, "shards:", { catalog = a, plan = { version = 1, shards = { a = a, b = b } } })
    local s, catalog = open({ a = a })
    s:append("x", { { type = "t" } })
    expect_error("INVALID_ARGUMENT", s.set_plan, s, { version = 2, shards = { a = a, c = catalog } })
    if catalog:match("^sqlite:/") then
      -- the same file by another spelling is the same store
      local respelled = catalog:gsub("^sqlite:/", "sqlite://")
      expect_error("INVALID_ARGUMENT", s.set_plan, s, { version = 2, shards = { a = a, c = respelled } })
    end
    assert.are.equal(1, s:plan().version)
    -- the plan session's name is reserved on a sharded store
    expect_error("INVALID_ARGUMENT", s.append, s, "eventstore.shard_plan", { { type = "plan", payload = { version = 99 } } })
    expect_error("INVALID_ARGUMENT", s.read, s, "eventstore.shard_plan")
    local other = track(eventstore.open("shards:" .. catalog))
    assert.are.equal(1, other:plan().version)
    local r = s:set_plan({ version = 2, shards = { a = a, b = b } })
    -- "x", the only session, moved exactly when it now hashes to b
    assert.are.equal(where({ a = a, b = b }).x == "b" and 1 or 0, r.moved)
    assert.are.equal(1, #s:read("x"))
  end)

  it("refuses two shard names on one store, then accepts a good plan (review bug 3)", function()
    local a, b = kind.url(), kind.url()
    local s = open({ a = a })
    for i = 1, 30 do s:append("k" .. i, { { type = "t", settled = true } }) end
    expect_error("INVALID_ARGUMENT", s.set_plan, s, { version = 2, shards = { a = a, b = b, c = b } })
    if b:match("^sqlite:/") then
      local respelled = b:gsub("^sqlite:/", "sqlite://")
      expect_error("INVALID_ARGUMENT", s.set_plan, s, { version = 2, shards = { a = a, b = b, c = respelled } })
    end
    assert.are.equal(1, s:plan().version)
    local r = s:set_plan({ version = 2, shards = { a = a, b = b } })
    assert.is_true(r.moved > 0)
    for i = 1, 30 do assert.are.equal(1, s:head("k" .. i)) end
  end)

  it("makes a deleted session usable again on a shard it once moved away from (review bug 4)", function()
    local a, b = kind.url(), kind.url()
    local s = open({ a = a })
    for i = 1, 40 do s:append("x" .. i, { { type = "t" } }) end
    s:set_plan({ version = 2, shards = { a = a, b = b } })
    local at = where({ a = a, b = b })
    local victim
    for session, shard in pairs(at) do if shard == "b" then victim = session end end
    assert.is_string(victim)
    s:delete(victim)
    s:set_plan({ version = 3, shards = { a = a } })
    assert.are.equal(0, s:head(victim))
    s:append(victim, { { type = "again" } })
    assert.are.equal(1, s:head(victim))
    assert.are.equal("again", s:read(victim)[1].type)
  end)

  it("keeps refs atomic across shards: racing put_refs and promotes (review bug 6)", function()
    local shards = plan_of(2)
    local s, catalog = open(shards)
    -- two sessions on different shards
    for i = 1, 40 do s:append("t" .. i, { { type = "t", settled = true } }) end
    local on = {}
    for _, name in ipairs({ "s1", "s2" }) do
      local direct = track(eventstore.open(shards[name]))
      on[name] = direct:sessions({ limit = 1 }).sessions[1].session
    end
    assert.is_string(on.s1)
    assert.is_string(on.s2)
    local N = 300
    local body = [[
      local eventstore = require("eventstore")
      local s = eventstore.open("shards:" .. arg[1])
      local target, n = arg[2], tonumber(arg[3])
      s:put_ref("src-" .. target, target)
      local won = {}
      for i = 1, n do
        s:put_ref("r" .. i, target)
        local ok = pcall(s.promote, s, "src-" .. target, "p" .. i, { expect = false })
        if ok then won[#won + 1] = i end
      end
      print(table.concat(won, " "))
      s:close()
    ]]
    local w1 = spawn(body, catalog, on.s1, N)
    local w2 = spawn(body, catalog, on.s2, N)
    local out1, e1 = w1()
    local out2, e2 = w2()
    assert.are.equal("", e1 .. e2)
    local wins = {}
    for _, out in ipairs({ out1, out2 }) do
      for i in out:gmatch("%d+") do wins[tonumber(i)] = (wins[tonumber(i)] or 0) + 1 end
    end
    for i = 1, N do
      local r = s:get_ref("r" .. i)
      assert.is_truthy(r, "ref r" .. i .. " was lost")
      assert.is_truthy(r.session == on.s1 or r.session == on.s2)
      assert.are.equal(1, r.head)
      assert.are.equal(1, wins[i] or 0, "promote onto p" .. i .. " won " .. tostring(wins[i] or 0) .. " times")
    end
    -- every ref listed once, with its session's head
    local listed = s:list_refs({ limit = 1000 })
    assert.are.equal(2 * N + 2, #listed)
    for _, r in ipairs(listed) do assert.are.equal(1, r.head, r.name) end
    -- deleting a session removes the refs naming it; a plan change keeps refs
    s:set_plan({ version = 2, shards = { s1 = shards.s1, s2 = shards.s2, s3 = kind.url() } })
    assert.are.equal(2 * N + 2, #s:list_refs({ limit = 1000 }))
    s:delete(on.s1)
    assert.is_nil(s:get_ref("src-" .. on.s1))
    assert.are.equal(on.s2, s:get_ref("src-" .. on.s2).session)
  end)

  it("a retried delete removes the refs its first try left in the catalog (second review 1)", function()
    local a, b = kind.url(), kind.url()
    local s = open({ a = a, b = b })
    s:append("gone", { { type = "t" } })
    s:put_ref("r-gone", "gone")
    s:put_ref("r-kept", "kept")
    -- what a delete whose catalog write failed leaves: the session gone
    -- from its shard, its ref still in the catalog
    local at = where({ a = a, b = b })
    local direct = track(eventstore.open(at.gone == "a" and a or b))
    direct:delete("gone")
    direct:close()
    assert.are.equal("gone", s:get_ref("r-gone").session)
    s:delete("gone") -- the retry: nothing left to delete on the shard
    assert.is_nil(s:get_ref("r-gone"))
    assert.are.equal("kept", s:get_ref("r-kept").session)
  end)

  it("tells stores apart whatever the ids option gives (second review 2)", function()
    -- a deterministic id source (as one restarted in each process) gives
    -- every store the same ids: the stores' identities must not come from it
    local ids = function() return "fixed-id" end
    local shards = { a = kind.url(), b = kind.url() }
    local s = track(eventstore.open("shards:", { catalog = kind.url(), ids = ids, plan = { version = 1, shards = shards } }))
    assert.are.equal(1, s:plan().version)
    local other = track(eventstore.open("shards:", { catalog = kind.url(), ids = ids, plan = { version = 1, shards = shards } }))
    assert.are.equal(1, other:plan().version)
  end)

  -- Breaks a shard's store under an open handle: its tables are dropped.
  local function break_store(url)
    local path = url:match("^sqlite:(.*)$")
    local cmd
    if path then
      cmd = "sqlite3 " .. sh_quote(path) .. " 'DROP TABLE events; DROP TABLE sessions'"
    else
      local schema = url:match("[?&]schema=([%w_]+)")
      local conninfo = url:gsub("[?&]schema=[%w_]+", "")
      cmd = "psql -q " .. sh_quote(conninfo) .. " -c " .. sh_quote("DROP SCHEMA " .. schema .. " CASCADE")
    end
    assert(os.execute(cmd .. " >/dev/null 2>&1"), "could not break the store: " .. cmd)
  end

  it("claim_next that skipped a failing shard asks the caller back soon (second review 3)", function()
    local clock = eventstore.manual_clock(1000000)
    local shards = plan_of(2)
    local s = track(eventstore.open("shards:", { catalog = kind.url(), clock = clock, plan = { version = 1, shards = shards } }))
    -- a session on each shard, its events handled: nothing is ready
    for i = 1, 20 do s:append("d" .. i, { { type = "t", settled = true } }) end
    local at = where(shards)
    local on = {}
    for session, name in pairs(at) do on[name] = session end
    assert.is_string(on.s1)
    assert.is_string(on.s2)
    local events, retry_at = s:claim_next({ holder = "h", ttl_ms = 60000 })
    assert.are.equal(0, #events)
    assert.is_nil(retry_at)
    break_store(shards.s1)
    -- s1 fails and is skipped; s2 answers with nothing: the caller must
    -- not sleep indefinitely past work that may wait on s1
    for _ = 1, 2 do -- every shard first once (the turn rotates)
      events, retry_at = s:claim_next({ holder = "h", ttl_ms = 60000 })
      assert.are.equal(0, #events)
      assert.are.equal(1000000 + 1000, retry_at)
    end
    -- an event on s2 due later than that still gives the short retry_at
    s:append(on.s2, { { type = "t", not_before = 1000000 + 60000 } })
    events, retry_at = s:claim_next({ holder = "h", ttl_ms = 60000 })
    assert.are.equal(0, #events)
    assert.are.equal(1000000 + 1000, retry_at)
  end)

  -- §5: each shard is a full store: keys (§3.10) and archive (§3.9) go to
  -- every shard (docs/sharding.md "Keys and archive").
  local function key_file()
    local base = os.tmpname()
    files[#files + 1] = base
    files[#files + 1] = base .. ".key"
    return base .. ".key"
  end

  local function archive_dir()
    local d = os.tmpname()
    os.remove(d)
    finally(function() os.execute("rm -rf " .. sh_quote(d)) end)
    return d
  end

  -- Installs plan version 2 of `shards` on s; it must move some sessions.
  -- Returns how many it moved and where() every session is then.
  local function grow(s, shards)
    local moved = s:set_plan({ version = 2, shards = shards }).moved
    assert.is_true(moved > 0)
    return moved, where(shards)
  end

  -- n sessions on each shard of `shards` (by where()), names prefix .. i
  local function spread(s, shards, prefix, n, batch)
    for i = 1, n do s:append(prefix .. i, batch(i)) end
    local at = where(shards)
    local by = {}
    for session, name in pairs(at) do
      if session:sub(1, #prefix) == prefix then by[name] = (by[name] or 0) + 1 end
    end
    return by
  end

  it("keys: sealed on every shard, read back opened; shred reaches every shard, also one added later", function()
    local keys = key_file()
    local shards = plan_of(2)
    local catalog = kind.url()
    local s = track(eventstore.open("shards:", { catalog = catalog, keys = keys, plan = { version = 1, shards = shards } }))
    local by = spread(s, shards, "c", 20, function(i)
      return { { type = "signed", payload = { mail = "m" .. i .. "@example.com" }, key = "k" }, { type = "plain", payload = { i = i } } }
    end)
    assert.is_true(by.s1 > 0 and by.s2 > 0, "sessions on both shards")
    assert.are.equal("m7@example.com", s:read("c7")[1].payload.mail)
    assert.truthy(s:read_at_rest("c7")[1].ciphertext:match("^es1:"))
    -- a shard opened directly without keys refuses to open a live sealed payload
    for _, url in pairs(shards) do
      local st = track(eventstore.open(url))
      local any = st:sessions({ limit = 1 }).sessions[1].session
      expect_error("INVALID_ARGUMENT", st.read, st, any)
      st:close()
    end
    -- a wrong key file: refused by the open
    local wrong = key_file()
    helpers.write_file(wrong, ("ab"):rep(32) .. "\n")
    os.execute("chmod 600 " .. sh_quote(wrong))
    expect_error("INVALID_ARGUMENT", eventstore.open, "shards:" .. catalog, { keys = wrong })
    assert.is_true(s:shred("k"))
    assert.is_false(s:shred("k"))
    for i = 1, 20 do
      local evs = s:read("c" .. i)
      assert.is_true(evs[1].shredded, "c" .. i)
      assert.is_nil(evs[1].payload)
      assert.are.same({ i = i }, evs[2].payload)
    end
    -- a shard added after the shred burns the name before any session lands on it
    local bigger = { s1 = shards.s1, s2 = shards.s2, s3 = kind.url() }
    s:set_plan({ version = 2, shards = bigger })
    local on3
    for i = 1, 200 do
      s:append("n" .. i, { { type = "t", settled = true } })
    end
    for session, name in pairs(where(bigger)) do
      if name == "s3" and session:match("^n") then on3 = session end
    end
    assert.is_string(on3)
    local err = expect_error("INVALID_ARGUMENT", s.append, s, on3, { { type = "t", key = "k" } })
    assert.truthy(tostring(err):find("shredded", 1, true), tostring(err))
    -- so is a name shredded before it was ever used
    assert.is_false(s:shred("never-used"))
    for _, session in ipairs({ on3, "c1", "c2" }) do
      expect_error("INVALID_ARGUMENT", s.append, s, session, { { type = "t", key = "never-used" } })
    end
  end)

  it("keys: a plan change moves sealed sessions (sealed again on the target) and shredded ones (still shredded)", function()
    local keys = key_file()
    local shards = plan_of(1)
    local s = track(eventstore.open("shards:", { catalog = kind.url(), keys = keys, plan = { version = 1, shards = shards } }))
    for i = 1, 30 do
      s:append("m" .. i, {
        { type = "a", payload = { secret = "live-" .. i }, key = "live-" .. (i % 3) },
        { type = "b", payload = { secret = "gone-" .. i }, key = "gone" },
        { type = "c", payload = { i = i }, key = "live-" .. (i % 3) },
      })
    end
    local rest_before = {}
    for i = 1, 30 do rest_before[i] = s:read_at_rest("m" .. i) end
    assert.is_true(s:shred("gone"))
    local bigger = { s1 = shards.s1, s2 = kind.url() }
    local moved, at = grow(s, bigger)
    local n2 = 0
    for i = 1, 30 do
      local evs = s:read("m" .. i)
      assert.are.same({ secret = "live-" .. i }, evs[1].payload)
      assert.is_true(evs[2].shredded)
      assert.is_nil(evs[2].payload)
      assert.are.same({ i = i }, evs[3].payload)
      local rest = s:read_at_rest("m" .. i)
      assert.are.equal(rest_before[i][1].id, rest[1].id)
      -- the shredded one keeps its sealed text; a live one moved to s2 is
      -- sealed again under s2's data key
      assert.are.equal(rest_before[i][2].ciphertext, rest[2].ciphertext)
      if at["m" .. i] == "s2" then
        n2 = n2 + 1
        assert.are_not.equal(rest_before[i][1].ciphertext, rest[1].ciphertext)
      else
        assert.are.equal(rest_before[i][1].ciphertext, rest[1].ciphertext)
      end
    end
    assert.are.equal(moved, n2)
    -- the moved sessions' keys are s2's own: a shred there reaches them
    assert.is_true(s:shred("live-1"))
    for i = 1, 30 do
      assert.are.equal(i % 3 == 1, s:read("m" .. i)[1].shredded == true, "m" .. i)
    end
  end)

  it("keys: a plan change through a handle without keys leaves sealed sessions where they are, usable", function()
    local keys = key_file()
    local shards = plan_of(1)
    local catalog = kind.url()
    local s = track(eventstore.open("shards:", { catalog = catalog, keys = keys, plan = { version = 1, shards = shards } }))
    for i = 1, 20 do s:append("k" .. i, { { type = "t", payload = { v = i }, key = "k" } }) end
    local plain = track(eventstore.open("shards:" .. catalog))
    local bigger = { s1 = shards.s1, s2 = kind.url() }
    local err = expect_error("INVALID_ARGUMENT", plain.set_plan, plain, { version = 2, shards = bigger })
    assert.truthy(tostring(err):find("opened without keys", 1, true), tostring(err))
    -- nothing moved, nothing frozen: every session reads and takes appends
    for session, shard in pairs(where(bigger)) do assert.are.equal("s1", shard, session) end
    for i = 1, 20 do
      assert.are.same({ v = i }, s:read("k" .. i)[1].payload)
      s:append("k" .. i, { { type = "u", payload = { w = i }, key = "k" } })
    end
    -- the handle with keys finishes the pending plan
    assert.is_true(s:set_plan({ version = 2, shards = bigger }).moved > 0)
    for i = 1, 20 do assert.are.same({ w = i }, s:read("k" .. i)[2].payload) end
  end)

  it("keys: fork between shards seals the copies under the target's key; shred reaches both", function()
    local keys = key_file()
    local shards = plan_of(2)
    local s = track(eventstore.open("shards:", { catalog = kind.url(), keys = keys, plan = { version = 1, shards = shards } }))
    s:append("src", { { type = "a", payload = { v = 1 }, key = "k" }, { type = "b", payload = { v = 2 }, key = "gone" } })
    assert.is_true(s:shred("gone"))
    -- forty targets: some on src's shard, some across
    local targets = {}
    for i = 1, 40 do
      local name = "f" .. i
      s:fork("src", 2, name)
      local evs = s:read(name)
      assert.are.same({ v = 1 }, evs[1].payload)
      assert.is_true(evs[2].shredded)
      targets[#targets + 1] = name
    end
    local at = where(shards)
    local crossed = 0
    for _, name in ipairs(targets) do
      if at[name] ~= at.src then crossed = crossed + 1 end
    end
    assert.is_true(crossed > 0 and crossed < #targets, "forks on both shards")
    assert.is_true(s:shred("k"))
    for _, name in ipairs(targets) do assert.is_true(s:read(name)[1].shredded, name) end
    assert.is_true(s:read("src")[1].shredded)
  end)

  it("archive: each shard's segments in DIR/NAME (name bytes escaped); paths relative to DIR; a plan change moves them", function()
    local dir = archive_dir()
    local shards = { a = kind.url(), ["../x y"] = kind.url() }
    local s = track(eventstore.open("shards:", { catalog = kind.url(), archive = dir, plan = { version = 1, shards = shards } }))
    local per = {}
    for i = 1, 30 do
      s:append("s" .. i, { { type = "t", payload = { i = i }, settled = true }, { type = "u", settled = true } })
      local g = s:archive("s" .. i, { through = 1 })
      assert.truthy(helpers.read_file(dir .. "/" .. g.file), g.file)
      local top = g.file:match("^([^/]+)/")
      per[top] = (per[top] or 0) + 1
      assert.are.same({ g.file }, helpers.pluck(s:segments("s" .. i), "file"))
      assert.are.same({ i = i }, s:read("s" .. i)[1].payload)
    end
    assert.is_true(per.a > 0 and per["%2E.%2Fx%20y"] > 0, helpers.dump(per))
    assert.are.equal(2, count(per))
    local v = s:verify_archive()
    assert.are.equal(30, v.checked)
    assert.are.same({}, v.problems)
    -- a file damaged on one shard is named relative to DIR
    local g = s:segments("s1")[1]
    local bytes = helpers.read_file(dir .. "/" .. g.file)
    os.remove(dir .. "/" .. g.file)
    v = s:verify_archive()
    assert.are.equal(1, #v.problems)
    assert.are.equal(g.file, v.problems[1].file)
    helpers.write_file(dir .. "/" .. g.file, bytes)
    -- a plan change moves sessions with segments: their files go to the
    -- new owner's directory, the old ones are removed
    local moved, at = grow(s, { a = shards.a, ["../x y"] = shards["../x y"], z = kind.url() })
    local on_z = 0
    for i = 1, 30 do
      local segs = s:segments("s" .. i)
      assert.are.equal(1, #segs)
      local want = at["s" .. i] == "../x y" and "%2E.%2Fx%20y" or at["s" .. i]
      assert.are.equal(want, segs[1].file:match("^([^/]+)/"), "s" .. i)
      if want == "z" then on_z = on_z + 1 end
      assert.are.same({ i = i }, s:read("s" .. i)[1].payload)
      assert.are.same({ 1, 2 }, helpers.indexes(s:read("s" .. i)))
    end
    assert.are.equal(moved, on_z)
    v = s:verify_archive()
    assert.are.equal(30, v.checked)
    assert.are.same({}, v.problems)
    assert.are.same({}, v.orphans)
    local p = io.popen("find " .. sh_quote(dir) .. " -name '*.seg' | wc -l")
    assert.are.equal(30, tonumber(p:read("a")))
    p:close()
  end)

  it("keys and archive: a move interrupted at any step is finished by the next set_plan, nothing lost or left", function()
    local dirs = {}
    finally(function() for _, d in ipairs(dirs) do os.execute("rm -rf " .. sh_quote(d)) end end)
    for _, crash_at in ipairs({ 1, 3, 6, 10, 17 }) do
      local dir = os.tmpname()
      os.remove(dir)
      dirs[#dirs + 1] = dir
      local keys = key_file()
      local shards = plan_of(1)
      local catalog = kind.url()
      local opts = { catalog = catalog, archive = dir, keys = keys, plan = { version = 1, shards = shards } }
      local s = track(eventstore.open("shards:", opts))
      for i = 1, 12 do
        s:append("x" .. i, { { type = "t", payload = { i = i }, settled = true }, { type = "u", payload = { s = "sealed-" .. i }, key = "k" .. (i % 2) } })
        s:archive("x" .. i, { through = 1 })
      end
      assert.is_true(s:shred("k0"))
      local grown = { s1 = shards.s1, s2 = kind.url() }
      s:_crash_after(crash_at)
      expect_error("STORAGE", s.set_plan, s, { version = 2, shards = grown })
      s:close()
      local again = track(eventstore.open("shards:" .. catalog, { archive = dir, keys = keys }))
      again:set_plan({ version = 2, shards = grown })
      local on2 = 0
      for session, shard in pairs(where(grown)) do
        if shard == "s2" then on2 = on2 + 1 end
        assert.are.equal(shard == "s2" and "s2" or "s1", again:segments(session)[1].file:match("^([^/]+)/"), session)
      end
      assert.is_true(on2 > 0, "crash at " .. crash_at)
      for i = 1, 12 do
        local evs = again:read("x" .. i)
        assert.are.same({ i = i }, evs[1].payload)
        if i % 2 == 0 then
          assert.is_true(evs[2].shredded, "x" .. i)
        else
          assert.are.same({ s = "sealed-" .. i }, evs[2].payload, "x" .. i)
        end
      end
      local v = again:verify_archive()
      assert.are.equal(12, v.checked)
      assert.are.same({}, v.problems)
      assert.are.same({}, v.orphans, "crash at " .. crash_at)
      again:close()
    end
  end)

  it("archive: a session whose archived events are sealed does not move; it stays usable, the plan pending", function()
    local dir = archive_dir()
    local keys = key_file()
    local shards = plan_of(1)
    local s = track(eventstore.open("shards:", { catalog = kind.url(), archive = dir, keys = keys, plan = { version = 1, shards = shards } }))
    for i = 1, 20 do
      s:append("a" .. i, { { type = "t", payload = { i = i }, key = "k", settled = true }, { type = "u", settled = true } })
      s:archive("a" .. i, { through = 1 })
    end
    local bigger = { s1 = shards.s1, s2 = kind.url() }
    local err = expect_error("INVALID_ARGUMENT", s.set_plan, s, { version = 2, shards = bigger })
    assert.truthy(tostring(err):find("sealed under key 'k'", 1, true), tostring(err))
    assert.are.equal(1, s:plan().version)
    for i = 1, 20 do
      assert.are.same({ i = i }, s:read("a" .. i)[1].payload)
      s:append("a" .. i, { { type = "v", settled = true } })
    end
  end)
end)
end
