-- Conformance: docs/contract.md §3.10, crypto-shredding. Payloads appended with
-- `key = NAME` are sealed under that key's data key (the store was opened
-- with {keys = PATH}); every read path opens them, and after
-- store:shred(NAME) shows `payload = nil, shredded = true`; snapshots that
-- folded them are dropped; SQLite keeps neither the key nor the plaintext
-- (the plaintext grep). docs/shredding.md. Runs once per backend URL.
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local expect_error = helpers.expect_error
local json = eventstore.json
local q = helpers.sh_quote

local key_files = {}

-- A fresh path for a master key file (the file does not exist yet).
local function key_path()
  local reserved = os.tmpname()
  local path = reserved .. ".key"
  key_files[#key_files + 1] = reserved
  key_files[#key_files + 1] = path
  return path
end

local function cleanup()
  eh.cleanup()
  for i = #key_files, 1, -1 do
    os.execute("rm -rf " .. q(key_files[i]))
    key_files[i] = nil
  end
end

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  local ok = p:close()
  return ok, out
end

local function mode_of(path)
  local _, out = sh("stat -c %a " .. q(path))
  return out:match("%d+")
end

local function db_path(url) return url:match("^sqlite:(.*)$") end

-- Whether the bytes of needle occur in the file (a missing file: false).
local function file_has(path, needle)
  local bytes = helpers.read_file(path)
  return bytes ~= nil and bytes:find(needle, 1, true) ~= nil
end

local sqlite_exec = helpers.sqlite3

local function payloads(events)
  local out = {}
  for i, e in ipairs(events) do out[i] = e.payload == nil and "nil" or json.encode(e.payload) end
  return out
end

for _, url in ipairs(helpers.urls_and_shards()) do
  describe(url, function()
    after_each(cleanup)

    -- A fresh store with a fresh key file: store, clock, concrete url, key path.
    local function new(opts)
      local keys = key_path()
      local o = { keys = keys }
      for k, v in pairs(opts or {}) do o[k] = v end
      local store, clock, concrete = helpers.new(url, o)
      return store, clock, concrete, keys
    end

    describe("sealing", function()
      it("payloads round-trip exactly under a key; events carry `key`, unkeyed ones do not", function()
        local store = new()
        local p = {
          big = 9007199254740993, min = math.mininteger, max = math.maxinteger,
          f = 0.1, huge = 1e300, three = 3.0, bytes = "a\0b\xc3\xa9", list = json.array({}), obj = {},
        }
        local stored = store:append("s", {
          { type = "t", payload = p, key = "customer-1" },
          { type = "t", payload = { plain = true } },
          { type = "t", key = "customer-1" }, -- no payload: null, still sealed
        })
        assert.equal("customer-1", stored[1].key)
        assert.is_nil(stored[2].key)
        assert.same(p, stored[1].payload)
        local back = store:read("s")
        assert.equal(json.encode(p), json.encode(back[1].payload))
        assert.equal("integer", math.type(back[1].payload.big))
        assert.equal("float", math.type(back[1].payload.three))
        assert.equal("customer-1", back[1].key)
        assert.is_nil(back[1].shredded)
        assert.is_nil(back[2].key)
        assert.same({ plain = true }, back[2].payload)
        assert.is_nil(back[3].payload)
        assert.equal("customer-1", back[3].key)
      end)

      it("max_payload_bytes limits the plaintext, not the (longer) sealed text", function()
        local store = new({ max_payload_bytes = 1000 })
        local text = string.rep("x", 990) -- 992 bytes of JSON; sealed it is ~1.4 KB
        local e = store:append("s", { { type = "t", payload = text, key = "k" } })[1]
        assert.equal(text, store:read("s")[1].payload)
        assert.equal(text, e.payload)
        expect_error("TOO_LARGE", store.append, store, "s", { { type = "t", payload = text .. "xxxxxxxxxx", key = "k" } })
      end)

      it("without keys an append with `key` is INVALID_ARGUMENT and nothing is written", function()
        local store = helpers.new(url)
        local err = helpers.refused(store, "INVALID_ARGUMENT", function()
          return store:append("s", { { type = "t", payload = 1 }, { type = "t", payload = 2, key = "k" } })
        end)
        assert.truthy(err.message:find("keys", 1, true))
        assert.equal(0, store:head("s"))
      end)

      it("a key must be a name: empty, NUL, over 255 bytes and non-strings are refused", function()
        local store = new()
        expect_error("INVALID_ARGUMENT", store.append, store, "s", { { type = "t", key = "" } })
        expect_error("INVALID_ARGUMENT", store.append, store, "s", { { type = "t", key = "a\0b" } })
        expect_error("INVALID_ARGUMENT", store.append, store, "s", { { type = "t", key = ("k"):rep(256) } })
        helpers.expect_arg_error(store.append, store, "s", { { type = "t", key = 7 } })
        expect_error("INVALID_ARGUMENT", store.shred, store, "")
        expect_error("INVALID_ARGUMENT", store.shred, store, "a\0b")
        assert.equal(0, store:head("s"))
      end)

      it("a replay compares the plaintext and the key: same returns the original, different is ID_CONFLICT", function()
        local store = new()
        local first = store:append("s", { { id = "e1", type = "t", payload = { v = 1 }, key = "k" } })
        local again = store:append("s", { { id = "e1", type = "t", payload = { v = 1 }, key = "k" } })
        assert.equal(first[1].position, again[1].position)
        assert.same({ v = 1 }, again[1].payload)
        expect_error("ID_CONFLICT", store.append, store, "s", { { id = "e1", type = "t", payload = { v = 2 }, key = "k" } })
        expect_error("ID_CONFLICT", store.append, store, "s", { { id = "e1", type = "t", payload = { v = 1 }, key = "other" } })
        expect_error("ID_CONFLICT", store.append, store, "s", { { id = "e1", type = "t", payload = { v = 1 } } })
        store:append("s", { { id = "p1", type = "t", payload = 1 } })
        expect_error("ID_CONFLICT", store.append, store, "s", { { id = "p1", type = "t", payload = 1, key = "k" } })
        assert.equal(2, store:head("s"))
      end)
    end)

    describe("shred", function()
      it("every read path shows the plaintext before and payload = nil, shredded = true after", function()
        local store, clock = new()
        local secret = { card = "4111", v = 7 }
        store:append("s", {
          { type = "a", payload = secret, key = "k" },          -- 1: claimed with claim()
          { type = "b", payload = secret, key = "k" },          -- 2: claimed with claim_next{types}
          { type = "c", payload = secret, key = "k" },          -- 3: dead letter
          { type = "d", payload = { open = 1 }, settled = true }, -- 4: unkeyed
        })
        local c3 = helpers.claimed(store, "s", { exclude = { 1, 2 }, limit = 1 })
        assert.equal(3, c3[1].index)
        store:fail("s", 3, c3[1].attempt, { error = "boom", max_failures = 1 })

        local function check(expect_plain)
          local function ok(e)
            if expect_plain then
              assert.same(secret, e.payload)
              assert.is_nil(e.shredded)
            else
              assert.is_nil(e.payload)
              assert.is_true(e.shredded)
            end
            assert.equal("k", e.key)
          end
          for i = 1, 3 do ok(store:read("s")[i]) end
          assert.same({ open = 1 }, store:read("s")[4].payload)
          ok(store:read_all({})[1])
          ok(store:events_page("s", { limit = 1 }).events[1])
          ok(store:wait("s", 0, 0)[1])
          ok(store:read_state("s", "r").events[2])
          ok(store:read_states({ "s" }, "r").s.events[1])
          ok(store:dead_letters({})[1])
          -- claims: a new attempt each time (the earlier claims expired)
          local claimed = helpers.claimed(store, "s", { limit = 1 })
          assert.equal(1, claimed[1].index)
          ok(claimed[1])
          local next_ = store:claim_next({ holder = "w", ttl_ms = 1000, types = { "b" } })
          assert.equal(2, next_[1].index)
          ok(next_[1])
          clock:advance(5000)
        end
        check(true)
        assert.is_true(store:shred("k"))
        check(false)
        -- revive and settle answer with the event (store get)
        local revived = store:revive("s", 3)
        assert.is_nil(revived.payload)
        assert.is_true(revived.shredded)
      end)

      it("the events a handler's complete() returns are sealed and come back as plaintext", function()
        local store = new()
        store:append("s", { { type = "order" } })
        local c = helpers.claimed(store, "s")
        local r = store:complete("s", 1, c[1].attempt, { { id = "r1", type = "receipt", payload = { pan = "4111" }, key = "k" } })
        assert.same({ pan = "4111" }, r.events[1].payload)
        assert.equal("k", r.events[1].key)
        local again = store:complete("s", 1, c[1].attempt, { { id = "r1", type = "receipt", payload = { pan = "4111" }, key = "k" } })
        assert.equal("completed", again.outcome)
        assert.same({ pan = "4111" }, again.events[1].payload)
        assert.truthy(store:read_at_rest("s")[2].ciphertext)
        store:shred("k")
        assert.is_true(store:read("s")[2].shredded)
      end)

      it("is idempotent: true once for a live key, then false; a never-used name is burned too", function()
        local store = new()
        store:append("s", { { type = "t", payload = 1, key = "k" } })
        assert.is_true(store:shred("k"))
        assert.is_false(store:shred("k"))
        assert.is_false(store:shred("never-used"))
        assert.is_false(store:shred("never-used"))
        for _, name in ipairs({ "k", "never-used" }) do
          local err = helpers.refused(store, "INVALID_ARGUMENT", function()
            return store:append("s", { { type = "t", payload = 2, key = name } })
          end)
          assert.truthy(err.message:find("shredded", 1, true))
        end
        -- other keys and plaintext events are untouched
        store:append("s", { { type = "t", payload = 3, key = "k2" }, { type = "t", payload = 4 } })
        assert.same({ "nil", "3", "4" }, payloads(store:read("s")))
      end)

      it("drops the snapshots that folded a shredded event; earlier ones and other sessions stay", function()
        local store = new()
        store:append("s", { { type = "t", payload = 1 }, { type = "t", payload = 2 } })
        store:append("s", { { type = "t", payload = 3, key = "k" }, { type = "t", payload = 4 } })
        store:append("other", { { type = "t", payload = 1 }, { type = "t", payload = 2, key = "k2" } })
        store:put_snapshot("s", "early", 2, "before the keyed event", "v1")
        store:put_snapshot("s", "at", 3, "folded 3", "v1")
        store:put_snapshot("s", "late", 4, "folded 3 and 4", "v1")
        store:put_snapshot("other", "r", 2, "folded k2", "v1")
        assert.is_true(store:shred("k"))
        assert.same({ "early" }, helpers.pluck(store:snapshots("s"), "reducer"))
        assert.equal("before the keyed event", store:read_state("s", "early").snapshot.state)
        assert.is_nil(store:read_state("s", "late").snapshot)
        assert.same({ "r" }, helpers.pluck(store:snapshots("other"), "reducer"))
        -- a snapshot written after the shred is dropped by the next shred
        store:put_snapshot("s", "late", 4, "raced in", "v1")
        assert.is_false(store:shred("k"))
        assert.same({ "early" }, helpers.pluck(store:snapshots("s"), "reducer"))
      end)

      it("a deleted session's key uses go with it (a new session of that name keeps its snapshots)", function()
        local store = new()
        store:append("s", { { type = "t", payload = 1, key = "k" } })
        assert.is_true(store:delete("s"))
        store:append("s", { { type = "t", payload = 1 } })
        store:put_snapshot("s", "r", 1, "no secret here", "v1")
        store:shred("k")
        assert.same({ "r" }, helpers.pluck(store:snapshots("s"), "reducer"))
      end)

      it("engine folds see the plaintext, then the shredded event; their snapshots are dropped", function()
        local store = new()
        local dir = eh.scripts_dir()
        eh.reducer(dir, "sum", [[
return {
  init = function() return { sum = 0, shredded = 0 } end,
  tick = function(state, event)
    if event.shredded then state.shredded = state.shredded + 1
    else state.sum = state.sum + event.payload.v end
  end,
}
]])
        local engine = eh.engine({ store = store, scripts = dir, snapshot_every = 1 })
        engine:append("s", { { type = "tick", payload = { v = 1 } } })
        engine:append("s", { { type = "tick", payload = { v = 10 }, key = "k" } })
        engine:append("s", { { type = "tick", payload = { v = 100 } } })
        assert.same({ sum = 111, shredded = 0 }, engine:state("s", "sum"))
        local snaps = store:snapshots("s")
        assert.equal(1, #snaps)
        assert.equal(3, snaps[1].index)
        assert.is_true(store:shred("k"))
        assert.same({}, store:snapshots("s"))
        assert.same({ sum = 101, shredded = 1 }, engine:state("s", "sum"))
      end)
    end)

    describe("the engine", function()
      it("handlers on several workers see plaintext and seal what they return", function()
        local store = new()
        local dir = eh.scripts_dir()
        eh.handler(dir, "job", [[
return function(event, ctx)
  assert(event.key == "k" and type(event.payload.v) == "number", "sealed payload not opened")
  return { { type = "done", payload = { v = event.payload.v * 2 }, key = "k" } }
end
]])
        local engine = eh.engine({ store = store, scripts = dir, workers = 4 })
        local batch = {}
        for i = 1, 200 do batch[i] = { type = "job", payload = { v = i }, key = "k" } end
        store:append("s", batch)
        assert.same({ handled = 200, failed = 0, dead = 0 }, eh.run(engine))
        local sum, sealed = 0, 0
        for _, e in ipairs(store:read("s")) do
          if e.type == "done" then sum = sum + e.payload.v end
        end
        for _, e in ipairs(store:read_at_rest("s")) do
          if e.ciphertext then sealed = sealed + 1 end
        end
        assert.equal(2 * (200 * 201 // 2), sum)
        assert.equal(400, sealed)
      end)
    end)

    describe("read_at_rest", function()
      it("shows keyed events as stored: ciphertext, no payload; unkeyed ones as usual", function()
        local store = new()
        store:append("s", {
          { type = "t", payload = { marker = "PLAIN-MARKER-1" }, key = "k" },
          { type = "t", payload = { open = true } },
        })
        local rest = store:read_at_rest("s")
        assert.equal(2, #rest)
        assert.is_nil(rest[1].payload)
        assert.equal("k", rest[1].key)
        assert.equal("es1:", rest[1].ciphertext:sub(1, 4))
        assert.falsy(rest[1].ciphertext:find("PLAIN-MARKER-1", 1, true))
        assert.is_nil(rest[1].shredded)
        assert.same({ open = true }, rest[2].payload)
        assert.is_nil(rest[2].ciphertext)
        assert.same(rest[1].id, store:read("s")[1].id)
        -- after the shred: the same ciphertext, marked shredded
        store:shred("k")
        local after = store:read_at_rest("s", { limit = 1 })
        assert.equal(rest[1].ciphertext, after[1].ciphertext)
        assert.is_true(after[1].shredded)
      end)

      it("needs no keys: a store opened without them audits as well", function()
        local store = helpers.new(url)
        store:append("s", { { type = "t", payload = 1 } })
        assert.same({ 1 }, helpers.pluck(store:read_at_rest("s"), "payload"))
      end)
    end)

    describe("fork", function()
      it("re-seals copies under their own ids; shredding the key shreds both", function()
        local store = new()
        store:append("s", {
          { type = "t", payload = { v = 1 }, key = "k" },
          { type = "t", payload = { v = 2 } },
        })
        store:put_snapshot("s", "r", 2, "folded", "v1")
        store:fork("s", 2, "copy")
        local copy = store:read("copy")
        assert.same({ v = 1 }, copy[1].payload)
        assert.equal("k", copy[1].key)
        local a, b = store:read_at_rest("s")[1], store:read_at_rest("copy")[1]
        assert.are_not.equal(a.id, b.id)
        assert.are_not.equal(a.ciphertext, b.ciphertext)
        assert.same({ "r" }, helpers.pluck(store:snapshots("copy"), "reducer"))
        assert.is_true(store:shred("k"))
        assert.is_true(store:read("s")[1].shredded)
        assert.is_true(store:read("copy")[1].shredded)
        assert.same({}, store:snapshots("copy"))
        -- a fork after the shred copies the shredded event as it is
        store:fork("s", 2, "later")
        local later = store:read("later")
        assert.is_true(later[1].shredded)
        assert.same({ v = 2 }, later[2].payload)
      end)
    end)

    -- §3.9 with §3.10: segment files hold what the rows held (sealed text),
    -- reads of archived events open it, and a shred reaches them too.
    describe("archived events", function()
      local dirs = {}
      after_each(function()
        for i = #dirs, 1, -1 do
          os.execute("rm -rf " .. helpers.sh_quote(dirs[i]))
          dirs[i] = nil
        end
      end)
      local function archived_store()
        local dir = os.tmpname()
        os.remove(dir)
        dirs[#dirs + 1] = dir
        local store = new({ archive = dir })
        return store, dir
      end
      -- every segment file under dir (a sharded store keeps each shard's
      -- in a directory of its own below it), at least one
      local function segment_bytes(dir)
        local p = io.popen("find " .. helpers.sh_quote(dir) .. " -name '*.seg' -exec cat {} +")
        local bytes = p:read("a")
        p:close()
        assert(#bytes > 0, "no segment file under " .. dir)
        return bytes
      end

      it("segments hold the sealed text; every read opens it; a shred shows on archived events and drops their snapshots", function()
        local marker = "ARCHIVED-SECRET-5d1e"
        local store, dir = archived_store()
        store:append("s", {
          { type = "t", payload = { note = marker }, key = "k", settled = true },
          { type = "t", payload = { plain = 1 }, settled = true },
          { type = "t", payload = { note = marker .. "-3" }, key = "k", settled = true },
        })
        local at_rest_before = store:read_at_rest("s")
        assert.equal(3, store:archive("s", { through = 3 }).through)
        assert.same({}, store:read_at_rest("s", { after = 3 }))
        -- what the segment gives back as stored is what the rows held: sealed
        local at_rest = store:read_at_rest("s")
        assert.equal(3, #at_rest)
        assert.equal(at_rest_before[1].ciphertext, at_rest[1].ciphertext)
        assert.is_nil(at_rest[1].payload)
        assert.equal("k", at_rest[1].key)
        assert.is_nil(segment_bytes(dir):find(marker, 1, true))
        -- transparent reads open it: read, events_page, read_state
        assert.equal(marker, store:read("s")[1].payload.note)
        assert.equal(marker .. "-3", store:events_page("s", { after = 2 }).events[1].payload.note)
        assert.equal(marker, store:read_state("s", "r").events[1].payload.note)
        store:put_snapshot("s", "r", 3, "folded " .. marker, "v1")
        assert.is_true(store:shred("k"))
        local after = store:read("s")
        assert.is_true(after[1].shredded)
        assert.is_nil(after[1].payload)
        assert.same({ plain = 1 }, after[2].payload)
        assert.is_true(store:events_page("s", { after = 2 }).events[1].shredded)
        assert.same({}, store:snapshots("s"))
        assert.same({}, store:verify_archive("s").problems)
      end)
    end)

    describe("the key file", function()
      it("is created 0600 when missing, 64 hex digits and a newline", function()
        local path = key_path()
        helpers.new(url, { keys = path })
        assert.equal("600", mode_of(path))
        assert.truthy(helpers.read_file(path):match("^%x+\n$"))
        assert.equal(65, #helpers.read_file(path))
      end)

      it("refuses a file group or others may read, naming it", function()
        local path = key_path()
        helpers.new(url, { keys = path })
        for _, mode in ipairs({ "640", "604", "660", "620" }) do
          os.execute("chmod " .. mode .. " " .. q(path))
          local err = expect_error("INVALID_ARGUMENT", eventstore.open, "memory:", { keys = path })
          assert.truthy(err.message:find(path, 1, true))
        end
      end)

      it("refuses malformed content and anything but a regular file", function()
        for _, content in ipairs({ "", "abc\n", ("0"):rep(63) .. "\n", ("g"):rep(64) .. "\n",
                                   ("0"):rep(64) .. "\n\n", ("0"):rep(66) .. "\n" }) do
          local path = key_path()
          helpers.write_file(path, content)
          os.execute("chmod 600 " .. q(path))
          local err = expect_error("INVALID_ARGUMENT", eventstore.open, "memory:", { keys = path })
          assert.truthy(err.message:find(path, 1, true))
        end
        local dir = key_path()
        os.execute("mkdir -m 700 " .. q(dir))
        expect_error("INVALID_ARGUMENT", eventstore.open, "memory:", { keys = dir })
        expect_error("INVALID_ARGUMENT", eventstore.open, "memory:", { keys = "" })
        expect_error("INVALID_ARGUMENT", eventstore.open, "memory:", { keys = "a\0b" })
      end)

      if url:match("^sqlite:") then
        it("another key file than the store's is refused at open, and nothing changes", function()
          local store, _, concrete, keys = new()
          store:append("s", { { type = "t", payload = { v = 1 }, key = "k" } })
          store:close()
          local path = db_path(concrete)
          local before = helpers.read_file(path)
          local other = key_path()
          eventstore.open("memory:", { keys = other }):close() -- makes another key file
          local err = expect_error("INVALID_ARGUMENT", eventstore.open, concrete, { keys = other })
          assert.truthy(err.message:find("does not match", 1, true))
          assert.equal(before, helpers.read_file(path))
          local again = helpers.open_same(concrete, { keys = keys })
          assert.same({ v = 1 }, again:read("s")[1].payload)
        end)

        it("a missing key file for a store with wrapped keys is an error saying so, and nothing is made", function()
          local store, _, concrete, keys = new()
          store:append("s", { { type = "t", payload = { v = 1 }, key = "k" } })
          store:close()
          local saved = helpers.read_file(keys)
          os.remove(keys)
          local path = db_path(concrete)
          local before = helpers.read_file(path)
          local err = expect_error("INVALID_ARGUMENT", eventstore.open, concrete, { keys = keys })
          assert.truthy(err.message:find(keys .. " is missing", 1, true), err.message)
          assert.is_nil(helpers.read_file(keys)) -- no stray key file
          assert.equal(before, helpers.read_file(path))
          -- the real file restored, the store opens
          helpers.write_file(keys, saved)
          os.execute("chmod 600 " .. q(keys))
          local again = helpers.open_same(concrete, { keys = keys })
          assert.same({ v = 1 }, again:read("s")[1].payload)
        end)

        it("a missing key file for a store without wrapped keys is still made", function()
          local store, _, concrete = new()
          store:append("s", { { type = "t", payload = 1 } })
          store:close()
          local other = key_path()
          local again = helpers.open_same(concrete, { keys = other })
          assert.equal("600", mode_of(other))
          again:append("s", { { type = "t", payload = 2, key = "k" } })
          assert.same({ "1", "2" }, payloads(again:read("s")))
        end)
      end
    end)

    if url:match("^sqlite:") then
      describe("on disk", function()
        it("without keys: live sealed events are INVALID_ARGUMENT naming the key, shredded ones read as shredded", function()
          local store, _, concrete = new()
          store:append("s", { { type = "t", payload = 1, key = "live" } })
          store:append("t", { { type = "t", payload = 2, key = "gone" }, { type = "t", payload = 3 } })
          store:shred("gone")
          store:close()
          local plain = helpers.open_same(concrete)
          local err = expect_error("INVALID_ARGUMENT", plain.read, plain, "s")
          assert.truthy(err.message:find("'live'", 1, true))
          assert.truthy(err.message:find("keys", 1, true))
          assert.same({ "nil", "3" }, payloads(plain:read("t")))
          -- shredding needs no master key
          assert.is_true(plain:shred("live"))
          assert.is_true(plain:read("s")[1].shredded)
        end)

        it("a tampered sealed payload is STORAGE naming the event, never other data", function()
          local store, _, concrete, keys = new()
          store:append("s", {
            { type = "t", payload = { v = "one" }, key = "k" },
            { type = "t", payload = { v = "two" }, key = "k" },
          })
          store:close()
          local path = db_path(concrete)
          -- another event's valid ciphertext (its id is bound in)
          sqlite_exec(path, "UPDATE events SET payload = (SELECT payload FROM events WHERE idx = 2) WHERE idx = 1")
          local s2 = helpers.open_same(concrete, { keys = keys })
          local err = expect_error("STORAGE", s2.read, s2, "s")
          assert.truthy(err.message:find("event 1 of session 's'", 1, true))
          expect_error("STORAGE", s2.read_all, s2, {})
          assert.same({ v = "two" }, s2:read("s", { after = 1 })[1].payload)
          s2:close()
          -- one flipped character
          sqlite_exec(path, "UPDATE events SET payload = substr(payload, 1, 30) || "
            .. "(CASE substr(payload, 31, 1) WHEN 'A' THEN 'B' ELSE 'A' END) || substr(payload, 32) WHERE idx = 2")
          -- the key name relabelled
          sqlite_exec(path, "INSERT INTO keys(name, wrapped, created_at) SELECT 'k2', wrapped, created_at FROM keys WHERE name = 'k'")
          local s3 = helpers.open_same(concrete, { keys = keys })
          expect_error("STORAGE", s3.read, s3, "s", { after = 1 })
          s3:close()
          sqlite_exec(path, "UPDATE events SET key = 'k2' WHERE idx = 1")
          local s4 = helpers.open_same(concrete, { keys = keys })
          expect_error("STORAGE", s4.read, s4, "s", { limit = 1 })
        end)

        it("a ciphertext moved between events whose long ids differ only at their end is STORAGE (the whole id is bound)", function()
          -- a tenant's stored names reach 64 + 1 + 255 bytes: the
          -- associated data must hold all of them, not a cut-off start
          local store, _, concrete, keys = new()
          local t = store:tenant(string.rep("T", 64))
          local key, common = string.rep("k", 255), string.rep("x", 140)
          t:append("s", {
            { type = "t", id = common .. string.rep("a", 115), payload = { who = "alice" }, key = key },
            { type = "t", id = common .. string.rep("b", 115), payload = { who = "bob" }, key = key },
          })
          store:close()
          local path = db_path(concrete)
          sqlite_exec(path, "UPDATE events SET payload = CASE idx WHEN 1 THEN (SELECT payload FROM events WHERE idx = 2)"
            .. " ELSE (SELECT payload FROM events WHERE idx = 1) END")
          local again = helpers.open_same(concrete, { keys = keys }):tenant(string.rep("T", 64))
          expect_error("STORAGE", again.read, again, "s")
        end)

        it("the plaintext grep: sealed events never show the marker; after shred neither the key nor the snapshot is in any file", function()
          local marker = "SECRET-MARKER-7f3a9c"
          local store, _, concrete, keys = new()
          local path = db_path(concrete)
          store:append("s", {
            { type = "t", payload = { note = marker, v = 1 }, key = "k" },
            { type = "t", payload = { note = marker .. "-2" }, key = "k" },
          })
          store:append("plain", { { type = "t", payload = "nothing secret" } })
          local function anywhere(needle) return file_has(path, needle) or file_has(path .. "-wal", needle) end
          assert.is_false(anywhere(marker), "a sealed payload is in the file in plaintext")
          -- the state a reducer folded from it: plaintext, in a snapshot
          store:put_snapshot("s", "r", 2, "state: " .. marker, "v1")
          assert.is_true(anywhere(marker), "the snapshot should be in the file before the shred")
          -- once checkpointed into the main file as well
          store:close()
          assert.is_true(file_has(path, marker))
          local wrapped_hex = sqlite_exec(path, "SELECT hex(wrapped) FROM keys WHERE name = 'k'"):match("%x+")
          assert.equal(144, #wrapped_hex) -- nonce 24 + key 32 + tag 16
          local wrapped = wrapped_hex:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)
          assert.is_true(file_has(path, wrapped))
          store = helpers.open_same(concrete, { keys = keys })
          store:put_snapshot("s", "r", 2, "state again: " .. marker, "v2") -- now in the WAL too
          assert.is_true(store:shred("k"))
          -- while the store is still open: the WAL was checkpointed and truncated
          assert.is_false(anywhere(marker), "the snapshot survived the shred")
          assert.is_false(anywhere(wrapped), "the wrapped data key survived the shred")
          assert.same({ "nil", "nil" }, payloads(store:read("s")))
          store:close()
          assert.is_false(anywhere(marker))
          assert.is_false(anywhere(wrapped))
          -- the log is intact
          local again = helpers.open_same(concrete, { keys = keys })
          assert.equal(2, again:head("s"))
          assert.equal("nothing secret", again:read("plain")[1].payload)
        end)
      end)
    end
  end)
end
