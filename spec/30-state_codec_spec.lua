-- 30-state_codec_spec.lua: the exact reducer-state codec (core/bridge/state.h,
-- docs/state-codec.md; docs/contract.md §4 "reducer state round-trips exactly").
--
-- Round trips of every kind of value the codec keeps (checking number
-- subtypes, bit patterns of floats, every string byte, key types, the
-- json.null sentinel and the json array mark), every refusal (an
-- INVALID_ARGUMENT error object naming the offending path), and hostile
-- bytes (truncations, mutations, random input, bombs): always a clean
-- INVALID_ARGUMENT, never a crash; and what decodes re-encodes to exactly
-- the same bytes (the format is canonical).

local es_ok, es = pcall(require, "eventstore")
local state = (es_ok and es.state) or require("eventstore_state")
local json = (es_ok and es.json) or require("eventstore.core").json

local encode, decode = state.encode, state.decode

-- Bit-exact float comparison (NaN payloads, -0.0).
local function bits(x) return string.pack("<d", x) end

-- Deep equality that also compares number subtypes, float bits and
-- metatables (the array mark).
local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) == "number" then
    if math.type(a) ~= math.type(b) then return false end
    if math.type(a) == "float" then return bits(a) == bits(b) end
    return a == b
  end
  if type(a) ~= "table" then return a == b end
  if getmetatable(a) ~= getmetatable(b) then return false end
  for k, v in pairs(a) do
    if not same(v, rawget(b, k)) then return false end
  end
  for k in pairs(b) do
    if rawget(a, k) == nil then return false end
  end
  return true
end

local function roundtrip(v)
  local bytes = encode(v)
  assert.are.equal("string", type(bytes))
  local back = decode(bytes)
  assert.is_true(same(v, back), "value changed in the round trip")
  -- Canonical: the restored value encodes to the same bytes.
  assert.are.equal(bytes, encode(back))
  return back, bytes
end

-- Asserts that f(...) raises an INVALID_ARGUMENT error object whose message
-- contains every given plain string; returns the message.
local function invalid(needles, f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok, "expected an INVALID_ARGUMENT error")
  assert.are.equal("table", type(e), "not an error object: " .. tostring(e))
  assert.are.equal("INVALID_ARGUMENT", e.code, tostring(e))
  assert.are.equal("string", type(e.message))
  assert.are.equal("INVALID_ARGUMENT: " .. e.message, tostring(e))
  for _, needle in ipairs(needles) do
    assert.truthy(e.message:find(needle, 1, true), ("message %q does not contain %q"):format(e.message, needle))
  end
  return e.message
end

local function hex(s)
  return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

-- A value with a bit of everything, for the corruption tests.
local function rich_value()
  return {
    1, 2.5, "three", true, false, json.null, { nested = { deeper = { -7 } } },
    name = "cart\0\255",
    n = 0 / 0,
    z = -0.0,
    big = math.maxinteger,
    small = math.mininteger,
    [1.5] = "float key",
    [-3] = "negative key",
    [true] = "yes",
    [false] = "no",
    arr = json.array({ 1, "two", json.null }),
    empty = {},
    [300] = 70000,
  }
end

describe("state codec: round trips", function()
  it("keeps nil and booleans", function()
    assert.is_nil(decode(encode(nil)))
    assert.are.equal(1, select("#", decode(encode(nil))))
    assert.is_true(decode(encode(true)))
    assert.is_false(decode(encode(false)))
  end)

  it("keeps integers as integers at every width boundary", function()
    local values = {
      0, 1, -1, 127, 128, -128, -129, 255, 256, 32767, 32768, -32768, -32769,
      65535, 65536, 2147483647, 2147483648, -2147483648, -2147483649,
      4294967296, 9007199254740993, math.maxinteger, math.mininteger,
    }
    for _, v in ipairs(values) do
      local back = decode(encode(v))
      assert.are.equal("integer", math.type(back), tostring(v))
      assert.are.equal(v, back)
    end
  end)

  it("uses the smallest integer width", function()
    assert.are.equal(3, #encode(0))            -- version, tag, 1 byte
    assert.are.equal(3, #encode(-128))
    assert.are.equal(4, #encode(128))
    assert.are.equal(6, #encode(32768))
    assert.are.equal(10, #encode(2147483648))
  end)

  it("keeps floats as floats, bit for bit", function()
    local values = {
      3.0, 0.0, -0.0, 0.1, -2.5, 1e300, -1e-300, 4.9e-324, 2.0 ^ 53, 2.0 ^ 63, -(2.0 ^ 63),
      math.huge, -math.huge, math.pi, 1 / 3,
    }
    for _, v in ipairs(values) do
      local back = decode(encode(v))
      assert.are.equal("float", math.type(back), tostring(v))
      assert.are.equal(bits(v), bits(back))
    end
    assert.are.equal("float", math.type(decode(encode(3.0))))
    assert.are.equal(3.0, decode(encode(3.0)))
  end)

  it("keeps NaN (with its payload) and -0.0", function()
    local nan = 0 / 0
    local back = decode(encode(nan))
    assert.is_true(back ~= back)
    assert.are.equal(bits(nan), bits(back))
    local other = string.unpack("<d", "\1\0\0\0\0\0\248\127") -- a NaN with a payload
    assert.are.equal(bits(other), bits(decode(encode(other))))
    local z = decode(encode(-0.0))
    assert.are.equal(-math.huge, 1 / z)
    assert.are.equal(math.huge, 1 / decode(encode(0.0)))
  end)

  it("keeps every byte of strings", function()
    local all = {}
    for i = 0, 255 do all[#all + 1] = string.char(i) end
    all = table.concat(all)
    for _, s in ipairs({ "", "\0", "a\0b", all, all:reverse(), "\255\254\192\128", "\237\160\128", ("x"):rep(1 << 20) }) do
      local back = decode(encode(s))
      assert.are.equal(#s, #back)
      assert.are.equal(s, back)
    end
  end)

  it("keeps tables with integer, float, string and boolean keys", function()
    roundtrip({})
    roundtrip({ 1, 2, 3 })
    roundtrip({ 1, nil, 3 })                               -- a hole
    roundtrip({ [0] = "zero", [-1] = "minus", [2] = "two" }) -- no array part
    roundtrip({ [math.maxinteger] = 1, [math.mininteger] = 2 })
    roundtrip({ [1.5] = "a", [-0.25] = "b", [math.huge] = "inf", [-math.huge] = "-inf", [1e300] = 1 })
    roundtrip({ [true] = 1, [false] = 0 })
    roundtrip({ ["\0"] = 1, [""] = 2, ["\255"] = 3, a = { b = { c = "d" } } })
    roundtrip({ [1] = 1, [2] = 2, [10] = 10, x = 1, [2.5] = 2.5, [true] = true })
    local back = roundtrip({ [3.0] = "was a float key" })   -- Lua made it an integer key
    assert.are.equal("was a float key", back[3])
    local t = decode(encode({ [1.5] = 1, [2] = 2 }))
    for k in pairs(t) do
      if k == 1.5 then assert.are.equal("float", math.type(k)) else assert.are.equal("integer", math.type(k)) end
    end
  end)

  it("keeps nested tables and mixed values", function()
    local v = rich_value()
    local back = roundtrip(v)
    assert.is_true(back.n ~= back.n)
    assert.are.equal(-math.huge, 1 / back.z)
    assert.are.equal("integer", math.type(back[7].nested.deeper[1]))
  end)

  it("keeps json.null as a value and as a key", function()
    local back = roundtrip({ json.null, a = json.null, [json.null] = "null key" })
    assert.are.equal(json.null, back[1])
    assert.are.equal(json.null, back.a)
    assert.are.equal("null key", back[json.null])
    assert.are.equal(json.null, decode(encode(json.null)))
  end)

  it("keeps the json array mark", function()
    local mark = getmetatable(json.array({}))
    assert.is_table(mark)
    local back = roundtrip(json.array({ 1, 2, json.array({}), {} }))
    assert.are.equal(mark, getmetatable(back))
    assert.is_true(json.is_array(back))
    assert.is_true(json.is_array(back[3]))
    assert.is_false(json.is_array(back[4]))
    assert.is_nil(getmetatable(back[4]))
    -- What json.decode produces survives too (arrays marked, objects not).
    local from_json = json.decode('{"list":[1,2.0,null,{"a":[]}],"obj":{}}')
    local b2 = roundtrip(from_json)
    assert.is_true(json.is_array(b2.list))
    assert.is_true(json.is_array(b2.list[4].a))
    assert.are.equal(json.encode(from_json), json.encode(b2))
    -- A marked empty array and an unmarked empty table differ.
    assert.are_not.equal(encode(json.array({})), encode({}))
  end)

  it("keeps large tables", function()
    local arr, map = {}, {}
    for i = 1, 100000 do arr[i] = i % 3 == 0 and i * 0.5 or i end
    for i = 1, 50000 do map["k" .. i] = i; map[-i] = "v" .. i end
    local back = roundtrip({ arr = arr, map = map })
    assert.are.equal(100000, #back.arr)
    assert.are.equal("float", math.type(back.arr[3]))
    assert.are.equal("v777", back.map[-777])
  end)

  it("accepts nesting up to the limit", function()
    local depth = state.max_depth or 200
    local root = {}
    local t = root
    for _ = 2, depth do
      t.x = {}
      t = t.x
    end
    t.leaf = "bottom"
    local back = roundtrip(root)
    for _ = 2, depth do back = back.x end
    assert.are.equal("bottom", back.leaf)
  end)

  it("encodes a table shared without a cycle twice (sharing is not kept)", function()
    local shared = { 1, 2 }
    local back = roundtrip({ a = shared, b = shared, list = { shared, shared } })
    assert.are_not.equal(back.a, back.b)
    assert.is_true(same(back.a, back.b))
    assert.is_true(same(back.list[1], shared))
  end)

  it("is deterministic: equal values give equal bytes, whatever the insertion order", function()
    local a, b = {}, {}
    for i = 1, 500 do a["k" .. i] = i; a[i * 1.5] = i end
    for i = 500, 1, -1 do b[i * 1.5] = i; b["k" .. i] = i end
    assert.are.equal(encode(a), encode(b))
    -- Removing and re-adding keys (which changes the table's internal
    -- layout) does not change the bytes either.
    for i = 1, 250 do b["k" .. i] = nil end
    for i = 1, 250 do b["k" .. i] = i end
    assert.are.equal(encode(a), encode(b))
  end)

  it("starts with the format version and leaves the value alone", function()
    local v = { 1, x = { 2 } }
    local bytes = encode(v)
    assert.are.equal(state.format_version or 1, bytes:byte(1))
    assert.are.equal(2, v.x[1])
    assert.are.equal(bytes, encode(v))
  end)

  it("restores into another Lua state", function()
    -- The bytes do not depend on the encoding state: a subprocess (a fresh
    -- lua_State in a fresh process) decodes what this one encoded.
    local v = rich_value()
    local bytes = encode(v)
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
    local cmd = ([[lua5.4 -e 'package.path = %q; package.cpath = %q
      local ok, es = pcall(require, "eventstore")
      local st = (ok and es.state) or require("eventstore_state")
      local f = io.open(%q, "rb"); local b = f:read("a"); f:close()
      local v = st.decode(b)
      assert(math.type(v.big) == "integer" and v.n ~= v.n and 1 / v.z == -math.huge)
      assert(st.encode(v) == b)
      io.write("same")']]):format(package.path, package.cpath, path)
    local p = io.popen(cmd .. " 2>&1")
    local out = p:read("a")
    p:close()
    os.remove(path)
    assert.are.equal("same", out)
  end)
end)

describe("state codec: refusals name the offending path", function()
  it("refuses functions, userdata and threads", function()
    invalid({ "state: ", "function" }, encode, print)
    invalid({ "state.items[3].cb", "function" }, encode, { items = { 1, 2, { cb = function() end } } })
    invalid({ "state.f", "userdata" }, encode, { f = io.stdout })
    invalid({ "state.co", "thread" }, encode, { co = coroutine.create(function() end) })
    invalid({ 'state["odd key"][2]', "function" }, encode, { ["odd key"] = { 1, print } })
    invalid({ "state[1.5]", "function" }, encode, { [1.5] = print })
    invalid({ "state[true]", "function" }, encode, { [true] = print })
    invalid({ "state[-4]", "thread" }, encode, { [-4] = coroutine.running() })
  end)

  it("names the root as told", function()
    invalid({ "state of reducer 'cart'.items.cb" }, encode, { items = { cb = print } }, "state of reducer 'cart'")
  end)

  it("refuses tables with a metatable other than the array mark, and says so", function()
    invalid({ "state.obj", "metatable" }, encode, { obj = setmetatable({}, {}) })
    invalid({ "state", "metatable" }, encode, setmetatable({}, { __index = function() end }))
    -- A metatable that merely looks like the mark is not the mark.
    invalid({ "metatable" }, encode, setmetatable({}, { __name = "eventstore.json.array" }))
  end)

  it("refuses keys that are tables, functions or other non-scalars", function()
    invalid({ "state.m", "table key" }, encode, { m = { [{}] = 1 } })
    invalid({ "state", "function key" }, encode, { [print] = 1 })
    invalid({ "state", "thread key" }, encode, { [coroutine.create(print)] = 1 })
    invalid({ "state", "userdata key" }, encode, { [io.stdout] = 1 })
  end)

  it("refuses cycles, naming where the table repeats", function()
    local t = {}
    t.self = t
    invalid({ "state.self", "cycle" }, encode, t)
    local a = { b = { c = {} } }
    a.b.c.back = a.b
    invalid({ "state.b.c.back", "cycle", "ancestor state.b" }, encode, a)
    local arr = { 1, 2, {} }
    arr[3][1] = arr
    invalid({ "state[3][1]", "cycle" }, encode, arr)
    -- A cycle through a value that is also a key is refused as a key first.
    local k = {}
    invalid({ "table key" }, encode, { [k] = k })
  end)

  it("refuses nesting deeper than the limit", function()
    local depth = state.max_depth or 200
    local root = {}
    local t = root
    for _ = 1, depth do
      t.x = {}
      t = t.x
    end
    local msg = invalid({ "state.x.x", "deeper than " .. depth }, encode, root)
    assert.truthy(#msg < 512)
  end)

  it("keeps messages readable for long paths and binary keys", function()
    local root = {}
    local t = root
    for i = 1, 60 do
      local key = ("k%d_"):format(i) .. ("z"):rep(30)
      t[key] = {}
      t = t[key]
    end
    t["\0bin\255"] = print
    local msg = invalid({ "state.k1_", "...", '["\\x00bin\\xff"]', "cannot encode a function" }, encode, root)
    assert.truthy(#msg < 512)
  end)

  it("leaves nothing behind after a refusal", function()
    -- A refusal deep inside a value is refused every time, and leaves no
    -- trace: the tables it had entered (marked against cycles) are not
    -- taken for a cycle afterwards, even reached twice.
    local inner = { deeper = { x = print } }
    local value = { 1, 2, inner }
    for _ = 1, 100 do
      invalid({ "cannot encode a function" }, encode, value)
    end
    inner.deeper.x = nil
    assert.are.same({ 1, 2, { deeper = {} } }, decode(encode(value)))
    local twice = decode(encode({ a = inner, b = inner }))
    assert.are.same({ deeper = {} }, twice.a)
    assert.are.same({ deeper = {} }, twice.b)
    assert.are.same({ 1, 2 }, decode(encode({ 1, 2 })))
  end)

  it("checks its arguments", function()
    local ok, e = pcall(decode, 42)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("bad argument", 1, true))
    ok, e = pcall(decode)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("bad argument", 1, true))
    ok, e = pcall(encode)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("bad argument", 1, true))
  end)
end)

describe("state codec: hostile bytes", function()
  local V = string.char(state.format_version or 1)

  -- Either a clean INVALID_ARGUMENT, or a value that re-encodes to exactly
  -- the same bytes (the decoder accepts only canonical encodings).
  local function check_bytes(b)
    local ok, v = pcall(decode, b)
    if ok then
      assert.are.equal(hex(b), hex(encode(v)))
    else
      assert.are.equal("table", type(v), tostring(v))
      assert.are.equal("INVALID_ARGUMENT", v.code, tostring(v))
    end
    return ok
  end

  it("refuses bad versions, empty input, unknown tags and trailing bytes", function()
    invalid({ "empty" }, decode, "")
    invalid({ "version" }, decode, "\0\0")
    invalid({ "version" }, decode, "\2\0")
    invalid({ "byte 1", "unknown tag 0xff" }, decode, V .. "\255")
    invalid({ "byte 1", "unknown tag 0x0c" }, decode, V .. "\12")
    invalid({ "byte 2", "trailing" }, decode, V .. "\0\0")
    invalid({ "truncated" }, decode, V)
  end)

  it("refuses absurd lengths before allocating", function()
    -- A string claiming 2^63 bytes, a table claiming 2^62 values or pairs.
    invalid({ "string of" }, decode, V .. "\9\128\128\128\128\128\128\128\128\128\1")
    invalid({ "cannot fit" }, decode, V .. "\10\128\128\128\128\128\128\128\128\64\0")
    invalid({ "cannot fit" }, decode, V .. "\10\0\128\128\128\128\128\128\128\128\64")
    invalid({ "cannot fit" }, decode, V .. "\10\3\0\1\1")
    invalid({ "overflows" }, decode, V .. "\9\255\255\255\255\255\255\255\255\255\127")
    invalid({ "truncated" }, decode, V .. "\9\255\255")
  end)

  it("refuses non-canonical encodings", function()
    invalid({ "minimally" }, decode, V .. "\9\128\0")                  -- overlong varint
    invalid({ "smallest width" }, decode, V .. "\5\1\0")               -- 1 as int16
    invalid({ "smallest width" }, decode, V .. "\7\0\0\0\128\255\255\255\255") -- int32 min as int64
    invalid({ "nil inside a table" }, decode, V .. "\10\1\0\0")
    invalid({ "nil table key" }, decode, V .. "\10\0\1\0\2")
    invalid({ "table as a table key" }, decode, V .. "\10\0\1\10\0\0\2")
    invalid({ "NaN table key" }, decode, V .. "\10\0\1\8\0\0\0\0\0\0\248\127\2")
    invalid({ "integer value" }, decode, V .. "\10\0\1\8\0\0\0\0\0\0\8\64\2") -- key 3.0
    invalid({ "integer value" }, decode, V .. "\10\0\1\8\0\0\0\0\0\0\0\128\2") -- key -0.0
    invalid({ "array part" }, decode, V .. "\10\1\1\2\4\1\2")          -- key 1 with narr 1
    invalid({ "array part" }, decode, V .. "\10\1\1\2\4\2\2")          -- key 2: array part not maximal
    invalid({ "out of order" }, decode, V .. "\10\0\2\9\1b\2\9\1a\2")
    invalid({ "out of order" }, decode, V .. "\10\0\2\9\1a\2\9\1a\2")  -- repeated key
    -- And the canonical forms of those are accepted.
    assert.are.same({ a = true, b = true }, decode(V .. "\10\0\2\9\1a\2\9\1b\2"))
    assert.are.same({ [3] = true }, decode(V .. "\10\0\1\4\3\2"))
  end)

  it("refuses depth bombs", function()
    local depth = state.max_depth or 200
    invalid({ "deeper than " .. depth }, decode, V .. ("\10\1\0"):rep(depth + 1) .. "\0")
    invalid({ "deeper than " .. depth }, decode, V .. ("\10\1\0"):rep(1000000))
    invalid({ "deeper than " .. depth }, decode, V .. ("\10\0\1\2"):rep(depth + 1))
    -- Exactly at the limit is fine.
    local ok_bytes = V .. ("\10\1\0"):rep(depth - 1) .. "\10\0\0"
    assert.are.equal(ok_bytes, encode(decode(ok_bytes)))
  end)

  it("refuses every truncation of a valid encoding", function()
    local bytes = encode(rich_value())
    for n = 0, #bytes - 1 do
      local ok, e = pcall(decode, bytes:sub(1, n))
      assert.is_false(ok, "a truncation to " .. n .. " bytes decoded")
      assert.are.equal("INVALID_ARGUMENT", e.code)
    end
    -- And every extension by a byte.
    for c = 0, 255 do
      invalid({ "trailing" }, decode, bytes .. string.char(c))
    end
  end)

  it("survives every single-byte mutation of a valid encoding", function()
    local bytes = encode(rich_value())
    local accepted = 0
    for i = 1, #bytes do
      for _, c in ipairs({ 0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 127, 128, 255 }) do
        local m = bytes:sub(1, i - 1) .. string.char(c) .. bytes:sub(i + 1)
        if check_bytes(m) then accepted = accepted + 1 end
      end
    end
    assert.truthy(accepted > 0)
  end)

  it("survives random bytes", function()
    math.randomseed(20240611)
    local accepted = 0
    for _ = 1, 20000 do
      local n = math.random(0, 24)
      local t = { V }
      for j = 1, n do
        -- Mostly small bytes, so that tags and short lengths come up often.
        t[j + 1] = string.char(math.random() < 0.7 and math.random(0, 12) or math.random(0, 255))
      end
      if check_bytes(table.concat(t)) then accepted = accepted + 1 end
    end
    assert.truthy(accepted > 100)
  end)
end)
