-- Conformance: docs/contract.md §3.9 archive segments (docs/retention.md,
-- "Archive"). Runs once per backend URL (helpers.urls()); every store gets
-- an archive directory of its own in a temporary directory.
local helpers = require("helpers")
local eventstore = require("eventstore")

local expect_error = helpers.expect_error
local indexes = helpers.indexes
local claim = helpers.claim
local json = eventstore.json

local dirs = {} -- archive directories made by the current test

local function fresh_dir()
  local d = os.tmpname()
  os.remove(d)
  d = d .. ".archive"
  dirs[#dirs + 1] = d
  return d
end

local function remove_dirs()
  for i = #dirs, 1, -1 do
    os.execute("rm -rf " .. helpers.sh_quote(dirs[i]))
    dirs[i] = nil
  end
end

-- Every file (relative path) under dir, sorted.
local function files_in(dir)
  local p = io.popen("cd " .. helpers.sh_quote(dir) .. " 2>/dev/null && find . -type f | sort")
  local out = {}
  for line in p:lines() do out[#out + 1] = line:sub(3) end
  p:close()
  return out
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- A string of every ASCII byte (NUL included) and some multi-byte UTF-8.
local function every_char()
  local t = {}
  for b = 0, 127 do t[#t + 1] = string.char(b) end
  return table.concat(t) .. "é€😀"
end

local function settled(store, session, n, from)
  local batch = {}
  for i = 1, n do
    local k = (from or 0) + i
    batch[i] = { type = "t" .. k, payload = { i = k }, settled = true }
  end
  return store:append(session, batch)
end

-- Events whose every field a read must give back exactly: extreme numbers,
-- bytes, lanes, causes, timers, a completed dispatch record with a failure
-- behind it, a settled dead letter.
local function rich_history(store, clock)
  store:append("s", {
    { type = "ints", payload = { min = math.mininteger, max = math.maxinteger, big = 9007199254740993, neg = -1 }, settled = true },
    { type = "floats", payload = { a = 0.1, b = 1e300, c = -2.5e-308, d = 3.0 }, lane = "l1", settled = true },
    { type = "bytes", payload = { s = every_char(), empty = "", arr = json.array({}), obj = {} }, settled = true },
    { type = "null", settled = true },
    { type = "work", payload = { n = 1 }, lane = "l2", not_before = helpers.T0 + 5 },
    { type = "doomed", payload = { n = 2 } },
  })
  clock:advance(10)
  local c = claim(store, "s", { limit = 1 })
  assert(c.events[1].index == 5)
  store:fail("s", 5, c.events[1].attempt, { error = "first try \0 failed", retry_after_ms = 1 })
  clock:advance(5)
  c = claim(store, "s", { limit = 2 })
  store:complete("s", 5, c.events[1].attempt, { { type = "child", payload = { from = 5 } } })
  store:fail("s", 6, c.events[2].attempt, { error = "no", max_failures = 1 })
  store:settle("s", 6, "given up")
  c = claim(store, "s", { holder = "w2" }) -- 7, the child (with its cause)
  store:complete("s", 7, c.events[1].attempt)
  settled(store, "s", 3, 7)
  return store:read("s")
end

for _, url in ipairs(helpers.urls_and_shards()) do
  describe(url, function()
    after_each(function()
      helpers.cleanup()
      remove_dirs()
    end)

    local function new(opts)
      local o = { archive = fresh_dir() }
      for k, v in pairs(opts or {}) do o[k] = v end
      local store, clock, full = helpers.new(url, o)
      return store, clock, full, o.archive
    end

    describe("archive", function()
      it("moves events into a segment file and reads them back exactly (every field, every byte)", function()
        local store, clock, _, dir = new()
        local before = rich_history(store, clock)
        local head = store:head("s")
        local g = store:archive("s", { through = 8 })
        assert.same({ 1, 8, 8 }, { g.from, g.through, g.count })
        assert.truthy(g.checksum:match("^%x+$") and #g.checksum == 64, g.checksum)
        -- HASH/FILE.seg; on shards: behind the shard's directory (docs/sharding.md)
        assert.truthy(g.file:match("^%x+/[^/]+%.seg$") or (url:match("^shards:") and g.file:match("^[^/]+/%x+/[^/]+%.seg$")), g.file)
        local f = io.open(dir .. "/" .. g.file, "rb")
        assert.equal(g.bytes, f:seek("end"))
        f:close()
        -- the rows are gone from the live store, the events are not
        assert.equal(head - 8, #store:read_all({}))
        assert.equal(helpers.dump(before), helpers.dump(store:read("s")))
        assert.equal(math.mininteger, store:read("s", { limit = 1 })[1].payload.min)
        assert.equal(9007199254740993, store:read("s", { limit = 1 })[1].payload.big)
        assert.equal("float", math.type(store:read("s", { after = 1, limit = 1 })[1].payload.d))
        assert.equal(every_char(), store:read("s", { after = 2, limit = 1 })[1].payload.s)
        assert.same({ g }, store:segments("s"))
      end)

      it("is idempotent: through at or below what is archived writes nothing", function()
        local store, _, _, dir = new()
        settled(store, "s", 5)
        local g = store:archive("s", { through = 3 })
        local files = files_in(dir)
        assert.is_nil(store:archive("s", { through = 3 }))
        assert.is_nil(store:archive("s", { through = 1 }))
        assert.is_nil(store:archive("s", { through = 0 }))
        assert.is_nil(store:archive("never", { through = 0 }))
        assert.same({ g }, store:segments("s"))
        assert.same(files, files_in(dir))
        local g2 = store:archive("s", { through = 5 })
        assert.same({ 4, 5, 2 }, { g2.from, g2.through, g2.count })
        assert.equal(2, #store:segments("s"))
        assert.same({ 1, 2, 3, 4, 5 }, indexes(store:read("s")))
      end)

      it("refuses a range holding a pending or dead event, changing nothing", function()
        local store, _, _, dir = new()
        settled(store, "s", 2)
        store:append("s", { { type = "work" } }) -- 3: pending
        settled(store, "s", 1, 3)
        local err = helpers.refused(store, "INVALID_ARGUMENT", function() return store:archive("s", { through = 4 }) end)
        assert.truthy(tostring(err):find("event 3 is pending", 1, true), tostring(err))
        assert.same({}, store:segments("s"))
        assert.same({}, files_in(dir))
        local c = claim(store, "s")
        store:fail("s", 3, c.events[1].attempt, { error = "x", max_failures = 1 })
        err = helpers.refused(store, "INVALID_ARGUMENT", function() return store:archive("s", { through = 3 }) end)
        assert.truthy(tostring(err):find("dead letter", 1, true), tostring(err))
        assert.same({}, files_in(dir))
        -- below it is fine; settled counts as processed
        assert.equal(2, store:archive("s", { through = 2 }).through)
        store:settle("s", 3, "given up")
        assert.equal(4, store:archive("s", { through = 4 }).through)
        assert.same({ 1, 2, 3, 4 }, indexes(store:read("s")))
        assert.equal("processed", store:read("s", { after = 2, limit = 1 })[1].status)
      end)

      it("bad arguments: through beyond the head, negative, missing; no archive directory", function()
        local store = new()
        settled(store, "s", 3)
        expect_error("NO_SUCH_EVENT", store.archive, store, "s", { through = 4 })
        expect_error("NO_SUCH_EVENT", store.archive, store, "nobody", { through = 1 })
        expect_error("INVALID_ARGUMENT", store.archive, store, "s", { through = -1 })
        expect_error("INVALID_ARGUMENT", store.archive, store, "", { through = 1 })
        expect_error("INVALID_ARGUMENT", store.archive, store, "a\0b", { through = 1 })
        helpers.expect_arg_error(function() return store:archive("s") end)
        helpers.expect_arg_error(function() return store:archive("s", {}) end)
        helpers.expect_arg_error(function() return store:archive("s", { through = "2" }) end)
        helpers.expect_arg_error(function() return store:archive("s", { through = 1.5 }) end)
        expect_error("INVALID_ARGUMENT", store.archive, store, "s", { through = math.mininteger })
        expect_error("NO_SUCH_EVENT", store.archive, store, "s", { through = math.maxinteger })
        assert.same({}, store:segments("s"))
        if url == "memory:" then
          local plain = helpers.new(url)
          settled(plain, "s", 1)
          local err = expect_error("INVALID_ARGUMENT", plain.archive, plain, "s", { through = 1 })
          assert.truthy(tostring(err):find("{archive = DIR}", 1, true), tostring(err))
          expect_error("INVALID_ARGUMENT", plain.compact_archive, plain, "s")
          expect_error("INVALID_ARGUMENT", plain.verify_archive, plain)
        end
      end)

      it("takes the archive location as a file: URL; another scheme, a remote host or %00 is refused", function()
        for _, form in ipairs({ "file://%s", "file://localhost%s", "file:%s", "FILE://%s" }) do
          local dir = fresh_dir()
          -- "a b" percent-encoded: the URL's path is decoded
          local store = helpers.new(url, { archive = form:format(dir .. "/a%20b") })
          settled(store, "s", 3)
          local seg = store:archive("s", { through = 2 })
          assert.is_table(seg, form)
          local files = files_in(dir .. "/a b")
          assert.is_true(#files >= 1, form .. ": no segment file under the decoded path")
          assert.same({ 1, 2, 3 }, indexes(store:read("s")))
          assert.same({}, files_in(dir .. "/a%20b"))
        end
        for _, bad in ipairs({
          { "s3://bucket/segments", "'s3:'" },
          { "https://example.com/x", "'https:'" },
          { "file://example.com/x", "'example.com'" },
          { "file:relative/dir", "absolute path" },
          { "file:///x%00y", "NUL" },
          { "file:///x?mode=ro", "query" },
        }) do
          -- (helpers.new turns an open's error into text naming the URL)
          local ok, err = pcall(helpers.new, url, { archive = bad[1] })
          assert.is_false(ok, bad[1] .. " was taken")
          assert.truthy(tostring(err):find("INVALID_ARGUMENT: archive: ", 1, true), bad[1] .. ": " .. tostring(err))
          assert.truthy(tostring(err):find(bad[2], 1, true), bad[1] .. ": " .. tostring(err))
        end
        -- a directory whose name merely holds a colon is a path, as before
        local dir = fresh_dir() .. "/odd:name"
        local store = helpers.new(url, { archive = dir })
        settled(store, "s", 2)
        store:archive("s", { through = 1 })
        assert.is_true(#files_in(dir) >= 1)
      end)

      it("keeps archived events in sessions{} counts (they stay readable)", function()
        local store = new()
        settled(store, "s", 5)
        store:archive("s", { through = 3 })
        local row = helpers.session_row(store, "s")
        assert.equal(5, row.events)
        assert.equal(1, row.first_index)
      end)
    end)

    describe("transparent reads", function()
      it("read with after/through/limit across the archived and live parts", function()
        local store = new()
        settled(store, "s", 10)
        local all = store:read("s")
        store:archive("s", { through = 4 })
        store:archive("s", { through = 7 })
        for after = 0, 10 do
          for through = after, 10 do
            for _, limit in ipairs({ 1, 2, 5 }) do
              local got = store:read("s", { after = after, through = through, limit = limit })
              local want = {}
              for i = after + 1, math.min(through, after + limit) do want[#want + 1] = all[i] end
              assert.equal(helpers.dump(want), helpers.dump(got), ("after %d through %d limit %d"):format(after, through, limit))
            end
          end
        end
      end)

      it("events_page, wait, read_state and read_states see archived events", function()
        local store = new()
        settled(store, "s", 6)
        store:put_snapshot("s", "r", 2, "two", "v1")
        store:archive("s", { through = 5 })
        local p = store:events_page("s", { after = 0, limit = 4 })
        assert.same({ 1, 2, 3, 4 }, indexes(p.events))
        assert.equal(6, p.through)
        assert.same({ 5, 6 }, indexes(store:events_page("s", { after = 4, through = p.through }).events))
        assert.same({ 1, 2 }, indexes(store:wait("s", 0, 0, 2)))
        local st = store:read_state("s", "r")
        assert.equal(2, st.snapshot.index)
        assert.same({ 3, 4, 5, 6 }, indexes(st.events))
        assert.same({ 1, 2, 3, 4, 5, 6 }, indexes(store:read_state("s", "none").events))
        assert.same({ 3, 4, 5, 6 }, indexes(store:read_states({ "s" }, "r").s.events))
        -- read_all reads live rows only (documented)
        assert.same({ 6 }, indexes(store:read_all({})))
      end)

      it("an engine folds archived events like live ones", function()
        if type(eventstore.engine) ~= "function" then return end
        local store = new()
        local scripts = fresh_dir()
        os.execute("mkdir -p " .. helpers.sh_quote(scripts .. "/reducers"))
        helpers.write_file(scripts .. "/reducers/sum.lua",
          "local function add(s, e) s.n = s.n + e.payload.i end\n"
          .. "return { init = function() return { n = 0 } end, t1 = add, t2 = add, t3 = add, t4 = add, t5 = add, t6 = add }")
        settled(store, "s", 6)
        local engine = eventstore.engine({ store = store, scripts = scripts })
        local want = engine:state("s", "sum")
        store:archive("s", { through = 4 })
        local engine2 = eventstore.engine({ store = store, scripts = scripts })
        assert.same(want, engine2:state("s", "sum"))
        assert.equal(21, engine2:state("s", "sum").n)
        engine:close()
        engine2:close()
      end)

      it("truncate after archive: below first_index is TRUNCATED, whole segments go with their files", function()
        local store, _, _, dir = new()
        settled(store, "s", 9)
        local g1 = store:archive("s", { through = 3 })
        local g2 = store:archive("s", { through = 6 })
        assert.equal(3, store:truncate("s", 2)) -- inside g1: the segment stays
        expect_error("TRUNCATED", store.read, store, "s")
        assert.same({ 3, 4, 5, 6, 7, 8, 9 }, indexes(store:read("s", { after = 2 })))
        assert.equal(2, #store:segments("s"))
        assert.equal(7, helpers.session_row(store, "s").events)
        assert.equal(6, store:truncate("s", 5)) -- past g1: its row and file go
        assert.same({ g2 }, store:segments("s"))
        assert.is_false(exists(dir .. "/" .. g1.file))
        assert.is_true(exists(dir .. "/" .. g2.file))
        assert.same({ 6, 7, 8, 9 }, indexes(store:read("s", { after = 5 })))
        assert.equal(4, helpers.session_row(store, "s").events)
        assert.equal(9, store:truncate("s", 8))
        assert.same({}, store:segments("s"))
        assert.same({}, files_in(dir))
        assert.same({ 9 }, indexes(store:read("s", { after = 8 })))
        assert.equal(1, helpers.session_row(store, "s").events)
        -- archiving after a truncate starts at first_index
        settled(store, "s", 2, 9)
        local g = store:archive("s", { through = 10 })
        assert.same({ 9, 10 }, { g.from, g.through })
        assert.same({ 9, 10, 11 }, indexes(store:read("s", { after = 8 })))
      end)

      it("delete removes the session's segment rows and files; the name starts afresh", function()
        local store, _, _, dir = new()
        settled(store, "s", 4)
        settled(store, "keep", 2)
        store:archive("s", { through = 2 })
        store:archive("s", { through = 4 })
        local kept = store:archive("keep", { through = 2 })
        assert.is_true(store:delete("s"))
        assert.same({}, store:segments("s"))
        assert.same({ kept.file }, files_in(dir))
        assert.equal(0, store:head("s"))
        settled(store, "s", 2)
        assert.same({ 1, 2 }, indexes(store:read("s")))
        local g = store:archive("s", { through = 2 })
        assert.equal(2, #store:read("s"))
        assert.equal(2, #files_in(dir))
        assert.same({ g }, store:segments("s"))
      end)

      it("fork of an archived session copies the archived part too", function()
        local store = new()
        local src = settled(store, "s", 6)
        store:put_snapshot("s", "r", 3, "three", "v1")
        store:archive("s", { through = 4 })
        store:fork("s", 5, "f")
        local got = store:read("f")
        assert.same({ 1, 2, 3, 4, 5 }, indexes(got))
        for i = 1, 5 do
          assert.equal(src[i].type, got[i].type)
          assert.same(src[i].payload, got[i].payload)
          assert.equal(src[i].created_at, got[i].created_at)
          assert.equal("s", got[i].origin.session)
          assert.equal(i, got[i].origin.index)
          assert.are_not.equal(src[i].id, got[i].id)
        end
        store:fork("s", 2, "f2")
        assert.same({ 1, 2 }, indexes(store:read("f2")))
        assert.same({ 1, 2, 3, 4, 5, 6 }, indexes(store:read("s")))
      end)
    end)

    describe("damaged segments", function()
      local function damaged(how)
        local store, _, _, dir = new()
        settled(store, "s", 6)
        local g = store:archive("s", { through = 4 })
        local path = dir .. "/" .. g.file
        local bytes = helpers.read_file(path)
        if how == "flip" then
          local at = #bytes - 3
          helpers.write_file(path, bytes:sub(1, at - 1) .. string.char(bytes:byte(at) ~ 0x40) .. bytes:sub(at + 1))
        elseif how == "flip header" then
          helpers.write_file(path, bytes:sub(1, 20) .. string.char(bytes:byte(21) ~ 1) .. bytes:sub(22))
        elseif how == "cut" then
          helpers.write_file(path, bytes:sub(1, #bytes // 2))
        elseif how == "extend" then
          helpers.write_file(path, bytes .. "x")
        else
          os.remove(path)
        end
        return store, g, path
      end

      for _, how in ipairs({ "flip", "flip header", "cut", "extend", "delete" }) do
        it(how .. ": a read that needs it is STORAGE naming the file; verify_archive reports it", function()
          local store, g, path = damaged(how)
          local err = expect_error("STORAGE", store.read, store, "s")
          assert.truthy(err.message:find(path, 1, true), err.message)
          if how == "delete" then assert.truthy(err.message:find("missing", 1, true), err.message) end
          expect_error("STORAGE", store.read_state, store, "s", "r")
          expect_error("STORAGE", store.fork, store, "s", 5, "f")
          expect_error("STORAGE", store.compact_archive, store, "s")
          -- the live part still reads
          assert.same({ 5, 6 }, indexes(store:read("s", { after = 4 })))
          local v = store:verify_archive()
          assert.equal(1, v.checked)
          assert.equal(1, #v.problems)
          assert.equal("s", v.problems[1].session)
          assert.equal(g.file, v.problems[1].file)
          assert.same({}, v.orphans)
          assert.equal(1, #store:verify_archive("s").problems)
          assert.same({}, store:verify_archive("other").problems)
        end)
      end

      it("a damaged file is never read as wrong events, even with a matching checksum elsewhere", function()
        -- swap two segments' files: each has a valid checksum, but not its row's
        local store, _, _, dir = new()
        settled(store, "s", 4)
        local a = store:archive("s", { through = 2 })
        local b = store:archive("s", { through = 4 })
        local ba, bb = helpers.read_file(dir .. "/" .. a.file), helpers.read_file(dir .. "/" .. b.file)
        helpers.write_file(dir .. "/" .. a.file, bb)
        helpers.write_file(dir .. "/" .. b.file, ba)
        expect_error("STORAGE", store.read, store, "s")
        assert.equal(2, #store:verify_archive().problems)
      end)

      it("orphan files are listed apart, never read, and removed by the next archive", function()
        local store, _, _, dir = new()
        settled(store, "s", 6)
        local g = store:archive("s", { through = 2 })
        local sdir = dir .. "/" .. g.file:match("^(.*)/[^/]+$") -- the session's directory
        -- a crash leaves a file of the next range (even a valid one) and a temporary
        helpers.write_file(sdir .. "/00000000000000000003-00000000000000000004-0000000000000000.seg",
          helpers.read_file(dir .. "/" .. g.file))
        helpers.write_file(sdir .. "/x.seg.tmp", "half")
        local v = store:verify_archive()
        assert.same({}, v.problems)
        assert.equal(2, #v.orphans)
        assert.same({ 1, 2, 3, 4, 5, 6 }, indexes(store:read("s")))
        store:archive("s", { through = 4 })
        assert.same({}, store:verify_archive().orphans)
        assert.equal(2, #files_in(dir))
        assert.same({ 1, 2, 3, 4, 5, 6 }, indexes(store:read("s")))
      end)
    end)

    describe("compact_archive", function()
      it("merges adjacent segments into one; reads stay identical; old files go; idempotent", function()
        local store, clock, _, dir = new()
        local before = rich_history(store, clock)
        store:archive("s", { through = 2 })
        store:archive("s", { through = 5 })
        store:archive("s", { through = 8 })
        local old = store:segments("s")
        assert.equal(3, #old)
        assert.same({ before = 3, after = 1 }, store:compact_archive("s"))
        local now = store:segments("s")
        assert.equal(1, #now)
        assert.same({ 1, 8, 8 }, { now[1].from, now[1].through, now[1].count })
        for _, g in ipairs(old) do assert.is_false(exists(dir .. "/" .. g.file)) end
        assert.same({ now[1].file }, files_in(dir))
        assert.equal(helpers.dump(before), helpers.dump(store:read("s")))
        assert.same({ before = 1, after = 1 }, store:compact_archive("s"))
        assert.same(now, store:segments("s"))
        assert.same({ before = 0, after = 0 }, store:compact_archive("nobody"))
        assert.same({}, store:verify_archive().problems)
      end)
    end)

    if url:match("^sqlite:") then
      describe("on SQLite", function()
        it("survives reopening, and PATH.archive is the default directory", function()
          local store, clock, full = helpers.new(url) -- no archive option
          local path = full:match("^sqlite:(.*)$")
          dirs[#dirs + 1] = path .. ".archive"
          local before = rich_history(store, clock)
          local g = store:archive("s", { through = 8 })
          assert.is_true(exists(path .. ".archive/" .. g.file))
          store:close()
          local again = helpers.open_same(full, { clock = clock })
          assert.equal(helpers.dump(before), helpers.dump(again:read("s")))
          assert.same({ g }, again:segments("s"))
          assert.is_nil(again:archive("s", { through = 8 }))
          assert.same({}, again:verify_archive().problems)
        end)

        it("an explicit archive directory is used after reopening with it", function()
          local store, clock, full, dir = new()
          settled(store, "s", 3)
          local g = store:archive("s", { through = 3 })
          assert.is_true(exists(dir .. "/" .. g.file))
          store:close()
          local again = helpers.open_same(full, { clock = clock, archive = dir })
          assert.same({ 1, 2, 3 }, indexes(again:read("s")))
          -- opened without it, the default directory holds nothing: STORAGE, never nothing
          local other = helpers.open_same(full, { clock = clock })
          expect_error("STORAGE", other.read, other, "s")
        end)
      end)
    end
  end)
end
