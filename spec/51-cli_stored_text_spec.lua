-- The `eventstore` binary on stored text it did not write: a SQLite file
-- from an older version may hold any bytes in last_error (an error cut in
-- the middle of a character, a stray byte). Every command that prints it
-- (dead, read, revive, settle) still succeeds and prints the bad bytes
-- escaped as \xHH; revive and settle check what they need before they
-- write, so a command that fails has changed nothing. docs/cli.md,
-- docs/limits.md.
--
-- The file is made by the store, then its last_error is overwritten with
-- the sqlite3 shell (as an older version could have left it).
local eventstore = require("eventstore")
local json = eventstore.json
local helpers = require("helpers")
local sh_quote = helpers.sh_quote

local BIN = helpers.BIN

local read_file = helpers.read_file

local work, db

local ch = require("cli_helpers")
local ndjson, ok = ch.ndjson, ch.ok

-- Runs the binary in `work` (cli_helpers.run; stdin empty): {code, out, err}.
local function es(args) return ch.run(work, args) end

-- Sets last_error of (session, idx) to raw bytes, as an older version could
-- have stored them.
local function poke_last_error(session, idx, bytes)
  local hex = bytes:gsub(".", function(c) return ("%02X"):format(c:byte()) end)
  local sql = ("UPDATE events SET last_error = CAST(X'%s' AS TEXT) WHERE session = '%s' AND idx = %d;")
    :format(hex, session, idx)
  local okay = os.execute("sqlite3 " .. sh_quote(db) .. " " .. sh_quote(sql))
  assert(okay, "sqlite3 failed")
end

-- "boom" and a 3-byte character cut after its first two bytes, then a
-- stray byte: what a byte-count cut of an error used to leave.
local CUT = "boom \xE2\x82 and \xFF end"
local SHOWN = "boom \\xE2\\x82 and \\xFF end"

describe("eventstore binary on stored text with invalid UTF-8", function()
  before_each(function()
    local p = assert(io.popen("mktemp -d"))
    work = p:read("l")
    p:close()
    db = work .. "/eventstore.db"
    local store = eventstore.open("sqlite:" .. db)
    store:append("s", { { type = "a", payload = { n = 1 } }, { type = "b" } })
    local c = store:claim("s", { holder = "w", ttl_ms = 60000, limit = 1 })
    store:fail("s", 1, c.events[1].attempt, { error = "boom", max_failures = 1 })
    store:close()
    poke_last_error("s", 1, CUT)
  end)

  after_each(function()
    os.execute("rm -rf " .. sh_quote(work))
  end)

  it("the store reads the bytes back as they are (so the CLI must cope)", function()
    local store = eventstore.open("sqlite:" .. db)
    assert.equal(CUT, store:read("s")[1].last_error)
    store:close()
  end)

  it("dead lists the dead letter, its last_error escaped", function()
    local got = ndjson(ok(es({ "dead" })))
    assert.equal(1, #got)
    assert.equal(SHOWN, got[1].last_error)
    assert.same({ n = 1 }, got[1].payload)
  end)

  it("read prints every event, the bad text escaped", function()
    local got = ndjson(ok(es({ "read", "s" })))
    assert.equal(2, #got)
    assert.equal(SHOWN, got[1].last_error)
    assert.equal("b", got[2].type)
  end)

  it("revive revives and prints the event", function()
    local got = ndjson(ok(es({ "revive", "s", "1" })))
    assert.equal("pending", got[1].status)
    assert.equal(SHOWN, got[1].last_error)
  end)

  it("settle settles, keeps the old error (now valid text) and prints it", function()
    local got = ndjson(ok(es({ "settle", "s", "1", "--reason", "by hand \xFF" })))
    assert.equal("processed", got[1].status)
    local e = got[1].last_error
    assert.is_number(utf8.len(e))
    assert.truthy(e:find("settled: by hand \u{FFFD}", 1, true), e)
    assert.truthy(e:find("boom \u{FFFD}\u{FFFD} and \u{FFFD} end", 1, true), e)
  end)

  it("revive and settle that fail (not a dead letter, no such index) change nothing", function()
    for _, args in ipairs({ { "revive", "s", "2" }, { "settle", "s", "2" }, { "revive", "s", "9" },
                            { "settle", "s", "9", "--reason", "x" } }) do
      local r = es(args)
      assert.are.equal(1, r.code, table.concat(args, " ") .. ": " .. r.err)
      assert.are.equal("", r.out)
    end
    local store = eventstore.open("sqlite:" .. db)
    local events = store:read("s")
    assert.equal("dead", events[1].status)
    assert.equal(CUT, events[1].last_error)
    assert.equal("pending", events[2].status)
    store:close()
  end)
end)
