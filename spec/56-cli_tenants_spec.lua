-- The binary with --tenant NAME (docs/tenants.md): every command that opens
-- the store works inside that tenant; `run --tenant` dispatches that
-- tenant's events only; names print as the tenant names them.
local eventstore = require("eventstore")
local helpers = require("helpers")
local ch = require("cli_helpers")

local ndjson, ok, fails = ch.ndjson, ch.ok, ch.fails
local SEP = "\31"

local work

local function es(args, stdin) return ch.run(work, args, stdin) end

local function open_db() return eventstore.open("sqlite:" .. work .. "/eventstore.db") end

local engine_it = ch.HAS_ENGINE and it or function(name) pending(name .. " (needs the engine)") end

describe("eventstore --tenant", function()
  before_each(function() work = ch.mkdtemp() end)
  after_each(function() os.execute("rm -rf " .. helpers.sh_quote(work)) end)

  it("append, read, sessions, dead, revive, settle and snapshots work inside the tenant", function()
    ok(es({ "append", "s", "note", '{"who":"A"}', "--id", "x", "--tenant", "A" }))
    ok(es({ "append", "s", "note", '{"who":"B"}', "--id", "x", "--tenant", "B" }))
    ok(es({ "append", "plain", "note", "--id", "x" }))
    local a = ndjson(ok(es({ "read", "s", "--tenant", "A" })))
    assert.equal(1, #a)
    assert.equal("A", a[1].payload.who)
    assert.equal("s", a[1].session)
    assert.equal("x", a[1].id)
    local b = ndjson(ok(es({ "read", "s", "--tenant", "B" })))
    assert.equal("B", b[1].payload.who)
    local names = {}
    for _, row in ipairs(ndjson(ok(es({ "sessions", "--tenant", "A" })))) do names[#names + 1] = row.session end
    assert.same({ "s" }, names)
    -- the root (no --tenant) sees every tenant under its prefix
    names = {}
    for _, row in ipairs(ndjson(ok(es({ "sessions" })))) do names[#names + 1] = row.session end
    table.sort(names)
    assert.same({ "A" .. SEP .. "s", "B" .. SEP .. "s", "plain" }, names)
    assert.same({}, ndjson(ok(es({ "read", "plain", "--tenant", "A" }))))
    -- a dead letter of B: invisible to A, revived through B
    local store = open_db()
    local B = store:tenant("B")
    B:append("d", { { type = "job" } })
    local c = B:claim("d", { holder = "h", ttl_ms = 1000 })
    B:fail("d", 1, c.events[1].attempt, { error = "boom", max_failures = 1 })
    store:close()
    assert.same({}, ndjson(ok(es({ "dead", "--tenant", "A" }))))
    local dead = ndjson(ok(es({ "dead", "--tenant", "B" })))
    assert.equal(1, #dead)
    assert.equal("d", dead[1].session)
    fails(es({ "revive", "d", "1", "--tenant", "A" }), 1, "NO_SUCH_EVENT")
    ok(es({ "revive", "d", "1", "--tenant", "B" }))
    assert.same({}, ndjson(ok(es({ "dead", "--tenant", "B" }))))
  end)

  it("on a shards: store: each tenant's sessions on every shard, seen only through it", function()
    local db, paths = ch.sharded(work)
    for i = 1, 9 do
      ok(es({ "append", "s" .. i, "note", '{"who":"A"}', "--tenant", "A", "--db", db }))
      ok(es({ "append", "s" .. i, "note", '{"who":"B"}', "--tenant", "B", "--db", db }))
    end
    local names = {}
    for _, row in ipairs(ndjson(ok(es({ "sessions", "--tenant", "A", "--db", db })))) do names[#names + 1] = row.session end
    table.sort(names)
    assert.same({ "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9" }, names)
    for i = 1, 9 do
      local a = ndjson(ok(es({ "read", "s" .. i, "--tenant", "A", "--db", db })))
      assert.equal(1, #a)
      assert.equal("A", a[1].payload.who)
    end
    -- the tenant's sessions are spread over the shards
    local holding = 0
    for _, path in pairs(paths) do
      local st = eventstore.open("sqlite:" .. path)
      local n = #st:tenant("A"):sessions({ limit = 100 }).sessions
      st:close()
      if n > 0 then holding = holding + 1 end
    end
    assert.is_true(holding >= 2, "tenant A's sessions on more than one shard")
  end)

  it("a bad tenant name is INVALID_ARGUMENT, exit 1, one line", function()
    ch.fails_one_line(es({ "append", "s", "t", "--tenant", "" }), 1, "INVALID_ARGUMENT")
    ch.fails_one_line(es({ "append", "s", "t", "--tenant", ("x"):rep(65) }), 1, "INVALID_ARGUMENT")
    ch.fails_one_line(es({ "append", "s", "t", "--tenant", "a\tb" }), 1, "INVALID_ARGUMENT")
  end)

  engine_it("run --tenant dispatches that tenant's events only; state folds the tenant's", function()
    local dir = work .. "/scripts"
    os.execute("mkdir -p " .. helpers.sh_quote(dir .. "/handlers") .. " " .. helpers.sh_quote(dir .. "/reducers"))
    helpers.write_file(dir .. "/handlers/ping.lua", [[
return function(event, ctx) return { { type = "pong", payload = { session = ctx.session } } } end
]])
    helpers.write_file(dir .. "/reducers/count.lua", [[
return { init = function() return { n = 0 } end, ping = function(s) s.n = s.n + 1 end }
]])
    ok(es({ "append", "s", "ping", "--tenant", "A" }))
    ok(es({ "append", "s", "ping", "--tenant", "A" }))
    ok(es({ "append", "s", "ping", "--tenant", "B" }))
    ok(es({ "append", "s", "ping" }))
    es({ "run", "--until-idle", "--tenant", "A" })
    local a = ndjson(ok(es({ "read", "s", "--tenant", "A" })))
    assert.equal(4, #a)
    assert.equal("pong", a[3].type)
    assert.equal("s", a[3].payload.session)
    assert.equal(1, #ndjson(ok(es({ "read", "s", "--tenant", "B" }))))
    assert.equal(1, #ndjson(ok(es({ "read", "s" }))))
    assert.same({ n = 2 }, eventstore.json.decode(ok(es({ "state", "s", "count", "--tenant", "A" }))))
    assert.same({ n = 1 }, eventstore.json.decode(ok(es({ "state", "s", "count", "--tenant", "B" }))))
  end)
end)
