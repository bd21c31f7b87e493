-- `eventstore retain [--dry-run]` (docs/cli.md, docs/retention.md
-- "Retention policies"): the rules of scripts/retention.lua applied once.
-- Every test runs the built binary in a fresh working directory against
-- its own SQLite file (./eventstore.db) and ./scripts.
local eventstore = require("eventstore")
local helpers = require("helpers")
local sh_quote, write_file = helpers.sh_quote, helpers.write_file

local ch = require("cli_helpers")
local ndjson, ok, fails_one_line = ch.ndjson, ch.ok, ch.fails_one_line

local work

local function es(args, stdin) return ch.run(work, args, stdin) end

-- The store, on a clock at 1 s after the epoch: its events are decades
-- old for the binary, which reads the system clock (so max_age_ms rules
-- need no waiting).
local function open()
  return eventstore.open("sqlite:" .. work .. "/eventstore.db", { clock = eventstore.manual_clock(1000) })
end

local function settled(s, session, n)
  local batch = {}
  for i = 1, n do batch[i] = { type = "step", payload = { i = i }, settled = true } end
  s:append(session, batch)
end

local function policy(text) write_file(work .. "/scripts/retention.lua", text) end

local function first_index(session)
  local s = open()
  local rows = s:sessions({ prefix = session }).sessions
  s:close()
  for _, r in ipairs(rows) do
    if r.session == session then return r.first_index end
  end
end

describe("eventstore retain", function()
  before_each(function()
    work = ch.mkdtemp()
    os.execute("mkdir -p " .. sh_quote(work .. "/scripts/handlers") .. " " .. sh_quote(work .. "/scripts/reducers"))
  end)
  after_each(function() os.execute("rm -rf " .. sh_quote(work)) end)

  it("--dry-run prints each action and changes nothing; retain applies them, once", function()
    local s = open()
    settled(s, "log-1", 5)
    settled(s, "keep-1", 5)
    s:close()
    policy([[return {{ sessions = "log-", keep_last = 2, action = "truncate" }}]])
    local dry = ndjson(ok(es({ "retain", "--dry-run" })))
    assert.same({ { action = "truncate", session = "log-1", from = 1, through = 3, dry_run = true } }, dry)
    assert.equal(1, first_index("log-1"))
    local done = ndjson(ok(es({ "retain" })))
    assert.same({ { action = "truncate", session = "log-1", from = 1, through = 3 } }, done)
    assert.equal(4, first_index("log-1"))
    assert.equal(1, first_index("keep-1"))
    assert.equal("", ok(es({ "retain" })), "nothing left to do")
  end)

  it("stops below a pending event and says so; leaves a session with a live lease alone", function()
    local s = open()
    settled(s, "p", 2)
    s:append("p", { { type = "waiting" } })
    settled(s, "p", 3)
    settled(s, "leased", 4)
    s:close()
    -- a lease on the system clock's time, live for the binary
    local live = eventstore.open("sqlite:" .. work .. "/eventstore.db")
    assert.equal("acquired", live:lease("leased", { holder = "w", ttl_ms = 3600000 }).outcome)
    live:close()
    policy([[return {{ sessions = "", keep_last = 1, action = "truncate" }}]])
    local done = ndjson(ok(es({ "retain" })))
    assert.same({ { action = "truncate", session = "p", from = 1, through = 2, stopped_at = 3,
      stopped_status = "pending" } }, done)
    assert.equal(3, first_index("p"))
    assert.equal(1, first_index("leased"))
  end)

  it("run applies the rules by itself, every --retention-every-ms of the store's clock", function()
    local s = open()
    settled(s, "log-1", 5)
    s:close()
    policy([[return {{ sessions = "log-", keep_last = 2, action = "truncate" }}]])
    -- an until-idle run sweeps at its start and before it returns
    ok(es({ "run", "--until-idle", "--retention-every-ms", "3600000" }))
    assert.equal(4, first_index("log-1"))
    -- a run that goes on sweeps again every 200 ms of the (system) clock:
    -- events appended while it runs are truncated without a restart (the
    -- default period, 60 s, is past the wait's ceiling)
    local function more()
      s = open()
      settled(s, "log-1", 3)
      s:close()
    end
    more()
    local pid = assert(io.popen(("cd %s && exec timeout 120 %s run --retention-every-ms 200 >run.out 2>run.err & echo $!")
      :format(sh_quote(work), sh_quote(ch.BIN)))):read("l")
    local ok_, err = pcall(function()
      helpers.wait_until(function() return first_index("log-1") == 7 end, "the run's first sweep", 60)
      more()
      helpers.wait_until(function() return first_index("log-1") == 10 end, "the next sweep", 50)
    end)
    os.execute("kill " .. pid)
    helpers.wait_until(function() return not helpers.alive(pid) end, "run to stop", 60)
    assert(ok_, err)
  end)

  it("archive and delete by max_age_ms", function()
    local s = open()
    settled(s, "audit-1", 4)
    settled(s, "tmp-1", 2)
    s:close()
    policy([[return {
      { sessions = "audit-", max_age_ms = 1000, action = "archive" },
      { sessions = "tmp-", max_age_ms = 1000, action = "delete" },
    }]])
    local done = ndjson(ok(es({ "retain" })))
    assert.equal(2, #done)
    assert.same({ "archive", "audit-1", 1, 4 }, { done[1].action, done[1].session, done[1].from, done[1].through })
    assert.same({ "delete", "tmp-1", 1000 }, { done[2].action, done[2].session, done[2].newest_at })
    local segs = ndjson(ok(es({ "segments", "audit-1" })))
    assert.equal(1, #segs)
    assert.equal(4, #ndjson(ok(es({ "read", "audit-1" }))))
    assert.is_nil(first_index("tmp-1"))
  end)

  it("without retention.lua, or with one that does not load: exit 1, one line naming the file", function()
    local s = open()
    settled(s, "x", 1)
    s:close()
    fails_one_line(es({ "retain" }), 1, "no retention rules: './scripts/retention.lua' does not exist")
    policy([[return {{ sessions = "x", keep_last = 1, action = "shrink" }}]])
    local err = fails_one_line(es({ "retain", "--dry-run" }), 1, "")
    assert.truthy(err:find("retention.lua: rule 1: action", 1, true), err)
    assert.equal(1, first_index("x"))
  end)
end)
