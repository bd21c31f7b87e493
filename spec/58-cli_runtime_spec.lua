-- The `eventstore` commands of issue 28 (docs/cli.md): append-many (§3.1
-- append_many from NDJSON batches) and cancel (§3.2).
--
-- Like 50-cli_spec.lua: every test runs the built binary in a fresh
-- working directory against its own SQLite file (./eventstore.db, the
-- default --db), and checks the store from this process.
local eventstore = require("eventstore")
local helpers = require("helpers")
local sh_quote = helpers.sh_quote

local ch = require("cli_helpers")
local ndjson, ok, fails_one_line = ch.ndjson, ch.ok, ch.fails_one_line

local work

local function es(args, stdin) return ch.run(work, args, stdin) end

local function open_db() return eventstore.open("sqlite:" .. work .. "/eventstore.db") end

-- The whole store as text, from this process (nil before any file exists).
local function world()
  local f = io.open(work .. "/eventstore.db", "r")
  if not f then return nil end
  f:close()
  local s = open_db()
  local w = helpers.world(s)
  s:close()
  return w
end

describe("eventstore append-many", function()
  before_each(function() work = ch.mkdtemp() end)
  after_each(function() os.execute("rm -rf " .. sh_quote(work)) end)

  it("appends every line's batch in one transaction and prints the stored events in order", function()
    ok(es({ "append", "b", "first" }))
    local input = table.concat({
      '{"session":"a","events":[{"type":"x","payload":{"n":1}},{"type":"y","id":"a-2"}]}',
      "",
      '{"session":"b","events":[{"type":"z","lane":"L"}],"expected":1}',
      '{"session":"c","events":[]}',
    }, "\n") .. "\n"
    local got = ndjson(ok(es({ "append-many" }, input)))
    assert.same({ "a", "a", "b" }, helpers.pluck(got, "session"))
    assert.same({ 1, 2, 2 }, helpers.pluck(got, "index"))
    assert.equal("a-2", got[2].id)
    assert.equal("L", got[3].lane)
    local s = open_db()
    assert.equal(2, s:head("a"))
    assert.equal(2, s:head("b"))
    s:close()
  end)

  it("a refused batch on a later line writes nothing and names its line", function()
    ok(es({ "append", "b", "first" }))
    local before = world()
    local input = '{"session":"a","events":[{"type":"x"}]}\n\n{"session":"b","events":[{"type":"y"}],"expected":0}\n'
    local err = fails_one_line(es({ "append-many" }, input), 1, "WRONG_EXPECTED_HEAD: stdin line 3 (session 'b')")
    assert.truthy(err:find("is at 1, expected 0", 1, true), err)
    assert.equal(before, world())
  end)

  it("checks every line before opening the store", function()
    local cases = {
      { "not json\n", "stdin line 1: invalid JSON" },
      { '[1]\n', "stdin line 1: expected a JSON object" },
      { '{"session":"a","events":[],"x":1}\n', "stdin line 1: unknown field 'x'" },
      { '{"events":[]}\n', 'stdin line 1: "session" must be a non-empty string' },
      { '{"session":"a","events":{"type":"x"}}\n', 'stdin line 1: "events" must be an array of events' },
      { '{"session":"a","events":[],"expected":-1}\n', 'stdin line 1: "expected" must be an integer >= 0' },
      { '{"session":"a","events":[{"type":"x"}]}\n{"session":"b","events":[{"type":"x","bogus":1}]}\n',
        "stdin line 2: events[1]: unknown field 'bogus'" },
      { '{"session":"a","events":[{"payload":1}]}\n', 'stdin line 1: events[1]: "type" must be a non-empty string' },
    }
    for _, c in ipairs(cases) do
      fails_one_line(es({ "append-many" }, c[1]), 1, c[2])
      assert.is_nil(world(), "nothing created for " .. c[1])
    end
  end)

  it("takes no arguments", function()
    local r = es({ "append-many", "s" })
    assert.equal(2, r.code)
    assert.truthy(r.err:find("append-many", 1, true), r.err)
  end)
end)

describe("eventstore cancel", function()
  before_each(function() work = ch.mkdtemp() end)
  after_each(function() os.execute("rm -rf " .. sh_quote(work)) end)

  it("cancels a pending event and prints it with its reason", function()
    ok(es({ "append", "s", "remind" }))
    local e = ndjson(ok(es({ "cancel", "s", "1", "--reason", "paid" })))[1]
    assert.equal("processed", e.status)
    assert.equal("paid", e.cancelled)
    -- again: a no-op that prints the same event
    assert.same(e, ndjson(ok(es({ "cancel", "s", "1", "--reason", "other" })))[1])
    ok(es({ "append", "s", "x" }))
    assert.equal("cancelled", ndjson(ok(es({ "cancel", "s", "2" })))[1].cancelled)
  end)

  it("refuses what cannot be cancelled, changing nothing", function()
    ok(es({ "append", "s", "x" }))
    local s = open_db()
    local c = s:claim("s", { holder = "w", ttl_ms = 3600 * 1000 })
    s:close()
    assert.equal("claimed", c.outcome)
    local before = world()
    fails_one_line(es({ "cancel", "s", "1" }), 1, "INVALID_ARGUMENT: event 1 in session 's' is claimed by 'w'")
    fails_one_line(es({ "cancel", "s", "7" }), 1, "NO_SUCH_EVENT: ")
    assert.equal(before, world())
    local r = es({ "cancel", "s", "0" })
    assert.equal(2, r.code)
    r = es({ "cancel", "s" })
    assert.equal(2, r.code)
  end)
end)
