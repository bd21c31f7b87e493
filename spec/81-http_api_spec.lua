-- spec/81-http_api_spec.lua: every JSON endpoint of core/http/routes.c
-- (docs/contract.md §6; the store rules of §3), over real HTTP, as a remote user
-- of the API sees it: success (status and shape), exact payloads, bad
-- input (a {code, message} answer and nothing changed), the store's
-- errors mapped to statuses, and each route's right (401/403).
--
-- Where docs/contract.md §6 is silent these specs follow docs/http-api.md: every
-- success is 200 (never 201), GET .../events answers {events, through},
-- unknown body fields are 400, presence answers {rows} and {applied},
-- DELETE of a ref {deleted}, a state JSON cannot carry is 422, and
-- REF_CONFLICT's body carries `expected` and `actual` beside §6's {code,
-- message} (the fields §3.7 gives the Lua error). Nothing in the docs was
-- found to contradict the contract.
--
-- SSE streams, /metrics and /healthz have their own specs. One server per
-- backend (helpers.urls()); tests use sessions of their own, and a test
-- that claims work uses a tenant of its own (claims span the token's
-- whole store, so another test's pending events would be handed out too).
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")
local oh = require("openapi_helpers")

local json = eventstore.json
local null = json.null
local array = json.array

local ADMIN = "admin-token" -- tenant *, every right: the root store
local MAX_BATCH = 20
local MAX_BODY = 2 * 1024 * 1024 -- above the store's 1 MiB payload limit, so both 413s are reachable

-- Tokens: the defaults, tokens lacking `read` (for the 403s of read
-- routes), and one all-rights token per claiming test ("w1".."w40", each
-- its own tenant).
local TOKENS = {}
for _, t in ipairs(hh.TOKENS) do TOKENS[#TOKENS + 1] = t end
TOKENS[#TOKENS + 1] = { "acme-append", "acme", "append" }
TOKENS[#TOKENS + 1] = { "acme-work", "acme", "work" }
for i = 1, 40 do TOKENS[#TOKENS + 1] = { "w" .. i, "w" .. i, "read,append,work,admin" } end

local REDUCER = hh.SUM_REDUCER

-- A reducer whose state JSON cannot carry (a float key), and one that
-- raises.
local REDUCER_FLOAT_KEY = [[
return {init = function() return {} end, add = function(state, event) state[1.5] = 1 return state end}
]]
local REDUCER_RAISES = [[
return {init = function() return {} end, add = function(state, event) error("no adding here") end}
]]

-- Every exactness case of docs/contract.md §1 in one payload, as raw JSON text.
local EXACT = [==[{"big":9007199254740993,"min":-9223372036854775808,"f":0.1,"e":1e300,]==] ..
  [==["s":"a\u0000b","ea":[],"eo":{},"nest":[[],[{}],{"a":[]}],"t":true,"z":null}]==]

local function shown(v) return type(v) == "table" and json.encode(v) or tostring(v) end

for _, template in ipairs(helpers.urls()) do
  describe("HTTP API on " .. template, function()
    local srv, scripts, records
    local serial, wserial = 0, 0

    -- A session name no other test of this server uses.
    local function name(tag)
      serial = serial + 1
      return ("%s-%d"):format(tag, serial)
    end
    -- A token of a tenant no other test uses (for claims).
    local function worker()
      wserial = wserial + 1
      assert(wserial <= 40, "more claiming tests than w tokens")
      return "w" .. wserial
    end

    setup(function()
      scripts = hh.scripts({ ["reducers/count.lua"] = REDUCER, ["reducers/floatkey.lua"] = REDUCER_FLOAT_KEY,
        ["reducers/raises.lua"] = REDUCER_RAISES })
      srv = hh.serve_on(template, { scripts = scripts, tokens = TOKENS,
        args = { "--max-batch", tostring(MAX_BATCH), "--max-body", tostring(MAX_BODY) } })
      records = oh.record()
    end)

    teardown(function()
      oh.stop()
      hh.rm(scripts)
      hh.stop_clean(srv)
    end)

    -- The position after which no event exists now (the root's last),
    -- paging on from the last one found (positions only grow).
    local high = 0
    local function last_position()
      while true do
        local st, b = hh.get(srv, ADMIN, "/v1/events?after=" .. high .. "&limit=1000")
        hh.check_ok(st, b, "read_all")
        for _, e in ipairs(b.events) do high = math.max(high, e.position) end
        if #b.events < 1000 then return high end
      end
    end

    -- Asserts that nothing was appended anywhere since position p.
    local function nothing_appended_since(p, what)
      local st, b = hh.get(srv, ADMIN, "/v1/events?after=" .. p)
      hh.check_ok(st, b, "read_all")
      assert(#b.events == 0, (what or "request") .. " appended: " .. shown(b.events))
    end

    -- The raw text of a session's events (everything a user can see of
    -- them: status, claims, failures), to compare before and after.
    local function raw_events(token, session)
      local st, b, _, text = hh.get(srv, token, hh.spath(session, "events"))
      hh.check_ok(st, b, "read " .. session)
      return text
    end

    -- ---------------------------------------------------------------
    describe("POST /v1/sessions/{s}/events", function()
      it("appends and answers {events, pending} with stored events", function()
        local s = name("append")
        local st, b, h = hh.post(srv, ADMIN, hh.spath(s, "events"), { events = {
          { type = "placed", payload = { sku = "A1", qty = 2 } },
          { type = "noted", id = "n-1", payload = "hello", lane = "l1" },
          { type = "fact", settled = true },
        } })
        assert.equal(200, st, shown(b)) -- docs/http-api.md: 200, never 201 (a retry gets the same answer)
        assert.truthy((h["content-type"] or ""):find("application/json", 1, true), shown(h))
        assert.equal(3, #b.events)
        assert.is_true(b.pending)
        local prev = 0
        for i, e in ipairs(b.events) do
          assert.equal(i, e.index)
          assert.equal(s, e.session)
          assert.equal("string", type(e.id))
          assert.is_true(#e.id > 0)
          assert.equal("integer", math.type(e.position))
          assert.is_true(e.position > prev)
          prev = e.position
          assert.equal("integer", math.type(e.created_at))
        end
        assert.equal("placed", b.events[1].type)
        assert.same({ qty = 2, sku = "A1" }, b.events[1].payload)
        assert.equal("pending", b.events[1].status)
        assert.equal("n-1", b.events[2].id)
        assert.equal("l1", b.events[2].lane)
        assert.equal("hello", b.events[2].payload)
        assert.equal("processed", b.events[3].status)
        assert.equal(null, b.events[3].payload) -- a missing payload is null, and present
        -- read back: the same events
        local got = hh.events(srv, ADMIN, s)
        assert.same(b.events, got)
      end)

      it("answers {ids, pending} under \"answer\": \"ids\", and refuses another answer", function()
        local s, id = name("append-ids"), name("p")
        local st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { answer = "ids", events = {
          { type = "placed", id = id }, { type = "fact", settled = true } } })
        assert.equal(200, st, shown(b))
        local got = hh.events(srv, ADMIN, s)
        assert.same({ ids = { id, got[2].id }, pending = true }, b)
        -- a replay answers with the ids stored first, "events" is the default
        st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { answer = "ids", events = { { type = "placed", id = id } } })
        assert.equal(200, st, shown(b))
        assert.same({ id }, b.ids)
        st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { answer = "events", events = { { type = "placed", id = id } } })
        assert.equal(200, st, shown(b))
        assert.equal(1, b.events[1].index)
        for _, bad in ipairs({ "rows", 2, { "ids" } }) do
          st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { answer = bad, events = { { type = "x" } } })
          assert.equal(400, st, shown(b))
          assert.equal("INVALID_ARGUMENT", b.code)
          assert.truthy(b.message:find("answer", 1, true), b.message)
        end
        assert.equal(2, #hh.events(srv, ADMIN, s))
      end)

      it("revision and meta (§3.1) go in and come back in every event answer", function()
        local s = name("meta")
        local st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { events = {
          { type = "v", revision = 3, meta = { z = 1, a = { "x" }, corr = "c-1" } },
          { type = "w", meta = null },
        } })
        assert.equal(200, st, shown(b))
        assert.equal(3, b.events[1].revision)
        assert.same({ a = { "x" }, corr = "c-1", z = 1 }, b.events[1].meta)
        assert.equal(1, b.events[2].revision)
        assert.is_nil(b.events[2].meta)
        local got = hh.events(srv, ADMIN, s)
        assert.same(b.events, got)
        -- the stored meta is canonical text, as a payload
        local _, _, _, text = hh.get(srv, ADMIN, hh.spath(s, "events"))
        assert.truthy(text:find('"meta":{"a":["x"],"corr":"c-1","z":1}', 1, true), text)
        -- a replay with another revision is ID_CONFLICT; bad values are 400s
        local id = b.events[1].id
        local p0 = last_position()
        st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { events = { { id = id, type = "v", revision = 4,
          meta = { z = 1, a = { "x" }, corr = "c-1" } } } })
        hh.check_error(409, "ID_CONFLICT", st, b, "replay with another revision")
        for _, bad in ipairs({ { revision = 0 }, { revision = 1.5 }, { revision = "2" }, { meta = { 1 } },
          { meta = "x" }, { meta = { s = ("x"):rep(8200) } } }) do
          bad.type = "v"
          st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { events = { bad } })
          assert.truthy(st == 400 or st == 413, shown(bad) .. " -> " .. tostring(st))
          assert.truthy(b.message:find("revision", 1, true) or b.message:find("meta", 1, true), shown(b))
        end
        nothing_appended_since(p0, "refused revision or meta")
      end)

      it("a traceparent header is stored as meta.traceparent on each event without one (§6)", function()
        local s = name("trace")
        local tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        local st, b = hh.request(srv, "POST", hh.spath(s, "events"), { token = ADMIN,
          headers = { traceparent = tp }, body = { events = {
            { type = "a" },
            { type = "b", meta = { k = 1 } },
            { type = "c", meta = { traceparent = "00-11111111111111111111111111111111-2222222222222222-00" } },
          } } })
        assert.equal(200, st, shown(b))
        assert.same({ traceparent = tp }, b.events[1].meta)
        assert.same({ k = 1, traceparent = tp }, b.events[2].meta)
        assert.equal("00-11111111111111111111111111111111-2222222222222222-00", b.events[3].meta.traceparent)
        -- a malformed header is ignored (W3C Trace Context), never stored
        for _, badtp in ipairs({ "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
          "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", tp .. "-more" }) do
          st, b = hh.request(srv, "POST", hh.spath(s, "events"), { token = ADMIN,
            headers = { traceparent = badtp }, body = { events = { { type = "d" } } } })
          assert.equal(200, st, shown(b))
          assert.is_nil(b.events[1].meta, badtp)
        end
      end)

      it("names round-trip: UTF-8, '/', spaces and '%' in a percent-encoded session name", function()
        local s = name("ünï/cödé x%y")
        local b = hh.append_ok(srv, ADMIN, s, { { type = "t", settled = true } })
        assert.equal(s, b.events[1].session)
        assert.equal(s, hh.events(srv, ADMIN, s)[1].session)
        local _, rows = hh.get(srv, ADMIN, "/v1/sessions?prefix=" .. hh.enc(s))
        assert.same({ s }, helpers.pluck(rows.sessions, "session"))
      end)

      it("a field given as null is the same as one left out (expected)", function()
        local s = name("null-expected")
        hh.append_ok(srv, ADMIN, s, { { type = "t", settled = true } })
        local st, b = hh.request(srv, "POST", hh.spath(s, "events"),
          { token = ADMIN, body = '{"events":[{"type":"t","settled":true,"lane":null}],"expected":null}' })
        hh.check_ok(st, b, "append with null fields")
        assert.equal(2, b.events[1].index)
        assert.is_nil(b.events[1].lane)
      end)

      it("answers pending = false when nothing of the session is pending", function()
        local s = name("settled")
        local b = hh.append_ok(srv, ADMIN, s, { { type = "fact", settled = true } })
        assert.is_false(b.pending)
        assert.equal("processed", b.events[1].status)
      end)

      it("an empty batch writes nothing", function()
        local s = name("empty")
        local p = last_position()
        local b = hh.append_ok(srv, ADMIN, s, array({}))
        assert.equal(0, #b.events)
        nothing_appended_since(p, "empty batch")
        assert.equal(0, hh.head(srv, ADMIN, s))
      end)

      it("expected: the head must match, else 409 WRONG_EXPECTED_HEAD and nothing written", function()
        local s = name("expected")
        hh.append_ok(srv, ADMIN, s, { { type = "a" } }, { expected = 0 })
        local before = raw_events(ADMIN, s)
        local p = last_position()
        local st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { events = { { type = "b" } }, expected = 0 })
        hh.check_error(409, "WRONG_EXPECTED_HEAD", st, b, "append expected 0 at head 1")
        nothing_appended_since(p)
        assert.equal(before, raw_events(ADMIN, s))
        local ok = hh.append_ok(srv, ADMIN, s, { { type = "b" } }, { expected = 1 })
        assert.equal(2, ok.events[1].index)
      end)

      it("an idempotent replay returns the stored events, even when expected no longer matches", function()
        local s = name("replay")
        local first = hh.append_ok(srv, ADMIN, s, { { type = "a", id = "r-1", payload = { x = 1 } },
          { type = "b", id = "r-2" } }, { expected = 0 })
        local p = last_position()
        local again = hh.append_ok(srv, ADMIN, s, { { type = "a", id = "r-1", payload = { x = 1 } },
          { type = "b", id = "r-2" } }, { expected = 0 })
        assert.same(first.events, again.events)
        nothing_appended_since(p, "replay")
      end)

      it("ID_CONFLICT (409): a replayed id with another payload", function()
        local s = name("idconflict")
        hh.append_ok(srv, ADMIN, s, { { type = "a", id = "c-1", payload = 1 } })
        local before = raw_events(ADMIN, s)
        local st, b = hh.post(srv, ADMIN, hh.spath(s, "events"),
          { events = { { type = "a", id = "c-1", payload = 2 } } })
        hh.check_error(409, "ID_CONFLICT", st, b, "replay with another payload")
        assert.equal(before, raw_events(ADMIN, s))
      end)

      it("PARTIAL_DUPLICATE_BATCH (409): stored and fresh ids mixed, a repeated id, another session's id", function()
        local s = name("partial")
        hh.append_ok(srv, ADMIN, s, { { type = "a", id = "p-1" } })
        local before = raw_events(ADMIN, s)
        local p = last_position()
        local cases = {
          { s, { { type = "a", id = "p-1" }, { type = "a", id = "p-2" } } },
          { s, { { type = "a", id = "p-3" }, { type = "a", id = "p-3" } } },
          { name("partial-other"), { { type = "a", id = "p-1" } } },
        }
        for i, c in ipairs(cases) do
          local st, b = hh.post(srv, ADMIN, hh.spath(c[1], "events"), { events = c[2] })
          hh.check_error(409, "PARTIAL_DUPLICATE_BATCH", st, b, "partial duplicate case " .. i)
        end
        nothing_appended_since(p)
        assert.equal(before, raw_events(ADMIN, s))
      end)

      it("a batch over --max-batch is 413 TOO_LARGE and writes nothing", function()
        local s = name("batch")
        local p = last_position()
        local evs = {}
        for i = 1, MAX_BATCH + 1 do evs[i] = { type = "x", payload = i } end
        local st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { events = evs })
        hh.check_error(413, "TOO_LARGE", st, b, "batch of max+1")
        nothing_appended_since(p)
        -- exactly the limit is fine
        evs[#evs] = nil
        local ok = hh.append_ok(srv, ADMIN, s, evs)
        assert.equal(MAX_BATCH, #ok.events)
      end)

      it("a body over --max-body is 413 and writes nothing", function()
        local s = name("body")
        local p = last_position()
        local big = '{"events":[{"type":"x","payload":"' .. ("a"):rep(MAX_BODY) .. '"}]}'
        -- the server may answer before reading the whole body; it must answer 413
        local st, b, text = hh.send_large(srv, "POST", hh.spath(s, "events"), ADMIN, big)
        assert.equal(413, st, text:sub(1, 300))
        hh.check_error(413, "TOO_LARGE", st, b, "oversized body")
        nothing_appended_since(p)
        assert.equal(0, hh.head(srv, ADMIN, s))
      end)

      it("a payload over the store's 1 MiB is 413 TOO_LARGE and writes nothing", function()
        local s = name("payload")
        local p = last_position()
        local st, b = hh.post(srv, ADMIN, hh.spath(s, "events"),
          { events = { { type = "x", payload = ("a"):rep(1024 * 1024 + 10) } } })
        hh.check_error(413, "TOO_LARGE", st, b, "oversized payload")
        nothing_appended_since(p)
      end)

      it("refuses bad bodies with 400 INVALID_ARGUMENT and writes nothing", function()
        local s = name("bad")
        hh.append_ok(srv, ADMIN, s, { { type = "seed" } })
        local before = raw_events(ADMIN, s)
        local p = last_position()
        local bodies = {
          '{"events":[',                                   -- invalid JSON
          '{"events":[{"type":"x"}]} trailing',            -- trailing garbage
          '{"events":[],"events":[]}',                     -- duplicate key
          '[{"type":"x"}]',                                -- not an object
          '{}',                                            -- no events
          '{"events":{"type":"x"}}',                       -- events an object (one event without its list)
          '{"events":"x"}',
          '{"events":[{"type":"x"}],"expected":"1"}',      -- expected a string
          '{"events":[{"type":"x"}],"expected":1.5}',
          '{"events":[{"type":"x"}],"expected":-1}',
          '{"events":[{"payload":1}]}',                    -- no type
          '{"events":[{"type":5}]}',
          '{"events":[{"type":""}]}',
          '{"events":[{"type":"x","id":""}]}',             -- empty id
          '{"events":[{"type":"x","id":7}]}',
          '{"events":[{"type":"x","lane":7}]}',
          '{"events":[{"type":"x","settled":"yes"}]}',
          '{"events":[{"type":"x","not_before":"soon"}]}',
          '{"events":[{"type":"x","cause":5}]}',
          '{"events":["x"]}',
          '{"events":[{"type":"x","payload":"\xff"}]}',    -- invalid UTF-8
          '{"events":[{"type":"x","payload":1e999}]}',      -- not a finite number
          '',                                              -- empty body
          '{"events":[{"type":"x","payload":"\\ud800"}]}', -- lone surrogate
          -- docs/http-api.md: unknown fields are refused, numbers are int64 integers
          '{"events":[{"type":"x"}],"expeted":0}',
          '{"events":[{"type":"x","paylod":1}]}',
          '{"events":[{"type":"x","cause":{"index":1}}]}',
          '{"events":[{"type":"x","cause":{"index":1,"attempt":1,"x":1}}]}',
          '{"events":[{"type":"x","at":1,"delay_ms":1}]}',
          '{"events":[{"type":"x","delay_ms":-1}]}',
          '{"events":[{"type":"x"}],"expected":1.0}',
          '{"events":[{"type":"x"}],"expected":9223372036854775808}',
          '{"events":[{"type":"x"}],"expected":-9223372036854775808}',
          '{"events":[{"type":"x"}],"expected":true}',
          '{"events":[{"type":"x\\u0000y"}]}',                -- NUL in a name
          '{"events":[{"type":"x","id":"a\\u0000b"}]}',
          '{"events":[{"type":"x","lane":"a\\u0000b"}]}',
          '{"events":[{"type":"x","payload":' .. ("["):rep(600) .. ("]"):rep(600) .. '}]}', -- nesting over 512
        }
        for _, body in ipairs(bodies) do
          local st, b = hh.request(srv, "POST", hh.spath(s, "events"), { token = ADMIN, body = body })
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "append body " .. ("%q"):format(body))
        end
        nothing_appended_since(p)
        assert.equal(before, raw_events(ADMIN, s))
      end)

      it("refuses bad session names (NUL, invalid UTF-8, over 255 bytes) with 400 and writes nothing", function()
        local p = last_position()
        for _, seg in ipairs({ "a%00b", "%00", "a%FFb", ("s"):rep(256) }) do
          local st, b = hh.post(srv, ADMIN, "/v1/sessions/" .. seg .. "/events", { events = { { type = "x" } } })
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "append to session " .. seg)
        end
        nothing_appended_since(p)
        -- 255 bytes is a valid name
        local ok = hh.append_ok(srv, ADMIN, ("s"):rep(255), { { type = "x", settled = true } })
        assert.equal(1, ok.events[1].index)
      end)
    end)

    -- ---------------------------------------------------------------
    describe("exact payloads", function()
      it("int64, floats, NUL in strings and empty containers round-trip exactly (raw text too)", function()
        local s = name("exact")
        local canon = json.encode(json.decode(EXACT))
        local body = '{"events":[{"type":"exact","payload":' .. EXACT .. '}]}'
        local st, b, _, text = hh.request(srv, "POST", hh.spath(s, "events"), { token = ADMIN, body = body })
        hh.check_ok(st, b, "append exact")
        assert.truthy(text:find('"payload":' .. canon, 1, true), "append answer: " .. text)
        local function check(pl)
          assert.equal("integer", math.type(pl.big))
          assert.equal(9007199254740993, pl.big)
          assert.equal("integer", math.type(pl.min))
          assert.equal(math.mininteger, pl.min)
          assert.equal("float", math.type(pl.f))
          assert.equal(0.1, pl.f)
          assert.equal(1e300, pl.e)
          assert.equal("a\0b", pl.s)
          assert.equal("[]", json.encode(pl.ea))
          assert.equal("{}", json.encode(pl.eo))
          assert.equal('[[],[{}],{"a":[]}]', json.encode(pl.nest))
          assert.is_true(pl.t)
          assert.equal(null, pl.z)
        end
        check(b.events[1].payload)
        -- read, read_all, events page: the same text
        local evs, rtext = hh.events(srv, ADMIN, s)
        check(evs[1].payload)
        assert.truthy(rtext:find('"payload":' .. canon, 1, true), "read answer: " .. rtext)
        local _, ab, _, atext = hh.get(srv, ADMIN, "/v1/events?after=" .. (b.events[1].position - 1) .. "&limit=1")
        assert.equal(b.events[1].id, ab.events[1].id)
        assert.truthy(atext:find('"payload":' .. canon, 1, true), "read_all answer: " .. atext)
      end)

      it("exact payloads through complete's result events and presence values", function()
        local w = worker()
        local s = name("exact-complete")
        hh.append_ok(srv, w, s, { { type = "job" } })
        local st, c = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000, limit = 1 })
        hh.check_ok(st, c, "claim")
        assert.equal(1, #c.events)
        local canon = json.encode(json.decode(EXACT))
        local body = '{"attempt":1,"events":[{"type":"out","payload":' .. EXACT .. '}]}'
        local st2, done, _, text = hh.request(srv, "POST", hh.spath(s, "events", 1, "complete"),
          { token = w, body = body })
        hh.check_ok(st2, done, "complete")
        assert.truthy(text:find('"payload":' .. canon, 1, true), "complete answer: " .. text)
        local _, rtext = hh.events(srv, w, s)
        assert.truthy(rtext:find('"payload":' .. canon, 1, true), "read answer: " .. rtext)
        -- presence values keep int64 exact too
        local ns = name("exact-ns")
        local pst, pb = hh.request(srv, "PUT", "/v1/presence/" .. hh.enc(ns) .. "/alice",
          { token = w, body = '{"values":{"n":9007199254740993,"f":0.1},"ttl_ms":3600000}' })
        hh.check_ok(pst, pb, "presence set")
        local _, rows, _, ptext = hh.get(srv, w, "/v1/presence/" .. hh.enc(ns))
        assert.truthy(ptext:find("9007199254740993", 1, true), ptext)
        local seen = {}
        for _, r in ipairs(rows.rows) do seen[r.field] = r.value end
        assert.equal("integer", math.type(seen.n))
        assert.equal(9007199254740993, seen.n)
        assert.equal(0.1, seen.f)
      end)
    end)

    -- ---------------------------------------------------------------
    describe("GET /v1/sessions/{s}/events", function()
      it("reads with after, limit and through (a stable page while the session grows)", function()
        local s = name("read")
        local evs = {}
        for i = 1, 5 do evs[i] = { type = "t", payload = i, settled = true } end
        hh.append_ok(srv, ADMIN, s, evs)
        local all = hh.events(srv, ADMIN, s)
        assert.same({ 1, 2, 3, 4, 5 }, helpers.indexes(all))
        local page = hh.events(srv, ADMIN, s, "?after=1&limit=2")
        assert.same({ 2, 3 }, helpers.indexes(page))
        assert.equal(2, page[1].payload)
        -- through pins the head: later appends do not show up in its pages
        local _, _, first = hh.events(srv, ADMIN, s, "?limit=2")
        assert.equal(5, first.through)
        hh.append_ok(srv, ADMIN, s, { { type = "t", payload = 6, settled = true } })
        local next_page, _, second = hh.events(srv, ADMIN, s, "?after=4&limit=2&through=" .. first.through)
        assert.same({ 5 }, helpers.indexes(next_page))
        assert.equal(5, second.through)
        -- an empty query value is the same as none (docs/http-api.md)
        assert.same({ 1, 2, 3, 4, 5, 6 }, helpers.indexes((hh.events(srv, ADMIN, s, "?after=&limit="))))
        -- a session without events reads as empty
        local none, text = hh.events(srv, ADMIN, name("nothing"))
        assert.equal(0, #none)
        assert.truthy(text:find('"events":[]', 1, true), text)
        local whole = select(3, hh.events(srv, ADMIN, name("nothing")))
        assert.equal(0, whole.through)
      end)

      it("refuses bad query numbers with 400", function()
        local s = name("read-bad")
        hh.append_ok(srv, ADMIN, s, { { type = "t", settled = true } })
        for _, q in ipairs({ "?after=abc", "?after=1.5", "?after=-1", "?limit=0", "?limit=-3", "?limit=x",
          "?limit=99999999999999999999", "?limit=1001", "?through=abc", "?through=-1", "?after=+1" }) do
          local st, b = hh.get(srv, ADMIN, hh.spath(s, "events") .. q)
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "read " .. q)
        end
      end)

      it("a bad session name is 400", function()
        for _, seg in ipairs({ "a%00b", "%FF", ("s"):rep(256) }) do
          local st, b = hh.get(srv, ADMIN, "/v1/sessions/" .. seg .. "/events")
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "read session " .. seg)
        end
      end)
    end)

    -- ---------------------------------------------------------------
    describe("GET /v1/sessions/{s}/head", function()
      it("answers {head}: 0 for an unknown session, n after n events", function()
        local s = name("head")
        local st, b = hh.get(srv, ADMIN, hh.spath(s, "head"))
        hh.check_ok(st, b, "head")
        assert.equal(200, st)
        assert.same({ head = 0 }, b)
        hh.append_ok(srv, ADMIN, s, { { type = "a" }, { type = "b" } })
        assert.equal(2, hh.head(srv, ADMIN, s))
      end)

      it("a session name with a NUL byte is 400", function()
        local st, b = hh.get(srv, ADMIN, "/v1/sessions/x%00y/head")
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "head of x%00y")
      end)
    end)

    -- ---------------------------------------------------------------
    describe("GET /v1/sessions/{s}/state/{reducer}", function()
      it("folds a reducer from the scripts directory: {state, index}, and at an index", function()
        local s = name("state")
        hh.append_ok(srv, ADMIN, s, { { type = "add", payload = { v = 2 }, settled = true },
          { type = "other", settled = true }, { type = "add", payload = { v = 5 }, settled = true } })
        local st, b = hh.get(srv, ADMIN, hh.spath(s, "state", "count"))
        hh.check_ok(st, b, "state")
        assert.equal(200, st)
        assert.equal(3, b.index)
        assert.same({ n = 2, sum = 7 }, b.state)
        local _, at = hh.get(srv, ADMIN, hh.spath(s, "state", "count") .. "?at=1")
        assert.equal(1, at.index)
        assert.same({ n = 1, sum = 2 }, at.state)
      end)

      it("unknown reducer: 404 NOT_FOUND; at beyond the head: 404 NO_SUCH_EVENT; bad at: 400", function()
        local s = name("state-bad")
        hh.append_ok(srv, ADMIN, s, { { type = "add", payload = { v = 1 }, settled = true } })
        local st, b = hh.get(srv, ADMIN, hh.spath(s, "state", "nope"))
        hh.check_error(404, "NOT_FOUND", st, b, "unknown reducer")
        st, b = hh.get(srv, ADMIN, hh.spath(s, "state", "count") .. "?at=9")
        hh.check_error(404, "NO_SUCH_EVENT", st, b, "state at 9")
        for _, q in ipairs({ "?at=x", "?at=-1", "?at=1.5" }) do
          st, b = hh.get(srv, ADMIN, hh.spath(s, "state", "count") .. q)
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "state " .. q)
        end
        st, b = hh.get(srv, ADMIN, hh.spath(s, "state") .. "/co%00unt")
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "reducer with NUL")
        st, b = hh.get(srv, ADMIN, hh.spath(s, "state", "../reducers/count"))
        assert.is_true(st == 400 or st == 404, shown(b)) -- a name, never a path
        -- a reducer that raises: 400 naming it; a state JSON cannot carry: 422
        st, b = hh.get(srv, ADMIN, hh.spath(s, "state", "raises"))
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "state of a raising reducer")
        assert.truthy(b.message:find("raises", 1, true), b.message)
        st, b = hh.get(srv, ADMIN, hh.spath(s, "state", "floatkey"))
        hh.check_error(422, "INVALID_ARGUMENT", st, b, "state with a float key")
      end)
    end)

    -- ---------------------------------------------------------------
    describe("GET /v1/sessions", function()
      it("lists sessions by prefix, pages with after/limit and a cursor", function()
        local pre = name("ls") .. "/"
        hh.append_ok(srv, ADMIN, pre .. "a", { { type = "x" }, { type = "y", settled = true } })
        hh.append_ok(srv, ADMIN, pre .. "b", { { type = "x", settled = true } })
        hh.append_ok(srv, ADMIN, pre .. "c", { { type = "x", settled = true } })
        local st, b = hh.get(srv, ADMIN, "/v1/sessions?prefix=" .. hh.enc(pre) .. "&limit=2")
        hh.check_ok(st, b, "sessions")
        assert.equal(200, st)
        assert.same({ pre .. "a", pre .. "b" }, helpers.pluck(b.sessions, "session"))
        assert.equal(pre .. "b", b.cursor)
        local a = b.sessions[1]
        assert.equal(2, a.events)
        assert.equal(1, a.pending)
        assert.equal(0, a.dead)
        assert.equal("integer", math.type(a.updated_at))
        local _, b2 = hh.get(srv, ADMIN, "/v1/sessions?prefix=" .. hh.enc(pre) .. "&limit=2&after=" .. hh.enc(b.cursor))
        assert.same({ pre .. "c" }, helpers.pluck(b2.sessions, "session"))
        assert.equal(null, b2.cursor, "last page's cursor: " .. shown(b2))
        assert.is_false(a.sealed)
      end)

      it("refuses bad query values with 400", function()
        for _, q in ipairs({ "?limit=0", "?limit=abc", "?limit=-1", "?limit=99999999999999999999",
          "?limit=1001", "?prefix=a%00b", "?after=%FF" }) do
          local st, b = hh.get(srv, ADMIN, "/v1/sessions" .. q)
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "sessions " .. q)
        end
      end)
    end)

    -- ---------------------------------------------------------------
    describe("GET /v1/events", function()
      it("reads all sessions in position order after a position", function()
        local s1, s2 = name("all-a"), name("all-b")
        local p = last_position()
        local a = hh.append_ok(srv, ADMIN, s1, { { type = "x", settled = true } })
        local b = hh.append_ok(srv, ADMIN, s2, { { type = "x", settled = true } })
        local c = hh.append_ok(srv, ADMIN, s1, { { type = "x", settled = true } })
        local st, r = hh.get(srv, ADMIN, "/v1/events?after=" .. p)
        hh.check_ok(st, r, "read_all")
        assert.same({ a.events[1].id, b.events[1].id, c.events[1].id }, helpers.pluck(r.events, "id"))
        assert.same({ s1, s2, s1 }, helpers.pluck(r.events, "session"))
        local _, r2 = hh.get(srv, ADMIN, "/v1/events?after=" .. p .. "&limit=2")
        assert.equal(2, #r2.events)
        local _, r3 = hh.get(srv, ADMIN, "/v1/events?after=" .. r2.events[2].position)
        assert.same({ c.events[1].id }, helpers.pluck(r3.events, "id"))
      end)

      it("refuses bad query numbers with 400", function()
        for _, q in ipairs({ "?after=x", "?after=-1", "?limit=0", "?limit=1.5", "?limit=1001" }) do
          local st, b = hh.get(srv, ADMIN, "/v1/events" .. q)
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "read_all " .. q)
        end
      end)
    end)

    -- ---------------------------------------------------------------
    describe("claims, complete, fail, renew", function()
      it("POST /v1/claims hands out ready events with attempt, holder and expiry", function()
        local w = worker()
        local s = name("claim")
        hh.append_ok(srv, w, s, { { type = "job", payload = 1 }, { type = "job", payload = 2 } })
        local st, b = hh.post(srv, w, "/v1/claims", { holder = "remote-1", ttl_ms = 60000, limit = 1 })
        hh.check_ok(st, b, "claim")
        assert.equal(200, st)
        assert.equal(1, #b.events)
        local e = b.events[1]
        assert.equal(s, e.session)
        assert.equal(1, e.index)
        assert.equal(1, e.attempt)
        assert.equal("remote-1", e.claim_holder)
        assert.equal("integer", math.type(e.claim_expires_at))
        local _, b2 = hh.post(srv, w, "/v1/claims", { holder = "remote-1", ttl_ms = 60000, limit = 10 })
        assert.same({ 2 }, helpers.indexes(b2.events))
        -- nothing ready now: no events; retry_at is the claims' expiry (or absent)
        local _, b3 = hh.post(srv, w, "/v1/claims", { holder = "remote-1", ttl_ms = 60000 })
        assert.equal(0, #b3.events)
        assert.is_true(b3.retry_at == null or math.type(b3.retry_at) == "integer", shown(b3))
        -- limit defaults to 1
        hh.append_ok(srv, w, s, { { type = "job" }, { type = "job" } })
        local _, b4 = hh.post(srv, w, "/v1/claims", { holder = "remote-1", ttl_ms = 60000 })
        assert.same({ 3 }, helpers.indexes(b4.events))
        -- types: only those types; [] claims nothing
        hh.append_ok(srv, w, s, { { type = "other" } })
        local _, b5 = hh.post(srv, w, "/v1/claims", { holder = "remote-1", ttl_ms = 60000, limit = 10,
          types = { "other" } })
        assert.same({ 5 }, helpers.indexes(b5.events)) -- not job 4, still ready
        local _, b6 = hh.post(srv, w, "/v1/claims", { holder = "remote-1", ttl_ms = 60000, limit = 10,
          types = array({}) })
        assert.equal(0, #b6.events)
      end)

      it("complete marks the event processed and appends result events with cause; a repeat is idempotent", function()
        local w = worker()
        local s = name("complete")
        hh.append_ok(srv, w, s, { { type = "job" } })
        local _, c = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        assert.equal(1, c.events[1].attempt)
        local body = { attempt = 1, events = { { type = "done", id = "d-1", payload = { ok = true } } } }
        local st, b = hh.post(srv, w, hh.spath(s, "events", 1, "complete"), body)
        hh.check_ok(st, b, "complete")
        assert.equal(200, st)
        assert.equal("completed", b.outcome)
        assert.equal(1, #b.events)
        assert.same({ index = 1, attempt = 1 }, b.events[1].cause)
        assert.equal(2, b.events[1].index)
        assert.equal("d-1", b.events[1].id)
        local evs = hh.events(srv, w, s)
        assert.equal("processed", evs[1].status)
        assert.equal(1, evs[1].processed_by_attempt)
        assert.same(b.events[1], evs[2])
        -- the same call again: the same stored events, nothing new
        local p = last_position()
        local st2, again = hh.post(srv, w, hh.spath(s, "events", 1, "complete"), body)
        hh.check_ok(st2, again, "complete again")
        assert.same(b.events, again.events)
        nothing_appended_since(p, "repeated complete")
        -- different ids after success: PARTIAL_DUPLICATE_BATCH
        local st3, e3 = hh.post(srv, w, hh.spath(s, "events", 1, "complete"),
          { attempt = 1, events = { { type = "done", id = "d-2" } } })
        hh.check_error(409, "PARTIAL_DUPLICATE_BATCH", st3, e3, "complete with other ids")
        nothing_appended_since(p, "complete with other ids")
        -- a retried complete whose events carry no ids: refused, nothing written twice
        hh.append_ok(srv, w, s, { { type = "job" } })
        local _, c2 = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        local idx = c2.events[1].index
        local noids = { attempt = 1, events = { { type = "done" } } }
        local _, first = hh.post(srv, w, hh.spath(s, "events", idx, "complete"), noids)
        assert.equal("completed", first.outcome)
        p = last_position()
        local st4, e4 = hh.post(srv, w, hh.spath(s, "events", idx, "complete"), noids)
        hh.check_error(409, "PARTIAL_DUPLICATE_BATCH", st4, e4, "complete retried without ids")
        nothing_appended_since(p, "complete retried without ids")
        -- a completion batch over --max-batch: 413, nothing written
        hh.append_ok(srv, w, s, { { type = "job" } })
        local _, c3 = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        local many = {}
        for i = 1, MAX_BATCH + 1 do many[i] = { type = "done", id = "m-" .. i } end
        local before = raw_events(w, s)
        p = last_position()
        local st5, e5 = hh.post(srv, w, hh.spath(s, "events", c3.events[1].index, "complete"), { attempt = 1, events = many })
        hh.check_error(413, "TOO_LARGE", st5, e5, "complete with max+1 events")
        nothing_appended_since(p, "complete over the batch limit")
        assert.equal(before, raw_events(w, s))
      end)

      it("complete by a superseded attempt answers outcome superseded and writes nothing", function()
        local w = worker()
        local s = name("superseded")
        hh.append_ok(srv, w, s, { { type = "job" } })
        hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        local st, f = hh.post(srv, w, hh.spath(s, "events", 1, "fail"), { attempt = 1, error = "e", max_failures = 5 })
        hh.check_ok(st, f, "fail")
        assert.equal("failed", f.outcome)
        local _, c2 = hh.post(srv, w, "/v1/claims", { holder = "h2", ttl_ms = 60000 })
        assert.equal(2, c2.events[1].attempt)
        local before = raw_events(w, s)
        local p = last_position()
        local st2, b = hh.post(srv, w, hh.spath(s, "events", 1, "complete"),
          { attempt = 1, events = { { type = "late" } } })
        hh.check_ok(st2, b, "stale complete")
        assert.equal("superseded", b.outcome)
        nothing_appended_since(p, "superseded complete")
        assert.equal(before, raw_events(w, s))
        -- an append whose cause names the superseded attempt: 409 SUPERSEDED_ATTEMPT
        local st3, b3 = hh.post(srv, w, hh.spath(s, "events"),
          { events = { { type = "late", cause = { index = 1, attempt = 1 } } } })
        hh.check_error(409, "SUPERSEDED_ATTEMPT", st3, b3, "append with stale cause")
        nothing_appended_since(p)
        -- the owner completes
        local _, ok = hh.post(srv, w, hh.spath(s, "events", 1, "complete"), { attempt = 2 })
        assert.equal("completed", ok.outcome)
      end)

      it("fail records the error; at max_failures the event is dead-lettered; repeating is idempotent", function()
        local w = worker()
        local s = name("fail")
        hh.append_ok(srv, w, s, { { type = "job" } })
        hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        local st, b = hh.post(srv, w, hh.spath(s, "events", 1, "fail"),
          { attempt = 1, error = "boom", max_failures = 2, retry_after_ms = 0 })
        hh.check_ok(st, b, "fail")
        assert.equal(200, st)
        assert.equal("failed", b.outcome)
        assert.equal(1, b.failures)
        local _, again = hh.post(srv, w, hh.spath(s, "events", 1, "fail"),
          { attempt = 1, error = "boom", max_failures = 2, retry_after_ms = 0 })
        assert.equal("failed", again.outcome)
        assert.equal(1, again.failures)
        local e = hh.events(srv, w, s)[1]
        assert.equal("boom", e.last_error)
        assert.equal(1, e.failures)
        assert.equal("pending", e.status)
        hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        local _, dead = hh.post(srv, w, hh.spath(s, "events", 1, "fail"),
          { attempt = 2, error = "boom2", max_failures = 2 })
        assert.equal("dead_lettered", dead.outcome)
        assert.equal(2, dead.failures)
        assert.equal("dead", hh.events(srv, w, s)[1].status)
        -- (event 1 is dead now) free text keeps what the store keeps: a NUL becomes U+FFFD (docs/http-api.md)
        hh.append_ok(srv, w, s, { { type = "job" } })
        local _, c2 = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        assert.equal(2, c2.events[1].index)
        local stn, fn = hh.request(srv, "POST", hh.spath(s, "events", 2, "fail"),
          { token = w, body = '{"attempt":1,"error":"a\\u0000b","max_failures":5}' })
        hh.check_ok(stn, fn, "fail with a NUL in its error")
        assert.equal("a\u{FFFD}b", hh.events(srv, w, s)[2].last_error)
      end)

      it("renew extends a live claim of the holder; a superseded attempt is listed as superseded", function()
        local w = worker()
        local s = name("renew")
        hh.append_ok(srv, w, s, { { type = "job" } })
        local _, c = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 10000 })
        local exp1 = c.events[1].claim_expires_at
        local st, b = hh.post(srv, w, hh.spath(s, "events", 1, "renew"), { holder = "h", attempt = 1, ttl_ms = 600000 })
        hh.check_ok(st, b, "renew")
        assert.equal(200, st)
        assert.same({ 1 }, b.renewed)
        assert.equal(0, #b.superseded)
        local e = hh.events(srv, w, s)[1]
        assert.is_true(e.claim_expires_at > exp1, "expiry did not move: " .. shown(e))
        -- another holder's renew: neither list, nothing moves
        local before = raw_events(w, s)
        local _, other = hh.post(srv, w, hh.spath(s, "events", 1, "renew"), { holder = "x", attempt = 1, ttl_ms = 900000 })
        assert.equal(0, #other.renewed)
        assert.equal(before, raw_events(w, s))
        -- superseded attempt
        hh.post(srv, w, hh.spath(s, "events", 1, "fail"), { attempt = 1, error = "e" })
        hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 10000 })
        local _, sup = hh.post(srv, w, hh.spath(s, "events", 1, "renew"), { holder = "h", attempt = 1, ttl_ms = 600000 })
        assert.same({ 1 }, sup.superseded)
        assert.equal(0, #sup.renewed)
      end)

      it("claims: bad bodies are 400 and nothing is claimed", function()
        local w = worker()
        local s = name("claim-bad")
        hh.append_ok(srv, w, s, { { type = "job" } })
        local before = raw_events(w, s)
        local bodies = {
          '{"holder":"h","ttl_ms":',
          '{"holder":"h","ttl_ms":-1}',
          '{"holder":"h","ttl_ms":1.5}',
          '{"holder":"h","ttl_ms":"100"}',
          '{"holder":"h","ttl_ms":0}',
          '{"ttl_ms":1000}',
          '{"holder":"","ttl_ms":1000}',
          '{"holder":7,"ttl_ms":1000}',
          '{"holder":"a\\u0000b","ttl_ms":1000}',
          '{"holder":"h","ttl_ms":1000,"limit":0}',
          '{"holder":"h","ttl_ms":1000,"limit":-1}',
          '{"holder":"h","ttl_ms":1000,"limit":"2"}',
          '{"holder":"h","ttl_ms":1000,"limit":99999999999999999999}',
          '{"holder":"h","ttl_ms":1000,"limit":1001}',
          '{"holder":"h","ttl_ms":1000,"limit":1.0}',
          '{"holder":"h","ttl_ms":1000,"types":"job"}',
          '{"holder":"h","ttl_ms":1000,"types":[5]}',
          '{"holder":"h","ttl_ms":1000,"holdr":"x"}',
          '[]',
          '',
        }
        for _, body in ipairs(bodies) do
          local st, b = hh.request(srv, "POST", "/v1/claims", { token = w, body = body })
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "claims body " .. ("%q"):format(body))
        end
        assert.equal(before, raw_events(w, s))
        local _, ok = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        assert.equal(1, ok.events[1].attempt)
      end)

      it("complete, fail, renew: bad input is 400/404 and changes nothing", function()
        local w = worker()
        local s = name("work-bad")
        hh.append_ok(srv, w, s, { { type = "job" } })
        hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        local before = raw_events(w, s)
        local p = last_position()
        local cases = {
          -- {path index, verb, body, status, code}
          { "1", "complete", '{"attempt":"1"}', 400, "INVALID_ARGUMENT" },
          { "1", "complete", '{}', 400, "INVALID_ARGUMENT" },
          { "1", "complete", '{"attempt":1,"events":{"type":"x"}}', 400, "INVALID_ARGUMENT" },
          { "1", "complete", '{"attempt":1,"events":[{"type":"x"}]', 400, "INVALID_ARGUMENT" },
          { "1", "complete", '{"attempt":1.5}', 400, "INVALID_ARGUMENT" },
          { "abc", "complete", '{"attempt":1}', 400, "INVALID_ARGUMENT" },
          { "1x", "complete", '{"attempt":1}', 400, "INVALID_ARGUMENT" },
          { "99", "complete", '{"attempt":1}', 404, "NO_SUCH_EVENT" },
          { "1", "fail", '{"attempt":"1"}', 400, "INVALID_ARGUMENT" },
          { "1", "fail", '{"error":"e"}', 400, "INVALID_ARGUMENT" },
          { "1", "fail", '{"attempt":1,"max_failures":0}', 400, "INVALID_ARGUMENT" },
          { "1", "fail", '{"attempt":1,"retry_after_ms":-1}', 400, "INVALID_ARGUMENT" },
          { "1", "fail", '{"attempt":1,"retry_after_ms":1.5}', 400, "INVALID_ARGUMENT" },
          { "1", "fail", '{"attempt":1,"error":7}', 400, "INVALID_ARGUMENT" },
          { "abc", "fail", '{"attempt":1,"error":"e"}', 400, "INVALID_ARGUMENT" },
          { "99", "fail", '{"attempt":1,"error":"e"}', 404, "NO_SUCH_EVENT" },
          { "1", "fail", '{"attempt":1}', 400, "INVALID_ARGUMENT" }, -- error is required (docs/http-api.md)
          { "1", "renew", '{"holder":"h","attempt":1,"ttl_ms":-1}', 400, "INVALID_ARGUMENT" },
          { "1", "renew", '{"holder":"h","attempt":1,"ttl_ms":2.5}', 400, "INVALID_ARGUMENT" },
          { "1", "renew", '{"attempt":1,"ttl_ms":1000}', 400, "INVALID_ARGUMENT" },
          { "1", "renew", '{"holder":"h","attempt":"1","ttl_ms":1000}', 400, "INVALID_ARGUMENT" },
          { "abc", "renew", '{"holder":"h","attempt":1,"ttl_ms":1000}', 400, "INVALID_ARGUMENT" },
          { "1", "complete", '{"attempt":1,"evnts":[]}', 400, "INVALID_ARGUMENT" },
          { "1", "fail", '{"attempt":1,"error":"e","max_failure":1}', 400, "INVALID_ARGUMENT" },
          { "1", "renew", '{"holder":"h","attempt":1,"ttl_ms":1000,"x":1}', 400, "INVALID_ARGUMENT" },
          { "0", "complete", '{"attempt":1}', 400, "INVALID_ARGUMENT" },
          { "-1", "fail", '{"attempt":1,"error":"e"}', 400, "INVALID_ARGUMENT" },
          { "+1", "complete", '{"attempt":1}', 400, "INVALID_ARGUMENT" },
          { "99999999999999999999", "complete", '{"attempt":1}', 400, "INVALID_ARGUMENT" },
          { "1", "complete", '{"attempt":1,"events":[{"type":"x","paylod":1}]}', 400, "INVALID_ARGUMENT" },
        }
        for _, c in ipairs(cases) do
          local path = hh.spath(s, "events") .. "/" .. c[1] .. "/" .. c[2]
          local st, b = hh.request(srv, "POST", path, { token = w, body = c[3] })
          hh.check_error(c[4], c[5], st, b, c[2] .. " " .. c[1] .. " " .. c[3])
        end
        nothing_appended_since(p)
        assert.equal(before, raw_events(w, s))
      end)
    end)

    -- ---------------------------------------------------------------
    describe("dead letters, revive, settle", function()
      -- Makes event 1 of a fresh session of tenant w a dead letter.
      local function dead_letter(w, s)
        hh.append_ok(srv, w, s, { { type = "job", payload = { n = 1 } } })
        local _, c = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        assert.equal(s, c.events[1].session)
        local _, f = hh.post(srv, w, hh.spath(s, "events", c.events[1].index, "fail"),
          { attempt = c.events[1].attempt, error = "boom", max_failures = 1 })
        assert.equal("dead_lettered", f.outcome)
      end

      it("GET /v1/dead-letters lists them with last_error; by session; paging by position", function()
        local w = worker()
        local s1, s2 = name("dl-a"), name("dl-b")
        dead_letter(w, s1)
        dead_letter(w, s2)
        local st, b = hh.get(srv, w, "/v1/dead-letters")
        hh.check_ok(st, b, "dead letters")
        assert.equal(200, st)
        assert.same({ s1, s2 }, helpers.pluck(b.events, "session"))
        assert.equal("dead", b.events[1].status)
        assert.equal("boom", b.events[1].last_error)
        local _, one = hh.get(srv, w, "/v1/dead-letters?session=" .. hh.enc(s2))
        assert.same({ s2 }, helpers.pluck(one.events, "session"))
        local _, after = hh.get(srv, w, "/v1/dead-letters?after=" .. b.events[1].position)
        assert.same({ s2 }, helpers.pluck(after.events, "session"))
        local _, lim = hh.get(srv, w, "/v1/dead-letters?limit=1")
        assert.same({ s1 }, helpers.pluck(lim.events, "session"))
        for _, q in ipairs({ "?limit=0", "?limit=x", "?after=x", "?session=a%00b", "?limit=1001" }) do
          local st2, e = hh.get(srv, w, "/v1/dead-letters" .. q)
          hh.check_error(400, "INVALID_ARGUMENT", st2, e, "dead letters " .. q)
        end
      end)

      it("revive puts a dead letter back to pending ({event}); settle marks it processed", function()
        local w = worker()
        local s = name("revive")
        dead_letter(w, s)
        local st, b = hh.post(srv, w, hh.spath(s, "events", 1, "revive"), {})
        hh.check_ok(st, b, "revive")
        assert.equal(200, st)
        assert.equal(1, b.event.index)
        assert.equal(s, b.event.session)
        assert.equal("pending", b.event.status)
        assert.equal(0, b.event.failures)
        local _, dl = hh.get(srv, w, "/v1/dead-letters?session=" .. hh.enc(s))
        assert.equal(0, #dl.events)
        assert.equal(b.event.id, hh.events(srv, w, s)[1].id)
        assert.equal("pending", hh.events(srv, w, s)[1].status)
        local _, c = hh.post(srv, w, "/v1/claims", { holder = "h", ttl_ms = 60000 })
        assert.equal(2, c.events[1].attempt)
        local _, f2 = hh.post(srv, w, hh.spath(s, "events", 1, "fail"), { attempt = 2, error = "again", max_failures = 1 })
        assert.equal("dead_lettered", f2.outcome)
        local st2, b2 = hh.post(srv, w, hh.spath(s, "events", 1, "settle"), { reason = "by hand" })
        hh.check_ok(st2, b2, "settle")
        assert.equal("processed", b2.event.status)
        assert.equal("processed", hh.events(srv, w, s)[1].status)
        local _, dl2 = hh.get(srv, w, "/v1/dead-letters?session=" .. hh.enc(s))
        assert.equal(0, #dl2.events)
      end)

      it("revive/settle: not a dead letter is 400, unknown index 404, bad index 400; nothing changes", function()
        local w = worker()
        local s = name("revive-bad")
        dead_letter(w, s)
        hh.append_ok(srv, w, s, { { type = "fact", settled = true } })
        local before = raw_events(w, s)
        for _, verb in ipairs({ "revive", "settle" }) do
          local cases = {
            { "2", 400, "INVALID_ARGUMENT" }, -- processed, not dead
            { "99", 404, "NO_SUCH_EVENT" },
            { "abc", 400, "INVALID_ARGUMENT" },
            { "1.0", 400, "INVALID_ARGUMENT" },
            { "0", 400, "INVALID_ARGUMENT" },
          }
          for _, c in ipairs(cases) do
            local st, b = hh.post(srv, w, hh.spath(s, "events") .. "/" .. c[1] .. "/" .. verb, {})
            hh.check_error(c[2], c[3], st, b, verb .. " " .. c[1])
          end
          local st, b = hh.request(srv, "POST", hh.spath(s, "events", 1, verb), { token = w, body = '{"reason":' })
          hh.check_error(400, "INVALID_ARGUMENT", st, b, verb .. " with invalid JSON")
        end
        local st, b = hh.post(srv, w, hh.spath(s, "events", 1, "settle"), { reason = 5 })
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "settle with a number reason")
        st, b = hh.post(srv, w, hh.spath(s, "events", 1, "settle"), { reason = "r", why = "x" })
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "settle with an unknown field")
        st, b = hh.post(srv, w, hh.spath(s, "events", 1, "revive"), { x = 1 })
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "revive with an unknown field")
        assert.equal(before, raw_events(w, s))
      end)
    end)

    -- ---------------------------------------------------------------
    describe("refs and promote", function()
      it("PUT, GET, list, DELETE a ref; its head is the session's head now", function()
        local pre = name("ref")
        local s = name("ref-session")
        hh.append_ok(srv, ADMIN, s, { { type = "x", settled = true } })
        local ref = pre .. "/main"
        local st, b = hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(ref), { session = s })
        hh.check_ok(st, b, "put_ref")
        assert.equal(200, st)
        assert.equal(ref, b.name)
        assert.equal(s, b.session)
        assert.equal(1, b.head)
        local st2, g = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(ref))
        hh.check_ok(st2, g, "get_ref")
        assert.equal(200, st2)
        assert.equal(ref, g.name)
        assert.equal(s, g.session)
        assert.equal(1, g.head)
        assert.equal("integer", math.type(g.created_at))
        assert.equal("integer", math.type(g.updated_at))
        hh.append_ok(srv, ADMIN, s, { { type = "x", settled = true } })
        local _, g2 = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(ref))
        assert.equal(2, g2.head)
        hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(pre .. "/other"), { session = s })
        local _, l = hh.get(srv, ADMIN, "/v1/refs?after=" .. hh.enc(pre .. "/") .. "&limit=2")
        assert.same({ pre .. "/main", pre .. "/other" }, helpers.pluck(l.refs, "name"))
        local _, l2 = hh.get(srv, ADMIN, "/v1/refs?after=" .. hh.enc(pre .. "/main") .. "&limit=1")
        assert.same({ pre .. "/other" }, helpers.pluck(l2.refs, "name"))
        local st3, d = hh.delete(srv, ADMIN, "/v1/refs/" .. hh.enc(ref))
        hh.check_ok(st3, d, "delete_ref")
        assert.same({ deleted = true }, d)
        local st4, gone = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(ref))
        hh.check_error(404, "NOT_FOUND", st4, gone, "deleted ref")
        -- deleting an absent ref is not an error
        local st5, d2 = hh.delete(srv, ADMIN, "/v1/refs/" .. hh.enc(ref))
        hh.check_ok(st5, d2, "delete absent ref")
        assert.same({ deleted = false }, d2)
        -- a page that is full has a cursor; the last page's is null
        local _, l3 = hh.get(srv, ADMIN, "/v1/refs?after=" .. hh.enc(pre .. "/") .. "&limit=1")
        assert.same({ pre .. "/other" }, helpers.pluck(l3.refs, "name"))
      end)

      it("promote moves to_ref to from_ref's session; expect is a compare-and-set (409 REF_CONFLICT)", function()
        local pre = name("promote")
        local s1, s2 = name("p-s1"), name("p-s2")
        local main, try = pre .. "/main", pre .. "/try"
        hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(main), { session = s1 })
        hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(try), { session = s2 })
        local st, b = hh.post(srv, ADMIN, "/v1/refs/" .. hh.enc(main) .. "/promote", { from = try, expect = s1 })
        hh.check_ok(st, b, "promote")
        assert.equal(200, st)
        assert.equal(main, b.name)
        assert.equal(s2, b.session)
        local _, g = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(main))
        assert.equal(s2, g.session)
        local before = select(4, hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(main)))
        -- lost compare-and-set: nothing moves
        hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(try), { session = s1 })
        local st2, e = hh.post(srv, ADMIN, "/v1/refs/" .. hh.enc(main) .. "/promote", { from = try, expect = s1 })
        hh.check_error(409, "REF_CONFLICT", st2, e, "promote with a stale expect", { "expected", "actual" })
        assert.equal(s1, e.expected)
        assert.equal(s2, e.actual)
        local st3, e3 = hh.post(srv, ADMIN, "/v1/refs/" .. hh.enc(main) .. "/promote", { from = try, expect = false })
        hh.check_error(409, "REF_CONFLICT", st3, e3, "promote expecting no ref", { "expected", "actual" })
        assert.equal(false, e3.expected)
        assert.equal(s2, e3.actual)
        assert.equal(before, select(4, hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(main))))
        -- expect = false creates a ref that does not exist yet
        local fresh = pre .. "/fresh"
        local st4, b4 = hh.post(srv, ADMIN, "/v1/refs/" .. hh.enc(fresh) .. "/promote", { from = try, expect = false })
        hh.check_ok(st4, b4, "promote to a new ref")
        local _, g4 = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(fresh))
        assert.equal(s1, g4.session)
        -- without expect: last writer wins
        local st5, b5 = hh.post(srv, ADMIN, "/v1/refs/" .. hh.enc(fresh) .. "/promote", { from = main })
        hh.check_ok(st5, b5, "promote without expect")
        local _, g5 = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(fresh))
        assert.equal(s2, g5.session)
        -- from_ref missing: 404 NOT_FOUND
        local st6, e6 = hh.post(srv, ADMIN, "/v1/refs/" .. hh.enc(main) .. "/promote", { from = pre .. "/none" })
        hh.check_error(404, "NOT_FOUND", st6, e6, "promote from a missing ref")
      end)

      it("bad ref input is 400 and creates or moves nothing", function()
        local pre = name("ref-bad")
        local s = name("rb-s")
        local main = pre .. "/main"
        hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc(main), { session = s })
        local before = select(4, hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(main)))
        local puts = { '{"session":', '{}', '{"session":5}', '{"session":""}', '{"session":"a\\u0000b"}',
          '[]', '', '{"session":"x","sesion":"y"}' }
        for _, body in ipairs(puts) do
          local st, b = hh.request(srv, "PUT", "/v1/refs/" .. hh.enc(main), { token = ADMIN, body = body })
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "put_ref body " .. ("%q"):format(body))
        end
        local st, b = hh.put(srv, ADMIN, "/v1/refs/a%00b", { session = s })
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "put_ref named a%00b")
        local promotes = { '{"from":', '{}', '{"from":5}', ('{"from":%s,"expect":5}'):format(json.encode(main)),
          ('{"from":%s,"expect":true}'):format(json.encode(main)),
          ('{"from":%s,"expect":null}'):format(json.encode(main)), -- docs: ambiguous, refused
          ('{"from":%s,"expct":false}'):format(json.encode(main)),
          ('{"from":%s,"expect":"a\\u0000b"}'):format(json.encode(main)) }
        for _, body in ipairs(promotes) do
          local st2, b2 = hh.request(srv, "POST", "/v1/refs/" .. hh.enc(pre .. "/x") .. "/promote",
            { token = ADMIN, body = body })
          hh.check_error(400, "INVALID_ARGUMENT", st2, b2, "promote body " .. ("%q"):format(body))
        end
        for _, q in ipairs({ "?limit=0", "?limit=x", "?limit=1001", "?after=a%00b" }) do
          local st3, b3 = hh.get(srv, ADMIN, "/v1/refs" .. q)
          hh.check_error(400, "INVALID_ARGUMENT", st3, b3, "list_refs " .. q)
        end
        assert.equal(before, select(4, hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(main))))
        local st4, b4 = hh.get(srv, ADMIN, "/v1/refs/" .. hh.enc(pre .. "/x"))
        hh.check_error(404, "NOT_FOUND", st4, b4, "ref x made by a refused promote")
      end)
    end)

    -- ---------------------------------------------------------------
    describe("lineage and children", function()
      it("a session that was not forked has no lineage and no children", function()
        local s = name("nofork")
        hh.append_ok(srv, ADMIN, s, { { type = "x", settled = true } })
        local st, b = hh.get(srv, ADMIN, hh.spath(s, "lineage"))
        hh.check_ok(st, b, "lineage")
        assert.equal(200, st)
        assert.equal(null, b.lineage, shown(b))
        local _, none = hh.get(srv, ADMIN, hh.spath(name("no-such-session"), "lineage"))
        assert.equal(null, none.lineage, shown(none))
        local st2, c = hh.get(srv, ADMIN, hh.spath(s, "children"))
        hh.check_ok(st2, c, "children")
        assert.equal(0, #c.children)
        assert.equal(null, c.cursor)
        for _, q in ipairs({ "?limit=0", "?limit=x", "?after=a%00b" }) do
          local st3, e = hh.get(srv, ADMIN, hh.spath(s, "children") .. q)
          hh.check_error(400, "INVALID_ARGUMENT", st3, e, "children " .. q)
        end
      end)

      it("lineage and children of forks made over HTTP", function()
        local s = name("parent")
        hh.append_ok(srv, ADMIN, s, { { type = "x", settled = true }, { type = "y", settled = true } })
        hh.check_ok(hh.post(srv, ADMIN, hh.spath(s, "fork"), { at = 1, to = s .. "/b" }))
        hh.check_ok(hh.post(srv, ADMIN, hh.spath(s, "fork"), { at = 2, to = s .. "/a" }))
        local st, l = hh.get(srv, ADMIN, hh.spath(s .. "/b", "lineage"))
        hh.check_ok(st, l, "lineage")
        local rec = l.lineage
        assert.equal(s .. "/b", rec.session)
        assert.equal(s, rec.parent)
        assert.equal(1, rec.at)
        assert.equal("integer", math.type(rec.created_at))
        local _, c = hh.get(srv, ADMIN, hh.spath(s, "children"))
        assert.same({ s .. "/a", s .. "/b" }, helpers.pluck(c.children, "session"))
        local _, c2 = hh.get(srv, ADMIN, hh.spath(s, "children") .. "?after=" .. hh.enc(s .. "/a") .. "&limit=5")
        assert.same({ s .. "/b" }, helpers.pluck(c2.children, "session"))
        local _, c3 = hh.get(srv, ADMIN, hh.spath(s, "children") .. "?limit=1")
        assert.same({ s .. "/a" }, helpers.pluck(c3.children, "session"))
        assert.equal(s .. "/a", c3.cursor)
        -- the fork's copies carry origin
        local evs = hh.events(srv, ADMIN, s .. "/b")
        assert.same({ session = s, index = 1 }, evs[1].origin)
      end)
    end)

    -- ---------------------------------------------------------------
    describe("presence", function()
      it("PUT sets a participant's fields; GET reads the namespace; null deletes a field", function()
        local ns = name("room")
        local st, b = hh.put(srv, ADMIN, "/v1/presence/" .. hh.enc(ns) .. "/alice",
          { values = { cursor = 5, name = "Alice" }, ttl_ms = 3600000, at = 100 })
        hh.check_ok(st, b, "presence set")
        assert.equal(200, st)
        assert.same({ cursor = 5, name = "Alice" }, b.applied)
        -- an older write loses (per field, by at)
        local _, old = hh.put(srv, ADMIN, "/v1/presence/" .. hh.enc(ns) .. "/alice",
          { values = { cursor = 1 }, ttl_ms = 3600000, at = 50 })
        assert.same({}, old.applied)
        hh.put(srv, ADMIN, "/v1/presence/" .. hh.enc(ns) .. "/bob", { values = { cursor = 9 }, ttl_ms = 3600000, seen = 3 })
        local st2, r = hh.get(srv, ADMIN, "/v1/presence/" .. hh.enc(ns))
        hh.check_ok(st2, r, "presence read")
        assert.equal(200, st2)
        local rows = {}
        for _, row in ipairs(r.rows) do
          rows[row.participant .. "." .. row.field] = row
          assert.equal("integer", math.type(row.at))
          assert.equal("integer", math.type(row.expires_at))
        end
        assert.equal(5, rows["alice.cursor"].value)
        assert.equal("Alice", rows["alice.name"].value)
        assert.equal(9, rows["bob.cursor"].value)
        assert.equal(3, rows["bob.cursor"].seen)
        -- a null deletes the field
        local _, del = hh.put(srv, ADMIN, "/v1/presence/" .. hh.enc(ns) .. "/alice",
          { values = { name = null }, ttl_ms = 3600000, at = 200 })
        assert.equal(null, del.applied.name)
        local _, r2 = hh.get(srv, ADMIN, "/v1/presence/" .. hh.enc(ns))
        local names = {}
        for _, row in ipairs(r2.rows) do names[#names + 1] = row.participant .. "." .. row.field end
        table.sort(names)
        assert.same({ "alice.cursor", "bob.cursor" }, names)
        -- an empty namespace reads as empty
        local _, r3 = hh.get(srv, ADMIN, "/v1/presence/" .. hh.enc(name("empty-room")))
        assert.equal(0, #r3.rows)
      end)

      it("bad presence input is 400 and stores nothing", function()
        local ns = name("room-bad")
        local bodies = { '{"values":{"a":1}}', '{"values":{"a":1},"ttl_ms":-1}', '{"values":{"a":1},"ttl_ms":1.5}',
          '{"values":{"a":1},"ttl_ms":"10"}', '{"values":[1],"ttl_ms":1000}', '{"values":5,"ttl_ms":1000}',
          '{"values":{"a":1},"ttl_ms":1000,"at":"x"}', '{"values":{"a":1},"ttl_ms":1000,"seen":1.5}',
          '{"values":{"a":', '', '{"values":{"a":1},"ttl_ms":1000,"ttl":5}', '{"values":{"a":1},"ttl_ms":1.0}' }
        for _, body in ipairs(bodies) do
          local st, b = hh.request(srv, "PUT", "/v1/presence/" .. hh.enc(ns) .. "/alice", { token = ADMIN, body = body })
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "presence body " .. ("%q"):format(body))
        end
        for _, path in ipairs({ "/v1/presence/a%00b/alice", "/v1/presence/" .. hh.enc(ns) .. "/al%00ice" }) do
          local st, b = hh.put(srv, ADMIN, path, { values = { a = 1 }, ttl_ms = 1000 })
          hh.check_error(400, "INVALID_ARGUMENT", st, b, "presence at " .. path)
        end
        local _, r = hh.get(srv, ADMIN, "/v1/presence/" .. hh.enc(ns))
        assert.equal(0, #r.rows)
        local st, b = hh.get(srv, ADMIN, "/v1/presence/a%00b")
        hh.check_error(400, "INVALID_ARGUMENT", st, b, "presence read of a%00b")
      end)
    end)

    -- ---------------------------------------------------------------
    describe("GET /v1/stats", function()
      it("answers store:stats(): calls, events, pending, dead, sessions", function()
        local w = worker()
        hh.append_ok(srv, w, name("stats"), { { type = "job" }, { type = "fact", settled = true } })
        local st, b = hh.get(srv, w, "/v1/stats")
        hh.check_ok(st, b, "stats")
        assert.equal(200, st)
        assert.equal(2, b.events)
        assert.equal(1, b.pending)
        assert.equal(0, b.dead)
        assert.equal(1, b.sessions)
        assert.equal("table", type(b.calls))
        local append = b.calls.append
        assert.is_table(append, shown(b.calls))
        assert.is_true(append.count >= 1)
        assert.equal("number", type(append.p99_us))
        assert.equal("number", type(append.p50_us))
        assert.equal("integer", math.type(append.errors))
        local _, root = hh.get(srv, ADMIN, "/v1/stats")
        assert.is_true(root.events >= 2)
      end)
    end)

    -- ---------------------------------------------------------------
    describe("the store's other errors over HTTP", function()
      it("STALE_FENCE (409): an append carrying a fence token never issued writes nothing", function()
        local s = name("fence")
        hh.append_ok(srv, ADMIN, s, { { type = "x", settled = true } })
        local p = last_position()
        local st, b = hh.post(srv, ADMIN, hh.spath(s, "events"), { events = { { type = "y" } }, fence = 7 })
        hh.check_error(409, "STALE_FENCE", st, b, "append with an unknown fence")
        nothing_appended_since(p)
      end)

      it("SEALED (409) and TRUNCATED (410), with the session sealed/truncated over HTTP", function()
        local sealed, cut = name("sealed"), name("cut")
        hh.append_ok(srv, ADMIN, sealed, { { type = "x", settled = true } })
        hh.append_ok(srv, ADMIN, cut, { { type = "x", settled = true }, { type = "x", settled = true }, { type = "x", settled = true } })
        hh.check_ok(hh.post(srv, ADMIN, hh.spath(sealed, "seal"), { reason = "done" }))
        hh.check_ok(hh.post(srv, ADMIN, hh.spath(cut, "truncate"), { through = 2 }))
        local p = last_position()
        local st, b = hh.post(srv, ADMIN, hh.spath(sealed, "events"), { events = { { type = "y" } } })
        hh.check_error(409, "SEALED", st, b, "append to a sealed session")
        nothing_appended_since(p)
        local _, rows = hh.get(srv, ADMIN, "/v1/sessions?prefix=" .. hh.enc(sealed))
        assert.is_true(rows.sessions[1].sealed)
        st, b = hh.get(srv, ADMIN, hh.spath(cut, "events"))
        hh.check_error(410, "TRUNCATED", st, b, "read below a truncation")
        local rest = hh.events(srv, ADMIN, cut, "?after=2")
        assert.same({ 3 }, helpers.indexes(rest))
      end)
    end)

    -- ---------------------------------------------------------------
    describe("names in paths", function()
      it("every route refuses a name that decodes to NUL or invalid UTF-8 with 400, changing nothing", function()
        local p = last_position()
        for _, bad in ipairs({ "a%00b", "%FF", "a%C3" }) do
          local paths = {
            { "POST", "/v1/sessions/" .. bad .. "/events", { events = { { type = "x" } } } },
            { "GET", "/v1/sessions/" .. bad .. "/events" },
            { "GET", "/v1/sessions/" .. bad .. "/head" },
            { "GET", "/v1/sessions/" .. bad .. "/state/count" },
            { "GET", "/v1/sessions/x/state/" .. bad },
            { "GET", "/v1/sessions/" .. bad .. "/lineage" },
            { "GET", "/v1/sessions/" .. bad .. "/children" },
            { "POST", "/v1/sessions/" .. bad .. "/events/1/revive", {} },
            { "POST", "/v1/sessions/" .. bad .. "/events/1/settle", {} },
            { "POST", "/v1/sessions/" .. bad .. "/events/1/complete", { attempt = 1 } },
            { "POST", "/v1/sessions/" .. bad .. "/events/1/fail", { attempt = 1, error = "e" } },
            { "POST", "/v1/sessions/" .. bad .. "/events/1/renew", { holder = "h", attempt = 1, ttl_ms = 1000 } },
            { "GET", "/v1/refs/" .. bad },
            { "PUT", "/v1/refs/" .. bad, { session = "x" } },
            { "DELETE", "/v1/refs/" .. bad },
            { "POST", "/v1/refs/" .. bad .. "/promote", { from = "x" } },
            { "GET", "/v1/presence/" .. bad },
            { "PUT", "/v1/presence/" .. bad .. "/p", { values = { a = 1 }, ttl_ms = 1000 } },
            { "PUT", "/v1/presence/ns/" .. bad, { values = { a = 1 }, ttl_ms = 1000 } },
          }
          for _, r in ipairs(paths) do
            local st, b = hh.request(srv, r[1], r[2], { token = ADMIN, body = r[3] })
            hh.check_error(400, "INVALID_ARGUMENT", st, b, r[1] .. " " .. r[2])
          end
        end
        nothing_appended_since(p)
      end)
    end)

    -- ---------------------------------------------------------------
    describe("routing", function()
      it("an unknown path is 404 NOT_FOUND; a known path with another method is 405 with Allow", function()
        local st, b, h = hh.get(srv, ADMIN, "/v1/nope")
        hh.check_error(404, "NOT_FOUND", st, b, "GET /v1/nope")
        assert.truthy((h["content-type"] or ""):find("application/json", 1, true), shown(h))
        local st2, b2, h2 = hh.delete(srv, ADMIN, hh.spath("x", "events"))
        hh.check_error(405, "METHOD_NOT_ALLOWED", st2, b2, "DELETE events")
        assert.truthy((h2.allow or ""):find("GET", 1, true), shown(h2))
        assert.truthy((h2.allow or ""):find("POST", 1, true), shown(h2))
      end)
    end)

    -- ---------------------------------------------------------------
    describe("auth", function()
      -- Every JSON route with a body valid for it: {method, path, body, right}.
      local function routes(s)
        local ev = hh.spath(s, "events")
        return {
          { "POST", ev, { events = { { type = "job" } } }, "append" },
          { "GET", ev, nil, "read" },
          { "GET", hh.spath(s, "head"), nil, "read" },
          { "GET", hh.spath(s, "state", "count"), nil, "read" },
          { "GET", hh.spath(s, "lineage"), nil, "read" },
          { "GET", hh.spath(s, "children"), nil, "read" },
          { "POST", ev .. "/1/revive", {}, "admin" },
          { "POST", ev .. "/1/settle", { reason = "r" }, "admin" },
          { "POST", ev .. "/1/complete", { attempt = 1 }, "work" },
          { "POST", ev .. "/1/fail", { attempt = 1, error = "e" }, "work" },
          { "POST", ev .. "/1/renew", { holder = "h", attempt = 1, ttl_ms = 1000 }, "work" },
          { "GET", "/v1/sessions", nil, "read" },
          { "GET", "/v1/events", nil, "read" },
          { "GET", "/v1/dead-letters", nil, "read" },
          { "POST", "/v1/claims", { holder = "h", ttl_ms = 1000 }, "work" },
          { "GET", "/v1/refs", nil, "read" },
          { "GET", "/v1/refs/" .. hh.enc(s), nil, "read" },
          { "PUT", "/v1/refs/" .. hh.enc(s), { session = s }, "admin" },
          { "DELETE", "/v1/refs/" .. hh.enc(s), nil, "admin" },
          { "POST", "/v1/refs/" .. hh.enc(s) .. "/promote", { from = s }, "admin" },
          { "GET", "/v1/presence/" .. hh.enc(s), nil, "read" },
          { "PUT", "/v1/presence/" .. hh.enc(s) .. "/p", { values = { a = 1 }, ttl_ms = 60000 }, "append" },
          { "GET", "/v1/stats", nil, "read" },
        }
      end
      -- Tokens of tenant acme lacking each right.
      local LACKING = {
        read = { "acme-append", "acme-work" },
        append = { "acme-read", "acme-work" },
        work = { "acme-read", "acme-append" },
        admin = { "acme-rw", "acme-read", "acme-append", "acme-work" },
      }

      -- acme's whole visible state, to show a refused request changed nothing.
      local function acme_world(s)
        local parts = {}
        for _, path in ipairs({ hh.spath(s, "events"), "/v1/refs", "/v1/presence/" .. hh.enc(s), "/v1/dead-letters" }) do
          local st, _, _, text = hh.get(srv, "acme-admin", path)
          parts[#parts + 1] = tostring(st) .. " " .. tostring(text)
        end
        return table.concat(parts, "\n")
      end

      it("401 UNAUTHORIZED without a token, with an unknown one, or a malformed header; nothing changes", function()
        local s = name("auth401")
        -- acme's session: event 1 claimed by acme, dead after a fail, so every route has a target
        hh.append_ok(srv, "acme-rw", s, { { type = "job-" .. s } })
        hh.put(srv, "acme-admin", "/v1/refs/" .. hh.enc(s), { session = s })
        local world = acme_world(s)
        local p = last_position()
        for _, r in ipairs(routes(s)) do
          local what = r[1] .. " " .. r[2]
          local st, b = hh.request(srv, r[1], r[2], { body = r[3] })
          hh.check_error(401, "UNAUTHORIZED", st, b, what .. " without a token")
          st, b = hh.request(srv, r[1], r[2], { token = "no-such-token", body = r[3] })
          hh.check_error(401, "UNAUTHORIZED", st, b, what .. " with an unknown token")
          st, b = hh.request(srv, r[1], r[2], { body = r[3], headers = { Authorization = "Basic YWNtZS1ydzo=" } })
          hh.check_error(401, "UNAUTHORIZED", st, b, what .. " with Basic auth")
          st, b = hh.request(srv, r[1], r[2], { body = r[3], headers = { Authorization = "Bearer" } })
          hh.check_error(401, "UNAUTHORIZED", st, b, what .. " with an empty bearer")
        end
        nothing_appended_since(p, "unauthorized requests")
        assert.equal(world, acme_world(s))
      end)

      it("403 FORBIDDEN with a token lacking the route's right; nothing changes", function()
        local s = name("auth403")
        hh.append_ok(srv, "acme-rw", s, { { type = "job-" .. s } })
        hh.put(srv, "acme-admin", "/v1/refs/" .. hh.enc(s), { session = s })
        hh.put(srv, "acme-rw", "/v1/presence/" .. hh.enc(s) .. "/p", { values = { a = 0 }, ttl_ms = 3600000 })
        local world = acme_world(s)
        local p = last_position()
        for _, r in ipairs(routes(s)) do
          for _, tok in ipairs(LACKING[r[4]]) do
            local st, b = hh.request(srv, r[1], r[2], { token = tok, body = r[3] })
            hh.check_error(403, "FORBIDDEN", st, b, ("%s %s with %s"):format(r[1], r[2], tok))
          end
        end
        nothing_appended_since(p, "forbidden requests")
        assert.equal(world, acme_world(s))
        -- and the token with the right gets past auth (whatever the store then says)
        for _, r in ipairs(routes(s)) do
          local tok = r[4] == "admin" and "acme-admin" or (r[4] == "read" and "acme-read" or "acme-rw")
          if r[4] == "append" then tok = "acme-append" end
          if r[4] == "work" then tok = "acme-work" end
          local st, b = hh.request(srv, r[1], r[2], { token = tok, body = r[3] })
          assert.is_true(st ~= 401 and st ~= 403, ("%s %s with %s: %s %s"):format(r[1], r[2], tok, tostring(st), shown(b)))
        end
      end)
    end)

    -- every answer of the routes above against the OpenAPI document
    -- (spec/openapi_helpers.lua): its schema for the route, or Error
    it("every answer met the OpenAPI document's schema for its route", oh.checks(function() return records end))
  end)
end
