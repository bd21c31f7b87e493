-- The `eventstore` commands for branches, refs and seals (issue 9 #5,
-- docs/cli.md): fork, lineage, children, refs, ref, promote, seal; truncate
-- and delete (issue 10 #5); and the
-- fields issue 9 added to sessions and events as the listing commands print
-- them.
--
-- Like 50-cli_spec.lua: every test runs the built binary in a fresh
-- working directory against its own SQLite file (./eventstore.db, the
-- default --db), and sets up or checks the store from this process.
local eventstore = require("eventstore")
local json = eventstore.json
local helpers = require("helpers")
local sh_quote, read_file, write_file = helpers.sh_quote, helpers.read_file, helpers.write_file

local BIN = helpers.BIN

local NEW = { "fork", "lineage", "children", "refs", "ref", "promote", "seal", "truncate", "delete" }

local ch = require("cli_helpers")
local lines, ndjson, ok, fails, fails_one_line = ch.lines, ch.ndjson, ch.ok, ch.fails, ch.fails_one_line
local mkdtemp = ch.mkdtemp

local work

-- Runs the binary in `work` (cli_helpers.run): {code, out, err}.
local function es(args, stdin) return ch.run(work, args, stdin) end

local function db_path() return work .. "/eventstore.db" end
local function open_db() return eventstore.open("sqlite:" .. db_path()) end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

-- Sets up the store from this process: fn(store), then closes it.
local function with_db(fn)
  local s = open_db()
  local ok_, err = pcall(fn, s)
  s:close()
  if not ok_ then error(err, 0) end
end

-- A session of n events (types e1..en) through the binary.
local function events(session, n)
  for i = 1, n do ok(es({ "append", session, "e" .. i, ('{"n":%d}'):format(i) })) end
end

local function sorted_keys(t)
  local k = {}
  for key in pairs(t) do k[#k + 1] = key end
  table.sort(k)
  return k
end

describe("eventstore branches, refs and seals", function()
  before_each(function() work = mkdtemp() end)
  after_each(function() os.execute("rm -rf " .. sh_quote(work)) end)

  ---------------------------------------------------------------------------
  describe("help and usage", function()
    it("the command list names every new command", function()
      local text = ok(es({ "--help" }))
      for _, c in ipairs(NEW) do
        assert.truthy(text:find("\n  " .. c .. " ", 1, true), c .. " missing from " .. text)
      end
      assert.are.equal(text, ok(es({ "help" })))
    end)

    for _, c in ipairs(NEW) do
      it(c .. " --help, -h and help " .. c .. " print its usage, exit 0, open nothing", function()
        local text = ok(es({ c, "--help" }))
        assert.truthy(text:match("^usage: eventstore " .. c .. " "), text)
        assert.truthy(text:find("--db URL", 1, true), text)
        assert.truthy(text:find("-h, --help", 1, true), text)
        assert.are.equal(text, ok(es({ c, "-h" })))
        assert.are.equal(text, ok(es({ "help", c })))
        -- --help wins over a wrong number of arguments
        assert.are.equal(text, ok(es({ c, "x", "0", "y", "z", "--help" })))
        assert.is_false(exists(db_path()))
      end)

      it(c .. ": an unknown option is a usage error with the synopsis, exit 2", function()
        local err = fails(es({ c, "a", "--frob" }), 2, c .. ": unknown option '--frob'")
        assert.truthy(err:find("\nusage: eventstore " .. c .. " ", 1, true), err)
        assert.is_false(exists(db_path()))
      end)
    end

    it("missing arguments are usage errors naming them, with the synopsis", function()
      local cases = {
        { { "fork" }, "fork: missing arguments FROM, AT, TO" },
        { { "fork", "a", "1" }, "fork: missing argument TO" },
        { { "lineage" }, "lineage: missing argument SESSION" },
        { { "children" }, "children: missing argument SESSION" },
        { { "ref" }, "ref: missing argument NAME" },
        { { "promote", "a" }, "promote: missing argument TO" },
        { { "seal" }, "seal: missing argument SESSION" },
      }
      for _, case in ipairs(cases) do
        local err = fails(es(case[1]), 2, case[2])
        assert.are.equal("eventstore: " .. case[2], err:match("^[^\n]*"))
        assert.truthy(err:find("\nusage: eventstore " .. case[1][1] .. " ", 1, true), err)
      end
      assert.is_false(exists(db_path()))
    end)

    it("extra arguments are usage errors", function()
      local cases = {
        { { "fork", "a", "1", "b", "c" }, "fork: unexpected argument 'c'" },
        { { "lineage", "a", "b" }, "lineage: unexpected argument 'b'" },
        { { "children", "a", "b" }, "children: unexpected argument 'b'" },
        { { "refs", "a" }, "refs: unexpected argument 'a'" },
        { { "ref", "a", "b", "c" }, "ref: unexpected argument 'c'" },
        { { "promote", "a", "b", "c" }, "promote: unexpected argument 'c'" },
        { { "seal", "a", "b" }, "seal: unexpected argument 'b'" },
      }
      for _, case in ipairs(cases) do fails(es(case[1]), 2, case[2]) end
    end)

    it("numbers are validated: one line naming the argument and its range, exit 2", function()
      events("a", 1)
      local cases = {
        { { "fork", "a", "x", "b" }, "fork: AT expects a whole number >= 0, got 'x'" },
        { { "fork", "a", "1.5", "b" }, "fork: AT expects a whole number >= 0, got '1.5'" },
        { { "fork", "a", "-1", "b" }, "fork: AT expects a whole number >= 0, got '-1'" },
        { { "fork", "a", "", "b" }, "fork: AT expects a whole number >= 0, got ''" },
        { { "fork", "a", "99999999999999999999", "b" }, "fork: AT expects a whole number >= 0, got '99999999999999999999'" },
        { { "refs", "--limit", "0" }, "refs: --limit expects a whole number >= 1, got '0'" },
        { { "refs", "--limit=-3" }, "refs: --limit expects a whole number >= 1, got '-3'" },
        { { "children", "a", "--limit", "0" }, "children: --limit expects a whole number >= 1, got '0'" },
        { { "children", "a", "--limit", "ten" }, "children: --limit expects a whole number >= 1, got 'ten'" },
      }
      for _, case in ipairs(cases) do
        local err = fails_one_line(es(case[1]), 2, case[2])
        assert.are.equal("eventstore: " .. case[2] .. "\n", err)
      end
      with_db(function(s) assert.is_nil(s:lineage("b")) end)
    end)

    it("options without their value, and promote's --expect with --expect-none, are usage errors", function()
      fails(es({ "refs", "--after" }), 2, "refs: option --after needs a value")
      fails(es({ "seal", "s", "--reason" }), 2, "seal: option --reason needs a value")
      fails(es({ "promote", "a", "b", "--expect" }), 2, "promote: option --expect needs a value")
      fails(es({ "promote", "a", "b", "--expect-none=yes" }), 2, "promote: option --expect-none takes no value")
      local err = fails(es({ "promote", "a", "b", "--expect", "s", "--expect-none" }), 2,
        "promote: --expect and --expect-none exclude each other")
      assert.truthy(err:find("\nusage: eventstore promote FROM TO", 1, true), err)
    end)

    it("no command creates a database that does not exist", function()
      for _, args in ipairs({
        { "fork", "a", "0", "b" }, { "lineage", "a" }, { "children", "a" }, { "refs" },
        { "ref", "r" }, { "ref", "r", "s" }, { "promote", "a", "b" }, { "seal", "s" },
      }) do
        fails_one_line(es(args), 1, "STORAGE: no database at './eventstore.db'")
      end
      assert.is_false(exists(db_path()))
    end)
  end)

  ---------------------------------------------------------------------------
  describe("fork and lineage", function()
    it("fork prints the lineage record; the branch holds copies of the first AT events", function()
      events("order-1", 3)
      local out = ok(es({ "fork", "order-1", "2", "order-1-b" }))
      assert.are.equal(1, #lines(out))
      local l = json.decode(out)
      assert.are.same({ "at", "created_at", "parent", "session" }, sorted_keys(l))
      assert.are.equal("order-1-b", l.session)
      assert.are.equal("order-1", l.parent)
      assert.are.equal(2, l.at)
      assert.are.equal("integer", math.type(l.created_at))
      -- read prints the copies with their origin; the source is unchanged
      local src = ndjson(ok(es({ "read", "order-1" })))
      local got = ndjson(ok(es({ "read", "order-1-b" })))
      assert.are.equal(3, #src)
      assert.are.equal(2, #got)
      for i, e in ipairs(got) do
        assert.are.equal(i, e.index)
        assert.are.equal(src[i].type, e.type)
        assert.are.same(src[i].payload, e.payload)
        assert.are_not.equal(src[i].id, e.id)
        assert.are.same({ session = "order-1", index = i }, e.origin)
        assert.are.equal("processed", e.status)
        assert.is_nil(src[i].origin)
      end
      -- sessions shows the branch's parent
      local rows = ndjson(ok(es({ "sessions" })))
      assert.are.equal(2, #rows)
      assert.are.equal("order-1-b", rows[2].session)
      assert.are.equal("order-1", rows[2].parent)
      assert.are.equal(2, rows[2].events)
      assert.is_nil(rows[1].parent)
    end)

    it("fork at 0 makes an empty branch, listed by sessions with no events", function()
      events("a", 1)
      local l = json.decode(ok(es({ "fork", "a", "0", "b" })))
      assert.are.equal(0, l.at)
      assert.are.equal("", ok(es({ "read", "b" })))
      local rows = ndjson(ok(es({ "sessions", "--prefix", "b" })))
      assert.are.equal(1, #rows)
      assert.are.equal(0, rows[1].events)
      assert.are.equal("a", rows[1].parent)
    end)

    it("fork onto a session that has events is refused, nothing changes", function()
      events("a", 2)
      events("b", 1)
      local before
      with_db(function(s) before = helpers.log_state(s) end)
      local err = fails_one_line(es({ "fork", "a", "1", "b" }), 1, "INVALID_ARGUMENT: ")
      assert.truthy(err:find("'b'", 1, true), err)
      with_db(function(s)
        assert.are.equal(before, helpers.log_state(s))
        assert.is_nil(s:lineage("b"))
      end)
    end)

    it("fork onto a fork, into itself, beyond the head, or from nothing is refused", function()
      events("a", 2)
      ok(es({ "fork", "a", "0", "b" }))
      local err = fails_one_line(es({ "fork", "a", "1", "b" }), 1, "INVALID_ARGUMENT: ")
      assert.truthy(err:find("already a fork", 1, true), err)
      fails_one_line(es({ "fork", "a", "1", "a" }), 1, "INVALID_ARGUMENT: ")
      err = fails_one_line(es({ "fork", "a", "3", "c" }), 1, "NO_SUCH_EVENT: ")
      assert.truthy(err:find("head is 2", 1, true), err)
      fails_one_line(es({ "fork", "nobody", "0", "c" }), 1, "NOT_FOUND: ")
      with_db(function(s) assert.is_nil(s:lineage("c")) end)
    end)

    it("lineage prints the chain of forks, nearest first; a root prints nothing", function()
      events("a", 3)
      ok(es({ "fork", "a", "2", "b" }))
      ok(es({ "fork", "b", "1", "c" }))
      local got = ndjson(ok(es({ "lineage", "c" })))
      assert.are.equal(2, #got)
      assert.are.same({ "c", "b", 1 }, { got[1].session, got[1].parent, got[1].at })
      assert.are.same({ "b", "a", 2 }, { got[2].session, got[2].parent, got[2].at })
      assert.are.same({ "at", "created_at", "parent", "session" }, sorted_keys(got[1]))
      assert.are.equal(1, #ndjson(ok(es({ "lineage", "b" }))))
      assert.are.equal("", ok(es({ "lineage", "a" })))
      assert.are.equal("", ok(es({ "lineage", "nobody" })))
    end)

    it("lineage prints each session once, even if the forks come back to one", function()
      -- a and b have rows without events; fork at 0 may then close a loop
      local looped
      with_db(function(s)
        s:seal("a")
        s:fork("a", 0, "b")
        looped = pcall(s.fork, s, "b", 0, "a")
      end)
      local got = ndjson(ok(es({ "lineage", "b" })))
      assert.are.equal("b", got[1].session)
      if looped then
        assert.are.same({ "b", "a" }, helpers.pluck(got, "session"))
        assert.are.same({ "a", "b" }, helpers.pluck(ndjson(ok(es({ "lineage", "a" }))), "session"))
      else
        assert.are.equal(1, #got)
      end
    end)

    it("children lists the forks of a session in byte order; --after and --limit page", function()
      events("a", 2)
      for _, name in ipairs({ "a-2", "a-1", "a-3" }) do ok(es({ "fork", "a", "1", name })) end
      ok(es({ "fork", "a-1", "0", "a-1-x" })) -- a grandchild is not a child
      local got = ndjson(ok(es({ "children", "a" })))
      assert.are.same({ "a-1", "a-2", "a-3" }, helpers.pluck(got, "session"))
      for _, l in ipairs(got) do
        assert.are.equal("a", l.parent)
        assert.are.equal(1, l.at)
      end
      assert.are.same({ "a-2", "a-3" }, helpers.pluck(ndjson(ok(es({ "children", "a", "--after", "a-1" }))), "session"))
      assert.are.same({ "a-1", "a-2" }, helpers.pluck(ndjson(ok(es({ "children", "a", "--limit", "2" }))), "session"))
      assert.are.same({ "a-2" }, helpers.pluck(ndjson(ok(es({ "children", "a", "--after=a-1", "--limit=1" }))), "session"))
      assert.are.equal("", ok(es({ "children", "a-2" })))
      assert.are.equal("", ok(es({ "children", "nobody" })))
    end)

    it("children pages through more than one store page", function()
      with_db(function(s)
        s:append("root", { { type = "x" } })
        for i = 1, 130 do s:fork("root", 1, ("kid-%03d"):format(i)) end
      end)
      local got = ndjson(ok(es({ "children", "root" })))
      assert.are.equal(130, #got)
      assert.are.equal("kid-001", got[1].session)
      assert.are.equal("kid-130", got[130].session)
      assert.are.equal(120, #ndjson(ok(es({ "children", "root", "--limit", "120" }))))
      assert.are.equal(30, #ndjson(ok(es({ "children", "root", "--after", "kid-100" }))))
    end)
  end)

  ---------------------------------------------------------------------------
  describe("refs, ref and promote", function()
    it("ref NAME SESSION points a ref; ref NAME shows it; refs lists them", function()
      events("s1", 2)
      local r = json.decode(ok(es({ "ref", "live", "s1" })))
      assert.are.same({ "created_at", "head", "name", "session", "updated_at" }, sorted_keys(r))
      assert.are.same({ "live", "s1", 2 }, { r.name, r.session, r.head })
      -- a session that does not exist yet: head 0
      local later = json.decode(ok(es({ "ref", "next", "not-yet" })))
      assert.are.same({ "next", "not-yet", 0 }, { later.name, later.session, later.head })
      local shown = json.decode(ok(es({ "ref", "live" })))
      assert.are.same(r, shown)
      -- head is the session's head now
      events("s1", 1)
      assert.are.equal(3, json.decode(ok(es({ "ref", "live" }))).head)
      -- moving it
      local moved = json.decode(ok(es({ "ref", "live", "not-yet" })))
      assert.are.equal("not-yet", moved.session)
      assert.are.equal(r.created_at, moved.created_at)
      local all = ndjson(ok(es({ "refs" })))
      assert.are.same({ "live", "next" }, helpers.pluck(all, "name"))
    end)

    it("ref NAME of a missing ref is NOT_FOUND: one line, exit 1", function()
      events("s1", 1)
      local r = es({ "ref", "nothing" })
      assert.are.equal("eventstore: NOT_FOUND: no ref 'nothing'\n", fails_one_line(r, 1, "NOT_FOUND: "))
      assert.are.equal("", ok(es({ "refs" })))
    end)

    it("refs pages: --after, --limit, and more than one store page", function()
      with_db(function(s)
        s:append("s", { { type = "x" } })
        for i = 1, 150 do s:put_ref(("r-%03d"):format(i), "s") end
      end)
      local all = ndjson(ok(es({ "refs" })))
      assert.are.equal(150, #all)
      assert.are.equal("r-001", all[1].name)
      assert.are.equal("r-150", all[150].name)
      assert.are.equal(1, all[1].head)
      assert.are.same({ "r-101", "r-102" }, helpers.pluck(ndjson(ok(es({ "refs", "--after", "r-100", "--limit", "2" }))), "name"))
      assert.are.equal(110, #ndjson(ok(es({ "refs", "--limit", "110" }))))
      assert.are.equal("", ok(es({ "refs", "--after", "r-150" })))
    end)

    it("promote without --expect: the last writer wins; prints the moved ref", function()
      events("a", 1)
      events("b", 2)
      ok(es({ "ref", "cand", "b" }))
      ok(es({ "ref", "live", "a" }))
      local r = json.decode(ok(es({ "promote", "cand", "live" })))
      assert.are.same({ "live", "b", 2 }, { r.name, r.session, r.head })
      assert.are.equal("b", json.decode(ok(es({ "ref", "live" }))).session)
      -- onto a ref that does not exist: created
      r = json.decode(ok(es({ "promote", "cand", "fresh" })))
      assert.are.same({ "fresh", "b" }, { r.name, r.session })
    end)

    it("promote --expect: wins when TO names the session, else REF_CONFLICT with expected and actual", function()
      events("a", 1)
      events("b", 1)
      ok(es({ "ref", "live", "a" }))
      ok(es({ "ref", "cand", "b" }))
      -- lose: live names a, not b
      local err = fails_one_line(es({ "promote", "cand", "live", "--expect", "b" }), 1, "REF_CONFLICT: ")
      assert.are.equal("eventstore: REF_CONFLICT: promote onto ref 'live' refused: expected 'b', found 'a'\n", err)
      assert.are.equal("a", json.decode(ok(es({ "ref", "live" }))).session)
      -- expecting a ref that does not exist
      err = fails_one_line(es({ "promote", "cand", "nothing", "--expect=a" }), 1, "REF_CONFLICT: ")
      assert.are.equal("eventstore: REF_CONFLICT: promote onto ref 'nothing' refused: expected 'a', found no ref\n", err)
      fails_one_line(es({ "ref", "nothing" }), 1, "NOT_FOUND: ")
      -- win
      local r = json.decode(ok(es({ "promote", "cand", "live", "--expect", "a" })))
      assert.are.same({ "live", "b" }, { r.name, r.session })
      -- the same compare-and-set again loses: live names b now
      err = fails_one_line(es({ "promote", "cand", "live", "--expect", "a" }), 1, "REF_CONFLICT: ")
      assert.truthy(err:find("expected 'a', found 'b'", 1, true), err)
    end)

    it("promote --expect-none: wins only when TO does not exist", function()
      events("a", 1)
      ok(es({ "ref", "cand", "a" }))
      local r = json.decode(ok(es({ "promote", "cand", "live", "--expect-none" })))
      assert.are.same({ "live", "a" }, { r.name, r.session })
      local err = fails_one_line(es({ "promote", "cand", "live", "--expect-none" }), 1, "REF_CONFLICT: ")
      assert.are.equal("eventstore: REF_CONFLICT: promote onto ref 'live' refused: expected no ref, found 'a'\n", err)
    end)

    it("promote from a missing ref is NOT_FOUND, nothing moves", function()
      events("a", 1)
      ok(es({ "ref", "live", "a" }))
      local err = fails_one_line(es({ "promote", "nothing", "live" }), 1, "NOT_FOUND: ")
      assert.truthy(err:find("'nothing'", 1, true), err)
      assert.are.same({ "live" }, helpers.pluck(ndjson(ok(es({ "refs" }))), "name"))
      assert.are.equal("a", json.decode(ok(es({ "ref", "live" }))).session)
    end)
  end)

  ---------------------------------------------------------------------------
  describe("seal", function()
    it("seal prints the session's row; append is then refused with SEALED, nothing written", function()
      events("s", 1)
      local row = json.decode(ok(es({ "seal", "s", "--reason", "closed for good" })))
      assert.are.equal("s", row.session)
      assert.is_true(row.sealed)
      assert.are.equal("closed for good", row.seal_reason)
      assert.are.equal("integer", math.type(row.sealed_at))
      assert.are.equal(1, row.events)
      local err = fails_one_line(es({ "append", "s", "more" }), 1, "SEALED: ")
      assert.truthy(err:find("closed for good", 1, true), err)
      fails_one_line(es({ "append", "s" }, '{"type":"a"}\n{"type":"b"}\n'), 1, "SEALED: ")
      assert.are.equal(1, #ndjson(ok(es({ "read", "s" }))))
      -- sealing again changes nothing: the first reason stays
      local again = json.decode(ok(es({ "seal", "s", "--reason", "other" })))
      assert.are.same(row, again)
      -- sessions lists it sealed; an unsealed one is listed "sealed": false
      events("t", 1)
      local rows = ndjson(ok(es({ "sessions" })))
      assert.are.same(row, rows[1])
      assert.are.equal(false, rows[2].sealed)
      assert.is_nil(rows[2].sealed_at)
    end)

    it("seal without --reason; a session without events is sealed and listed", function()
      events("other", 1)
      local row = json.decode(ok(es({ "seal", "empty" })))
      assert.are.equal("empty", row.session)
      assert.is_true(row.sealed)
      assert.is_nil(row.seal_reason)
      assert.are.equal(0, row.events)
      fails_one_line(es({ "append", "empty", "x" }), 1, "SEALED: session 'empty' is sealed")
      -- forking into it writes events: refused; at 0 it is allowed
      fails_one_line(es({ "fork", "other", "1", "empty" }), 1, "SEALED: ")
    end)
  end)

  ---------------------------------------------------------------------------
  describe("the new fields in listings", function()
    it("sessions prints fence and lease", function()
      with_db(function(s)
        s:append("f", { { type = "x" } })
        s:fence("f")
        s:lease("l", { holder = "worker-1", ttl_ms = 600000 })
      end)
      local rows = ndjson(ok(es({ "sessions" })))
      assert.are.same({ "f", "l" }, helpers.pluck(rows, "session"))
      assert.are.equal(1, rows[1].fence)
      assert.is_nil(rows[1].lease)
      assert.are.equal(0, rows[2].events)
      assert.are.equal("worker-1", rows[2].lease.holder)
      assert.are.equal("integer", math.type(rows[2].lease.token))
      assert.are.equal("integer", math.type(rows[2].lease.expires_at))
    end)

    it("read and dead print the dispatch record's new fields", function()
      with_db(function(s)
        s:append("s", { { type = "ok" }, { type = "bad" } })
        local c = s:claim("s", { holder = "w", ttl_ms = 60000, limit = 1 })
        local e = c.events[1]
        s:complete("s", e.index, e.attempt, {})
        c = s:claim("s", { holder = "w", ttl_ms = 60000, limit = 1 })
        e = c.events[1]
        s:fail("s", e.index, e.attempt, { error = "nope", max_failures = 1 })
      end)
      local got = ndjson(ok(es({ "read", "s" })))
      local done, dead = got[1], got[2]
      assert.are.equal("processed", done.status)
      assert.are.equal(1, done.processed_by_attempt)
      assert.are.equal("integer", math.type(done.first_claimed_at))
      assert.are.equal("integer", math.type(done.last_claimed_at))
      assert.is_nil(done.failed_at)
      assert.are.equal("dead", dead.status)
      assert.are.equal("integer", math.type(dead.failed_at))
      assert.are.equal("integer", math.type(dead.first_claimed_at))
      assert.is_nil(dead.processed_by_attempt)
      local letters = ndjson(ok(es({ "dead" })))
      assert.are.equal(1, #letters)
      assert.are.equal(dead.failed_at, letters[1].failed_at)
    end)
  end)

  ---------------------------------------------------------------------------
  describe("truncate and delete", function()
    -- n processed events: appended through the engine, with no handler for
    -- their type in the (empty) scripts directory.
    local function settled(session, n)
      os.execute("mkdir -p " .. sh_quote(work .. "/s/handlers"))
      for i = 1, n do ok(es({ "append", session, "note", ('{"n":%d}'):format(i), "--scripts", "s" })) end
    end

    it("truncate drops 1..THROUGH and prints the row; read then starts after it", function()
      settled("s", 3)
      local row = json.decode(ok(es({ "truncate", "s", "2" })))
      assert.are.equal(3, row.first_index)
      assert.are.equal(1, row.events)
      fails_one_line(es({ "read", "s" }), 1, "TRUNCATED: ")
      local rest = ndjson(ok(es({ "read", "s", "--after", "2" })))
      assert.are.equal(1, #rest)
      assert.are.equal(3, rest[1].index)
    end)

    it("truncate refuses a pending event in the range, a bad THROUGH and one past the head", function()
      events("s", 2) -- no --scripts: stored pending
      local err = fails_one_line(es({ "truncate", "s", "1" }), 1, "INVALID_ARGUMENT: ")
      assert.truthy(err:find("pending", 1, true), err)
      assert.are.equal(2, #ndjson(ok(es({ "read", "s" }))))
      fails(es({ "truncate", "s", "x" }), 2, "truncate: THROUGH expects a whole number >= 0")
      fails(es({ "truncate", "s", "-1" }), 2, "truncate: THROUGH expects a whole number >= 0")
      fails_one_line(es({ "truncate", "s", "9" }), 1, "NO_SUCH_EVENT: ")
    end)

    it("truncate --scripts snapshots the reducers first, so state stays readable", function()
      os.execute("mkdir -p " .. sh_quote(work .. "/s/reducers"))
      write_file(work .. "/s/reducers/count.lua",
        "return {init = function() return {n = 0} end, note = function(s) s.n = s.n + 1 end}")
      settled("s", 3)
      ok(es({ "truncate", "s", "2", "--scripts", "s" }))
      assert.are.equal(3, json.decode(ok(es({ "state", "s", "count", "--scripts", "s" }))).n)
    end)

    it("delete needs --yes, removes the session and its refs, and says whether it existed", function()
      settled("s", 2)
      with_db(function(st) st:put_ref("main", "s") end)
      fails(es({ "delete", "s" }), 2, "delete: this removes the session for good; add --yes")
      assert.are.equal(2, #ndjson(ok(es({ "read", "s" }))))
      assert.are.same({ deleted = true, session = "s" }, json.decode(ok(es({ "delete", "s", "--yes" }))))
      assert.are.equal("", ok(es({ "read", "s" })))
      fails_one_line(es({ "ref", "main" }), 1, "NOT_FOUND: ")
      assert.are.same({ deleted = false, session = "s" }, json.decode(ok(es({ "delete", "s", "--yes" }))))
    end)
  end)
end)
