-- Retention policies (docs/contract.md §3.9, docs/retention.md "Retention
-- policies"): scripts/retention.lua applied by the engine every
-- retention_every_ms of the store's clock, under a lease, and by
-- run{until_idle} before it returns. A manual clock drives every test; runs
-- once per backend URL and on shards: (helpers.urls_and_shards()).
local helpers = require("helpers")
local eh = require("engine_helpers")

local row_of = helpers.session_row

-- n settled events (processed at once: nobody handles them).
local function settled(store, session, n)
  local batch = {}
  for i = 1, n do batch[i] = { type = "step", payload = { i = i }, settled = true } end
  return store:append(session, batch)
end

local function rules(t, text) eh.write_script(t.dir .. "/retention.lua", text) end

-- A store (with an archive directory, for the archive action), its clock,
-- a scripts directory holding `policy`, and an engine on them.
local function setup(url, policy, opts)
  local dir = eh.scripts_dir() -- removed by eh.cleanup, the archive inside it too
  local store, clock = helpers.new(url, { archive = dir .. "/archive" })
  local t = { store = store, clock = clock, dir = dir }
  rules(t, policy)
  local o = { store = store, scripts = t.dir, retention_every_ms = 60000 }
  for k, v in pairs(opts or {}) do o[k] = v end
  t.engine = eh.engine(o)
  return t
end

-- Whole "tmp/" sessions go a second after their newest event; "t/"
-- sessions keep their newest event (the specs of a session the sweep
-- must age or cannot plan, beside one it applies as usual).
local TMP_DELETE_T_TRUNCATE = [[return {
  { sessions = "tmp/", max_age_ms = 1000, action = "delete" },
  { sessions = "t/", keep_last = 1, action = "truncate" },
}]]

local function first_index(store, session)
  local row = row_of(store, session)
  return row and row.first_index
end

for _, url in ipairs(helpers.urls_and_shards()) do
  describe(url, function()
    after_each(eh.cleanup)

    it("keep_last truncates all but the newest n; the first rule whose prefix matches wins", function()
      local t = setup(url, [[return {
        { sessions = "orders/vip", keep_last = 8, action = "truncate" },
        { sessions = "orders/", keep_last = 3, action = "truncate" },
      }]])
      settled(t.store, "orders/1", 10)
      settled(t.store, "orders/vip-1", 10)
      settled(t.store, "carts/1", 10)
      t.engine:run({ until_idle = true })
      assert.equal(8, first_index(t.store, "orders/1"))
      assert.equal(3, first_index(t.store, "orders/vip-1"))
      assert.equal(1, first_index(t.store, "carts/1")) -- no rule: untouched
      assert.equal(10, t.store:head("orders/1"))
      local st = t.engine:stats().retention
      assert.same({ truncate = 2, archive = 0, delete = 0, failed = 0, sweeps = 1 }, st)
    end)

    it("max_age_ms truncates the events older than it, by the store's clock", function()
      local t = setup(url, [[return {{ sessions = "", max_age_ms = 5000, action = "truncate" }}]])
      settled(t.store, "s", 2)         -- at T0
      t.clock:advance(3000)
      settled(t.store, "s", 2)         -- at T0 + 3000
      t.clock:advance(3000)            -- now T0 + 6000: the first two are 6 s old
      t.engine:run({ until_idle = true })
      assert.equal(3, first_index(t.store, "s"))
      assert.equal(2, #t.store:read("s", { after = 2 }))
    end)

    it("applies the rules every retention_every_ms of the store's clock, not at every run", function()
      local t = setup(url, [[return {{ sessions = "", keep_last = 1, action = "truncate" }}]],
        { retention_every_ms = 10000 })
      settled(t.store, "s", 3)
      t.engine:run({ until_idle = true })
      assert.equal(3, first_index(t.store, "s"))
      settled(t.store, "s", 3)
      t.clock:advance(9999)
      t.engine:run({ until_idle = true })
      assert.equal(3, first_index(t.store, "s"), "not due yet")
      assert.equal(1, t.engine:stats().retention.sweeps)
      t.clock:advance(1)
      t.engine:run({ until_idle = true })
      assert.equal(6, first_index(t.store, "s"))
      assert.equal(2, t.engine:stats().retention.sweeps)
    end)

    it("never drops a pending or dead event: it stops below the first one", function()
      local t = setup(url, [[return {{ sessions = "", keep_last = 1, action = "truncate" }}]])
      settled(t.store, "p", 3)
      t.store:append("p", { { type = "nobody-handles-this" } }) -- 4: pending
      settled(t.store, "p", 4)
      settled(t.store, "d", 2)
      local ev = t.store:append("d", { { type = "doomed" } })[1] -- 3: dead below
      settled(t.store, "d", 3)
      local c = helpers.claimed(t.store, "d")[1]
      assert.equal(3, c.index)
      t.store:fail("d", 3, c.attempt, { error = "x", max_failures = 1 })
      assert.equal("dead", t.store:read("d", { after = ev.index - 1, limit = 1 })[1].status)
      t.engine:run({ until_idle = true })
      assert.equal(4, first_index(t.store, "p"))
      assert.equal("pending", t.store:read("p", { limit = 1, after = 3 })[1].status)
      assert.equal(3, first_index(t.store, "d"))
      assert.equal("dead", t.store:read("d", { limit = 1, after = 2 })[1].status)
    end)

    it("never touches a session with a live lease; once it has expired, it does", function()
      local t = setup(url, [[return {{ sessions = "", keep_last = 1, action = "truncate" }}]],
        { retention_every_ms = 1000 })
      settled(t.store, "leased", 5)
      settled(t.store, "free", 5)
      local lease = t.store:lease("leased", { holder = "worker-a", ttl_ms = 5000 })
      assert.equal("acquired", lease.outcome)
      t.engine:run({ until_idle = true })
      assert.equal(1, first_index(t.store, "leased"))
      assert.equal(5, first_index(t.store, "free"))
      t.clock:advance(5000) -- the lease ends at now >= expires_at
      t.engine:run({ until_idle = true })
      assert.equal(5, first_index(t.store, "leased"))
    end)

    it("archive moves the range into segments (dropped from the live rows, read transparently)", function()
      local t = setup(url, [[return {{ sessions = "", keep_last = 2, action = "archive" }}]])
      settled(t.store, "s", 6)
      t.engine:run({ until_idle = true })
      local segs = t.store:segments("s")
      assert.equal(1, #segs)
      assert.equal(1, segs[1].from)
      assert.equal(4, segs[1].through)
      assert.equal(6, #t.store:read("s"))
      assert.equal(1, t.engine:stats().retention.archive)
    end)

    it("delete removes a whole session whose newest event is older than max_age_ms, never one with pending events", function()
      local t = setup(url, [[return {{ sessions = "tmp/", max_age_ms = 1000, action = "delete" }}]])
      settled(t.store, "tmp/old", 2)
      settled(t.store, "tmp/busy", 2)
      t.store:append("tmp/busy", { { type = "nobody-handles-this" } })
      t.clock:advance(1001)
      settled(t.store, "tmp/young", 2)
      t.engine:run({ until_idle = true })
      assert.equal(0, t.store:head("tmp/old"))
      assert.is_nil(row_of(t.store, "tmp/old"))
      assert.equal(3, t.store:head("tmp/busy"))
      assert.equal(2, t.store:head("tmp/young"))
      assert.equal(1, t.engine:stats().retention.delete)
    end)

    -- A delete rule ages a session by its newest event; once every event
    -- was truncated that event is gone (a read of it is TRUNCATED), and
    -- the session's last write stands in for it. That session must not
    -- stop the sweep: the other sessions' actions are planned and applied.
    it("delete takes a fully truncated session by its last write, and the other actions still apply", function()
      local t = setup(url, TMP_DELETE_T_TRUNCATE)
      settled(t.store, "tmp/gone", 2)
      settled(t.store, "t/keep", 3)
      assert.equal(3, t.store:truncate("tmp/gone", 2)) -- every event truncated
      t.clock:advance(1000) -- not older than max_age_ms yet
      local function planned()
        local out = {}
        for i, a in ipairs(t.engine:retain({ dry_run = true })) do
          out[i] = { a.action, a.session, a.through or a.newest_at, a.error }
        end
        return out
      end
      assert.same({ { "truncate", "t/keep", 2 } }, planned())
      t.clock:advance(1)
      assert.same({ { "truncate", "t/keep", 2 }, { "delete", "tmp/gone", helpers.T0 } }, planned())
      assert.equal(3, first_index(t.store, "tmp/gone"), "a dry run changes nothing")
      assert.equal(1, first_index(t.store, "t/keep"), "a dry run changes nothing")
      t.engine:run({ until_idle = true })
      assert.is_nil(row_of(t.store, "tmp/gone"))
      assert.equal(0, t.store:head("tmp/gone"))
      assert.equal(3, first_index(t.store, "t/keep"))
      assert.same({ truncate = 1, archive = 0, delete = 1, failed = 0, sweeps = 1 }, t.engine:stats().retention)
    end)

    if url:match("^sqlite:") then
      -- A read that fails (here a payload the sqlite3 shell garbled) is
      -- that session's failure, reported on its action and counted; it
      -- is never applied, and it never keeps the others from applying.
      it("a session whose plan fails is reported with its error; the other actions apply", function()
        local dir = eh.scripts_dir()
        local store, clock, concrete = helpers.new(url)
        settled(store, "t/keep", 3)
        settled(store, "tmp/bad", 1)
        settled(store, "tmp/old", 1)
        store:close()
        helpers.sqlite3(concrete:match("^sqlite:(.*)$"),
          "UPDATE events SET payload = '{not json' WHERE session = 'tmp/bad'")
        store = helpers.open_same(concrete, { clock = clock })
        local t = { store = store, clock = clock, dir = dir }
        rules(t, TMP_DELETE_T_TRUNCATE)
        local engine = eh.engine({ store = store, scripts = dir })
        clock:advance(1001)
        local actions = engine:retain()
        assert.same({ "t/keep", "tmp/bad", "tmp/old" }, helpers.pluck(actions, "session"))
        assert.is_nil(actions[1].error)
        assert.equal("delete", actions[2].action)
        assert.is_string(actions[2].error)
        assert.is_nil(actions[3].error)
        assert.equal(3, first_index(store, "t/keep"))
        assert.equal(1, store:head("tmp/bad"))
        assert.is_nil(row_of(store, "tmp/old"))
        assert.same({ truncate = 1, archive = 0, delete = 1, failed = 1, sweeps = 1 }, engine:stats().retention)
      end)
    end

    it("one engine per store sweeps: another one's sweep waits for the lease", function()
      local t = setup(url, [[return {{ sessions = "s", keep_last = 1, action = "truncate" }}]])
      local other = eh.engine({ store = t.store, scripts = t.dir, retention_every_ms = 60000 })
      settled(t.store, "s", 3)
      t.engine:run({ until_idle = true })
      assert.equal(3, first_index(t.store, "s"))
      settled(t.store, "s", 3)
      other:run({ until_idle = true })
      assert.equal(3, first_index(t.store, "s"), "the other engine must not sweep")
      assert.equal(0, other:stats().retention.sweeps)
      t.engine:close() -- gives the lease back
      other:run({ until_idle = true })
      assert.equal(3, first_index(t.store, "s"), "the other engine looks again a period later")
      t.clock:advance(60000)
      other:run({ until_idle = true })
      assert.equal(6, first_index(t.store, "s"))
      assert.equal(1, other:stats().retention.sweeps)
    end)

    it("retain{dry_run} plans without changing anything; retain applies", function()
      local t = setup(url, [[return {{ sessions = "", keep_last = 2, action = "truncate" }}]])
      settled(t.store, "s", 5)
      local plan = t.engine:retain({ dry_run = true })
      assert.equal(1, #plan)
      assert.same({ "truncate", "s", 1, 3 }, { plan[1].action, plan[1].session, plan[1].from, plan[1].through })
      assert.equal(1, first_index(t.store, "s"))
      assert.equal(0, t.engine:stats().retention.truncate)
      t.engine:retain()
      assert.equal(4, first_index(t.store, "s"))
      assert.equal(1, t.engine:stats().retention.truncate)
    end)

    it("a retention.lua that does not load, or a bad rule, is an error at eventstore.engine naming the file", function()
      local store = helpers.new(url)
      local dir = eh.scripts_dir()
      for _, case in ipairs({
        { "return {{ sessions = 'a', keep_last = 1, action = 'truncate' }", "retention.lua:1:" },
        { "return {{ sessions = 'a', keep_last = 1, action = 'shred' }}", "rule 1: action" },
        { "return {{ sessions = 'a', action = 'truncate' }}", "keep_last or max_age_ms" },
        { "return {{ sessions = 'a', keep_last = -1, action = 'truncate' }}", "keep_last must be" },
        { "return {{ sessions = 'a', keep_last = 1, action = 'delete' }}", "delete needs max_age_ms" },
        { "return {{ session = 'a', keep_last = 1, action = 'truncate' }}", "unknown field 'session'" },
      }) do
        eh.write_script(dir .. "/retention.lua", case[1])
        local ok, err = pcall(eh.engine, { store = store, scripts = dir })
        assert.is_false(ok, case[1])
        assert.truthy(tostring(err):find(case[2], 1, true), tostring(err))
        assert.truthy(tostring(err):find("retention.lua", 1, true), tostring(err))
      end
      eh.write_script(dir .. "/retention.lua", "return {}")
      local ok, err = pcall(eh.engine, { store = store, scripts = dir, retention_every_ms = 0 })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("retention_every_ms", 1, true), tostring(err))
    end)
  end)
end
