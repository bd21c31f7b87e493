-- The `eventstore` binary (docs/cli.md): every command, its --help, and
-- its error paths, run as a real process against temporary SQLite files.
--
-- Each test gets a fresh working directory: the binary runs there, so the
-- defaults (--db sqlite:./eventstore.db, --scripts ./scripts) are what is
-- tested, and the repository's own scripts/ never leaks in. Engine tests
-- write a small scripts directory (a handler, a failing handler, reducers).
--
-- Tests that need the engine (run, state, append through the engine) are
-- pending while require("eventstore").engine is nil.
--
-- The binary is $BUILD/bin/eventstore (BUILD defaults to build), relative to
-- the repository root, where the suite runs; build it first (`make`).
local eventstore = require("eventstore")
local json = eventstore.json

local helpers = require("helpers")
local sh_quote = helpers.sh_quote

local BIN = helpers.BIN

local read_file = helpers.read_file

local write_file = helpers.write_file

local ch = require("cli_helpers")
local mkdtemp, lines, ndjson, ok, fails = ch.mkdtemp, ch.lines, ch.ndjson, ch.ok, ch.fails

local work -- the current test's working directory

-- Runs the binary in `work` (cli_helpers.run): {code, how, out, err}.
local function es(args, stdin) return ch.run(work, args, stdin) end

local function db_path() return work .. "/eventstore.db" end

-- Opens the test's database from this process (to set up or check state).
local function open_db()
  return eventstore.open("sqlite:" .. db_path())
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

-- The scripts directory the engine tests use.
local function write_scripts(dir)
  os.execute("mkdir -p " .. sh_quote(dir .. "/handlers") .. " " .. sh_quote(dir .. "/reducers"))
  write_file(dir .. "/handlers/greet.lua", [[
return function(event, ctx)
  return { { type = "greeted", payload = { name = event.payload.name } } }
end
]])
  -- a handler call that takes a while (to be in flight when a signal comes)
  write_file(dir .. "/handlers/slow.lua", [[
return function(event, ctx)
  os.execute("sleep " .. tostring(event.payload.seconds))
  return { { type = "slept" } }
end
]])
  write_file(dir .. "/handlers/boom.lua", [[
return function(event, ctx) error("boom") end
]])
  write_file(dir .. "/reducers/count.lua", [[
return {
  init = function() return { n = 0, names = {} } end,
  greet = function(state, event)
    state.n = state.n + 1
    state.names[#state.names + 1] = event.payload.name
  end,
}
]])
  -- a state JSON cannot print: integer keys that are not a sequence
  write_file(dir .. "/reducers/sparse.lua", [[
return {
  init = function() return {} end,
  greet = function(state, event) state[event.index * 10] = true end,
}
]])
end

local COMMANDS = { "run", "append", "read", "state", "sessions", "dead", "revive", "settle", "snapshots", "help" }

describe("eventstore binary", function()
  before_each(function()
    work = mkdtemp()
  end)

  after_each(function()
    os.execute("rm -rf " .. sh_quote(work))
  end)

  it("is built", function()
    assert.is_true(exists(BIN), BIN .. " is missing: run `make` first")
  end)

  ---------------------------------------------------------------------------
  describe("help and usage", function()
    it("--help, -h and help print the command list on stdout", function()
      for _, args in ipairs({ { "--help" }, { "-h" }, { "help" } }) do
        local text = ok(es(args))
        assert.truthy(text:match("^usage: eventstore COMMAND"), text)
        for _, c in ipairs(COMMANDS) do
          assert.truthy(text:find("\n  " .. c .. " ", 1, true), c .. " missing from " .. text)
        end
      end
    end)

    for _, c in ipairs(COMMANDS) do
      it(c .. " --help and -h print its usage on stdout and exit 0, writing nothing", function()
        local text = ok(es({ c, "--help" }))
        assert.truthy(text:match("^usage: eventstore " .. c), text)
        assert.truthy(text:find("--help", 1, true))
        assert.are.equal(text, ok(es({ c, "-h" })))
        assert.are.equal(text, ok(es({ "help", c })))
        assert.is_false(exists(db_path()))
      end)
    end

    it("--help wins over missing or bad arguments", function()
      assert.truthy(ok(es({ "revive", "--help" })):match("^usage: eventstore revive SESSION INDEX"))
      assert.truthy(ok(es({ "read", "--after", "x", "--help" })):match("^usage: eventstore read"))
      -- over unknown options and options without their value too, in any order
      assert.truthy(ok(es({ "read", "--help", "--bogus" })):match("^usage: eventstore read"))
      assert.truthy(ok(es({ "append", "--bogus", "-h" })):match("^usage: eventstore append"))
      assert.truthy(ok(es({ "read", "s", "--after", "--help" })):match("^usage: eventstore read"))
      assert.is_false(exists(db_path()))
    end)

    it("--version prints the version", function()
      assert.are.equal(eventstore._VERSION .. "\n", ok(es({ "--version" })))
    end)

    it("no command: usage on stderr, exit 2", function()
      local err = fails(es({}), 2, "no command given")
      assert.truthy(err:find("\nusage: eventstore COMMAND", 1, true))
    end)

    it("an unknown command: usage on stderr, exit 2", function()
      local err = fails(es({ "frobnicate", "x" }), 2, "unknown command 'frobnicate'")
      assert.truthy(err:find("\nusage: eventstore COMMAND", 1, true))
      fails(es({ "help", "frobnicate" }), 2, "unknown command 'frobnicate'")
    end)

    for _, c in ipairs(COMMANDS) do
      it(c .. ": an unknown option is a usage error (exit 2), nothing written", function()
        local err = fails(es({ c, "--frob" }), 2, c .. ": unknown option '--frob'")
        assert.truthy(err:find("\nusage: eventstore " .. c, 1, true), err)
        assert.is_false(exists(db_path()))
      end)
    end

    it("an unknown option before the command is a usage error", function()
      fails(es({ "--frob", "read", "s" }), 2, "unknown option '--frob'")
    end)

    it("missing and extra arguments are usage errors with the synopsis", function()
      local cases = {
        { { "read" }, "read: missing argument" },
        { { "read", "a", "b" }, "read: unexpected argument 'b'" },
        { { "append" }, "append: missing argument" },
        { { "append", "s", "t", "{}", "x" }, "append: unexpected argument 'x'" },
        { { "state", "s" }, "state: missing argument" },
        { { "revive", "s" }, "revive: missing argument" },
        { { "settle" }, "settle: missing arguments" },
        { { "snapshots" }, "snapshots: missing argument" },
        { { "sessions", "x" }, "sessions: unexpected argument 'x'" },
        { { "dead", "a", "b" }, "dead: unexpected argument 'b'" },
        { { "run", "x" }, "run: unexpected argument 'x'" },
      }
      for _, case in ipairs(cases) do
        local err = fails(es(case[1]), 2, case[2])
        assert.truthy(err:find("\nusage: eventstore " .. case[1][1], 1, true), err)
      end
      assert.is_false(exists(db_path()))
    end)

    it("numbers are validated: one clear line, exit 2", function()
      local cases = {
        { { "read", "s", "--after", "x" }, "read: --after expects a whole number >= 0, got 'x'" },
        { { "read", "s", "--after=-1" }, "read: --after expects a whole number >= 0, got '-1'" },
        { { "read", "s", "--limit", "0" }, "read: --limit expects a whole number >= 1, got '0'" },
        { { "read", "s", "--after", "99999999999999999999999" }, "read: --after expects a whole number" },
        { { "revive", "s", "x" }, "revive: INDEX expects a whole number >= 1, got 'x'" },
        { { "settle", "s", "0" }, "settle: INDEX expects a whole number >= 1, got '0'" },
        { { "state", "s", "r", "--at", "1.5" }, "state: --at expects a whole number >= 0, got '1.5'" },
        { { "run", "--workers", "0" }, "run: --workers expects a whole number from 1 to 256, got '0'" },
        { { "run", "--ttl-ms", "0" }, "run: --ttl-ms expects a whole number from 1 to 3153600000000, got '0'" },
        { { "run", "--retention-every-ms", "0" },
          "run: --retention-every-ms expects a whole number from 1 to 31536000000, got '0'" },
        { { "serve", "--tokens", "t", "--retention-every-ms", "x" },
          "serve: --retention-every-ms expects a whole number from 1 to 31536000000, got 'x'" },
        { { "sessions", "--limit", "many" }, "sessions: --limit expects a whole number >= 1" },
        { { "dead", "--limit", "" }, "dead: --limit expects a whole number >= 1" },
      }
      for _, case in ipairs(cases) do
        local err = fails(es(case[1]), 2, case[2])
        assert.are.equal(1, #lines(err), err)
      end
    end)

    it("an option without its value is a usage error", function()
      fails(es({ "read", "s", "--after" }), 2, "read: option --after needs a value")
      fails(es({ "--db" }), 2, "option --db needs a value")
      -- only an argument that does not look like an option is a value
      fails(es({ "read", "s", "--limit", "--db", "memory:" }), 2, "read: option --limit needs a value")
    end)

    it("a missing subcommand is named", function()
      fails(es({ "projection" }), 2, "projection: missing argument SUBCOMMAND")
    end)

    it("a write error on stdout is an error, not a silent exit 0", function()
      local _, _, code = os.execute(("cd %s && %s --help >/dev/full 2>.err"):format(sh_quote(work), sh_quote(BIN)))
      assert.are.equal(1, code)
      assert.truthy(read_file(work .. "/.err"):match("^eventstore: cannot write to stdout: "))
      -- an export, whose own writes and flush were not checked
      ok(es({ "append", "s", "t" }))
      _, _, code = os.execute(("cd %s && %s export >/dev/full 2>.err"):format(sh_quote(work), sh_quote(BIN)))
      assert.are.equal(1, code)
      assert.truthy(read_file(work .. "/.err"):match("^eventstore: cannot write the export to stdout: "))
      local r = es({ "export", "--out", "/dev/full" })
      assert.are.equal(1, r.code)
      assert.truthy(r.err:match("^eventstore: cannot write the export to /dev/full: [^\n]*\n$"), r.err) -- one line
    end)

    it("a flag given a value is a usage error", function()
      fails(es({ "read", "s", "--follow=yes" }), 2, "read: option --follow takes no value")
    end)
  end)

  ---------------------------------------------------------------------------
  describe("append", function()
    it("appends one event with a JSON payload and prints it as NDJSON", function()
      local out = ok(es({ "append", "s-1", "greet", '{"name":"ada","n":9007199254740993,"f":0.1,"e":[]}' }))
      local got = ndjson(out)
      assert.are.equal(1, #got)
      local e = got[1]
      assert.are.equal("s-1", e.session)
      assert.are.equal(1, e.index)
      assert.are.equal("greet", e.type)
      assert.are.equal("pending", e.status)
      assert.are.equal(9007199254740993, e.payload.n)
      assert.truthy(out:find('"e":[]', 1, true), out)
      assert.truthy(out:find('"f":0.1', 1, true), out)
      -- the default --db is ./eventstore.db
      local store = open_db()
      assert.are.equal(1, store:head("s-1"))
      assert.are.equal(e.id, store:read("s-1")[1].id)
      store:close()
    end)

    it("without JSON the payload is null; --id and --lane are kept", function()
      local e = ndjson(ok(es({ "append", "s", "ping", "--id", "my-id", "--lane=l1" })))[1]
      assert.are.equal(json.null, e.payload)
      assert.are.equal("my-id", e.id)
      assert.are.equal("l1", e.lane)
      -- the same id again is an idempotent replay: the original comes back
      local again = ndjson(ok(es({ "append", "s", "ping", "--id", "my-id", "--lane=l1" })))[1]
      assert.are.equal(1, again.index)
    end)

    it("--revision and --meta, and revision and meta on stdin lines, are stored and printed", function()
      local e = ndjson(ok(es({ "append", "s", "t", "--revision", "3", "--meta", '{"corr":"c-1","n":[1]}' })))[1]
      assert.are.equal(3, e.revision)
      assert.are.same({ corr = "c-1", n = { 1 } }, e.meta)
      local got = ndjson(ok(es({ "append", "s" }, '{"type":"u","revision":2,"meta":{"k":1}}\n{"type":"v"}\n')))
      assert.are.equal(2, got[1].revision)
      assert.are.same({ k = 1 }, got[1].meta)
      assert.are.equal(1, got[2].revision)
      assert.is_nil(got[2].meta)
      -- read prints them as stored
      local back = ndjson(ok(es({ "read", "s" })))
      assert.are.same({ 3, 2, 1 }, { back[1].revision, back[2].revision, back[3].revision })
      assert.are.same({ corr = "c-1", n = { 1 } }, back[1].meta)
      -- bad values: one line, nothing written
      fails(es({ "append", "s", "t", "--revision", "0" }), 2, "append: --revision expects a whole number from 1 to 2147483647")
      fails(es({ "append", "s", "t", "--meta", "[1]" }), 2, "append: --meta expects a JSON object")
      fails(es({ "append", "s" }, '{"type":"u"}\n{"type":"u","revision":1.5}\n'), 1,
        'stdin line 2: "revision" must be a whole number')
      fails(es({ "append", "s" }, '{"type":"u","meta":"x"}\n'), 1, 'stdin line 1: "meta" must be a JSON object')
      -- over 8 KiB (§3.1): a usage error for the option, the line named for stdin
      local big = '{"x":"' .. ("a"):rep(9000) .. '"}'
      fails(es({ "append", "s", "t", "--meta", big }), 2, "append: --meta is over 8192 bytes of JSON")
      fails(es({ "append", "s" }, '{"type":"u","meta":' .. big .. '}\n'), 1, 'stdin line 1: "meta" is over 8192 bytes')
      local store = open_db()
      assert.are.equal(3, store:head("s"))
      store:close()
    end)

    it("takes a negative number or a string as the JSON argument", function()
      assert.are.equal(-5, ndjson(ok(es({ "append", "s", "t", "-5" })))[1].payload)
      assert.are.equal("x", ndjson(ok(es({ "append", "s", "t", '"x"' })))[1].payload)
      assert.are.equal("--", ndjson(ok(es({ "append", "s", "t", "--", '"--"' })))[1].payload)
    end)

    it("an invalid JSON argument: one line, exit 2, nothing written", function()
      ok(es({ "append", "s", "t" }))
      local err = fails(es({ "append", "s", "t", '{"a":' }), 2, "append: invalid JSON payload: ")
      assert.are.equal(1, #lines(err))
      fails(es({ "append", "s", "t", "{} x" }), 2, "append: invalid JSON payload: ")
      local store = open_db()
      assert.are.equal(1, store:head("s"))
      store:close()
    end)

    it("a store error (empty session) is one line with its code, exit 1", function()
      local err = fails(es({ "append", "", "t" }), 1, "INVALID_ARGUMENT: ")
      assert.are.equal(1, #lines(err))
    end)

    it("reads NDJSON events from stdin and appends them as one batch", function()
      local input = '{"type":"a","payload":[1,2]}\n\n{"type":"b","lane":"l","id":"id-b"}\r\n'
        .. '{"type":"c","payload":{"k":null}}'
      local got = ndjson(ok(es({ "append", "s" }, input)))
      assert.are.same({ 1, 2, 3 }, { got[1].index, got[2].index, got[3].index })
      assert.are.same({ "a", "b", "c" }, { got[1].type, got[2].type, got[3].type })
      assert.are.equal("id-b", got[2].id)
      assert.are.equal("l", got[2].lane)
      assert.are.equal(json.null, got[2].payload)
      assert.are.equal(got[1].created_at, got[3].created_at)
    end)

    it("empty stdin appends nothing", function()
      assert.are.equal("", ok(es({ "append", "s" }, "")))
    end)

    it("a bad stdin line: 'stdin line N: why', exit 1, nothing written", function()
      ok(es({ "append", "s", "first" }))
      local cases = {
        { '{"type":"a"}\n{"type":\n', "stdin line 2: invalid JSON: " },
        { '{"type":"a"}\n[1,2]\n', "stdin line 2: expected a JSON object" },
        { '\n\n"str"\n', "stdin line 3: expected a JSON object" },
        { '{"type":"a"}\n{"payload":1}\n', 'stdin line 2: "type" must be a non-empty string' },
        { '{"type":""}\n', 'stdin line 1: "type" must be a non-empty string' },
        { '{"type":"a","id":7}\n', 'stdin line 1: "id" must be a string' },
        { '{"type":"a","lane":false}\n', 'stdin line 1: "lane" must be a string' },
        { '{"type":"a","extra":1}\n', "stdin line 1: unknown field 'extra'" },
      }
      for _, case in ipairs(cases) do
        local err = fails(es({ "append", "s" }, case[1]), 1, case[2])
        assert.are.equal(1, #lines(err), err)
      end
      local store = open_db()
      assert.are.equal(1, store:head("s"))
      store:close()
    end)

    it("a batch the store rejects writes nothing", function()
      -- the same id twice in one batch
      local err = fails(es({ "append", "s" }, '{"type":"a","id":"x"}\n{"type":"b","id":"x"}\n'), 1,
        "PARTIAL_DUPLICATE_BATCH: ")
      assert.are.equal(1, #lines(err))
      local store = open_db()
      assert.are.equal(0, store:head("s"))
      store:close()
    end)

    it("--id and --lane without TYPE are a usage error", function()
      fails(es({ "append", "s", "--id", "x" }, '{"type":"a"}\n'), 2, "append: --id and --lane need TYPE")
    end)

    it("an explicit --scripts that does not exist is an error, nothing written", function()
      fails(es({ "append", "s", "t", "--scripts", "nope" }), 1, "scripts directory 'nope' does not exist")
      assert.is_false(exists(db_path()))
    end)

    it("goes through the engine only with --scripts: no handler there means stored processed", function()
      write_scripts(work .. "/scripts")
      -- ./scripts exists, but without --scripts every event is stored pending
      local plain = ndjson(ok(es({ "append", "s", "note", '{"x":1}' })))[1]
      assert.are.equal("pending", plain.status)
      local a = ndjson(ok(es({ "append", "s", "note", '{"x":1}', "--scripts", "scripts" })))[1]
      assert.are.equal("processed", a.status)
      local b = ndjson(ok(es({ "append", "s", "greet", '{"name":"ada"}', "--scripts", "scripts" })))[1]
      assert.are.equal("pending", b.status)
      local got = ndjson(ok(es({ "append", "s", "--scripts", "scripts" }, '{"type":"note"}\n{"type":"greet","payload":{"name":"bo"}}\n')))
      assert.are.same({ "processed", "pending" }, { got[1].status, got[2].status })
    end)
  end)

  ---------------------------------------------------------------------------
  describe("read", function()
    before_each(function()
      local store = open_db()
      store:append("s", { { type = "a", payload = { i = 1 } }, { type = "b" }, { type = "c", payload = { 1.5 } } })
      store:append("other", { { type = "x" } })
      store:close()
    end)

    it("prints every event of the session as NDJSON in index order", function()
      local out = ok(es({ "read", "s" }))
      local got = ndjson(out)
      assert.are.same({ 1, 2, 3 }, { got[1].index, got[2].index, got[3].index })
      assert.are.same({ "a", "b", "c" }, { got[1].type, got[2].type, got[3].type })
      assert.are.equal(1, got[1].payload.i)
      assert.are.equal(json.null, got[2].payload)
      assert.truthy(out:find('"payload":null', 1, true))
      assert.truthy(out:find('"payload":[1.5]', 1, true))
      for _, e in ipairs(got) do
        assert.are.equal("s", e.session)
        assert.are.equal("pending", e.status)
        assert.is_string(e.id)
      end
    end)

    it("--after and --limit", function()
      local got = ndjson(ok(es({ "read", "s", "--after", "1", "--limit", "1" })))
      assert.are.equal(1, #got)
      assert.are.equal(2, got[1].index)
      assert.are.equal(0, #ndjson(ok(es({ "read", "s", "--after=3" }))))
    end)

    it("a session with no events prints nothing", function()
      assert.are.equal("", ok(es({ "read", "nobody" })))
    end)

    it("reads a session of more than one page", function()
      local store = open_db()
      local batch = {}
      for i = 1, 2500 do batch[i] = { type = "t", payload = i } end
      store:append("big", batch)
      store:close()
      local got = ndjson(ok(es({ "read", "big", "--after", "10" })))
      assert.are.equal(2490, #got)
      assert.are.equal(11, got[1].index)
      assert.are.equal(2500, got[#got].payload)
      assert.are.equal(1500, #ndjson(ok(es({ "read", "big", "--limit", "1500" }))))
    end)

    it("--follow prints history, then events appended by another process", function()
      local out = work .. "/follow.out"
      -- --limit ends the follow after the 4th event; timeout guards the test
      local p = assert(io.popen(("cd %s && timeout 120 %s read s --follow --limit 4 >%s 2>&1; echo $?"):format(
        sh_quote(work), sh_quote(BIN), sh_quote(out))))
      -- append only once the follower has printed the history (3 events):
      -- from then on, only following can show the 4th, however late the
      -- follower started
      local deadline = helpers.wall() + 60
      local function printed() return select(2, (read_file(out) or ""):gsub("\n", "")) end
      while printed() < 3 and helpers.wall() < deadline do helpers.sleep(0.02) end
      assert.are.equal(3, printed(), "the follower never printed the history: " .. (read_file(out) or ""))
      ok(es({ "append", "s", "late", '{"n":4}' }))
      local code = p:read("l")
      p:close()
      assert.are.equal("0", code, read_file(out))
      local got = ndjson(read_file(out))
      assert.are.equal(4, #got)
      assert.are.equal("late", got[4].type)
      assert.are.equal(4, got[4].payload.n)
    end)

    it("--follow keeps waiting until it is interrupted", function()
      local _, _, code = os.execute(("cd %s && timeout -s INT 1 %s read s --follow >/dev/null 2>&1")
        :format(sh_quote(work), sh_quote(BIN)))
      -- still running after 1 s: timeout had to interrupt it (124)
      assert.are.equal(124, code)
    end)

    it("a database that does not exist is an error, and is not created", function()
      local err = fails(es({ "read", "s", "--db", "sqlite:" .. work .. "/none.db" }), 1, "STORAGE: no database at")
      assert.are.equal(1, #lines(err))
      assert.is_false(exists(work .. "/none.db"))
    end)
  end)

  ---------------------------------------------------------------------------
  describe("sessions, dead, revive, settle, snapshots", function()
    local dead_id

    before_each(function()
      local store = open_db()
      store:append("order-1", { { type = "placed" }, { type = "paid", payload = { amount = 5 } } })
      store:append("order-2", { { type = "placed" } })
      store:append("user-1", { { type = "joined" } })
      -- make order-1 #2 a dead letter
      local c = store:claim("order-1", { holder = "spec", ttl_ms = 60000 })
      for _, e in ipairs(c.events) do
        if e.index == 2 then
          local r = store:fail("order-1", 2, e.attempt, { error = "card declined", max_failures = 1 })
          assert.are.equal("dead_lettered", r.outcome)
          dead_id = e.id
        else
          store:complete("order-1", e.index, e.attempt, {})
        end
      end
      store:put_snapshot("user-1", "profile", 1, "state-bytes", "v1")
      store:close()
    end)

    it("sessions prints one JSON object per session in byte order", function()
      local got = ndjson(ok(es({ "sessions" })))
      assert.are.same({ "order-1", "order-2", "user-1" }, { got[1].session, got[2].session, got[3].session })
      assert.are.equal(2, got[1].events)
      assert.are.equal(1, got[1].dead)
      assert.are.equal(0, got[1].pending)
      assert.are.equal(1, got[2].pending)
      assert.is_number(got[1].first_at)
      assert.is_number(got[1].updated_at)
    end)

    it("sessions --prefix, --after and --limit", function()
      local got = ndjson(ok(es({ "sessions", "--prefix", "order-" })))
      assert.are.equal(2, #got)
      got = ndjson(ok(es({ "sessions", "--limit", "1" })))
      assert.are.equal(1, #got)
      assert.are.equal("order-1", got[1].session)
      got = ndjson(ok(es({ "sessions", "--after", "order-1" })))
      assert.are.same({ "order-2", "user-1" }, { got[1].session, got[2].session })
      assert.are.equal("", ok(es({ "sessions", "--prefix", "zzz" })))
    end)

    it("sessions pages through more than one page", function()
      local store = open_db()
      for i = 1, 250 do store:append(("bulk-%03d"):format(i), { { type = "t" } }) end
      store:close()
      assert.are.equal(250, #ndjson(ok(es({ "sessions", "--prefix", "bulk-" }))))
      assert.are.equal(120, #ndjson(ok(es({ "sessions", "--prefix", "bulk-", "--limit", "120" }))))
    end)

    it("dead lists dead letters with their error, of all or one session", function()
      local got = ndjson(ok(es({ "dead" })))
      assert.are.equal(1, #got)
      assert.are.equal(dead_id, got[1].id)
      assert.are.equal("dead", got[1].status)
      assert.truthy(got[1].last_error:find("card declined", 1, true))
      assert.are.equal(1, #ndjson(ok(es({ "dead", "order-1" }))))
      assert.are.equal("", ok(es({ "dead", "order-2" })))
      assert.are.equal(1, #ndjson(ok(es({ "dead", "--limit", "1" }))))
    end)

    it("revive puts the dead letter back to pending and prints it", function()
      local e = ndjson(ok(es({ "revive", "order-1", "2" })))[1]
      assert.are.equal(dead_id, e.id)
      assert.are.equal("pending", e.status)
      assert.are.equal(0, e.failures)
      assert.are.equal("", ok(es({ "dead" })))
    end)

    it("settle marks the dead letter processed, with --reason", function()
      local e = ndjson(ok(es({ "settle", "order-1", "2", "--reason", "refunded by hand" })))[1]
      assert.are.equal("processed", e.status)
      assert.truthy(e.last_error:find("refunded by hand", 1, true))
      assert.are.equal("", ok(es({ "dead" })))
    end)

    it("revive or settle of an event that is not dead: exit 1, nothing changed", function()
      fails(es({ "revive", "order-2", "1" }), 1, "INVALID_ARGUMENT: ")
      fails(es({ "settle", "order-2", "1" }), 1, "INVALID_ARGUMENT: ")
      local store = open_db()
      assert.are.equal("pending", store:read("order-2")[1].status)
      store:close()
    end)

    it("revive or settle of a missing index: NO_SUCH_EVENT, exit 1", function()
      local err = fails(es({ "revive", "order-1", "9" }), 1, "NO_SUCH_EVENT: ")
      assert.are.equal(1, #lines(err))
      fails(es({ "settle", "nobody", "1" }), 1, "NO_SUCH_EVENT: ")
    end)

    it("snapshots lists a session's snapshots", function()
      local got = ndjson(ok(es({ "snapshots", "user-1" })))
      assert.are.equal(1, #got)
      assert.are.equal("profile", got[1].reducer)
      assert.are.equal(1, got[1].index)
      assert.are.equal("v1", got[1].version)
      assert.are.equal("", ok(es({ "snapshots", "order-1" })))
    end)

    it("--db before the command works too", function()
      local url = "sqlite:" .. db_path()
      os.execute("mkdir " .. sh_quote(work .. "/elsewhere"))
      local saved = work
      work = work .. "/elsewhere"
      local got = ndjson(ok(es({ "--db", url, "sessions" })))
      work = saved
      assert.are.equal(3, #got)
    end)
  end)

  ---------------------------------------------------------------------------
  describe("an unreachable database", function()
    local BAD = "sqlite:/nonexistent-dir/x.db"
    local cases = {
      { "append", "s", "t", "{}" },
      { "append", "s" },
      { "read", "s" },
      { "sessions" },
      { "dead" },
      { "revive", "s", "1" },
      { "settle", "s", "1" },
      { "snapshots", "s" },
    }
    for _, args in ipairs(cases) do
      it(args[1] .. ": 'eventstore: STORAGE: ...', one line, exit 1", function()
        local a = { table.unpack(args) }
        a[#a + 1] = "--db"
        a[#a + 1] = BAD
        local err = fails(es(a, '{"type":"a"}\n'), 1, "STORAGE: ")
        assert.are.equal(1, #lines(err), err)
      end)
    end

    it("run and state: STORAGE, exit 1", function()
      write_scripts(work .. "/scripts")
      fails(es({ "run", "--until-idle", "--db", BAD }), 1, "STORAGE: ")
      fails(es({ "state", "s", "count", "--db", BAD }), 1, "STORAGE: ")
    end)

    it("a malformed URL is INVALID_ARGUMENT, exit 1", function()
      fails(es({ "append", "s", "t", "--db", "bogus:x" }), 1, "INVALID_ARGUMENT: ")
    end)
  end)

  ---------------------------------------------------------------------------
  describe("run", function()
    it("without a scripts directory is an error (nothing is settled by accident)", function()
      fails(es({ "run", "--until-idle" }), 1, "scripts directory './scripts' does not exist")
      fails(es({ "run", "--scripts", "nope" }), 1, "scripts directory 'nope' does not exist")
      -- a file is not a missing directory: say which it is
      write_file(work .. "/README.md", "# not scripts\n")
      for _, cmd in ipairs({ { "run", "--until-idle" }, { "state", "s", "count" }, { "append", "s", "t" } }) do
        local a = { table.unpack(cmd) }
        a[#a + 1] = "--scripts"
        a[#a + 1] = "README.md"
        fails(es(a), 1, "scripts directory 'README.md' is not a directory (--scripts DIR)")
      end
      fails(es({ "serve", "--tokens", "README.md", "--scripts", "README.md" }), 1,
        "scripts directory 'README.md' is not a directory (--scripts DIR; or --no-engine")
    end)

    it("a handler with a syntax error stops it at start, naming the file and line; nothing is claimed (§4)", function()
      local store = open_db()
      store:append("s", { { type = "greet", payload = { name = "ada" } } })
      store:close()
      write_scripts(work .. "/scripts")
      write_file(work .. "/scripts/handlers/greet.lua", "return function(event, ctx)\n  return { { type = = 'x' } }\nend\n")
      local err = fails(es({ "run", "--until-done" }), 1, "INVALID_ARGUMENT: cannot load ./scripts/handlers/greet.lua:2: ")
      assert.are.equal(1, #lines(err), err)
      store = open_db()
      local e = store:read("s")[1]
      store:close()
      assert.are.equal("pending", e.status)
      assert.are.equal(0, e.attempts)
    end)

    it("--until-done exits 3 when it dead-lettered events, after the summary (§4)", function()
      local store = open_db()
      store:append("s", { { type = "boom" }, { type = "greet", payload = { name = "ada" } } })
      -- four failures already: the run's attempt is the fifth, the engine's
      -- max_failures (without waiting for four backoffs)
      for _ = 1, 4 do
        local c = store:claim("s", { holder = "earlier", ttl_ms = 60000, limit = 1 })
        store:fail("s", 1, c.events[1].attempt, { error = "earlier boom", retry_after_ms = 0 })
      end
      store:close()
      write_scripts(work .. "/scripts")
      local r = es({ "run", "--until-done" })
      assert.are.equal(3, r.code, "exit code; stderr: " .. r.err)
      assert.are.equal("handled 1, failed 0, dead 1, pending 0\n", r.out)
      store = open_db()
      assert.are.equal("dead", store:read("s")[1].status)
      store:close()
      -- nothing dead-lettered by this run: 0 again
      assert.are.equal("handled 0, failed 0, dead 0, pending 0\n", ok(es({ "run", "--until-done" })))
    end)

    it("--until-idle handles every ready event and prints the summary", function()
      local store = open_db()
      store:append("s-1", { { type = "greet", payload = { name = "ada" } }, { type = "boom" } })
      store:append("s-2", { { type = "greet", payload = { name = "bo" } } })
      store:close()
      write_scripts(work .. "/scripts")
      local r = es({ "run", "--until-idle", "--workers", "2" })
      assert.are.equal(0, r.code, "exit code")
      -- boom failed once and waits for its backoff: still pending; the
      -- failed attempt is one line on stderr (its traceback is in last_error)
      assert.are.equal("handled 2, failed 1, dead 0, pending 1\n", r.out)
      assert.truthy(r.err:find("s%-1 #2 boom attempt 1 failed, retry in %d+ ms: .*boom"), r.err)
      assert.are.equal(1, select(2, r.err:gsub("\n", "")), "one line per failed attempt")
      store = open_db()
      local s1 = store:read("s-1")
      assert.are.equal(3, #s1)
      assert.are.equal("greeted", s1[3].type)
      assert.are.equal("ada", s1[3].payload.name)
      assert.are.same({ index = 1, attempt = 1 }, { index = s1[3].cause.index, attempt = s1[3].cause.attempt })
      assert.are.equal("processed", s1[1].status)
      assert.are.equal("pending", s1[2].status)
      assert.truthy(s1[2].last_error:find("boom", 1, true))
      local s2 = store:read("s-2")
      assert.are.equal("greeted", s2[2].type)
      store:close()
      -- nothing else ready now: a second run handles nothing. boom's
      -- backoff (0.5 to 1 s) may have run out meanwhile on a busy machine
      -- (a campaign under load saw it): then its attempt 2 fails, one line.
      local again = es({ "run", "--until-idle" })
      assert.are.equal(0, again.code, again.err)
      local failed = again.err == "" and 0 or 1
      if failed == 1 then
        assert.truthy(again.err:find("^[^\n]*s%-1 #2 boom attempt 2 failed, retry in %d+ ms: [^\n]*boom\n$"), again.err)
      end
      assert.are.equal(("handled 0, failed %d, dead 0, pending 1\n"):format(failed), again.out)
    end)

    it("--holder names the engine's claims, --ttl-ms their TTL; an empty holder is refused", function()
      local store = open_db()
      store:append("h", { { type = "greet", payload = { name = "cy" } } })
      store:close()
      write_scripts(work .. "/scripts")
      -- the claim still in force when the handler ran: its holder, its expiry
      write_file(work .. "/scripts/handlers/greet.lua", [[
return function(event, ctx)
  return { { type = "seen", payload = { holder = event.claim_holder, ttl = event.claim_expires_at - ctx.now() } } }
end
]])
      fails(es({ "run", "--until-idle", "--holder", "" }), 1, "INVALID_ARGUMENT: holder must be 1 to 255 bytes")
      assert.are.equal("handled 1, failed 0, dead 0, pending 0\n",
        ok(es({ "run", "--until-idle", "--holder", "box-7/1", "--ttl-ms", "4000" })))
      store = open_db()
      local seen = store:read("h")[2]
      store:close()
      assert.are.equal("box-7/1", seen.payload.holder)
      assert.is_true(seen.payload.ttl > 0 and seen.payload.ttl <= 4000, tostring(seen.payload.ttl))
    end)

    -- Runs `run` in the background, sends it SIG after `after` seconds (and
    -- once more `again` seconds later, if given); returns its exit status
    -- and the ms from the last signal to its exit, as strings. `ready` (a
    -- shell command) is waited for first, up to 20 s, so a loaded machine
    -- that starts the binary slowly does not signal it too early.
    local function run_and_signal(sig, after, again, ready)
      local script = ([[
cd %s || exit 99
timeout --foreground -k 2 120 %s run >run.out 2>run.err &
pid=$!
i=0
while [ $i -lt 600 ] && ! { %s ; } >/dev/null 2>&1; do sleep 0.1; i=$((i + 1)); done
sleep %s
kill -%s $pid
%s
t0=$(date +%%s%%N)
wait $pid
rc=$?
t1=$(date +%%s%%N)
echo "$rc $(( (t1 - t0) / 1000000 ))"
]]):format(sh_quote(work), sh_quote(BIN), ready or "true", after, sig,
        again and ("sleep %s; kill -%s $pid"):format(again, sig) or "")
      -- timeout forwards the signal to the binary alone (--foreground: not
      -- to its process group, so a handler's child is not killed with it)
      -- and exits with its status. Its 120 s, and the 60 s the handler may
      -- take to start, are hang ceilings only: with two busy loops and a
      -- parallel suite on two cores, a run took over 30 s from its start to
      -- its exit (the stop itself is timed by each test).
      local p = assert(io.popen("sh -c " .. sh_quote(script)))
      local line = p:read("l")
      p:close()
      return line:match("^(%d+) (%d+)$")
    end

    it("SIGTERM: exits 0 within a few seconds and prints the summary", function()
      write_scripts(work .. "/scripts")
      ok(es({ "append", "s", "greet", '{"name":"ada"}' }))
      local handled = sh_quote(BIN) .. " read s | grep -q greeted"
      local rc, ms = run_and_signal("TERM", 0.2, nil, handled)
      assert.are.equal("0", rc, read_file(work .. "/run.err"))
      -- a hang ceiling only (it stops in well under a second when idle)
      assert.is_true(tonumber(ms) < 25000, "took " .. ms .. " ms to stop")
      assert.are.equal("", read_file(work .. "/run.err"))
      assert.are.equal("handled 1, failed 0, dead 0, pending 0\n", read_file(work .. "/run.out"))
      local store = open_db()
      assert.are.equal("greeted", store:read("s")[2].type)
      store:close()
    end)

    it("SIGTERM while a handler runs: the handler is interrupted, its attempt retried later, exit 0", function()
      write_scripts(work .. "/scripts")
      ok(es({ "append", "s", "slow", '{"seconds":19.7}' }))
      -- signalled once the handler's command runs (a loaded machine may take
      -- longer than the pause alone to claim the event and start it)
      local rc, ms = run_and_signal("TERM", 0.5, nil, "pgrep -f 'slee[p] 19.7'")
      assert.are.equal("0", rc, read_file(work .. "/run.err"))
      -- the handler sleeps over 19 s: stopping in under 15 s proves it was
      -- interrupted (it takes well under a second; no tighter bound, so a
      -- loaded machine cannot fail it)
      assert.is_true(tonumber(ms) < 15000, "took " .. ms .. " ms to stop")
      assert.are.equal("handled 0, failed 1, dead 0, pending 1\n", read_file(work .. "/run.out"))
      assert.truthy(read_file(work .. "/run.err"):find("stopping: interrupting 1 running handler", 1, true))
      local store = open_db()
      local events = store:read("s")
      assert.are.equal(1, #events)
      assert.are.equal("pending", events[1].status)
      assert.are.equal(1, events[1].attempts)
      assert.truthy(events[1].last_error:find("interrupted: the engine is stopping", 1, true), events[1].last_error)
      assert.is_nil(events[1].claim_holder) -- ready for the next run at once
      store:close()
      os.execute("pkill -f 'sleep 19.7' >/dev/null 2>&1")
    end)

    it("SIGINT while a handler is in os.execute is not lost: the run stops before the handler ends", function()
      write_scripts(work .. "/scripts")
      ok(es({ "append", "s", "slow", '{"seconds":19.3}' }))
      -- signalled once the handler's command runs (a loaded machine may take
      -- longer than the pause alone to claim the event and start it)
      local rc, ms = run_and_signal("INT", 0.5, nil, "pgrep -f 'slee[p] 19.3'")
      assert.are.equal("0", rc, read_file(work .. "/run.err"))
      -- the handler sleeps over 19 s: stopping in under 15 s proves it was
      -- interrupted (it takes well under a second; no tighter bound, so a
      -- loaded machine cannot fail it)
      assert.is_true(tonumber(ms) < 15000, "took " .. ms .. " ms to stop")
      assert.are.equal("handled 0, failed 1, dead 0, pending 1\n", read_file(work .. "/run.out"))
      os.execute("pkill -f 'sleep 19.3' >/dev/null 2>&1")
    end)

    it("a second signal quits at once, saying so", function()
      write_scripts(work .. "/scripts")
      ok(es({ "append", "s", "slow", '{"seconds":19.1}' }))
      -- the first signal once the handler runs (the line about a second
      -- Ctrl-C is printed only while handlers run; a loaded machine once
      -- signalled before). `slee[p]`: 'sleep 19.1' would also match the
      -- waiting shell's own command line, which holds the pattern, so the
      -- wait would end at once (it did, in all three tests that wait so).
      local rc, ms = run_and_signal("TERM", 0.5, 0.4, "pgrep -f 'slee[p] 19.1'")
      os.execute("pkill -f 'sleep 19.1' >/dev/null 2>&1")
      assert.are.equal("143", rc, read_file(work .. "/run.err"))
      -- "at once": long before the 19 s handler would end (no tighter
      -- bound: a loaded machine must not fail it)
      assert.is_true(tonumber(ms) < 10000, "took " .. ms .. " ms")
      local err = read_file(work .. "/run.err")
      assert.truthy(err:find("press Ctrl-C again to quit now", 1, true), err)
      assert.truthy(err:find("quitting at once", 1, true), err)
    end)

    it("SIGINT: exits 0 and prints the summary", function()
      write_scripts(work .. "/scripts")
      -- The signal goes to the binary once it catches SIGINT (its SigCgt
      -- mask in /proc has bit 1), not after a fixed time: under a sanitizer
      -- on a busy machine the binary once took over a second to get there
      -- and died of the signal (130). A non-interactive shell starts its
      -- background jobs with SIGINT ignored; the binary's own handler
      -- replaces that. timeout (a hang ceiling only) exits with its status.
      -- The child must already be the binary (its exe): between timeout's
      -- fork and its exec the child is timeout, whose inherited SIGINT
      -- handler shows in SigCgt too and exits 130 (a busy CI run caught
      -- that window).
      local script = ([[
cd %s || exit 99
bin=$(readlink -f %s)
timeout --foreground -k 2 120 "$bin" run >run.out 2>run.err &
tpid=$!
i=0
while [ $i -lt 600 ]; do
  c=$(pgrep -P $tpid)
  x=$(readlink /proc/$c/exe 2>/dev/null)
  m=$(awk '/^SigCgt:/ { print $2 }' /proc/$c/status 2>/dev/null)
  [ -n "$c" ] && [ "$x" = "$bin" ] && [ -n "$m" ] && [ $(( 0x$m & 2 )) -ne 0 ] && break
  sleep 0.1
  i=$((i + 1))
done
kill -INT $c
wait $tpid
echo $?
]]):format(sh_quote(work), sh_quote(BIN))
      local p = assert(io.popen("sh -c " .. sh_quote(script)))
      local code = tonumber(p:read("l"))
      p:close()
      assert.are.equal(0, code, read_file(work .. "/run.err"))
      assert.are.equal("handled 0, failed 0, dead 0, pending 0\n", read_file(work .. "/run.out"))
    end)

    it("keeps a progress line on stderr when it is a terminal", function()
      if not os.execute("command -v script >/dev/null 2>&1") then
        pending("needs script(1) for a pseudo-terminal")
        return
      end
      write_scripts(work .. "/scripts")
      ok(es({ "append", "s", "slow", '{"seconds":1.2}' }))
      -- script(1) gives the binary a terminal; stdout goes to a file
      local cmd = ("cd %s && %s -qec %s /dev/null"):format(sh_quote(work), "script",
        sh_quote(sh_quote(BIN) .. " run --until-idle >run.out"))
      local p = assert(io.popen(cmd))
      local tty = p:read("a")
      p:close()
      assert.truthy(tty:find("\r\27[Khandled 0, failed 0, dead 0, pending 1", 1, true), ("%q"):format(tty))
      -- cleared before the summary, which goes to stdout
      assert.are.equal("\r\27[K", tty:sub(-4), ("%q"):format(tty))
      assert.are.equal("handled 1, failed 0, dead 0, pending 0\n", read_file(work .. "/run.out"))
      -- not a terminal: no progress line
      assert.are.equal("handled 0, failed 0, dead 0, pending 0\n", ok(es({ "run", "--until-idle" })))
    end)
  end)

  ---------------------------------------------------------------------------
  describe("state", function()
    it("without a scripts directory is an error", function()
      ok(es({ "append", "s", "greet", '{"name":"ada"}' }))
      fails(es({ "state", "s", "count" }), 1, "scripts directory './scripts' does not exist")
    end)

    it("on a database that does not exist is an error", function()
      os.execute("mkdir " .. sh_quote(work .. "/scripts"))
      fails(es({ "state", "s", "count" }), 1, "STORAGE: no database at")
    end)

    it("prints the folded state as JSON, --at N", function()
      write_scripts(work .. "/scripts")
      ok(es({ "append", "s" }, '{"type":"greet","payload":{"name":"ada"}}\n{"type":"note"}\n'
        .. '{"type":"greet","payload":{"name":"bo"}}\n'))
      assert.are.equal('{"n":2,"names":["ada","bo"]}\n', ok(es({ "state", "s", "count" })))
      assert.are.equal('{"n":1,"names":["ada"]}\n', ok(es({ "state", "s", "count", "--at", "2" })))
      assert.are.equal('{"n":0,"names":{}}\n', ok(es({ "state", "s", "count", "--at", "0" })))
      assert.are.equal('{"n":0,"names":{}}\n', ok(es({ "state", "nobody", "count" })))
    end)

    it("errors: unknown reducer, --at beyond the head, a state JSON cannot carry", function()
      write_scripts(work .. "/scripts")
      ok(es({ "append", "s", "greet", '{"name":"ada"}' }))
      fails(es({ "state", "s", "nope" }), 1, "NOT_FOUND: ")
      fails(es({ "state", "s", "count", "--at", "5" }), 1, "NO_SUCH_EVENT: ")
      ok(es({ "append", "s", "greet", '{"name":"bo"}' }))
      local err = fails(es({ "state", "s", "sparse" }), 1, "the state of reducer 'sparse' cannot be printed as JSON: ")
      assert.are.equal(1, #lines(err))
    end)
  end)
end)
