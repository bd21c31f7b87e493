-- The `eventstore` archive commands (issue 10 #5, docs/cli.md): archive,
-- segments, verify-archive, compact-archive. Like 53-cli_branches_spec.lua:
-- every test runs the built binary in a fresh working directory against
-- its own SQLite file (./eventstore.db), whose default archive directory is
-- ./eventstore.db.archive.
local eventstore = require("eventstore")
local json = eventstore.json
local helpers = require("helpers")
local sh_quote, read_file, write_file = helpers.sh_quote, helpers.read_file, helpers.write_file

local ch = require("cli_helpers")
local lines, ndjson, ok, fails_one_line = ch.lines, ch.ndjson, ch.ok, ch.fails_one_line

local work

local function es(args, stdin) return ch.run(work, args, stdin) end

local function settled(session, n)
  local s = eventstore.open("sqlite:" .. work .. "/eventstore.db")
  local batch = {}
  for i = 1, n do batch[i] = { type = "e" .. i, payload = { n = i, big = 9007199254740993 }, settled = true } end
  s:append(session, batch)
  s:close()
end

describe("eventstore archive commands", function()
  before_each(function() work = ch.mkdtemp() end)
  after_each(function() os.execute("rm -rf " .. sh_quote(work)) end)

  it("archive prints the new segment, then written = false; reads stay the same", function()
    settled("s", 5)
    local before = ok(es({ "read", "s" }))
    local g = json.decode(ok(es({ "archive", "s", "3" })))
    assert.is_true(g.written)
    assert.same({ "s", 1, 3, 3 }, { g.session, g.from, g.through, g.count })
    assert.is_not_nil(read_file(work .. "/eventstore.db.archive/" .. g.file))
    assert.same({ session = "s", written = false }, json.decode(ok(es({ "archive", "s", "3" }))))
    assert.equal(before, ok(es({ "read", "s" })))
    local segs = ndjson(ok(es({ "segments", "s" })))
    assert.equal(1, #segs)
    assert.equal(g.checksum, segs[1].checksum)
    assert.equal("", ok(es({ "segments", "other" })))
  end)

  it("verify-archive: 0 when all is well; exit 1 naming each bad file; orphans are notes", function()
    settled("s", 6)
    local a = json.decode(ok(es({ "archive", "s", "2" })))
    local b = json.decode(ok(es({ "archive", "s", "4" })))
    assert.same({ checked = 2, problems = 0, orphans = 0 }, json.decode(ok(es({ "verify-archive" }))))
    -- an orphan is a note, exit 0
    local dir = work .. "/eventstore.db.archive/" .. a.file:match("^(%x+)/")
    write_file(dir .. "/stray.seg.tmp", "x")
    local r = es({ "verify-archive", "s" })
    assert.equal(0, r.code, r.err)
    assert.truthy(r.err:find("note: orphan " .. a.file:match("^(%x+)/") .. "/stray.seg.tmp", 1, true), r.err)
    os.remove(dir .. "/stray.seg.tmp")
    -- damage both files: each is named, exit 1
    local path = work .. "/eventstore.db.archive/" .. a.file
    local bytes = read_file(path)
    write_file(path, bytes:sub(1, -2) .. string.char(bytes:byte(-1) ~ 1))
    os.remove(work .. "/eventstore.db.archive/" .. b.file)
    r = es({ "verify-archive" })
    assert.equal(1, r.code)
    assert.same({ checked = 2, problems = 2, orphans = 0 }, json.decode(r.out))
    local errs = lines(r.err)
    assert.equal(2, #errs, r.err)
    assert.truthy(errs[1]:find("eventstore: bad segment " .. a.file, 1, true), errs[1])
    assert.truthy(errs[1]:find("corrupt", 1, true), errs[1])
    assert.truthy(errs[2]:find("eventstore: bad segment " .. b.file, 1, true), errs[2])
    assert.truthy(errs[2]:find("missing", 1, true), errs[2])
    -- a read that needs them fails naming the file
    local e = fails_one_line(es({ "read", "s" }), 1, "STORAGE: archive segment")
    assert.truthy(e:find(a.file, 1, true), e)
  end)

  it("compact-archive merges and prints the counts", function()
    settled("s", 6)
    ok(es({ "archive", "s", "2" }))
    ok(es({ "archive", "s", "4" }))
    ok(es({ "archive", "s", "6" }))
    local before = ok(es({ "read", "s" }))
    assert.same({ session = "s", before = 3, after = 1 }, json.decode(ok(es({ "compact-archive", "s" }))))
    assert.same({ session = "s", before = 1, after = 1 }, json.decode(ok(es({ "compact-archive", "s" }))))
    assert.equal(before, ok(es({ "read", "s" })))
    assert.equal(1, #ndjson(ok(es({ "segments", "s" }))))
  end)

  it("refusals: pending events (exit 1, nothing written), bad THROUGH (exit 2), memory: without --archive", function()
    ok(es({ "append", "s", "work" }))
    fails_one_line(es({ "archive", "s", "1" }), 1, "INVALID_ARGUMENT: cannot archive session 's' through 1: event 1 is pending")
    assert.equal("", ok(es({ "segments", "s" })))
    fails_one_line(es({ "archive", "s", "2" }), 1, "NO_SUCH_EVENT")
    local r = es({ "archive", "s", "x" })
    assert.equal(2, r.code)
    r = es({ "archive", "s" })
    assert.equal(2, r.code)
    fails_one_line(es({ "archive", "s", "1", "--db", "memory:" }), 1, "INVALID_ARGUMENT")
    -- memory: with --archive works (an empty store: nothing to archive)
    assert.same({ session = "s", written = false },
      json.decode(ok(es({ "archive", "s", "0", "--db", "memory:", "--archive", work .. "/arch" }))))
  end)

  it("--archive DIR puts the segments there", function()
    settled("s", 2)
    local g = json.decode(ok(es({ "archive", "s", "2", "--archive", "elsewhere" })))
    assert.is_not_nil(read_file(work .. "/elsewhere/" .. g.file))
    assert.equal(2, #ndjson(ok(es({ "read", "s", "--archive", "elsewhere" }))))
    assert.same({ checked = 1, problems = 0, orphans = 0 },
      json.decode(ok(es({ "verify-archive", "--archive", "elsewhere" }))))
  end)

  it("on a shards: store: --archive DIR holds each shard's segments in DIR/NAME; paths are relative to DIR", function()
    local db = ch.sharded(work)
    local function run(args)
      local all = { "--db", db, "--archive", "arch" }
      for _, a in ipairs(args) do all[#all + 1] = a end
      return es(all)
    end
    local s = eventstore.open(db)
    for i = 1, 9 do s:append("s" .. i, { { type = "e", payload = { n = 1 }, settled = true }, { type = "e", settled = true } }) end
    s:close()
    local tops = {}
    for i = 1, 9 do
      local g = json.decode(ok(run({ "archive", "s" .. i, "1" })))
      assert.is_true(g.written)
      assert.is_not_nil(read_file(work .. "/arch/" .. g.file), g.file)
      tops[g.file:match("^([abc])/")] = true
      assert.equal(g.file, ndjson(ok(run({ "segments", "s" .. i })))[1].file)
      assert.equal(2, #ndjson(ok(run({ "read", "s" .. i }))))
    end
    assert.is_true((tops.a and 1 or 0) + (tops.b and 1 or 0) + (tops.c and 1 or 0) >= 2, "segments of two shards")
    assert.same({ checked = 9, problems = 0, orphans = 0 }, json.decode(ok(run({ "verify-archive" }))))
  end)

  it("every command has --help", function()
    for _, c in ipairs({ "archive", "segments", "verify-archive", "compact-archive" }) do
      local out = ok(es({ c, "--help" }))
      assert.truthy(out:find("usage: eventstore " .. c, 1, true), out)
      assert.truthy(out:find("--archive DIR", 1, true), out)
    end
  end)
end)
