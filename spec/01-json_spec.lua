-- 01-json_spec.lua: eventstore.json, the exact payload codec (docs/contract.md §1,
-- docs/json.md). Every rule of the canonical form and of strict decoding has
-- an assert here that fails if the rule is broken.

local helpers = require("helpers")
local ok, es = pcall(require, "eventstore")
local json = ok and es.json or require("eventstore.core").json

local encode, decode = json.encode, json.decode

-- Runs f and returns the error it raised (fails the test if it did not).
local function raised(f, ...)
  local okf, e = pcall(f, ...)
  assert(not okf, "expected an error")
  return e
end

-- Asserts that f(...) raises an INVALID_ARGUMENT error object whose message
-- matches every given Lua pattern; returns the error.
local function invalid(patterns, f, ...)
  local e = raised(f, ...)
  assert.are.equal("table", type(e), "error is not an error object: " .. tostring(e))
  assert.are.equal("INVALID_ARGUMENT", e.code)
  assert.are.equal("string", type(e.message))
  local s = tostring(e)
  assert.are.equal("INVALID_ARGUMENT: " .. e.message, s)
  for _, p in ipairs(patterns or {}) do
    assert.truthy(e.message:find(p), ("message %q does not match %q"):format(e.message, p))
  end
  return e
end

local function bad_json(text, ...)
  return invalid({ "byte %d+", ... }, decode, text)
end

-- Deep equality that also compares number subtypes, array marks and -0.0.
local same = helpers.json_same

local function nested(n, open, close)
  return open:rep(n) .. close:rep(n)
end

describe("eventstore.json", function()
  it("exposes encode, decode, null, array, is_array", function()
    assert.are.equal("function", type(json.encode))
    assert.are.equal("function", type(json.decode))
    assert.are.equal("function", type(json.array))
    assert.are.equal("function", type(json.is_array))
    assert.are.equal("userdata", type(json.null))
  end)

  describe("integers", function()
    it("encode exactly, all of int64", function()
      assert.are.equal("0", encode(0))
      assert.are.equal("-1", encode(-1))
      assert.are.equal("9007199254740993", encode(9007199254740993))
      assert.are.equal("9223372036854775807", encode(math.maxinteger))
      assert.are.equal("-9223372036854775808", encode(math.mininteger))
    end)

    it("decode as Lua integers, all of int64", function()
      for _, n in ipairs { 0, 1, -1, 9007199254740993, -9007199254740993, math.maxinteger, math.mininteger } do
        local v = decode(tostring(n))
        assert.are.equal("integer", math.type(v))
        assert.are.equal(n, v)
      end
      assert.are.equal("integer", math.type(decode("-0")))
    end)

    it("decode an integer literal outside int64 as a float", function()
      local v = decode("9223372036854775808")
      assert.are.equal("float", math.type(v))
      assert.are.equal(2.0 ^ 63, v)
      v = decode("-9223372036854775809")
      assert.are.equal("float", math.type(v))
      assert.are.equal(-2.0 ^ 63, v)
      v = decode("123456789012345678901234567890")
      assert.are.equal("float", math.type(v))
      assert.are.equal(1.2345678901234568e29, v)
      assert.are.equal("1.2345678901234568e+29", encode(v))
    end)
  end)

  describe("floats", function()
    local cases = {
      { 0.1, "0.1" }, { 3.0, "3.0" }, { 100.0, "100.0" }, { -0.0, "-0.0" }, { 0.0, "0.0" },
      { 1e300, "1e+300" }, { 5e-324, "5e-324" }, { 1.5e-7, "1.5e-07" }, { 1e16, "1e+16" },
      { 1e15, "1000000000000000.0" }, { 0.0001, "0.0001" }, { 1e-5, "1e-05" },
      { 1 / 3, "0.3333333333333333" }, { 2 / 3, "0.6666666666666666" }, { -2.5, "-2.5" },
      { 123456789.125, "123456789.125" }, { 1.7976931348623157e308, "1.7976931348623157e+308" },
      { 2.2250738585072014e-308, "2.2250738585072014e-308" }, { 2.0 ^ 53, "9007199254740992.0" },
      { 2.0 ^ 63, "9.223372036854776e+18" }, { 0.1 + 0.2, "0.30000000000000004" },
      -- a power of two, where the shortest digits are not the rounded ones
      { 2.0 ^ -1017, "7.120236347223045e-307" },
      { 1e21, "1e+21" }, { 1.5e300, "1.5e+300" }, { 1e-100, "1e-100" },
    }
    for _, c in ipairs(cases) do
      it(("encode %s as %s and read it back exactly"):format(c[2], c[2]), function()
        assert.are.equal(c[2], encode(c[1]))
        local v = decode(c[2])
        assert.are.equal("float", math.type(v))
        assert.is_true(same(c[1], v))
      end)
    end

    it("keep 3.0 a float and 3 an integer", function()
      assert.are.equal("float", math.type(decode("3.0")))
      assert.are.equal("integer", math.type(decode("3")))
      assert.are.equal("float", math.type(decode("3e0")))
      assert.are.equal("float", math.type(decode("1E2")))
      assert.are.equal(100.0, decode("1E2"))
      assert.are.equal("3.0", encode(decode("3.0")))
      assert.are.equal("3", encode(decode("3")))
      assert.are.equal("[3,3.0]", encode(json.array { 3, 3.0 }))
    end)

    it("canonicalise float spellings", function()
      assert.are.equal("[1.5,2500.0,0.001,1e+100,0.0,-0.0]", encode(decode("[1.50, 2.5e3, 1E-3, 1e100, 0e5, -0.0]")))
    end)

    it("reject NaN and infinities", function()
      invalid({ "NaN" }, encode, 0 / 0)
      invalid({ "NaN" }, encode, math.huge)
      invalid({ "NaN" }, encode, -math.huge)
      invalid({ "^value%.x%[2%]" }, encode, { x = json.array { 1, math.huge } })
    end)

    it("reject literals beyond the double range", function()
      bad_json("1e400", "out of range")
      bad_json("-1e400", "out of range")
      bad_json("1" .. ("0"):rep(400), "out of range")
      assert.are.equal(0.0, decode("1e-400"))
    end)

    it("decode long literals exactly", function()
      assert.are.equal(1e-300, decode("0." .. ("0"):rep(299) .. "1"))
      assert.are.equal(0.1, decode("0.1" .. ("0"):rep(1000)))
    end)
  end)

  describe("strings", function()
    it("escape only quote, backslash and control characters", function()
      assert.are.equal([["a\"b\\c"]], encode('a"b\\c'))
      assert.are.equal([["\b\f\n\r\t"]], encode("\b\f\n\r\t"))
      assert.are.equal([["\u0001\u001f\u000b"]], encode("\1\31\11"))
      assert.are.equal('"/\127é😀\u{2028}"', encode("/\127é😀\u{2028}"))
    end)

    it("keep embedded NUL bytes", function()
      assert.are.equal([["a\u0000b"]], encode("a\0b"))
      local s = decode([["a\u0000b"]])
      assert.are.equal(3, #s)
      assert.are.equal("a\0b", s)
      assert.are.equal('{"k\\u0000":"\\u0000"}', encode(decode('{"k\\u0000":"\\u0000"}')))
    end)

    it("decode every escape", function()
      assert.are.equal('"\\/\b\f\n\r\t', decode([["\"\\\/\b\f\n\r\t"]]))
      assert.are.equal("é", decode([["\u00e9"]]))
      assert.are.equal("é", decode([["\u00E9"]]))
      assert.are.equal("😀", decode([["\ud83d\ude00"]]))
      assert.are.equal("\u{10FFFF}", decode([["\udbff\udfff"]]))
      assert.are.equal([["😀"]], encode(decode([["\uD83D\uDE00"]])))
    end)

    it("reject invalid UTF-8 when encoding", function()
      for _, s in ipairs {
        "\xff", "\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xed\xa0\x80", "\xed\xbf\xbf",
        "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "\xe2\x82", "\x80", "ok\xe9",
      } do
        invalid({ "UTF%-8" }, encode, s)
      end
      invalid({ "^value%.a%[1%]: string is not valid UTF%-8 %(byte 2%)" }, encode, { a = { "ab\xff" } })
      invalid({ "^value: a key is not valid UTF%-8" }, encode, { ["\xff"] = 1 })
    end)

    it("reject invalid UTF-8 when decoding", function()
      for _, s in ipairs { "\xff", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80" } do
        bad_json('"' .. s .. '"', "UTF%-8")
        bad_json('{"' .. s .. '":1}', "UTF%-8")
      end
      assert.truthy(bad_json('["ok", "a\xffb"]').message:find("byte 9", 1, true))
    end)

    it("reject lone surrogates", function()
      bad_json([["\ud800"]], "surrogate")
      bad_json([["\udc00"]], "surrogate")
      bad_json([["\ud800\u0041"]], "surrogate")
      bad_json([["\ud800x"]], "surrogate")
      bad_json([["\ude00\ud83d"]], "surrogate")
    end)

    it("reject bad escapes and raw control characters", function()
      bad_json([["\x41"]], "escape")
      bad_json([["\u12"]], "escape")
      bad_json([["\u12g4"]], "escape")
      bad_json([["\U0041"]], "escape")
      bad_json('"a\nb"', "control")
      bad_json('"a\0b"', "control")
      bad_json('"abc', "unterminated")
      bad_json('"abc\\', "unterminated")
    end)

    it("round-trip long strings", function()
      local s = ("héllo \0 wörld \"\\\n"):rep(20000)
      assert.are.equal(s, decode(encode(s)))
    end)
  end)

  describe("arrays and objects", function()
    it("keep empty arrays and empty objects apart", function()
      assert.are.equal("[]", encode(json.array {}))
      assert.are.equal("[]", encode(json.array()))
      assert.are.equal("{}", encode({}))
      assert.are.equal("[]", encode(decode("[]")))
      assert.are.equal("{}", encode(decode("{}")))
      assert.are.equal('{"a":[],"b":{},"c":[[],{}]}', encode(decode('{"a":[],"b":{},"c":[[],{}]}')))
    end)

    it("mark decoded arrays, and only arrays", function()
      local v = decode('[1,[2],{"a":[]}]')
      assert.is_true(json.is_array(v))
      assert.is_true(json.is_array(v[2]))
      assert.is_false(json.is_array(v[3]))
      assert.is_true(json.is_array(v[3].a))
      assert.are.equal(getmetatable(json.array {}), getmetatable(v))
      assert.is_false(json.is_array(decode("{}")))
      assert.is_false(json.is_array({ 1, 2 }))
      assert.is_false(json.is_array("x"))
    end)

    it("array() marks and returns the same table", function()
      local t = { 1, 2 }
      assert.are.equal(t, json.array(t))
      assert.is_true(json.is_array(t))
      assert.are.equal(t, json.array(t)) -- marking twice is harmless
      local e = raised(json.array, setmetatable({}, { __index = {} }))
      assert.are.equal("string", type(e))
      assert.truthy(e:find("bad argument #1", 1, true))
      assert.truthy(raised(json.array, 42):find("bad argument #1", 1, true))
    end)

    it("encode marked arrays with holes as null, refuse mostly-hole ones", function()
      local t = json.array {}
      t[1], t[3] = 1, 3
      assert.are.equal("[1,null,3]", encode(t))
      assert.are.equal("[null,null,3]", encode(json.array { [3] = 3 }))
      invalid({ "too sparse" }, encode, json.array { [1000] = 1 })
      invalid({ "array has a string key" }, encode, json.array { 1, x = 2 })
      invalid({ "array has integer key 0" }, encode, json.array { [0] = 1 })
      invalid({ "array has float key 1.5" }, encode, json.array { [1.5] = 1 })
    end)

    it("treat unmarked tables with keys 1..n as arrays", function()
      assert.are.equal("[1,2,3]", encode({ 1, 2, 3 }))
      assert.are.equal("[[1],{\"a\":[true,false]}]", encode({ { 1 }, { a = { true, false } } }))
      assert.are.equal("[1.0]", encode({ [1.0] = 1.0 }))
    end)

    it("reject mixed, sparse and oddly keyed tables, naming the path", function()
      invalid({ "^value: table mixes array and object keys$" }, encode, { 1, 2, x = 1 })
      invalid({ "^value%.items%[2%]: table mixes array and object keys$" }, encode,
        { items = { {}, { 1, a = 2 } } })
      invalid({ "not a sequence" }, encode, { 1, nil, 3 })
      invalid({ "not a sequence" }, encode, { [2] = 1 })
      invalid({ "integer key 0" }, encode, { [0] = 1 })
      invalid({ "integer key %-1" }, encode, { [-1] = 1 })
      invalid({ "float key 1.5" }, encode, { [1.5] = 1 })
      invalid({ "boolean key" }, encode, { [true] = 1 })
      invalid({ "table key" }, encode, { [{}] = 1 })
      invalid({ '^value%["a b"%]%.c: cannot encode a function' }, encode, { ["a b"] = { c = print } })
    end)

    it("sort object keys in byte order, shorter prefix first", function()
      assert.are.equal('{"":5,"A":4,"a":2,"aa":3,"b":1}', encode({ b = 1, a = 2, aa = 3, A = 4, [""] = 5 }))
      assert.are.equal('{"z":1,"é":2}', encode({ ["é"] = 2, z = 1 }))
      -- by the raw bytes, not by their escaped spelling ("\u0001" > "A")
      assert.are.equal('{"\\u0001":1,"A":2}', encode({ ["\1"] = 1, A = 2 }))
      assert.are.equal('{"a":1,"a\\u0000":2}', encode({ ["a\0"] = 2, a = 1 }))
      local t = {}
      for i = 1, 200 do t["k" .. (i * 7919 % 1000)] = i end
      local text = encode(t)
      local prev
      for k in text:gmatch('"(k%d+)":') do
        if prev then assert.is_true(prev < k) end
        prev = k
      end
      assert.are.equal(text, encode(decode(text)))
      assert.are.equal('{"a":1,"b":{"c":2,"d":3}}', encode(decode(' { "b" : { "d" : 3 , "c" : 2 } , "a" : 1 } ')))
    end)

    it("reject duplicate object keys, also when spelled differently", function()
      bad_json('{"a":1,"a":2}', "duplicate")
      bad_json('{"a":1,"\\u0061":2}', "duplicate")
      bad_json('{"a":{"x":1,"x":1}}', "duplicate")
      local e = bad_json('{"a":1, "b":2, "a":3}', "duplicate")
      assert.truthy(e.message:find("byte 15", 1, true))
      -- the first key, in text order, that repeats an earlier one
      e = bad_json('{"b":1,"a":1,"b":2,"a":2}', "duplicate")
      assert.truthy(e.message:find('byte 13: duplicate object key "b"', 1, true), e.message)
      -- reported when the object closes: an earlier syntax error in it wins
      e = bad_json('{"a":1,"a":2,"c":x}')
      assert.truthy(e.message:find("byte 17: unexpected character 'x'", 1, true), e.message)
    end)
  end)

  describe("null", function()
    it("maps top-level null to nil and inner null to json.null", function()
      assert.is_nil(decode("null"))
      assert.are.equal(1, select("#", decode("null")))
      assert.are.equal(json.null, decode("[null]")[1])
      assert.are.equal(json.null, decode('{"a":null}').a)
      assert.are.equal("null", encode(nil))
      assert.are.equal("null", encode(json.null))
      assert.are.equal('{"a":null}', encode({ a = json.null }))
      assert.are.equal("[null,1]", encode(decode("[null,1]")))
    end)
  end)

  describe("strict decoding", function()
    it("accepts any value at top level and JSON whitespace around it", function()
      assert.are.equal(1, decode(" \t\r\n1 \t\r\n"))
      assert.are.equal("x", decode('"x"'))
      assert.is_true(decode("true"))
      assert.is_false(decode("false"))
    end)

    it("rejects trailing garbage and leading junk", function()
      bad_json("[1,2] x", "trailing")
      bad_json("{} {}", "trailing")
      bad_json("1 2", "trailing")
      bad_json("truex", "trailing")
      bad_json("\xef\xbb\xbf1")
      bad_json("\f1")
      bad_json("x1")
      bad_json("1\0")
      assert.truthy(bad_json("[1,2] x").message:find("byte 6", 1, true))
    end)

    it("rejects what RFC 8259 does not allow", function()
      for _, text in ipairs {
        "", " ", "[1,]", '{"a":1,}', "[,1]", "{,}", "['a']", "{a:1}", '{"a" 1}', '{"a":}', "[1 2]",
        "01", "-01", "+1", ".5", "1.", "1.e5", "1e", "1e+", "-", "0x10", "NaN", "Infinity", "-Infinity",
        "nul", "tru", "True", "NULL", "/**/1", "[1]//", "[", "]", "{", '{"a"', '{"a":1', "[1,", '"\t"',
        "\u{a0}1",
      } do
        bad_json(text)
      end
    end)

    it("names the byte offset of the problem", function()
      assert.truthy(bad_json('{"a":tru}').message:find("at byte 8", 1, true))
      assert.truthy(bad_json("[1,]").message:find("at byte 3", 1, true))
      assert.truthy(bad_json("").message:find("at byte 0", 1, true))
    end)

    it("rejects a non-string with a standard argument error", function()
      for _, v in ipairs { 42, {}, true } do
        local e = raised(function() return json.decode(v) end)
        assert.are.equal("string", type(e))
        assert.truthy(e:find("bad argument #1 to 'decode'", 1, true), e)
      end
      assert.truthy(raised(function() return json.decode() end):find("bad argument #1", 1, true))
    end)
  end)

  describe("nesting", function()
    local max = 512
    it(("allows %d levels and refuses %d, both ways"):format(max, max + 1), function()
      local ok_text = nested(max, "[", "]")
      assert.are.equal(ok_text, encode(decode(ok_text)))
      bad_json(nested(max + 1, "[", "]"), "nesting")
      bad_json(('{"a":'):rep(max + 1) .. "1" .. ("}"):rep(max + 1), "nesting")
      local t = json.array {}
      local inner = t
      for _ = 2, max do
        local n = json.array {}
        inner[1] = n
        inner = n
      end
      assert.are.equal(ok_text, encode(t))
      inner[1] = json.array {}
      invalid({ "nesting" }, encode, t)
    end)

    it("survives absurd nesting", function()
      bad_json(("["):rep(1000000), "nesting")
      bad_json(('{"a":'):rep(100000), "nesting")
    end)
  end)

  describe("values JSON cannot carry", function()
    it("are rejected with INVALID_ARGUMENT naming the type and path", function()
      invalid({ "^value: cannot encode a function$" }, encode, print)
      invalid({ "^value%.f: cannot encode a function$" }, encode, { f = function() end })
      invalid({ "^value%[2%]: cannot encode a thread$" }, encode, { 1, coroutine.create(print) })
      invalid({ "^value%.io: cannot encode a userdata$" }, encode, { io = io.stdout })
    end)

    it("include cycles, which are told apart from shared tables", function()
      local t = { a = { b = {} } }
      t.a.b.c = t
      invalid({ "^cycle at value%.a%.b%.c$" }, encode, t)
      local self = {}
      self[1] = self
      invalid({ "^cycle at value%[1%]$" }, encode, self)
      local shared = { 1 }
      assert.are.equal('{"x":[1],"y":[1]}', encode({ x = shared, y = shared }))
    end)

    it("raise error objects whose tostring is CODE: message", function()
      local e = invalid({}, encode, print)
      assert.are.equal("INVALID_ARGUMENT: value: cannot encode a function", tostring(e))
      e = invalid({}, decode, "[")
      assert.are.equal("INVALID_ARGUMENT: " .. e.message, tostring(e))
      assert.are.equal(getmetatable(e), getmetatable(invalid({}, encode, 0 / 0)))
    end)

    it("need an argument to encode", function()
      assert.truthy(raised(function() return json.encode() end):find("bad argument #1 to 'encode'", 1, true))
    end)
  end)

  describe("round trips", function()
    it("decode(encode(x)) is x", function()
      local values = {
        0, -1, math.maxinteger, math.mininteger, 9007199254740993, 0.1, -0.0, 1e300, 5e-324, 3.0,
        "", "a\0b", "é😀", true, false, json.array { json.null },
        json.array {}, {}, json.array { 1, 2.5, "x", json.null, {}, json.array {} },
        { a = 1, b = { c = json.array { true, false } }, ["k\0"] = "v", ["é"] = -0.0 },
      }
      for _, v in ipairs(values) do
        assert.is_true(same(v, decode(encode(v))), encode(v))
      end
    end)

    it("encode(decode(text)) is text for canonical text", function()
      for _, text in ipairs {
        "null", "true", "0", "-9223372036854775808", "9223372036854775807", "0.1", "1e+300", "5e-324",
        "-0.0", "3.0", '""', '"\\u0000\\"\\\\\\n"', "[]", "{}", "[[],{}]", '{"":[],"a":{"b":null}}',
        '[1,1.5,"s",true,false,null]', '{"a":1,"aa":2,"b":3}', "1.2345678901234568e-300", "0.7999999999999999",
        "9.223372036854776e+18",
      } do
        assert.are.equal(text, encode(decode(text)))
      end
    end)

    it("holds for many generated values", function()
      math.randomseed(42)
      for _ = 1, 3000 do
        -- mostly valid code points, sometimes a surrogate (which must be refused)
        local v = helpers.random_json(0)
        local ok_enc, text = pcall(encode, v)
        if ok_enc then
          local back = decode(text)
          assert.is_true(same(v, back), text)
          assert.are.equal(text, encode(back))
        else
          -- only a generated surrogate code point may be refused
          assert.are.equal("INVALID_ARGUMENT", text.code)
          assert.truthy(text.message:find("UTF%-8"), text.message)
        end
      end
    end)
  end)

  describe("locale", function()
    it("does not depend on LC_NUMERIC", function()
      local old = os.setlocale(nil, "numeric")
      local loc
      for _, name in ipairs { "de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "ru_RU.UTF-8", "pt_BR.UTF-8" } do
        if os.setlocale(name, "numeric") then
          loc = name
          break
        end
      end
      if not loc then
        os.setlocale(old, "numeric")
        pending("no comma-decimal locale installed (see docs/json.md to test with one)")
        return
      end
      local okl, err = pcall(function()
        assert.are.equal("[0.1,1.5e-07,3.0]", encode(json.array { 0.1, 1.5e-7, 3.0 }))
        assert.are.equal(2.5, decode("2.5"))
        assert.are.equal(1.25e-10, decode("1.25e-10"))
      end)
      os.setlocale(old, "numeric")
      assert(okl, err)
    end)
  end)
end)
