-- Engine: docs/contract.md §4 and docs/engine.md -- handlers, events without a
-- handler, hot reload, retries with backoff, dead letters, lanes under two
-- workers, timers, the instruction and memory budgets, ctx, close.
-- Reducers and snapshots are in 41-engine_state_spec.lua, kill -9 in
-- 42-engine_crash_spec.lua. Runs once per backend URL (helpers.urls()).
--
-- Handlers run in the engine's worker Lua states, not in this one: they
-- report what they saw only through the events they return, which the tests
-- read back from the log.
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")

local T0 = helpers.T0
local counts = eh.counts
local event = eh.event
local expect_error = helpers.expect_error

-- A handler returning one event of type `out` (no handler file: settled).
local function returns(out)
  return ([[
return function(event, ctx)
  return { { type = %q, payload = { of = event.index } } }
end
]]):format(out)
end

local function contains(haystack, needle)
  return type(haystack) == "string" and haystack:find(needle, 1, true) ~= nil
end

local function contains_ci(haystack, pattern)
  return type(haystack) == "string" and haystack:lower():find(pattern) ~= nil
end

-- engine:append of events whose type has a handler file: each must be
-- stored pending (else the engine did not see its own handler file).
local function append_pending(engine, session, events, opts)
  local stored, pending = engine:append(session, events, opts)
  for i, e in ipairs(stored) do
    assert.equal("pending", e.status, ("engine:append stored %s #%d (%s) %s: the engine did not see "
      .. "scripts/handlers/%s.lua"):format(session, e.index, e.type, tostring(e.status), e.type))
  end
  return stored, pending
end

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    after_each(eh.cleanup)

    -- A fresh store on a manual clock at T0 and an empty scripts directory.
    -- t.engine(opts) opens an engine on them (opts added to store/scripts).
    local function setup() return eh.setup(url) end
    local run = eh.run

    -------------------------------------------------------------------------
    describe("handlers", function()
      it("appends a handler's returned events with cause {index, attempt} and marks the event processed", function()
        local t = setup()
        t.handler("order.placed", [[
return function(event, ctx)
  return {
    { type = "order.confirmed", payload = { order = event.payload.order, qty = event.payload.qty } },
    { type = "order.audit", id = "audit-" .. event.payload.order, lane = "audit", payload = { n = 1 } },
  }
end
]])
        local engine = t.engine()
        local stored, pending = engine:append("s", { { type = "order.placed", payload = { order = "A1", qty = 2 } } })
        assert.equal(1, #stored)
        assert.equal("pending", stored[1].status)
        assert.is_true(pending)

        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))

        local events = t.store:read("s")
        assert.equal(3, #events)
        local placed, confirmed, audit = events[1], events[2], events[3]
        assert.equal("processed", placed.status)
        assert.equal(1, placed.attempts)
        assert.equal(0, placed.failures)
        assert.equal(T0, placed.processed_at)

        assert.equal("order.confirmed", confirmed.type)
        assert.same({ order = "A1", qty = 2 }, confirmed.payload)
        assert.same({ index = 1, attempt = 1 }, confirmed.cause)
        assert.equal("s", confirmed.session)
        assert.equal(2, confirmed.index)

        assert.equal("order.audit", audit.type)
        assert.equal("audit-A1", audit.id)
        assert.equal("audit", audit.lane)
        assert.same({ index = 1, attempt = 1 }, audit.cause)

        -- the returned events have no handler: the engine settled them
        assert.equal("processed", confirmed.status)
        assert.equal("processed", audit.status)

        -- nothing left: a second run does nothing
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        assert.equal(3, t.store:head("s"))
      end)

      it("a handler returning nothing processes the event and appends nothing", function()
        local t = setup()
        t.handler("quiet", "return function(event, ctx) end\n")
        t.handler("empty", "return function(event, ctx) return {} end\n")
        local engine = t.engine()
        t.store:append("s", { { type = "quiet" }, { type = "empty" } })
        assert.same({ handled = 2, failed = 0, dead = 0 }, run(engine))
        assert.equal(2, t.store:head("s"))
        assert.equal("processed", event(t.store, "s", 1).status)
        assert.equal("processed", event(t.store, "s", 2).status)
      end)

      it("runs the handlers of returned events in turn within the same run", function()
        local t = setup()
        t.handler("a", returns("b"))
        t.handler("b", returns("c"))
        t.handler("c", returns("d")) -- d has no handler
        local engine = t.engine()
        append_pending(engine, "s", { { type = "a" } })
        assert.same({ handled = 3, failed = 0, dead = 0 }, run(engine))
        local events = t.store:read("s")
        assert.same({ "a", "b", "c", "d" }, helpers.pluck(events, "type"))
        assert.is_nil(events[1].cause)
        assert.same({ index = 1, attempt = 1 }, events[2].cause)
        assert.same({ index = 2, attempt = 1 }, events[3].cause)
        assert.same({ index = 3, attempt = 1 }, events[4].cause)
        for _, e in ipairs(events) do
          assert.equal("processed", e.status, "event " .. e.index .. " (" .. e.type .. ")")
        end
        assert.equal(3, events[4].payload.of)
      end)

      it("handles the pending events of every session", function()
        local t = setup()
        t.handler("job", returns("job.done"))
        local engine = t.engine()
        for _, s in ipairs({ "s1", "s2", "s3" }) do
          t.store:append(s, { { type = "job" }, { type = "job" } })
        end
        assert.same({ handled = 6, failed = 0, dead = 0 }, run(engine))
        for _, s in ipairs({ "s1", "s2", "s3" }) do
          local events = t.store:read(s)
          assert.equal(4, #events, s)
          for _, e in ipairs(events) do assert.equal("processed", e.status) end
          local done = eh.of_type(events, "job.done")
          assert.same({ 1, 2 }, helpers.sorted(helpers.pluck(helpers.pluck(done, "cause"), "index")))
        end
      end)

      it("gives the handler the stored event with its attempt, and ctx.session, ctx.attempt, ctx.now()", function()
        local t = setup()
        t.handler("probe", [[
return function(event, ctx)
  ctx.log("probing", event.index)
  return { {
    type = "probe.result",
    payload = {
      index = event.index, session = event.session, type = event.type, id = event.id,
      lane = event.lane, attempt = event.attempt, status = event.status, data = event.payload,
      ctx_session = ctx.session, ctx_attempt = ctx.attempt, now = ctx.now(),
    },
  } }
end
]])
        local engine = t.engine()
        t.store:append("sess-1", { { type = "other", settled = true }, { id = "p-1", type = "probe", lane = "L", payload = { x = 1, y = "z" } } })
        t.clock:set(T0 + 12345)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        local r = event(t.store, "sess-1", 3)
        assert.equal("probe.result", r.type)
        assert.same({
          index = 2, session = "sess-1", type = "probe", id = "p-1", lane = "L", attempt = 1,
          status = "pending", data = { x = 1, y = "z" },
          ctx_session = "sess-1", ctx_attempt = 1, now = T0 + 12345,
        }, r.payload)
        assert.equal("integer", math.type(r.payload.now))
        assert.equal(T0 + 12345, event(t.store, "sess-1", 2).processed_at)
      end)

      it("run returns the handled, failed and dead counts of that run", function()
        local t = setup()
        t.handler("ok", returns("ok.done"))
        t.handler("bad", "return function(event, ctx) error('bad handler') end\n")
        local engine = t.engine({ max_failures = 5 })
        t.store:append("s", { { type = "ok" }, { type = "bad" }, { type = "ok" } })
        assert.same({ handled = 2, failed = 1, dead = 0 }, run(engine))
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine)) -- bad waits for its backoff
      end)

      it("each engine uses its own scripts directory (engines opened and closed one after another)", function()
        local t = setup()
        for i = 1, 6 do
          local dir = eh.scripts_dir()
          local job = "job" .. i -- only this engine's directory has its handler
          eh.handler(dir, job, ([[
return function(event, ctx)
  return { { type = "done", payload = { engine = %d } } }
end
]]):format(i))
          local engine = eh.engine({ store = t.store, scripts = dir })
          local session = "s" .. i
          local stored = engine:append(session, { { type = job } })
          assert.equal("pending", stored[1].status, "engine " .. i .. " does not see its own handler")
          assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
          assert.same({ engine = i }, event(t.store, session, 2).payload)
          engine:close()
        end
      end)

      it("engine:append is store:append: expected head, returned stored events", function()
        local t = setup()
        t.handler("work", returns("work.done"))
        local engine = t.engine()
        local stored = engine:append("s", { { id = "w1", type = "work", payload = { n = 1 } } }, { expected = 0 })
        assert.equal(1, stored[1].index)
        assert.equal("w1", stored[1].id)
        assert.same({ n = 1 }, stored[1].payload)
        expect_error("WRONG_EXPECTED_HEAD", function()
          engine:append("s", { { type = "work" } }, { expected = 0 })
        end)
        -- a lost-acknowledgement retry returns the original
        local again = engine:append("s", { { id = "w1", type = "work", payload = { n = 1 } } })
        assert.equal(1, again[1].index)
        assert.equal(1, t.store:head("s"))
        -- opts.answer as store:append's: the ids alone, or refused before any write
        local ids, pending = engine:append("s", { { type = "work" }, { id = "w3", type = "work" } }, { answer = "ids" })
        assert.same({ eh.event(t.store, "s", 2).id, "w3" }, ids)
        assert.is_true(pending)
        expect_error("INVALID_ARGUMENT", engine.append, engine, "s", { { type = "work" } }, { answer = "all" })
        assert.equal(3, t.store:head("s"))
      end)

      it("results carry meta.correlation and meta.causation beside the handler's own meta (§4)", function()
        local t = setup()
        -- the handler's meta is kept; its own correlation wins over the chain's
        t.handler("order.placed", [[
return function(event, ctx)
  return {
    { type = "order.confirmed", revision = 2 },
    { type = "order.audit", meta = { who = "clerk", n = 1 } },
    { type = "order.audit", meta = { correlation = "own" } },
  }
end
]])
        t.handler("order.confirmed", [[
return function(event, ctx)
  -- ctx.meta is the handled event's meta (§4)
  return { { type = "order.shipped", payload = { seen = ctx.meta and ctx.meta.causation or "none" } } }
end
]])
        local engine = t.engine()
        local placed = engine:append("s", { { type = "order.placed" } })[1]
        local traced = engine:append("u", { { type = "order.placed", meta = { correlation = "req-42" } } })[1]
        assert.same({ handled = 4, failed = 0, dead = 0 }, run(engine))
        local s = t.store:read("s")
        local root = placed.id
        assert.equal(nil, s[1].meta) -- the first of a chain has none: it correlates as its own id
        assert.same({ correlation = root, causation = root }, s[2].meta)
        assert.equal(2, s[2].revision)
        assert.same({ correlation = root, causation = root, who = "clerk", n = 1 }, s[3].meta)
        assert.same({ correlation = "own", causation = root }, s[4].meta)
        -- a result of a result: the chain's correlation, its own cause
        assert.equal("order.shipped", s[5].type)
        assert.same({ correlation = root, causation = s[2].id }, s[5].meta)
        assert.same({ seen = root }, s[5].payload) -- order.confirmed's handler read its ctx.meta
        -- an event that carries a correlation passes it on
        local u = t.store:read("u")
        assert.same({ correlation = "req-42", causation = traced.id }, u[2].meta)
        assert.same({ correlation = "req-42", causation = u[2].id }, u[5].meta)
      end)
    end)

    -------------------------------------------------------------------------
    describe("events of a type with no handler", function()
      it("engine:append stores them processed; types with a handler stay pending", function()
        local t = setup()
        t.handler("work", returns("work.done"))
        local engine = t.engine()
        local stored, pending = engine:append("s", { { type = "note" }, { type = "work" }, { type = "note.other" } })
        assert.same({ "processed", "pending", "processed" }, helpers.pluck(stored, "status"))
        assert.is_true(pending)
        assert.same({ "processed", "pending", "processed" }, helpers.pluck(t.store:read("s"), "status"))

        local _, pending2 = engine:append("t", { { type = "note" } })
        assert.is_false(pending2)
        assert.equal("processed", event(t.store, "t", 1).status)

        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal(4, t.store:head("s"))
      end)

      -- A type names a handler the way the scan of handlers/ finds them
      -- (docs/engine.md): "./t" or ".hidden" never does, even where a path
      -- of that name reaches a file, since no run claims that type: stored
      -- pending, such an event would wait for ever.
      it("engine:append judges a type by the handler scan's rule: './t' and '.hidden' are stored processed", function()
        local t = setup()
        t.handler("t", returns("t.done"))
        t.handler(".hidden", returns("hidden.done")) -- a hidden file: never a handler
        local engine = t.engine()
        local stored = engine:append("s", { { type = "./t" }, { type = "t" }, { type = ".hidden" } })
        assert.same({ "processed", "pending", "processed" }, helpers.pluck(stored, "status"))
        assert.same({ "processed", "pending", "processed" }, helpers.pluck(t.store:read("s"), "status"))
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.same({ "./t", "t", ".hidden", "t.done" }, helpers.pluck(t.store:read("s"), "type"))
        assert.same({}, t.store:pending_types())
      end)

      it("the engine leaves events appended straight to the store pending, for an engine with their handler", function()
        local t = setup()
        local engine = t.engine()
        local _, pending = t.store:append("s", { { type = "note" }, { type = "note", lane = "L" }, { type = "note", lane = "L" } })
        assert.is_true(pending)
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        for i = 1, 3 do
          local e = event(t.store, "s", i)
          assert.equal("pending", e.status)
          assert.equal(0, e.attempts) -- never even claimed
        end
        assert.equal(3, t.store:head("s"))
      end)

      it("a handler file added later handles the ones left pending, not the ones the engine wrote", function()
        local t = setup()
        local engine = t.engine()
        engine:append("s", { { type = "note" } })   -- written by the engine: processed
        t.store:append("s", { { type = "note" } })  -- straight to the store: pending
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        assert.equal("processed", event(t.store, "s", 1).status)
        assert.equal("pending", event(t.store, "s", 2).status)

        t.handler("note", returns("noted"))
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal(3, t.store:head("s"))
        assert.same({ 2 }, helpers.pluck(helpers.pluck(eh.of_type(t.store:read("s"), "noted"), "cause"), "index"))
      end)

      it("once a handler file exists, new events of its type go to it", function()
        local t = setup()
        local engine = t.engine()
        engine:append("s", { { type = "note" } })
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        t.handler("note", returns("noted"))
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))

        t.store:append("s", { { type = "note" } }) -- index 2
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        local stored = engine:append("s", { { type = "note" } }) -- index 4
        assert.equal("pending", stored[1].status)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        local noted = eh.of_type(t.store:read("s"), "noted")
        assert.same({ 2, 4 }, helpers.pluck(helpers.pluck(noted, "cause"), "index"))
      end)
    end)

    -------------------------------------------------------------------------
    describe("hot reload", function()
      local function version_handler(v)
        return ([[
return function(event, ctx)
  return { { type = "out", payload = { version = %d, of = event.index } } }
end
]]):format(v)
      end

      it("a changed handler file is used from the next run on", function()
        local t = setup()
        t.handler("job", version_handler(1))
        local engine = t.engine()
        append_pending(engine, "s", { { type = "job" } })
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal(1, event(t.store, "s", 2).payload.version)

        t.handler("job", version_handler(2)) -- new content, mtime moved forward
        append_pending(engine, "s", { { type = "job" } }) -- index 3
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        local out = event(t.store, "s", 4)
        assert.same({ version = 2, of = 3 }, out.payload)
      end)

      it("a changed handler file is picked up by an engine that stays open (after more than a second)", function()
        local t = setup()
        t.handler("job", version_handler(1))
        local engine = t.engine({ workers = 2 })
        append_pending(engine, "s", { { type = "job" } })
        run(engine)
        assert.equal(1, event(t.store, "s", 2).payload.version)
        t.handler("job", version_handler(7))
        os.execute("sleep 1.1")
        append_pending(engine, "s", { { type = "job" }, { type = "job" } })
        assert.same({ handled = 2, failed = 0, dead = 0 }, run(engine))
        for _, e in ipairs(eh.of_type(t.store:read("s", { after = 2 }), "out")) do
          assert.equal(7, e.payload.version)
        end
      end)

      it("a changed handler file is picked up during a run, about a second after it was last looked at", function()
        -- The workers keep the handler the loader found for as long as the
        -- loader itself would: a run that goes on uses the new file once
        -- that second is over. One event is appended per progress tick
        -- until one is handled by the new version (or ~10 s went by).
        local t = setup()
        t.handler("job", version_handler(1))
        local engine = t.engine()
        append_pending(engine, "s", { { type = "job" } })
        local changed, seen, ticks = false, false, 0
        engine:run({
          progress_ms = 20,
          progress = function()
            local outs = eh.of_type(t.store:read("s"), "out")
            if not changed then
              if #outs == 1 then
                t.handler("job", version_handler(2))
                changed = true
              end
              return
            end
            for _, e in ipairs(outs) do
              if e.payload.version == 2 then seen = true end
            end
            ticks = ticks + 1
            if seen or ticks > 500 then
              engine:stop()
              return
            end
            t.store:append("s", { { type = "job" } })
          end,
        })
        assert.is_true(seen, "the run went on with the old handler")
        assert.equal(1, event(t.store, "s", 2).payload.version)
      end)

      it("a handler file with a syntax error is an error at eventstore.engine naming the file and line (§4)", function()
        local t = setup()
        t.handler("broken", "return function(event, ctx)\n  return { { type = \n")
        t.handler("fine", returns("fine.done"))
        t.store:append("a", { { type = "broken" } })
        local err = expect_error("INVALID_ARGUMENT", t.engine)
        assert.is_true(contains(err.message, "handlers/broken.lua:3:"), "the file and line: " .. err.message)
        -- nothing was claimed: no attempt charged for a typo
        local e = event(t.store, "a", 1)
        assert.equal("pending", e.status)
        assert.equal(0, e.attempts)
      end)

      it("a reducer whose top level raises, and a handler that returns no function, are errors at eventstore.engine", function()
        local t = setup()
        t.reducer("count", "local x = nil\nreturn { init = x.y }\n")
        local err = expect_error("INVALID_ARGUMENT", t.engine)
        assert.is_true(contains(err.message, "reducers/count.lua:2:"), "the file and line: " .. err.message)
        t.reducer("count", "return { init = function() return {} end }\n")
        t.handler("notfn", "return 42\n")
        err = expect_error("INVALID_ARGUMENT", t.engine)
        assert.is_true(contains(err.message, "handlers/notfn.lua: must return a function, not number"), err.message)
        -- two broken scripts: the first is named, the other counted
        t.handler("also", "return function(\n")
        err = expect_error("INVALID_ARGUMENT", t.engine)
        assert.is_true(contains(err.message, "handlers/also.lua:"), err.message)
        assert.is_true(contains(err.message, "(and 1 more script that do not load)"), err.message)
      end)

      it("a script whose path is over 4 KiB is an error naming it, never cut short to another name", function()
        local t = setup()
        local part = ("n"):rep(240)
        local long = t.dir .. ("/" .. part):rep(16) -- under PATH_MAX itself ...
        local q = eh.sh_quote
        assert(os.execute("mkdir -p " .. q(long .. "/handlers")))
        -- ... but not with handlers/<part>/job.lua below it: moved there
        -- from handlers/ (a path that long cannot be opened whole)
        local src = os.tmpname()
        eh.write_file(src, "return function() end\n")
        assert(os.execute("cd " .. q(long .. "/handlers") .. " && mkdir " .. part .. " && mv " .. q(src)
          .. " " .. part .. "/job.lua"))
        local err = expect_error("INVALID_ARGUMENT", t.engine, { scripts = long })
        assert.is_true(contains(err.message, "script path too long (over 4095 bytes)"), err.message)
      end)

      it("a reload that fails keeps the last good version running, charges no attempt, and is counted once", function()
        local t = setup()
        t.handler("job", version_handler(1))
        local engine = t.engine({ workers = 2 })
        append_pending(engine, "s", { { type = "job" } })
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        t.handler("job", "return function(event, ctx)\n  return { { type = \n")
        append_pending(engine, "s", { { type = "job" }, { type = "job" }, { type = "job" } })
        -- a run looks at every file again when it starts: the edit is seen
        assert.same({ handled = 3, failed = 0, dead = 0 }, run(engine))
        for _, e in ipairs(eh.of_type(t.store:read("s"), "out")) do assert.equal(1, e.payload.version) end
        for i = 3, 5 do
          local e = event(t.store, "s", i)
          assert.equal("processed", e.status)
          assert.equal(1, e.attempts)
          assert.equal(0, e.failures)
        end
        -- both workers may have seen the broken file: one change, one count
        assert.equal(1, engine:stats().reload_failures)
        -- fixed, the new version runs
        t.handler("job", version_handler(7))
        append_pending(engine, "s", { { type = "job" } })
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        local last = t.store:read("s")
        assert.equal(7, last[#last].payload.version)
        assert.equal(1, engine:stats().reload_failures)
      end)

      it("a reducer that fails to reload folds with its last good version, also in a state that never ran it", function()
        local t = setup()
        t.reducer("count", [[
return { init = function() return { n = 0 } end, job = function(s) s.n = s.n + 1 end }
]])
        local engine = t.engine()
        t.store:append("s", { { type = "job" }, { type = "job" } })
        -- engine:state folds in the engine's fold state, which has not
        -- loaded the reducer yet: it gets the source that loaded at start
        t.reducer("count", "return { init = \n")
        assert.same({ n = 2 }, engine:state("s", "count"))
        assert.equal(1, engine:stats().reload_failures)
      end)

      it("a handler file added after the start that does not load fails its events naming the file; other events go on", function()
        local t = setup()
        t.handler("fine", returns("fine.done"))
        local engine = t.engine({ max_failures = 5, backoff_ms = 1000 })
        -- no version of it ever loaded: there is nothing to keep running
        t.handler("broken", "return function(event, ctx)\n  return { { type = \n")
        t.store:append("a", { { type = "broken" } })
        t.store:append("b", { { type = "fine" }, { type = "fine" } })
        assert.same({ handled = 2, failed = 1, dead = 0 }, run(engine))

        local e = event(t.store, "a", 1)
        assert.equal("pending", e.status)
        assert.equal(1, e.failures)
        assert.is_string(e.last_error)
        assert.is_true(contains(e.last_error, "broken.lua:3:"), "last_error must name the file and line: " .. tostring(e.last_error))
        assert.equal("processed", event(t.store, "b", 1).status)
        assert.equal("processed", event(t.store, "b", 2).status)

        -- fixed, it runs on the retry
        t.handler("broken", returns("repaired"))
        t.clock:set(e.retry_at)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        local repaired = event(t.store, "a", 2)
        assert.equal("repaired", repaired.type)
        assert.same({ index = 1, attempt = 2 }, repaired.cause)
      end)
    end)

    -------------------------------------------------------------------------
    describe("retries with backoff", function()
      it("an error on attempt 1 waits for its backoff, then attempt 2 succeeds", function()
        local t = setup()
        t.handler("flaky", [[
return function(event, ctx)
  if ctx.attempt == 1 then error("flaky: first attempt fails") end
  return { { type = "flaky.done", payload = { attempt = ctx.attempt } } }
end
]])
        local engine = t.engine({ backoff_ms = 1000, backoff_cap_ms = 60000, max_failures = 5 })
        t.store:append("s", { { type = "flaky" } })
        assert.same({ handled = 0, failed = 1, dead = 0 }, run(engine))

        local e = event(t.store, "s", 1)
        assert.equal("pending", e.status)
        assert.equal(1, e.failures)
        assert.equal(1, e.attempts) -- not retried within the same run
        assert.is_true(contains(e.last_error, "flaky: first attempt fails"), tostring(e.last_error))
        assert.is_number(e.retry_at)
        assert.is_true(e.retry_at >= T0 + 500 and e.retry_at <= T0 + 1000,
          ("first retry_at must be within [now + 500, now + 1000], got now + %d"):format(e.retry_at - T0))
        local retry_at = e.retry_at

        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        t.clock:set(retry_at - 1)
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        assert.equal(1, event(t.store, "s", 1).attempts)

        t.clock:set(retry_at)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        e = event(t.store, "s", 1)
        assert.equal("processed", e.status)
        assert.equal(2, e.attempts)
        local done = event(t.store, "s", 2)
        assert.equal("flaky.done", done.type)
        assert.same({ index = 1, attempt = 2 }, done.cause)
        assert.same({ attempt = 2 }, done.payload)
      end)

      it("the n-th retry waits between half and all of min(backoff_ms * 2^(n-1), backoff_cap_ms)", function()
        local t = setup()
        t.handler("always", "return function(event, ctx) error('always fails') end\n")
        local engine = t.engine({ backoff_ms = 1000, backoff_cap_ms = 3000, max_failures = 10 })
        t.store:append("s", { { type = "always" } })
        local expected_wait = { 1000, 2000, 3000, 3000, 3000 }
        local now = T0
        for n, wait in ipairs(expected_wait) do
          assert.same({ handled = 0, failed = 1, dead = 0 }, run(engine), "run " .. n)
          local e = event(t.store, "s", 1)
          assert.equal(n, e.failures)
          assert.equal(n, e.attempts)
          assert.equal("pending", e.status)
          assert.is_true(e.retry_at >= now + wait // 2 and e.retry_at <= now + wait,
            ("retry %d: retry_at must be within [now + %d, now + %d], got now + %d")
              :format(n, wait // 2, wait, e.retry_at - now))
          -- nothing happens before retry_at
          t.clock:set(e.retry_at - 1)
          assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
          now = e.retry_at
          t.clock:set(now)
        end
      end)
    end)

    -------------------------------------------------------------------------
    describe("dead letters", function()
      it("dead-letters at max_failures keeping the error and its traceback; revive after a fix completes it", function()
        local t = setup()
        t.handler("doomed", [[
local function deeper()
  error("doomed: handler always fails")
end
return function(event, ctx)
  deeper()
end
]])
        local engine = t.engine({ max_failures = 2, backoff_ms = 100, backoff_cap_ms = 1000 })
        t.store:append("s", { { type = "doomed" } })
        assert.same({ handled = 0, failed = 1, dead = 0 }, run(engine))
        local e = event(t.store, "s", 1)
        assert.equal("pending", e.status)
        assert.equal(1, e.failures)

        t.clock:set(e.retry_at)
        local r = run(engine)
        assert.equal(0, r.handled)
        assert.equal(1, r.dead)
        e = event(t.store, "s", 1)
        assert.equal("dead", e.status)
        assert.equal(2, e.failures)
        assert.is_true(contains(e.last_error, "doomed: handler always fails"), tostring(e.last_error))
        assert.is_true(contains(e.last_error, "stack traceback"), "last_error must hold a traceback: " .. tostring(e.last_error))
        local dead = t.store:dead_letters({})
        assert.equal(1, #dead)
        assert.equal(1, dead[1].index)

        -- a dead letter is not retried, however long we wait
        t.clock:advance(10 * 60 * 1000)
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        assert.equal("dead", event(t.store, "s", 1).status)

        -- fix the handler, revive: it runs again and completes
        t.handler("doomed", [[
return function(event, ctx)
  return { { type = "doomed.done", payload = { attempt = ctx.attempt } } }
end
]])
        t.store:revive("s", 1)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        e = event(t.store, "s", 1)
        assert.equal("processed", e.status)
        local done = event(t.store, "s", 2)
        assert.equal("doomed.done", done.type)
        assert.equal(3, e.attempts) -- two failed claims, then the revived one
        assert.same({ index = 1, attempt = 3 }, done.cause)
        assert.same({ attempt = 3 }, done.payload)
        assert.equal(0, #t.store:dead_letters({}))
      end)

      it("a dead letter blocks its lane until settled", function()
        local t = setup()
        t.handler("doomed", "return function(event, ctx) error('doomed') end\n")
        t.handler("next", returns("next.done"))
        local engine = t.engine({ max_failures = 1 })
        t.store:append("s", { { type = "doomed", lane = "L" }, { type = "next", lane = "L" }, { type = "next" } })
        local r = run(engine)
        assert.equal(1, r.handled) -- the unlaned event
        assert.equal(1, r.dead)
        assert.equal("dead", event(t.store, "s", 1).status)
        assert.equal("pending", event(t.store, "s", 2).status)
        t.clock:advance(10 * 60 * 1000)
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        assert.equal("pending", event(t.store, "s", 2).status)

        t.store:settle("s", 1, "skipped by the test")
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal("processed", event(t.store, "s", 2).status)
      end)
    end)

    -------------------------------------------------------------------------
    describe("lanes", function()
      it("handles each lane strictly in index order with 2 workers", function()
        local t = setup()
        t.handler("step", [[
return function(event, ctx)
  local x = 0
  for i = 1, 20000 + (event.index * 7919) % 20000 do x = x + i end
  return { { type = "seen", payload = { index = event.index, lane = event.lane } } }
end
]])
        local engine = t.engine({ workers = 2 })
        local lanes = { "a", "b", "c" }
        local batch, by_lane = {}, { a = {}, b = {}, c = {}, none = {} }
        for i = 1, 75 do
          local lane = (i % 5 == 0) and nil or lanes[i % 3 + 1]
          batch[i] = { type = "step", lane = lane, payload = { i = i } }
          table.insert(by_lane[lane or "none"], i)
        end
        t.store:append("s", batch)
        assert.same({ handled = 75, failed = 0, dead = 0 }, run(engine))

        local events = t.store:read("s")
        assert.equal(150, #events)
        local seen = { a = {}, b = {}, c = {}, none = {} }
        for _, e in ipairs(events) do
          assert.equal("processed", e.status, "event " .. e.index)
          if e.type == "seen" then
            assert.equal(e.payload.index, e.cause.index)
            table.insert(seen[e.payload.lane or "none"], e.payload.index)
          end
        end
        for _, lane in ipairs(lanes) do
          assert.same(by_lane[lane], seen[lane], "lane " .. lane .. " was not handled in index order")
        end
        assert.same(by_lane.none, helpers.sorted(seen.none))
      end)
    end)

    -------------------------------------------------------------------------
    describe("timers", function()
      it("a returned event with delay_ms gets not_before = now at completion + delay_ms and waits for the clock", function()
        local t = setup()
        t.handler("start", [[
return function(event, ctx)
  return { { type = "tick", delay_ms = 5000, payload = { n = 1 } } }
end
]])
        t.handler("tick", returns("ticked"))
        local engine = t.engine()
        append_pending(engine, "s", { { type = "start" } })
        t.clock:set(T0 + 100)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        local tick = event(t.store, "s", 2)
        assert.equal("tick", tick.type)
        assert.equal(T0 + 5100, tick.not_before)
        assert.equal("pending", tick.status)
        assert.same({ index = 1, attempt = 1 }, tick.cause)
        assert.same({ n = 1 }, tick.payload)

        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        t.clock:set(T0 + 5099)
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        assert.equal(2, t.store:head("s"))
        t.clock:set(T0 + 5100)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        local ticked = event(t.store, "s", 3)
        assert.equal("ticked", ticked.type)
        assert.same({ index = 2, attempt = 1 }, ticked.cause)
        assert.equal("processed", event(t.store, "s", 2).status)
      end)

      it("a returned event with at gets not_before = at", function()
        local t = setup()
        t.handler("schedule", [[
return function(event, ctx)
  return { { type = "tick", at = event.payload.at } }
end
]])
        t.handler("tick", returns("ticked"))
        local engine = t.engine()
        append_pending(engine, "s", { { type = "schedule", payload = { at = T0 + 7777 } } })
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal(T0 + 7777, event(t.store, "s", 2).not_before)
        t.clock:set(T0 + 7776)
        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        t.clock:set(T0 + 7777)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal("ticked", event(t.store, "s", 3).type)
      end)

      it("engine:append accepts delay_ms and at", function()
        local t = setup()
        t.handler("tick", returns("ticked"))
        local engine = t.engine()
        t.clock:set(T0 + 10)
        local stored = append_pending(engine, "s", { { type = "tick", delay_ms = 3000 }, { type = "tick", at = T0 + 2000 } })
        assert.equal(T0 + 3010, stored[1].not_before)
        assert.equal(T0 + 2000, stored[2].not_before)
        assert.equal(T0 + 3010, event(t.store, "s", 1).not_before)
        assert.equal(T0 + 2000, event(t.store, "s", 2).not_before)

        assert.same({ handled = 0, failed = 0, dead = 0 }, run(engine))
        t.clock:set(T0 + 2000)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal("processed", event(t.store, "s", 2).status)
        assert.equal("pending", event(t.store, "s", 1).status)
        t.clock:set(T0 + 3010)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal("processed", event(t.store, "s", 1).status)
      end)
    end)

    -------------------------------------------------------------------------
    describe("budgets", function()
      it("a handler over the instruction budget fails naming it; the engine handles the other events", function()
        local t = setup()
        t.handler("spin", "return function(event, ctx) while true do end end\n")
        t.handler("ok", returns("ok.done"))
        local engine = t.engine({ instruction_budget = 100000 })
        t.store:append("a", { { type = "spin" } })
        t.store:append("b", { { type = "ok" }, { type = "ok" } })
        assert.same({ handled = 2, failed = 1, dead = 0 }, run(engine))
        local e = event(t.store, "a", 1)
        assert.equal("pending", e.status)
        assert.equal(1, e.failures)
        assert.is_true(contains_ci(e.last_error, "instruction.budget"),
          "last_error must name the instruction budget: " .. tostring(e.last_error))
        assert.equal("processed", event(t.store, "b", 2).status)

        -- the engine keeps going: the worker that ran into the budget works on
        t.clock:advance(10 * 60 * 1000)
        t.store:append("b", { { type = "ok" } })
        assert.same({ handled = 1, failed = 1, dead = 0 }, run(engine))
        assert.equal("processed", event(t.store, "b", 5).status)
        assert.equal(2, event(t.store, "a", 1).failures)
      end)

      it("the instruction budget is per handler call, not cumulative", function()
        local t = setup()
        t.handler("medium", [[
return function(event, ctx)
  local x = 0
  for i = 1, 20000 do x = x + i end
  return { { type = "medium.done", payload = { x = x } } }
end
]])
        local engine = t.engine({ instruction_budget = 100000, workers = 1 })
        local batch = {}
        for i = 1, 12 do batch[i] = { type = "medium" } end
        t.store:append("s", batch)
        assert.same({ handled = 12, failed = 0, dead = 0 }, run(engine))
      end)

      it("a handler over the memory budget fails naming it; the engine survives and handles other events", function()
        local t = setup()
        t.handler("hog_string", [[
return function(event, ctx)
  local s = string.rep("x", 128 * 1024 * 1024)
  return { { type = "never", payload = { n = #s } } }
end
]])
        t.handler("hog_table", [[
return function(event, ctx)
  local t = {}
  for i = 1, 200000 do t[i] = string.rep("y", 1000) .. i end
  return { { type = "never", payload = { n = #t } } }
end
]])
        t.handler("ok", returns("ok.done"))
        local engine = t.engine({ memory_budget = 32 * 1024 * 1024 })
        t.store:append("a", { { type = "hog_string" } })
        t.store:append("b", { { type = "hog_table" } })
        t.store:append("c", { { type = "ok" }, { type = "ok" } })
        assert.same({ handled = 2, failed = 2, dead = 0 }, run(engine))
        for _, s in ipairs({ "a", "b" }) do
          local e = event(t.store, s, 1)
          assert.equal("pending", e.status, s)
          assert.equal(1, e.failures, s)
          assert.is_true(contains_ci(e.last_error, "memory.budget"),
            "last_error of " .. s .. " must name the memory budget: " .. tostring(e.last_error))
          assert.equal(1, t.store:head(s), "nothing appended for " .. s)
        end
        assert.equal("processed", event(t.store, "c", 1).status)
        assert.equal("processed", event(t.store, "c", 2).status)

        -- the worker's Lua state is usable afterwards
        t.store:append("c", { { type = "ok" } })
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        assert.equal("processed", event(t.store, "c", 5).status)
      end)
    end)

    -------------------------------------------------------------------------
    describe("claims of long handlers", function()
      it("renews the claim while a handler runs past ttl_ms, so no other worker retakes it", function()
        -- The real clock: the claim must really expire without renewal.
        local store = helpers.open(url)
        local dir = eh.scripts_dir()
        eh.handler(dir, "slow", [[return function(e)
          os.execute("sleep 2.5") -- 2.5 TTLs; the keeper renews every ttl/3
          return {{type = "slow.done"}}
        end]])
        -- A TTL long enough that a loaded machine's scheduling delays (a
        -- renewal must be more than 600 ms late to lose the claim) cannot
        -- fail the test; short enough that the handler outlives it.
        local engine = eh.engine({ store = store, scripts = dir, workers = 2, ttl_ms = 1000 })
        append_pending(engine, "s", { { type = "slow" } })
        -- Without renewal the workers would retake each other's claims for
        -- ever: bound the run so a broken keeper fails instead of hanging.
        local deadline = os.time() + 60
        local r = eh.counts(engine:run({ until_idle = true, progress_ms = 100, progress = function()
          if os.time() > deadline then engine:stop() end
        end }))
        assert.same({ handled = 1, failed = 0, dead = 0 }, r)
        local e = event(store, "s", 1)
        assert.equal("processed", e.status)
        assert.equal(1, e.attempts, "a second worker took the event over: the claim was not renewed")
        assert.equal(2, store:head("s"), "exactly one result")
        engine:close()
      end)
    end)

    -------------------------------------------------------------------------
    describe("close", function()
      -- How many open file descriptors of this process point at path (or
      -- its -wal / -shm / -journal).
      local function fds_on(path)
        local pid = eh.read_file("/proc/self/stat"):match("^(%d+)")
        local p = assert(io.popen("ls -l /proc/" .. pid .. "/fd 2>/dev/null"))
        local n = 0
        for line in p:lines() do
          if line:find(path, 1, true) then n = n + 1 end
        end
        p:close()
        return n
      end

      if url:match("^sqlite:") then
        it("closes a store the engine opened from a URL", function()
          local store, clock, concrete = helpers.new(url)
          store:close() -- only the file name is needed (removed by cleanup)
          local path = concrete:match("^sqlite:(.*)$")
          assert.equal(0, fds_on(path))
          local dir = eh.scripts_dir()
          eh.handler(dir, "job", returns("job.done"))
          local engine = eh.engine({ store = concrete, scripts = dir, clock = clock })
          append_pending(engine, "s", { { type = "job" } })
          assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
          assert.is_true(fds_on(path) > 0, "the engine should hold the sqlite file open")
          engine:close()
          assert.equal(0, fds_on(path), "engine:close() must close the store it opened")

          local check = helpers.open_same(concrete)
          local events = check:read("s")
          assert.equal(2, #events)
          assert.equal("processed", events[1].status)
          assert.same({ index = 1, attempt = 1 }, events[2].cause)
          assert.equal(T0, events[1].processed_at) -- the clock option reached the store
        end)
      end

      it("works on a store it opens from a URL and closes it without error", function()
        local clock = helpers.manual_clock(T0)
        local store_url = url
        if url:match("^sqlite:") then
          local s, _, concrete = helpers.new(url)
          s:close()
          store_url = concrete
        end
        local dir = eh.scripts_dir()
        eh.handler(dir, "job", returns("job.done"))
        local engine = eh.engine({ store = store_url, scripts = dir, clock = clock })
        local stored = append_pending(engine, "s", { { type = "job" } })
        assert.equal(T0, stored[1].created_at)
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        engine:close()
      end)

      it("leaves a store it was given open", function()
        local t = setup()
        t.handler("job", returns("job.done"))
        local engine = t.engine()
        append_pending(engine, "s", { { type = "job" } })
        assert.same({ handled = 1, failed = 0, dead = 0 }, run(engine))
        engine:close()
        -- the store is still usable
        local stored = t.store:append("s", { { type = "after.close" } })
        assert.equal(3, stored[1].index)
        assert.equal(3, #t.store:read("s"))
        assert.equal(3, t.store:head("s"))
      end)
    end)

    -------------------------------------------------------------------------
    -- inline_runs (docs/engine.md "Inline runs"): an until-idle run on the
    -- calling thread, as a replay's scratch engine runs. The same outcomes
    -- as a run with threads; the deadline tripped by the budget hook.
    describe("inline runs", function()
      it("handles chains, retries with backoff, timers and dead letters as a run with threads does", function()
        local outcomes = {}
        for _, inline in ipairs({ false, true }) do
          local t = setup()
          t.handler("a", returns("b"))
          t.handler("b", returns("c"))
          t.handler("flaky", [[
return function(event, ctx)
  if event.attempt < 2 then error("not yet") end
  return { { type = "flaky.done", payload = { attempt = event.attempt } } }
end
]])
          t.handler("broken", "return function(event, ctx) error('always') end\n")
          t.handler("tick", returns("tock"))
          local engine = t.engine({ inline_runs = inline, max_failures = 2, backoff_ms = 1000 })
          append_pending(engine, "s", { { type = "a" }, { type = "flaky" }, { type = "broken" },
            { type = "tick", delay_ms = 5000 } })
          local got = { run(engine) }
          t.clock:advance(1000) -- the retries are due, the timer is not
          got[#got + 1] = run(engine)
          t.clock:advance(5000)
          got[#got + 1] = run(engine)
          got[#got + 1] = run(engine)
          local events = {}
          for _, e in ipairs(t.store:read("s")) do
            events[#events + 1] = { e.type, e.status, e.attempts, e.failures, e.cause and e.cause.index }
          end
          got[#got + 1] = events
          outcomes[#outcomes + 1] = got
          engine:close()
        end
        assert.same(outcomes[1], outcomes[2])
        -- and what they agree on is what the options say
        assert.same({ handled = 2, failed = 2, dead = 0 }, outcomes[2][1])
        assert.same({ handled = 1, failed = 0, dead = 1 }, outcomes[2][2])
        assert.same({ handled = 1, failed = 0, dead = 0 }, outcomes[2][3])
        assert.same({ handled = 0, failed = 0, dead = 0 }, outcomes[2][4])
      end)

      it("trips a handler past its deadline through the budget hook (no watchdog thread)", function()
        local t = setup()
        t.handler("spin", "return function(event, ctx) while true do end end\n")
        local engine = t.engine({ inline_runs = true, instruction_budget = 0, deadline_ms = 200,
          max_failures = 1 })
        append_pending(engine, "s", { { type = "spin" } })
        assert.same({ handled = 0, failed = 0, dead = 1 }, run(engine))
        local e = event(t.store, "s", 1)
        assert.equal("dead", e.status)
        assert.truthy(contains(e.last_error, "deadline exceeded (200 ms)"), e.last_error)
      end)

      it("calls the progress function between events, and its error stops the run", function()
        local t = setup()
        t.handler("wait", "return function(event, ctx) local n = 0; for i = 1, 3e6 do n = n + i end end\n")
        local engine = t.engine({ inline_runs = true, instruction_budget = 0 })
        local evs = {}
        for i = 1, 40 do evs[i] = { type = "wait" } end
        append_pending(engine, "s", evs)
        local calls = 0
        local ok, err = pcall(engine.run, engine, { until_idle = true, progress_ms = 1, progress = function(st)
          calls = calls + 1
          assert.is_table(st)
          if calls == 2 then error("enough") end
        end })
        assert.is_false(ok)
        assert.truthy(contains(tostring(err), "enough"), tostring(err))
        assert.equal(2, calls)
        local left = 0
        for _, e in ipairs(t.store:read("s")) do if e.status == "pending" then left = left + 1 end end
        assert.is_true(left > 0, "the run did not stop when the progress function failed")
        -- the next run takes up what is left
        assert.same({ handled = left, failed = 0, dead = 0 }, run(engine))
      end)

      it("folds engine:state on the calling thread, under the same budgets", function()
        local t = setup()
        t.handler("job", returns("job.done"))
        t.reducer("count", [[
return { init = function() return { n = 0 } end,
  ["job.done"] = function(s, e) s.n = s.n + 1 end }
]])
        t.reducer("spin", [[
return { init = function() return {} end,
  ["job.done"] = function(s, e) while true do end end }
]])
        local engine = t.engine({ inline_runs = true, instruction_budget = 0, deadline_ms = 200 })
        append_pending(engine, "s", { { type = "job" }, { type = "job" } })
        assert.same({ handled = 2, failed = 0, dead = 0 }, run(engine))
        assert.same({ n = 2 }, engine:state("s", "count"))
        local err = expect_error("INVALID_ARGUMENT", engine.state, engine, "s", "spin")
        assert.truthy(contains(tostring(err), "deadline exceeded (200 ms)"), tostring(err))
        -- the runner is usable after the trip
        assert.same({ n = 2 }, engine:state("s", "count"))
      end)

      it("runs without until_idle on threads as before, and refuses more than one worker", function()
        local t = setup()
        t.handler("job", returns("job.done"))
        local engine = t.engine({ inline_runs = true })
        append_pending(engine, "s", { { type = "job" } })
        local stopped = engine:run({ progress_ms = 20, progress = function(st)
          if st.handled >= 1 then engine:stop() end
        end })
        assert.equal(1, stopped.handled)
        local err = expect_error("INVALID_ARGUMENT", t.engine, { inline_runs = true, workers = 2 })
        assert.truthy(contains(tostring(err), "inline_runs needs workers = 1"), tostring(err))
        local ok, why = pcall(t.engine, { inline_runs = 1 })
        assert.is_false(ok)
        assert.truthy(contains(tostring(why), "inline_runs"), tostring(why))
      end)
    end)
  end)
end
