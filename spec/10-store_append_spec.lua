-- Conformance: docs/contract.md §1 (payloads through the store) and §3.1 (append
-- and read: indexes, positions, ids, batch idempotency, expected head, the
-- attempt fence). Runs once per backend URL (helpers.urls()).
local eventstore = require("eventstore")
local helpers = require("helpers")

local json = eventstore.json
local T0 = helpers.T0
local expect_error = helpers.expect_error
local indexes = helpers.indexes

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(helpers.cleanup)

    local function new(opts)
      return helpers.new(url, opts)
    end

    -- Appends one event with this payload (payload == nil: no payload field)
    -- and returns every way of reading it back: the append result, read,
    -- read_all and (sqlite) a second handle reading the file.
    local function readbacks(payload)
      local store, clock, full = new()
      local ev = { type = "t" }
      if payload ~= nil then ev.payload = payload end
      local stored = store:append("p", { ev })
      local out = { n = 0 }
      local function add(v) out.n = out.n + 1; out[out.n] = v end
      add(stored[1].payload)
      add(store:read("p")[1].payload)
      add(store:read_all({})[1].payload)
      if full:match("^sqlite:") then
        local other = helpers.open_same(full, { clock = clock })
        add(other:read("p")[1].payload)
      end
      return out
    end

    local function each_readback(payload, check)
      local got = readbacks(payload)
      assert.is_true(got.n >= 3)
      for i = 1, got.n do check(got[i], i) end
    end

    -- Asserts that append(session, events) raises code and changes nothing.
    local function rejects(code, store, session, events, opts)
      local before = helpers.log_state(store)
      local head = store:head(session)
      expect_error(code, function() return store:append(session, events, opts) end)
      assert.equal(head, store:head(session))
      assert.equal(before, helpers.log_state(store))
    end

    local claim = helpers.claim

    -------------------------------------------------------------------------
    describe("§1 payloads through the store", function()
      it("keeps every int64 an integer, including the extremes", function()
        local p = {
          a = 9007199254740993, b = math.mininteger, c = math.maxinteger, d = -1, e = 0,
          arr = json.array({ 9007199254740993, math.mininteger, math.maxinteger }),
        }
        each_readback(p, function(got)
          for _, k in ipairs({ "a", "b", "c", "d", "e" }) do
            assert.equal("integer", math.type(got[k]))
            assert.equal(p[k], got[k])
          end
          for i = 1, 3 do
            assert.equal("integer", math.type(got.arr[i]))
            assert.equal(p.arr[i], got.arr[i])
          end
          assert.equal(json.encode(p), json.encode(got))
        end)
      end)

      it("keeps top-level integer payloads at the int64 limits", function()
        for _, v in ipairs({ math.mininteger, math.maxinteger, 9007199254740993, 0 }) do
          each_readback(v, function(got)
            assert.equal("integer", math.type(got))
            assert.equal(v, got)
          end)
        end
      end)

      it("keeps floats floats with all their digits", function()
        local floats = { 0.1, 1e300, 3.0, -2.5, 1 / 3, 5e-324, 1.7976931348623157e308,
          2.0 ^ 53, 123456.789e-20, 0.30000000000000004, -1e-300, 100.0 }
        each_readback(json.array(floats), function(got)
          for i, f in ipairs(floats) do
            assert.equal("float", math.type(got[i]))
            assert.is_true(got[i] == f, ("float %d: expected %.17g got %.17g"):format(i, f, got[i]))
          end
        end)
      end)

      it("reads 3.0 back as a float, and 3 as an integer", function()
        each_readback(3.0, function(got)
          assert.equal("float", math.type(got))
          assert.equal(3.0, got)
        end)
        each_readback(json.array({ 3, 3.0 }), function(got)
          assert.equal("integer", math.type(got[1]))
          assert.equal("float", math.type(got[2]))
          assert.equal("[3,3.0]", json.encode(got))
        end)
        each_readback({ x = 3.0 }, function(got)
          assert.equal("float", math.type(got.x))
        end)
      end)

      it("round-trips booleans and top-level strings", function()
        each_readback(true, function(got) assert.equal(true, got) end)
        each_readback(false, function(got) assert.equal(false, got) end)
        each_readback("plain text", function(got) assert.equal("plain text", got) end)
        each_readback("", function(got) assert.equal("", got) end)
      end)

      it("keeps every byte of strings: embedded NUL and control characters", function()
        local ctl = {}
        for b = 0, 31 do ctl[#ctl + 1] = string.char(b) end
        ctl = table.concat(ctl) .. "\127"
        local p = {
          nul = "a\0b", only_nul = "\0", ctl = ctl, quotes = "\"\\/",
          ["key\0with nul"] = "v\0",
          arr = json.array({ "x\0y", "\0\0" }),
        }
        each_readback(p, function(got)
          assert.equal("a\0b", got.nul)
          assert.equal(3, #got.nul)
          assert.equal("\0", got.only_nul)
          assert.equal(ctl, got.ctl)
          assert.equal("\"\\/", got.quotes)
          assert.equal("v\0", got["key\0with nul"])
          assert.equal("x\0y", got.arr[1])
          assert.equal("\0\0", got.arr[2])
        end)
        each_readback("top\0level", function(got) assert.equal("top\0level", got) end)
      end)

      it("keeps multi-byte UTF-8 exactly", function()
        local s = "é€😀中文 \u{10FFFF} \u{FEFF}"
        each_readback({ [s] = s }, function(got)
          assert.equal(s, got[s])
        end)
      end)

      it("rejects invalid UTF-8 in a string value with INVALID_ARGUMENT, writing nothing", function()
        local bad = {
          "\xff", "abc\xfe", "\xc3\x28", "\xc0\xaf", "\xe2\x82", "\xed\xa0\x80",
          "\xf4\x90\x80\x80", "\x80",
        }
        for _, b in ipairs(bad) do
          local store = new()
          store:append("p", { { type = "ok", payload = 1 } })
          rejects("INVALID_ARGUMENT", store, "p", { { type = "t", payload = b } })
          rejects("INVALID_ARGUMENT", store, "p", { { type = "t", payload = { s = b } } })
          rejects("INVALID_ARGUMENT", store, "p", { { type = "t", payload = json.array({ "ok", b }) } })
          assert.equal(1, store:head("p"))
        end
      end)

      it("rejects invalid UTF-8 in an object key with INVALID_ARGUMENT, writing nothing", function()
        local store = new()
        rejects("INVALID_ARGUMENT", store, "p", { { type = "t", payload = { ["k\xff"] = 1 } } })
        assert.equal(0, store:head("p"))
        assert.same({}, store:read_all({}))
      end)

      it("round-trips an empty array and an empty object at the top level", function()
        each_readback(json.array({}), function(got)
          assert.equal("table", type(got))
          assert.is_nil(next(got))
          assert.equal("[]", json.encode(got))
        end)
        each_readback({}, function(got)
          assert.equal("table", type(got))
          assert.is_nil(next(got))
          assert.equal("{}", json.encode(got))
        end)
      end)

      it("round-trips nested empty arrays and objects", function()
        local p = { a = json.array({}), o = {}, n = json.array({ json.array({}), {} }) }
        each_readback(p, function(got)
          assert.equal('{"a":[],"n":[[],{}],"o":{}}', json.encode(got))
        end)
      end)

      it("keeps json.null inside arrays", function()
        each_readback(json.array({ 1, json.null, 3 }), function(got)
          assert.equal(1, got[1])
          assert.is_true(rawequal(json.null, got[2]))
          assert.equal(3, got[3])
          assert.equal("[1,null,3]", json.encode(got))
        end)
      end)

      it("keeps json.null inside objects", function()
        each_readback({ a = json.null, b = 1 }, function(got)
          assert.is_true(rawequal(json.null, got.a))
          assert.equal(1, got.b)
          assert.equal('{"a":null,"b":1}', json.encode(got))
        end)
      end)

      it("reads a missing payload back as nil", function()
        each_readback(nil, function(got) assert.is_nil(got) end)
      end)

      it("round-trips deeply nested values", function()
        local p = json.array({})
        local cur = p
        for i = 1, 60 do
          local nxt = { depth = i, list = json.array({}) }
          cur[1] = nxt
          cur = nxt.list
        end
        local text = json.encode(p)
        each_readback(p, function(got) assert.equal(text, json.encode(got)) end)
      end)

      local unrepresentable = {
        { "a function", function() return function() end end },
        { "a cycle", function() local t = { x = 1 }; t.self = t; return t end },
        { "a cycle through an array", function() local t = json.array({}); t[1] = { back = t }; return t end },
        { "NaN", function() return 0 / 0 end },
        { "NaN inside an object", function() return { x = 0 / 0 } end },
        { "+infinity", function() return math.huge end },
        { "-infinity", function() return json.array({ -math.huge }) end },
        { "a table mixing array and string keys", function() return { 1, 2, x = 3 } end },
        { "a sparse array", function() return { [1] = 1, [3] = 3 } end },
        { "a boolean key", function() return { [true] = 1 } end },
        { "a float key", function() return { [1.5] = 1 } end },
        { "a coroutine", function() return coroutine.create(function() end) end },
        { "a userdata", function() return { f = io.stdout } end },
      }
      for _, case in ipairs(unrepresentable) do
        it("rejects " .. case[1] .. " with INVALID_ARGUMENT before writing anything", function()
          local store = new()
          store:append("p", { { type = "first", payload = 1 } })
          rejects("INVALID_ARGUMENT", store, "p", { { type = "t", payload = case[2]() } })
          -- the bad payload second in a batch: the valid first one is not written either
          rejects("INVALID_ARGUMENT", store, "p", {
            { type = "ok", payload = { fine = true } },
            { type = "t", payload = case[2]() },
          })
          assert.equal(1, store:head("p"))
        end)
      end

      it("answers an append with the payloads read decodes, for many generated values", function()
        -- every payload in append's answer (a first append, and one of
        -- the same ids answered with the events stored first) is what
        -- decoding its canonical text gives, json.decode(json.encode(v)),
        -- as read gives it: to the number subtype, the array mark and the
        -- null, in tables of its own
        local store = new()
        helpers.seed("append answers")
        local shared = { k = json.array { 1, 2 } }
        local edge = {
          json.null, -0.0, 2.0, 0.1, "", "a\0b", {}, json.array {}, { 1, 2, 3 },
          json.array { [1] = 1, [3] = 3 }, setmetatable({ a = 1 }, { __index = function() return 9 end }),
          { a = shared, b = shared }, { x = { y = { z = json.array { json.null, { false } } } } },
        }
        local values = {}
        for i, v in ipairs(edge) do values[i] = v end
        for i = #edge + 1, 600 do values[i] = helpers.random_json(0, true) end
        local batch = {}
        for i, v in ipairs(values) do batch[i] = { type = "t", payload = v } end
        for from = 1, #batch, 100 do
          local part = table.move(batch, from, math.min(from + 99, #batch), 1, {})
          store:append("gen", part)
        end
        local answered = {}
        for from = 1, #batch, 100 do
          -- again with the same ids: the answer is the events stored first
          local part = table.move(batch, from, math.min(from + 99, #batch), 1, {})
          for i, e in ipairs(part) do part[i] = { type = e.type, payload = e.payload, id = "gen-" .. (from + i - 1) } end
          for _, e in ipairs(store:append("ids", part)) do answered[#answered + 1] = e end
          for _, e in ipairs(store:append("ids", part)) do assert.is_true(helpers.json_same(answered[e.index].payload, e.payload)) end
        end
        local read = store:read("ids", { limit = 1000 })
        assert.equal(#values, #read)
        for i, v in ipairs(values) do
          local want = json.decode(json.encode(v))
          assert.is_true(helpers.json_same(want, read[i].payload), json.encode(v))
          assert.is_true(helpers.json_same(want, answered[i].payload), json.encode(v))
          if type(v) == "table" then assert.are_not.equal(v, answered[i].payload, "a copy, not the caller's table") end
        end
        -- the answer's tables are the event's own: two events never share one
        assert.are_not.equal(answered[12].payload.a, answered[12].payload.b)
      end)

      it("rejects a payload over max_payload_bytes with TOO_LARGE, writing nothing", function()
        local store = new({ max_payload_bytes = 100 })
        store:append("p", { { type = "t", payload = "small" } })
        rejects("TOO_LARGE", store, "p", { { type = "t", payload = string.rep("x", 200) } })
        rejects("TOO_LARGE", store, "p", { { type = "t", payload = { k = string.rep("y", 200) } } })
        assert.equal(1, store:head("p"))
      end)

      it("accepts a payload whose canonical text is exactly max_payload_bytes", function()
        local store = new({ max_payload_bytes = 100 })
        -- a string of n bytes encodes as n + 2 bytes (the quotes)
        local stored = store:append("p", { { type = "t", payload = string.rep("x", 98) } })
        assert.equal(string.rep("x", 98), stored[1].payload)
        rejects("TOO_LARGE", store, "p", { { type = "t", payload = string.rep("x", 99) } })
        assert.equal(1, store:head("p"))
      end)

      it("measures the canonical text, not the Lua value (escapes count)", function()
        local store = new({ max_payload_bytes = 100 })
        -- 30 NUL bytes encode as 30 * "\u0000" + quotes = 182 bytes
        rejects("TOO_LARGE", store, "p", { { type = "t", payload = string.rep("\0", 30) } })
        assert.equal(0, store:head("p"))
      end)

      it("rejects a batch holding one oversized payload as a whole", function()
        local store = new({ max_payload_bytes = 100 })
        rejects("TOO_LARGE", store, "p", {
          { type = "a", payload = 1 },
          { type = "b", payload = string.rep("z", 500) },
        })
        assert.equal(0, store:head("p"))
        assert.same({}, store:read_all({}))
      end)

      it("defaults max_payload_bytes to 1 MiB", function()
        local store = new()
        local limit = 1024 * 1024
        local under = string.rep("x", limit - 2) -- canonical text exactly 1 MiB
        local stored = store:append("p", { { type = "t", payload = under } })
        assert.equal(#under, #stored[1].payload)
        assert.equal(#under, #store:read("p")[1].payload)
        rejects("TOO_LARGE", store, "p", { { type = "t", payload = string.rep("x", limit - 1) } })
        rejects("TOO_LARGE", store, "p", { { type = "t", payload = string.rep("x", limit + 1000) } })
        assert.equal(1, store:head("p"))
      end)

      if url:match("^sqlite:") then
        it("keeps payloads exact after the store is closed and reopened", function()
          local store, clock, full = new()
          local p = { i = math.mininteger, f = 0.1, t = 3.0, s = "a\0b", e = json.array({}), o = {},
            n = json.array({ json.null }) }
          store:append("p", { { type = "t", payload = p } })
          store:close()
          local again = helpers.open_same(full, { clock = clock })
          local got = again:read("p")[1].payload
          assert.equal(json.encode(p), json.encode(got))
          assert.equal("integer", math.type(got.i))
          assert.equal("float", math.type(got.t))
        end)
      end
    end)

    -------------------------------------------------------------------------
    describe("§3.1 append and read", function()
      it("numbers events 1, 2, 3, ... densely per session across batches", function()
        local store = new()
        local a = store:append("s", { { type = "a" }, { type = "b" }, { type = "c" } })
        assert.same({ 1, 2, 3 }, indexes(a))
        local b = store:append("s", { { type = "d" }, { type = "e" } })
        assert.same({ 4, 5 }, indexes(b))
        local other = store:append("t", { { type = "x" } })
        assert.same({ 1 }, indexes(other))
        assert.same({ 1, 2, 3, 4, 5 }, indexes(store:read("s")))
        for _, e in ipairs(store:read("s")) do assert.equal("integer", math.type(e.index)) end
      end)

      it("answers with the ids alone under opts.answer = \"ids\", the stored events' own", function()
        local store = new()
        store:append("s", { { type = "first" } })
        local ids, pending = store:append("s", { { type = "a", id = "given-1", payload = { n = 1 } },
          { type = "b" }, { type = "c", settled = true } }, { answer = "ids" })
        assert.is_true(pending)
        local read = store:read("s")
        assert.equal(4, #read)
        assert.same({ read[2].id, read[3].id, read[4].id }, ids)
        assert.equal("given-1", ids[1])
        for _, id in ipairs(ids) do assert.equal("string", type(id)) end
        -- a replay of the batch answers with the ids stored first, writes nothing
        local again = store:append("s", { { type = "a", id = "given-1", payload = { n = 1 } } }, { answer = "ids" })
        assert.same({ "given-1" }, again)
        assert.equal(4, store:head("s"))
        -- "events" is the default answer
        assert.equal("given-1", store:append("s", { { type = "a", id = "given-1", payload = { n = 1 } } },
          { answer = "events" })[1].id)
        -- the ids of a tenant's events, as its reads give them
        local ok, t = pcall(store.tenant, store, "acme")
        if ok then
          local tids = t:append("s", { { type = "t" }, { type = "t", id = "mine" } }, { answer = "ids" })
          assert.same({ t:read("s")[1].id, "mine" }, tids)
        end
        local empty, none = store:append("quiet", {}, { answer = "ids" })
        assert.same({}, empty)
        assert.is_false(none)
      end)

      it("refuses another opts.answer before writing anything", function()
        local store = new()
        local err = expect_error("INVALID_ARGUMENT", store.append, store, "s", { { type = "a" } }, { answer = "rows" })
        assert.truthy(tostring(err.message):find("opts.answer", 1, true), err.message)
        local ok, msg = pcall(store.append, store, "s", { { type = "a" } }, { answer = 5 })
        assert.is_false(ok)
        assert.truthy(tostring(msg):find("answer", 1, true), tostring(msg))
        assert.equal(0, store:head("s"))
      end)

      it("head is 0 for an unknown session and the last index otherwise", function()
        local store = new()
        assert.equal(0, store:head("nobody"))
        store:append("s", { { type = "a" }, { type = "b" } })
        assert.equal(2, store:head("s"))
        assert.equal("integer", math.type(store:head("s")))
        store:append("s", { { type = "c" } })
        assert.equal(3, store:head("s"))
        assert.equal(0, store:head("nobody"))
      end)

      it("returns every field of a stored event, the same from append and read", function()
        local store, clock = new()
        clock:set(T0 + 7)
        local stored, pending = store:append("s1", {
          { id = "e-1", type = "created", payload = { n = 1 }, lane = "L", not_before = T0 + 100 },
        })
        assert.is_true(pending)
        assert.equal(1, #stored)
        local e = stored[1]
        assert.equal("e-1", e.id)
        assert.equal("created", e.type)
        assert.same({ n = 1 }, e.payload)
        assert.equal(1, e.index)
        assert.equal("s1", e.session)
        assert.equal("integer", math.type(e.position))
        assert.is_true(e.position >= 1)
        assert.equal(T0 + 7, e.created_at)
        assert.equal("integer", math.type(e.created_at))
        assert.is_nil(e.cause)
        assert.equal("L", e.lane)
        assert.equal(T0 + 100, e.not_before)
        assert.equal("pending", e.status)
        assert.equal(0, e.attempts)
        assert.equal(0, e.failures)
        assert.is_nil(e.last_error)
        assert.is_nil(e.processed_at)
        assert.is_nil(e.claim_holder)
        assert.is_nil(e.claim_expires_at)
        assert.is_nil(e.retry_at)
        assert.equal(helpers.dump(e), helpers.dump(store:read("s1")[1]))
        assert.equal(helpers.dump(e), helpers.dump(store:read_all({})[1]))
      end)

      it("leaves lane and not_before nil when not given", function()
        local store = new()
        local e = store:append("s", { { type = "a" } })[1]
        assert.is_nil(e.lane)
        assert.is_nil(e.not_before)
        assert.is_nil(e.cause)
        local r = store:read("s")[1]
        assert.is_nil(r.lane)
        assert.is_nil(r.not_before)
      end)

      it("gives positions strictly increasing in commit order across sessions", function()
        local store = new()
        local got = {}
        for _, s in ipairs({ "a", "b", "a", "c", "b" }) do
          local stored = store:append(s, { { type = "x" }, { type = "y" } })
          for _, e in ipairs(stored) do got[#got + 1] = e end
        end
        for i = 2, #got do
          assert.is_true(got[i].position > got[i - 1].position,
            ("position %d not after %d"):format(got[i].position, got[i - 1].position))
        end
        local all = store:read_all({})
        assert.equal(#got, #all)
        for i = 1, #got do
          assert.equal(got[i].id, all[i].id)
          assert.equal(got[i].position, all[i].position)
        end
      end)

      it("generates ids in UUIDv7 form when none is given", function()
        local store = new()
        local stored = store:append("s", { { type = "a" }, { type = "b" } })
        for _, e in ipairs(stored) do
          assert.equal("string", type(e.id))
          assert.equal(36, #e.id)
          assert.truthy(e.id:match("^%x%x%x%x%x%x%x%x%-%x%x%x%x%-7%x%x%x%-[89abAB]%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"),
            "not a UUIDv7: " .. e.id)
        end
      end)

      it("generates unique ids", function()
        local store = new()
        local batch = {}
        for i = 1, 200 do batch[i] = { type = "t" } end
        local seen = {}
        for _ = 1, 3 do
          for _, e in ipairs(store:append("s", batch)) do
            assert.is_nil(seen[e.id], "duplicate id " .. e.id)
            seen[e.id] = true
          end
        end
      end)

      it("generates time-ordered ids", function()
        local store, clock = new()
        local ids = {}
        for i = 1, 30 do
          clock:advance(1)
          ids[i] = store:append("s" .. (i % 3), { { type = "t" } })[1].id
        end
        for i = 2, #ids do
          assert.is_true(ids[i - 1]:lower() < ids[i]:lower(),
            ("id %s generated later sorts before %s"):format(ids[i], ids[i - 1]))
        end
      end)

      it("keeps a supplied id", function()
        local store = new()
        local e = store:append("s", { { id = "my-own-id", type = "t" } })[1]
        assert.equal("my-own-id", e.id)
        assert.equal("my-own-id", store:read("s")[1].id)
      end)

      it("accepts an id of 255 bytes and rejects 256 bytes, an empty id and invalid UTF-8", function()
        local store = new()
        local e = store:append("s", { { id = string.rep("i", 255), type = "t" } })[1]
        assert.equal(string.rep("i", 255), e.id)
        rejects("INVALID_ARGUMENT", store, "s", { { id = string.rep("j", 256), type = "t" } })
        rejects("INVALID_ARGUMENT", store, "s", { { id = "", type = "t" } })
        rejects("INVALID_ARGUMENT", store, "s", { { id = "bad\xff", type = "t" } })
        assert.equal(1, store:head("s"))
      end)

      it("rejects an empty type or one over 255 bytes with INVALID_ARGUMENT", function()
        local store = new()
        rejects("INVALID_ARGUMENT", store, "s", { { type = "" } })
        rejects("INVALID_ARGUMENT", store, "s", { { type = "ok" }, { type = "" } })
        rejects("INVALID_ARGUMENT", store, "s", { { type = string.rep("t", 256) } })
        assert.equal(0, store:head("s"))
        store:append("s", { { type = string.rep("t", 255) } })
        assert.equal(1, store:head("s"))
      end)

      it("rejects an empty lane with INVALID_ARGUMENT", function()
        local store = new()
        rejects("INVALID_ARGUMENT", store, "s", { { type = "t", lane = "" } })
        rejects("INVALID_ARGUMENT", store, "s", { { type = "t", lane = string.rep("l", 256) } })
        assert.equal(0, store:head("s"))
      end)

      it("takes created_at from the injected manual clock", function()
        local store, clock = new()
        local a = store:append("s", { { type = "a" } })[1]
        assert.equal(T0, a.created_at)
        clock:advance(250)
        local b = store:append("s", { { type = "b" }, { type = "c" } })
        assert.equal(T0 + 250, b[1].created_at)
        assert.equal(T0 + 250, b[2].created_at)
        clock:set(T0 + 5000)
        local c = store:append("t", { { type = "d" } })[1]
        assert.equal(T0 + 5000, c.created_at)
        assert.equal(T0, store:read("s")[1].created_at)
      end)

      it("accepts a plain function as the clock", function()
        local t = 42000
        local store = helpers.open(url, { clock = function() return t end })
        assert.equal(42000, store:append("s", { { type = "a" } })[1].created_at)
        t = 43000
        assert.equal(43000, store:append("s", { { type = "b" } })[1].created_at)
      end)

      it("stores settled = true events as processed and never dispatches them", function()
        local store, clock = new()
        clock:set(T0 + 3)
        local stored, pending = store:append("s", { { type = "done", settled = true } })
        assert.is_false(pending)
        local e = stored[1]
        assert.equal("processed", e.status)
        assert.equal(T0 + 3, e.processed_at)
        assert.equal(0, e.attempts)
        assert.equal("processed", store:read("s")[1].status)
        assert.equal("settled", claim(store, "s").outcome)
        local next_events = store:claim_next({ holder = "w", ttl_ms = 1000, limit = 10 })
        assert.same({}, next_events)
      end)

      it("reports pending: whether the session has a pending event after the call", function()
        local store = new()
        local _, p1 = store:append("s", { { type = "settled", settled = true } })
        assert.is_false(p1)
        local _, p2 = store:append("s", { { type = "work" } })
        assert.is_true(p2)
        local _, p3 = store:append("s", { { type = "more", settled = true } })
        assert.is_true(p3) -- event 2 is still pending
        local _, p4 = store:append("other", { { type = "x", settled = true } })
        assert.is_false(p4) -- pending is per session
        local c = claim(store, "s")
        store:complete("s", c.events[1].index, c.events[1].attempt, {})
        local _, p5 = store:append("s", { { type = "after", settled = true } })
        assert.is_false(p5)
      end)

      it("does not count a dead letter as pending", function()
        local store = new()
        store:append("s", { { type = "work" } })
        local c = claim(store, "s")
        store:fail("s", 1, c.events[1].attempt, { error = "boom", max_failures = 1 })
        local _, pending = store:append("s", { { type = "note", settled = true } })
        assert.is_false(pending)
      end)

      it("returns {} for an empty batch and writes nothing", function()
        local store = new()
        local stored, pending = store:append("s", {})
        assert.same({}, stored)
        assert.is_false(pending)
        assert.equal(0, store:head("s"))
        assert.same({}, store:read_all({}))
        store:append("s", { { type = "a" } })
        local before = helpers.log_state(store)
        local stored2, pending2 = store:append("s", {})
        assert.same({}, stored2)
        assert.is_true(pending2)
        assert.equal(1, store:head("s"))
        assert.equal(before, helpers.log_state(store))
      end)

      it("reads with after, through and limit", function()
        local store = new()
        local batch = {}
        for i = 1, 6 do batch[i] = { type = "t" .. i } end
        store:append("s", batch)
        assert.same({ 1, 2, 3, 4, 5, 6 }, indexes(store:read("s")))
        assert.same({ 1, 2, 3, 4, 5, 6 }, indexes(store:read("s", {})))
        assert.same({ 3, 4, 5, 6 }, indexes(store:read("s", { after = 2 })))
        assert.same({ 1, 2, 3 }, indexes(store:read("s", { through = 3 })))
        assert.same({ 1, 2 }, indexes(store:read("s", { limit = 2 })))
        assert.same({ 2, 3 }, indexes(store:read("s", { after = 1, through = 4, limit = 2 })))
        assert.same({ 2, 3, 4 }, indexes(store:read("s", { after = 1, through = 4 })))
        assert.same({ 5, 6 }, indexes(store:read("s", { after = 4, limit = 10 })))
        assert.same({}, store:read("s", { after = 6 }))
        assert.same({}, store:read("s", { after = 3, through = 3 }))
        assert.same({ 5, 6 }, indexes(store:read("s", { after = 4, through = 100 })))
        assert.equal("t4", store:read("s", { after = 3, limit = 1 })[1].type)
      end)

      it("reads {} from an unknown session", function()
        local store = new()
        store:append("s", { { type = "a" } })
        assert.same({}, store:read("unknown"))
        assert.same({}, store:read("unknown", { after = 0, limit = 5 }))
      end)

      it("read_all returns every event in position order, with after and limit", function()
        local store = new()
        store:append("a", { { type = "a1" } })
        store:append("b", { { type = "b1" }, { type = "b2" } })
        store:append("a", { { type = "a2" } })
        local all = store:read_all({})
        assert.same({ "a1", "b1", "b2", "a2" }, helpers.pluck(all, "type"))
        assert.same({ "a", "b", "b", "a" }, helpers.pluck(all, "session"))
        assert.same(helpers.pluck(all, "type"), helpers.pluck(store:read_all({ after = 0 }), "type"))
        local rest = store:read_all({ after = all[2].position })
        assert.same({ "b2", "a2" }, helpers.pluck(rest, "type"))
        assert.same({ "a1", "b1" }, helpers.pluck(store:read_all({ limit = 2 }), "type"))
        assert.same({ "b2" }, helpers.pluck(store:read_all({ after = all[2].position, limit = 1 }), "type"))
        assert.same({}, store:read_all({ after = all[4].position }))
      end)

      it("read_all of an empty store is {}", function()
        local store = new()
        assert.same({}, store:read_all({}))
      end)

      it("stores and returns lane and not_before", function()
        local store = new()
        local stored = store:append("s", {
          { type = "a", lane = "cart" },
          { type = "b", not_before = T0 + 5000 },
        })
        assert.equal("cart", stored[1].lane)
        assert.equal(T0 + 5000, stored[2].not_before)
        local r = store:read("s")
        assert.equal("cart", r[1].lane)
        assert.is_nil(r[1].not_before)
        assert.is_nil(r[2].lane)
        assert.equal(T0 + 5000, r[2].not_before)
      end)

      it("accepts a batch of 10,000 events and rejects 10,001 with TOO_LARGE", function()
        local store = new()
        local batch = {}
        for i = 1, 10001 do batch[i] = { type = "t" } end
        rejects("TOO_LARGE", store, "s", batch)
        assert.equal(0, store:head("s"))
        batch[10001] = nil
        local stored = store:append("s", batch)
        assert.equal(10000, #stored)
        assert.equal(10000, store:head("s"))
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.1 batch idempotency", function()
      it("a full replay writes nothing and returns the originals", function()
        local store, clock = new()
        local first = store:append("s", {
          { id = "A", type = "t", payload = { n = 1 } },
          { id = "B", type = "u", payload = json.array({ 1, 2 }) },
        })
        clock:advance(1000)
        local before = helpers.log_state(store)
        local again, pending = store:append("s", {
          { id = "A", type = "t", payload = { n = 1 } },
          { id = "B", type = "u", payload = json.array({ 1, 2 }) },
        })
        assert.is_true(pending)
        assert.equal(before, helpers.log_state(store))
        assert.equal(2, store:head("s"))
        assert.same({ "A", "B" }, helpers.pluck(again, "id"))
        assert.same({ 1, 2 }, indexes(again))
        for i = 1, 2 do
          assert.equal(first[i].position, again[i].position)
          assert.equal(T0, again[i].created_at)
          assert.equal("s", again[i].session)
        end
      end)

      it("a replay returns the originals in the batch's order", function()
        local store = new()
        store:append("s", { { id = "A", type = "t" }, { id = "B", type = "t" }, { id = "C", type = "t" } })
        local again = store:append("s", { { id = "C", type = "t" }, { id = "A", type = "t" }, { id = "B", type = "t" } })
        assert.same({ "C", "A", "B" }, helpers.pluck(again, "id"))
        assert.same({ 3, 1, 2 }, indexes(again))
        assert.equal(3, store:head("s"))
      end)

      it("a replay of part of an earlier batch (every id stored) is a replay", function()
        local store = new()
        store:append("s", { { id = "A", type = "t" }, { id = "B", type = "t" } })
        local again = store:append("s", { { id = "B", type = "t" } })
        assert.same({ 2 }, indexes(again))
        assert.equal(2, store:head("s"))
      end)

      it("a full replay returns the originals even when expected no longer matches", function()
        local store = new()
        store:append("s", { { id = "A", type = "t" } }, { expected = 0 })
        store:append("s", { { id = "B", type = "t" } })
        local again = store:append("s", { { id = "A", type = "t" } }, { expected = 0 })
        assert.same({ "A" }, helpers.pluck(again, "id"))
        assert.equal(1, again[1].index)
        assert.equal(2, store:head("s"))
      end)

      it("a full replay of a caused event returns the original after its attempt lost ownership", function()
        local store = new()
        store:append("s", { { type = "work" } })
        local c = claim(store, "s")
        store:append("s", { { id = "R", type = "reply", cause = { index = 1, attempt = c.events[1].attempt } } })
        store:fail("s", 1, c.events[1].attempt, { error = "later failure" })
        local again = store:append("s", { { id = "R", type = "reply", cause = { index = 1, attempt = 1 } } })
        assert.same({ "R" }, helpers.pluck(again, "id"))
        assert.equal(2, again[1].index)
        assert.equal(2, store:head("s"))
      end)

      it("a replay whose type differs is ID_CONFLICT", function()
        local store = new()
        store:append("s", { { id = "A", type = "t", payload = 1 }, { id = "B", type = "t", payload = 2 } })
        rejects("ID_CONFLICT", store, "s", { { id = "A", type = "t", payload = 1 }, { id = "B", type = "other", payload = 2 } })
        assert.equal(2, store:head("s"))
      end)

      it("a replay whose payload differs is ID_CONFLICT", function()
        local store = new()
        store:append("s", { { id = "A", type = "t", payload = { n = 1 } } })
        rejects("ID_CONFLICT", store, "s", { { id = "A", type = "t", payload = { n = 2 } } })
        rejects("ID_CONFLICT", store, "s", { { id = "A", type = "t", payload = { n = 1, m = 0 } } })
        rejects("ID_CONFLICT", store, "s", { { id = "A", type = "t" } })
        assert.equal(1, store:head("s"))
      end)

      it("an integer and the equal float are different payloads (ID_CONFLICT)", function()
        local store = new()
        store:append("s", { { id = "A", type = "t", payload = 1 } })
        rejects("ID_CONFLICT", store, "s", { { id = "A", type = "t", payload = 1.0 } })
        store:append("s", { { id = "B", type = "t", payload = json.array({}) } })
        rejects("ID_CONFLICT", store, "s", { { id = "B", type = "t", payload = {} } })
      end)

      it("a replay with the same payload built differently is a replay", function()
        local store = new()
        local p1 = {}
        p1.b = 2; p1.a = json.array({ 1, 2 }); p1.c = { y = 1, x = 2 }
        store:append("s", { { id = "A", type = "t", payload = p1 } })
        local p2 = { c = { x = 2, y = 1 }, a = json.array({ 1, 2 }), b = 2 }
        local again = store:append("s", { { id = "A", type = "t", payload = p2 } })
        assert.equal(1, again[1].index)
        assert.equal(1, store:head("s"))
      end)

      it("a batch repeating a fresh id is PARTIAL_DUPLICATE_BATCH", function()
        local store = new()
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "X", type = "t" }, { id = "X", type = "t" } })
        assert.equal(0, store:head("s"))
      end)

      it("a batch repeating a stored id is PARTIAL_DUPLICATE_BATCH", function()
        local store = new()
        store:append("s", { { id = "A", type = "t" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "A", type = "t" }, { id = "A", type = "t" } })
        assert.equal(1, store:head("s"))
      end)

      it("a batch mixing stored and fresh ids is PARTIAL_DUPLICATE_BATCH", function()
        local store = new()
        store:append("s", { { id = "A", type = "t" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "A", type = "t" }, { id = "NEW", type = "t" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "NEW", type = "t" }, { id = "A", type = "t" } })
        -- an event without an id is fresh too
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "A", type = "t" }, { type = "t" } })
        assert.equal(1, store:head("s"))
        -- and the fresh id was not written: it can be appended now
        assert.equal(2, store:append("s", { { id = "NEW", type = "t" } })[1].index)
      end)

      it("reusing an id of another session is PARTIAL_DUPLICATE_BATCH", function()
        local store = new()
        store:append("a", { { id = "A", type = "t" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "b", { { id = "A", type = "t" } })
        store:append("b", { { id = "B", type = "t" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "b", { { id = "B", type = "t" }, { id = "A", type = "t" } })
        assert.equal(1, store:head("b"))
        assert.equal(1, store:head("a"))
      end)

      it("a batch that is no whole replay is PARTIAL_DUPLICATE_BATCH even when a stored id differs, in any order", function()
        local store = new()
        store:append("s", { { id = "A", type = "t" } })
        store:append("o", { { id = "B", type = "t" } })
        -- A changed beside a fresh id, or beside another session's id: the
        -- batch is no replay, whichever event comes first
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "A", type = "X" }, { id = "NEW", type = "t" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "NEW", type = "t" }, { id = "A", type = "X" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "A", type = "X" }, { id = "B", type = "t" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "B", type = "t" }, { id = "A", type = "X" } })
        rejects("PARTIAL_DUPLICATE_BATCH", store, "s", { { id = "A", type = "X" }, { type = "t" } })
        -- every id stored here: a replay, which the change makes ID_CONFLICT
        rejects("ID_CONFLICT", store, "s", { { id = "A", type = "X" } })
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.1 expected head", function()
      it("appends when the head equals expected", function()
        local store = new()
        local a = store:append("s", { { type = "a" } }, { expected = 0 })
        assert.equal(1, a[1].index)
        local b = store:append("s", { { type = "b" }, { type = "c" } }, { expected = 1 })
        assert.same({ 2, 3 }, indexes(b))
      end)

      it("raises WRONG_EXPECTED_HEAD and writes nothing when it does not", function()
        local store = new()
        rejects("WRONG_EXPECTED_HEAD", store, "s", { { type = "a" } }, { expected = 1 })
        assert.equal(0, store:head("s"))
        store:append("s", { { type = "a" }, { type = "b" } })
        rejects("WRONG_EXPECTED_HEAD", store, "s", { { type = "c" } }, { expected = 1 })
        rejects("WRONG_EXPECTED_HEAD", store, "s", { { type = "c" } }, { expected = 3 })
        rejects("WRONG_EXPECTED_HEAD", store, "s", { { type = "c" } }, { expected = 0 })
        assert.equal(2, store:head("s"))
        store:append("s", { { type = "c" } }, { expected = 2 })
        assert.equal(3, store:head("s"))
      end)

      it("checks expected per session", function()
        local store = new()
        store:append("a", { { type = "x" }, { type = "y" } })
        assert.equal(1, store:append("b", { { type = "x" } }, { expected = 0 })[1].index)
      end)
    end)

    -------------------------------------------------------------------------
    describe("§3.1 attempt fence (cause)", function()
      local function setup()
        local store, clock = new()
        store:append("s", { { type = "work" } })
        return store, clock
      end

      it("accepts a cause whose attempt owns the event and stores the cause", function()
        local store = setup()
        local c = claim(store, "s")
        assert.equal(1, c.events[1].attempt)
        local stored = store:append("s", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        assert.same({ index = 1, attempt = 1 }, stored[1].cause)
        assert.same({ index = 1, attempt = 1 }, store:read("s")[2].cause)
        -- appending with a cause does not complete or release the event
        local e = store:read("s")[1]
        assert.equal("pending", e.status)
        assert.equal("w1", e.claim_holder)
      end)

      it("accepts a cause while the attempt owns an expired claim nobody re-took", function()
        local store, clock = setup()
        claim(store, "s", { ttl_ms = 100 })
        clock:advance(5000)
        local stored = store:append("s", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        assert.equal(2, stored[1].index)
      end)

      it("raises SUPERSEDED_ATTEMPT once another claim started a new attempt", function()
        local store, clock = setup()
        claim(store, "s", { ttl_ms = 100 })
        clock:advance(100)
        local c2 = claim(store, "s", { holder = "w2" })
        assert.equal(2, c2.events[1].attempt)
        rejects("SUPERSEDED_ATTEMPT", store, "s", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        local err = expect_error("SUPERSEDED_ATTEMPT", function()
          return store:append("s", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        end)
        assert.equal("attempt 1 no longer owns event 1 in session 's'", err.message)
        local ok = store:append("s", { { type = "reply", cause = { index = 1, attempt = 2 } } })
        assert.equal(2, ok[1].index)
      end)

      it("raises SUPERSEDED_ATTEMPT after the attempt failed", function()
        local store = setup()
        claim(store, "s")
        assert.equal("failed", store:fail("s", 1, 1, { error = "boom", max_failures = 5 }).outcome)
        rejects("SUPERSEDED_ATTEMPT", store, "s", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        assert.equal(1, store:head("s"))
      end)

      it("raises SUPERSEDED_ATTEMPT after the attempt was dead-lettered", function()
        local store = setup()
        claim(store, "s")
        assert.equal("dead_lettered", store:fail("s", 1, 1, { error = "boom", max_failures = 1 }).outcome)
        rejects("SUPERSEDED_ATTEMPT", store, "s", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        assert.equal(1, store:head("s"))
      end)

      it("raises SUPERSEDED_ATTEMPT after the attempt completed", function()
        local store = setup()
        claim(store, "s")
        store:complete("s", 1, 1, {})
        rejects("SUPERSEDED_ATTEMPT", store, "s", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        assert.equal(1, store:head("s"))
      end)

      it("raises SUPERSEDED_ATTEMPT for an attempt that never started", function()
        local store = setup()
        rejects("SUPERSEDED_ATTEMPT", store, "s", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        claim(store, "s")
        rejects("SUPERSEDED_ATTEMPT", store, "s", { { type = "reply", cause = { index = 1, attempt = 2 } } })
        assert.equal(1, store:head("s"))
      end)

      it("raises NO_SUCH_EVENT for a cause index that does not exist", function()
        local store = setup()
        claim(store, "s")
        rejects("NO_SUCH_EVENT", store, "s", { { type = "reply", cause = { index = 7, attempt = 1 } } })
        rejects("NO_SUCH_EVENT", store, "other", { { type = "reply", cause = { index = 1, attempt = 1 } } })
        assert.equal(1, store:head("s"))
        assert.equal(0, store:head("other"))
      end)

      it("rejects a whole batch when one cause is superseded", function()
        local store, clock = setup()
        store:append("s", { { type = "work2" } })
        claim(store, "s", { ttl_ms = 100 })
        clock:advance(100)
        claim(store, "s", { holder = "w2", exclude = { 2 } }) -- event 1 now at attempt 2
        rejects("SUPERSEDED_ATTEMPT", store, "s", {
          { type = "r1", cause = { index = 2, attempt = 1 } },
          { type = "r2", cause = { index = 1, attempt = 1 } },
        })
        assert.equal(2, store:head("s"))
      end)
    end)
  end)
end
