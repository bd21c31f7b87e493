-- eventstore stats (docs/cli.md, docs/stats.md): the store's counts, from
-- the counters it keeps, as text or one JSON object; --tenant; bad usage.
-- And run's summary line, whose pending comes from the same counts.
local eventstore = require("eventstore")
local helpers = require("helpers")
local ch = require("cli_helpers")

local ok, fails = ch.ok, ch.fails
local json = eventstore.json

local work

local function es(args, stdin) return ch.run(work, args, stdin) end

local engine_it = ch.HAS_ENGINE and it or function(name) pending(name .. " (needs the engine)") end

describe("eventstore stats", function()
  before_each(function() work = ch.mkdtemp() end)
  after_each(function() os.execute("rm -rf " .. helpers.sh_quote(work)) end)

  it("prints sessions, events, pending and dead", function()
    ok(es({ "append", "a", "t" }))
    ok(es({ "append", "a", "t" }))
    ok(es({ "append", "b", "t" }))
    ok(es({ "append", "s", "t", "--tenant", "acme" }))
    assert.same({ "sessions 3", "events 4", "pending 4", "dead 0" }, ch.lines(ok(es({ "stats" }))))
    local st = json.decode(ok(es({ "stats", "--json" })))
    assert.same({ sessions = 3, events = 4, pending = 4, dead = 0 },
      { sessions = st.sessions, events = st.events, pending = st.pending, dead = st.dead })
    assert.equal("table", type(st.calls))
    -- a tenant's own counts
    st = json.decode(ok(es({ "stats", "--json", "--tenant", "acme" })))
    assert.same({ 1, 1, 1, 0 }, { st.sessions, st.events, st.pending, st.dead })
  end)

  it("counts dead letters and settled events as the store does", function()
    local store = eventstore.open("sqlite:" .. work .. "/eventstore.db")
    store:append("s", { { type = "t" }, { type = "t", settled = true } })
    local got = store:claim("s", { holder = "w", ttl_ms = 60000 }).events
    store:fail("s", 1, got[1].attempt, { error = "x", max_failures = 1 })
    store:close()
    assert.same({ "sessions 1", "events 2", "pending 0", "dead 1" }, ch.lines(ok(es({ "stats" }))))
  end)

  it("refuses arguments and a missing database", function()
    fails(es({ "stats", "x" }), 2, "stats: unexpected argument 'x'")
    fails(es({ "stats", "--db", "sqlite:" .. work .. "/none.db" }), 1, "")
    assert.is_nil(io.open(work .. "/none.db", "r"), "nothing created")
  end)

  engine_it("run's summary counts what is still pending from the store's counts", function()
    os.execute("mkdir -p " .. helpers.sh_quote(work .. "/scripts/handlers"))
    helpers.write_file(work .. "/scripts/handlers/ok.lua", "return function() end\n")
    ok(es({ "append", "a", "ok" }))
    ok(es({ "append", "a", "nobody" }))
    ok(es({ "append", "b", "nobody" }))
    local r = es({ "run", "--until-idle" })
    assert.equal(0, r.code, r.err)
    assert.matches("handled 1, failed 0, dead 0, pending 2", r.out)
    assert.same({ "sessions 2", "events 3", "pending 2", "dead 0" }, ch.lines(ok(es({ "stats" }))))
  end)
end)
