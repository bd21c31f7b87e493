-- The binary's crypto-shredding (issue 10 #3 and #5, docs/cli.md,
-- docs/shredding.md): append --key (and a stdin line's "key") with
-- --keys PATH, read of sealed and shredded events, read --at-rest, and
-- shred KEY --yes. Every test runs the built binary in a fresh working
-- directory against its own SQLite file (./eventstore.db, the default --db).
local eventstore = require("eventstore")
local helpers = require("helpers")
local ch = require("cli_helpers")

local ok, fails, ndjson = ch.ok, ch.fails, ch.ndjson

local work

local function es(args, stdin) return ch.run(work, args, stdin) end

describe("eventstore with --keys", function()
  before_each(function() work = ch.mkdtemp() end)
  after_each(function() os.execute("rm -rf " .. helpers.sh_quote(work)) end)

  it("append --key seals the payload: read shows it with --keys, the file never holds it", function()
    local e = ndjson(ok(es({ "append", "c-1", "signed-up", '{"email":"ann@example.com"}', "--key", "c-1",
      "--keys", "master.key" })))[1]
    assert.equal("c-1", e.key)
    assert.equal("ann@example.com", e.payload.email)
    local _, out = pcall(function()
      local p = io.popen("stat -c %a " .. helpers.sh_quote(work .. "/master.key"))
      local m = p:read("a")
      p:close()
      return m
    end)
    assert.equal("600", out:match("%d+"))
    local back = ndjson(ok(es({ "read", "c-1", "--keys", "master.key" })))
    assert.equal("ann@example.com", back[1].payload.email)
    assert.is_nil(back[1].shredded)
    -- store options may come before the command too
    back = ndjson(ok(es({ "--keys", "master.key", "read", "c-1" })))
    assert.equal("c-1", back[1].key)
    local file = helpers.read_file(work .. "/eventstore.db") .. (helpers.read_file(work .. "/eventstore.db-wal") or "")
    assert.falsy(file:find("ann@example.com", 1, true))
  end)

  it("without --keys: append --key writes nothing, read of a live sealed event fails naming the key", function()
    fails(es({ "append", "c-1", "signed-up", '{"email":"x"}', "--key", "c-1" }), 1, "INVALID_ARGUMENT")
    ok(es({ "append", "c-1", "plain", "1" }))
    ok(es({ "append", "c-1", "signed-up", '{"email":"x"}', "--key", "c-1", "--keys", "master.key" }))
    local err = fails(es({ "read", "c-1" }), 1, "INVALID_ARGUMENT")
    assert.truthy(err:find("'c-1'", 1, true))
    assert.truthy(err:find("--keys", 1, true))
    assert.equal(2, #ndjson(ok(es({ "read", "c-1", "--keys", "master.key" }))))
  end)

  it("stdin lines carry a key; --key without TYPE is a usage error", function()
    local stored = ndjson(ok(es({ "append", "c-2", "--keys", "master.key" },
      '{"type":"a","payload":{"v":1},"key":"k2"}\n{"type":"b","payload":{"v":2}}\n')))
    assert.equal("k2", stored[1].key)
    assert.is_nil(stored[2].key)
    fails(es({ "append", "c-2", "--key", "k2", "--keys", "master.key" }), 2, "append: --key needs TYPE")
    fails(es({ "append", "c-2", "--keys", "master.key" }, '{"type":"a","key":7}\n'), 1, 'stdin line 1: "key" must be a string')
  end)

  it("shred asks for --yes, then reads print payload null and shredded true; the name is burned", function()
    ok(es({ "append", "c-1", "signed-up", '{"email":"ann@example.com"}', "--key", "c-1", "--keys", "master.key" }))
    ok(es({ "append", "c-1", "plan", '{"plan":"pro"}', "--keys", "master.key" }))
    fails(es({ "shred", "c-1" }), 2, "shred: this destroys the key for good; add --yes to do it")
    assert.equal("ann@example.com", ndjson(ok(es({ "read", "c-1", "--keys", "master.key" })))[1].payload.email)
    -- no --keys needed to shred
    assert.same({ { key = "c-1", shredded = true } }, ndjson(ok(es({ "shred", "c-1", "--yes" }))))
    assert.same({ { key = "c-1", shredded = false } }, ndjson(ok(es({ "shred", "c-1", "--yes" }))))
    for _, args in ipairs({ { "read", "c-1" }, { "read", "c-1", "--keys", "master.key" } }) do
      local out = ok(es(args))
      local first = ch.lines(out)[1]
      assert.truthy(first:find('"payload":null', 1, true), first)
      assert.truthy(first:find('"shredded":true', 1, true), first)
      assert.equal("pro", ndjson(out)[2].payload.plan)
    end
    fails(es({ "append", "c-1", "x", "{}", "--key", "c-1", "--keys", "master.key" }), 1,
      "INVALID_ARGUMENT: key 'c-1' was shredded")
    local file = helpers.read_file(work .. "/eventstore.db") .. (helpers.read_file(work .. "/eventstore.db-wal") or "")
    assert.falsy(file:find("ann@example.com", 1, true))
  end)

  it("read --at-rest prints the ciphertext, no payload, without --keys; it excludes --follow", function()
    ok(es({ "append", "c-1", "signed-up", '{"email":"ann@example.com"}', "--key", "c-1", "--keys", "master.key" }))
    local rest = ndjson(ok(es({ "read", "c-1", "--at-rest" })))[1]
    assert.equal("es1:", rest.ciphertext:sub(1, 4))
    assert.equal(eventstore.json.null, rest.payload)
    -- the whole address, not "ann": three letters turn up in random base64
    -- about once in 7,000 runs (a CI run met it)
    assert.falsy(rest.ciphertext:find("ann@example.com", 1, true))
    assert.falsy(rest.ciphertext:find("example", 1, true))
    ok(es({ "shred", "c-1", "--yes" }))
    local after = ndjson(ok(es({ "read", "c-1", "--at-rest" })))[1]
    assert.equal(rest.ciphertext, after.ciphertext)
    assert.is_true(after.shredded)
    fails(es({ "read", "c-1", "--at-rest", "--follow" }), 2, "read: --follow and --at-rest exclude each other")
  end)

  it("a wrong or unsafe key file is refused and changes nothing", function()
    ok(es({ "append", "c-1", "signed-up", '{"v":1}', "--key", "c-1", "--keys", "master.key" }))
    local before = helpers.read_file(work .. "/eventstore.db")
    -- a missing file is said to be missing, and none is made (§3.10)
    local err = fails(es({ "read", "c-1", "--keys", "other.key" }), 1, "INVALID_ARGUMENT")
    assert.truthy(err:find("other.key is missing", 1, true), err)
    assert.is_nil(helpers.read_file(work .. "/other.key"))
    helpers.write_file(work .. "/other.key", ("ab"):rep(32) .. "\n")
    os.execute("chmod 600 " .. helpers.sh_quote(work .. "/other.key"))
    err = fails(es({ "read", "c-1", "--keys", "other.key" }), 1, "INVALID_ARGUMENT")
    assert.truthy(err:find("does not match", 1, true))
    os.execute("chmod 644 " .. helpers.sh_quote(work .. "/master.key"))
    err = fails(es({ "read", "c-1", "--keys", "master.key" }), 1, "INVALID_ARGUMENT")
    assert.truthy(err:find("master.key", 1, true))
    assert.equal(before, helpers.read_file(work .. "/eventstore.db"))
  end)

  it("on a shards: store: --key seals on every shard, shred burns the name on each (docs/sharding.md)", function()
    local db, paths = ch.sharded(work)
    local function run(args, stdin)
      local all = { "--db", db, "--keys", "master.key" }
      for _, a in ipairs(args) do all[#all + 1] = a end
      return es(all, stdin)
    end
    for i = 1, 12 do
      ok(run({ "append", "c-" .. i, "signed-up", '{"email":"ann' .. i .. '@example.com"}', "--key", "c" }))
    end
    assert.equal("ann3@example.com", ndjson(ok(run({ "read", "c-3" })))[1].payload.email)
    local holding = 0
    for _, path in pairs(paths) do
      local file = (helpers.read_file(path) or "") .. (helpers.read_file(path .. "-wal") or "")
      assert.falsy(file:find("@example.com", 1, true), path)
      if file:find("c-", 1, true) then holding = holding + 1 end
    end
    assert.is_true(holding >= 2, "sessions on more than one shard")
    assert.same({ { key = "c", shredded = true } }, ndjson(ok(es({ "shred", "c", "--yes", "--db", db }))))
    for i = 1, 12 do
      local e = ndjson(ok(run({ "read", "c-" .. i })))[1]
      assert.is_true(e.shredded, "c-" .. i)
      assert.equal(eventstore.json.null, e.payload)
    end
    fails(run({ "append", "c-1", "x", "{}", "--key", "c" }), 1, "INVALID_ARGUMENT: key 'c' was shredded")
  end)

  it("shred --help documents the command", function()
    local out = ok(es({ "shred", "--help" }))
    assert.truthy(out:find("usage: eventstore shred KEY --yes", 1, true))
    assert.truthy(out:find("--keys PATH", 1, true))
  end)
end)
