-- Regression specs (issue 31): what random calls through the Lua API found
-- (a use-after-free in the engine handle, a leak on a closed root store,
-- raw VM errors where §2 promises an error object, clock values that are
-- the C API's "absent"). Each test is named after the defect it holds
-- fixed; under `make check-sanitize` the memory errors and leaks fail the
-- run too. spec/36-api_fuzz_spec.lua runs the random calls that keep
-- looking for more of their kind. Runs once per backend URL.
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local expect_error = helpers.expect_error
local expect_arg_error = helpers.expect_arg_error
local T0 = helpers.T0

local collected = helpers.collected

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    ---------------------------------------------------------------------------
    describe("engine handle", function()
      it("use-after-free: close() from progress after a refused nested run() is refused, the run ends", function()
        local t = eh.setup(url)
        t.handler("x", "return function() end")
        local engine = t.engine({ workers = 2 })
        t.store:append("s", { { type = "x" }, { type = "x" } })
        local nested, closing
        local r = engine:run({ progress_ms = 1, progress = function()
          if nested == nil then
            nested = { pcall(engine.run, engine, { until_idle = true }) }
            -- The refused nested run must leave the outer run's guard on:
            -- closing here would free the engine under its workers.
            closing = { pcall(engine.close, engine) }
            engine:stop()
          end
        end })
        assert.is_false(nested[1])
        assert.is_true(eventstore.is_error(nested[2], "INVALID_ARGUMENT"), tostring(nested[2]))
        assert.is_false(closing[1], "close() from the progress function succeeded while the engine ran")
        assert.is_true(eventstore.is_error(closing[2], "INVALID_ARGUMENT"), tostring(closing[2]))
        assert.is_table(r)
        -- The engine is still usable, then closes.
        assert.is_true(engine:has_handler("x"))
        engine:close()
        expect_error("CLOSED", function() return engine:has_handler("x") end)
      end)

      it("type confusion: handlers cannot reach the engine's C functions or the registry", function()
        local t = eh.setup(url)
        -- Before the cut-down debug library, a handler could take the
        -- box finalizer from debug.getregistry() or the engine's protected
        -- call from debug.getinfo(level, "f").func and call it on a file
        -- handle, whose bytes were then used as the engine's structs.
        t.reducer("r", "return { init = function() return {} end }")
        t.handler("x", [[
return function(event, ctx)
  ctx.state("r")
  local refused = {}
  for _, name in ipairs({ "getregistry", "getmetatable", "setmetatable", "getupvalue",
                          "setupvalue", "upvaluejoin", "getlocal", "setlocal",
                          "getuservalue", "setuservalue", "sethook", "gethook" }) do
    local ok, err = pcall(debug[name], io.stdout, 1, 1)
    if ok or not tostring(err):find("debug." .. name .. " is not available", 1, true) then
      error("debug." .. name .. " was not refused: " .. tostring(err))
    end
    refused[#refused + 1] = name
  end
  local levels = 0
  for level = 1, 50 do
    local info = debug.getinfo(level, "fSl")
    if not info then break end
    assert(info.func == nil, "getinfo gave a function at level " .. level)
    levels = levels + 1
  end
  assert(debug.getinfo(1, "S").short_src:find("x", 1, true), "getinfo(1) is not the handler")
  assert(debug.traceback("m"):find("^m\n"), "traceback")
  return { { type = "done", payload = { refused = #refused, levels = levels } } }
end
]])
        local engine = t.engine()
        t.store:append("s", { { type = "x" } })
        local r = engine:run({ until_idle = true })
        assert.equal(1, r.handled, tostring(t.store:read("s")[1].last_error))
        local done = t.store:read("s")[2]
        assert.equal("done", done.type)
        assert.equal(12, done.payload.refused)
        assert.is_true(done.payload.levels >= 2)
        engine:close()
      end)

      it("raw error: close() from a progress function raises an error object", function()
        local t = eh.setup(url)
        local engine = t.engine()
        local err
        engine:run({ progress_ms = 1, progress = function()
          if err == nil then
            local ok, e = pcall(engine.close, engine)
            err = ok and "closed" or e
            engine:stop()
          end
        end })
        assert.is_true(eventstore.is_error(err, "INVALID_ARGUMENT"), tostring(err))
        assert.is_true(err.message:find("stop", 1, true) ~= nil, err.message)
      end)

      it("raw error: every method of a closed engine raises CLOSED, stop() too; close() twice is harmless", function()
        local t = eh.setup(url)
        local engine = t.engine()
        engine:close()
        engine:close()
        local calls = {
          run = { { until_idle = true } },
          stop = {},
          state = { "s", "r" },
          append = { "s", { { type = "x" } } },
          has_handler = { "x" },
          lease = { "s", { ttl_ms = 10 } },
          truncate = { "s", 0 },
          release = { "s" },
          stats = {},
          _stats_enabled = { true },
        }
        for name, args in pairs(calls) do
          local ok, err = pcall(engine[name], engine, table.unpack(args))
          assert.is_false(ok, name .. " succeeded on a closed engine")
          assert.is_true(eventstore.is_error(err, "CLOSED"), name .. ": " .. tostring(err))
        end
        assert.equal(0, t.store:head("s"), "a refused call wrote")
      end)

      it("raw error: an engine method called on something else is an argument error", function()
        local t = eh.setup(url)
        local engine = t.engine()
        for _, bad in ipairs({ 5, "x", {}, t.store }) do
          expect_arg_error(engine.has_handler, bad, "x")
          expect_arg_error(engine.stop, bad)
          expect_arg_error(engine.close, bad)
        end
      end)
    end)

    ---------------------------------------------------------------------------
    describe("store handle", function()
      it("leak: presence_subscribe on a tenant whose root is closed raises CLOSED and keeps nothing", function()
        local root = helpers.new(url)
        local tenant = root:tenant("acme")
        root:close()
        local weak = setmetatable({}, { __mode = "k" })
        for _ = 1, 3 do
          local fn = function() end
          weak[fn] = true
          expect_error("CLOSED", function() return tenant:presence_subscribe("room", fn) end)
          fn = nil -- luacheck: ignore
        end
        assert.is_true(collected(weak), "the refused subscription kept its callback")
        expect_error("CLOSED", function() return tenant:subscribe("s", function() end) end)
        expect_error("CLOSED", function() return tenant:head("s") end)
      end)

      it("raw error: store.stream on a non-store is an argument error at the call", function()
        local store = helpers.new(url)
        local stream = store.stream
        for _, bad in ipairs({ 5, "s", {}, eventstore.manual_clock(0) }) do
          local msg = expect_arg_error(stream, bad, "s")
          assert.is_true(msg:find("#1 to 'stream' (eventstore.Store expected", 1, true) ~= nil, msg)
        end
        -- a tenant handle is a store
        local n = 0
        store:tenant("a"):append("s", { { type = "t" } })
        for _ in store:tenant("a"):stream("s", { timeout_ms = 0 }) do n = n + 1 end
        assert.equal(1, n)
      end)

      it("raw error: an __index that replaces a later element of the events list is an argument error", function()
        local store = helpers.new(url)
        for _, replacement in ipairs({ false, 5, "x" }) do
          local events = {}
          events[1] = setmetatable({}, { __index = function(_, k)
            if k == "type" then
              events[3] = replacement or nil
              return "a"
            end
          end })
          events[2] = { type = "b" }
          events[3] = { type = "c" }
          local msg = expect_arg_error(store.append, store, "s", events)
          assert.is_true(msg:find("events[3]", 1, true) ~= nil, msg)
        end
        assert.equal(0, store:head("s"), "a refused append wrote")
      end)

      it("raw error: a finalizer that replaces a later element of the events list is an argument error", function()
        local store = helpers.new(url)
        local events = { { type = "a" }, { type = "b" } }
        -- The finalizer runs at the collection the first event's __index
        -- forces, in the middle of the conversion.
        events[1] = setmetatable({}, { __index = function(_, k)
          if k == "type" then
            setmetatable({}, { __gc = function() events[2] = nil end })
            collectgarbage("collect")
            return "a"
          end
        end })
        expect_arg_error(store.append, store, "s", events)
        assert.equal(0, store:head("s"), "a refused append wrote")
      end)
    end)

    ---------------------------------------------------------------------------
    describe("clock range", function()
      it("manual_clock():set(math.mininteger) is refused and leaves the clock", function()
        local clock = eventstore.manual_clock(T0)
        for _, v in ipairs({ math.mininteger, -1 }) do
          expect_error("INVALID_ARGUMENT", function() return clock:set(v) end)
          assert.equal(T0, clock:now())
        end
        assert.equal(0, clock:set(0))
        assert.equal(math.maxinteger, clock:set(math.maxinteger))
      end)

      it("manual_clock(ms) and advance() refuse a time outside 0..math.maxinteger", function()
        for _, v in ipairs({ math.mininteger, -1 }) do
          expect_error("INVALID_ARGUMENT", function() return eventstore.manual_clock(v) end)
        end
        local clock = eventstore.manual_clock(5)
        expect_error("INVALID_ARGUMENT", function() return clock:advance(-6) end)
        assert.equal(5, clock:now())
        assert.equal(0, clock:advance(-5))
      end)

      it("a clock function returning math.mininteger or a negative time fails the call, nothing written", function()
        for _, v in ipairs({ math.mininteger, -1 }) do
          local now = T0
          local store = helpers.open(url, { clock = function() return now end })
          store:append("s", { { type = "a" } })
          now = v
          local err = expect_error("INVALID_ARGUMENT", function() return store:append("s", { { type = "b" } }) end)
          assert.is_true(err.message:find("clock", 1, true) ~= nil, err.message)
          now = T0 + 1
          assert.equal(1, store:head("s"))
          local rows = store:sessions({}).sessions
          assert.equal(T0, rows[1].first_at)
          assert.equal(T0, rows[1].updated_at)
          assert.equal(T0, store:read("s")[1].created_at)
        end
      end)

      it("generated ids stay in time order past the 48 bits of milliseconds a UUIDv7 holds", function()
        local clock = eventstore.manual_clock((1 << 48) - 2)
        local store = helpers.open(url, { clock = clock })
        local ids = {}
        for _, t in ipairs({ (1 << 48) - 2, (1 << 48) - 1, 1 << 48, (1 << 48) + 5, math.maxinteger }) do
          clock:set(t)
          ids[#ids + 1] = store:append("s", { { type = "t" } })[1].id
        end
        for i = 2, #ids do
          assert.is_true(ids[i] > ids[i - 1], ("id %d sorts before id %d: %s, %s"):format(i, i - 1, ids[i], ids[i - 1]))
        end
        assert.equal("ffffffff-ffff-", ids[#ids]:sub(1, 14))
        assert.equal(math.maxinteger, store:read("s")[5].created_at)
      end)
    end)
  end)
end
