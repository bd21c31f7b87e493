-- Moving a store while it is used (docs/moving.md "Consistency of an
-- export", "Backups"): an export taken while another process appends is a
-- consistent cut (every batch whole, positions without gaps up to the
-- header's, each session row agreeing with its events) and imports into a
-- store that reads as the source did at that position; a backup taken
-- while an engine and a writer run holds such a cut too, with nothing
-- half-completed; `export --sessions PREFIX` carries those sessions whole;
-- a plain `copy` between sqlite: and postgres:// gives a store that
-- answers reads as its source.
local eventstore = require("eventstore")
local helpers = require("helpers")
local ch = require("cli_helpers")
local ph = require("proc_helpers")

local json = eventstore.json
local q = helpers.sh_quote
local pg_url = helpers.pg_url()

local scratch = ch.scratch()
local procs, workdir, track, cleanup = scratch.procs, scratch.workdir, scratch.track, scratch.cleanup

local function lua_env()
  return { LUA_PATH = os.getenv("LUA_PATH") or "", LUA_CPATH = os.getenv("LUA_CPATH") or "" }
end

-- The writer: batches until DIR/stop exists, each one write transaction,
-- but only while DIR/go exists (see while_writing). Two of three are an
-- append of 4 events to one session, the third an append_many of 2 + 2
-- events across two sessions. Every event's payload names its batch and
-- the batch's size, so a reader can tell a whole batch from a part of one.
-- DIR/started appears after the 20th batch.
local WRITER = [[
local eventstore = require("eventstore")
local url, dir = arg[1], arg[2]
local s <close> = eventstore.open(url)
local function events(tag, n)
  local b = {}
  for j = 1, n do b[j] = { type = "t", payload = { batch = tag, total = 4, j = j } } end
  return b
end
local function exists(name)
  local f = io.open(dir .. "/" .. name)
  if f then f:close() end
  return f ~= nil
end
local k = 0
while not exists("stop") do
  if exists("go") then
    k = k + 1
    local tag = "k" .. k
    if k % 3 == 0 then
      s:append_many({ { session = "m" .. (k % 5), events = events(tag, 2) },
                      { session = "n" .. (k % 4), events = events(tag, 2) } })
    else
      s:append("b" .. (k % 7), events(tag, 4))
    end
    if k == 20 then io.open(dir .. "/started", "w"):close() end
  else
    s:wait("writer-pause", 0, 5) -- a session nobody writes: a 5 ms pause
  end
end
]]

local function start_writer(dir, url)
  helpers.write_file(dir .. "/writer.lua", WRITER)
  helpers.write_file(dir .. "/go", "")
  local w = ph.spawn({ "lua5.4", dir .. "/writer.lua", url, dir }, lua_env(), dir .. "/writer.log")
  procs[#procs + 1] = w
  helpers.wait_until(function()
    if ph.status(w) then error("the writer ended: " .. ph.tail(dir .. "/writer.log", 20)) end
    return helpers.read_file(dir .. "/started") ~= nil
  end, "the writer's first batches", 120)
  os.remove(dir .. "/go")
  return w
end

local function stop_writer(dir, w)
  helpers.write_file(dir .. "/stop", "")
  assert.equal(0, ph.wait(w, 120), ph.tail(dir .. "/writer.log", 20))
end

-- Every event of a store up to position `through` (all: nil), as read_all
-- returns them.
local function events_upto(store, through)
  local out, after = {}, 0
  repeat
    local page = store:read_all({ after = after, limit = 1000 })
    for _, e in ipairs(page) do
      if through and e.position > through then return out end
      out[#out + 1] = e
    end
    if #page > 0 then after = page[#page].position end
  until #page == 0
  return out
end

local function last_position(store)
  return store:stats().events -- no event is ever deleted here: the count is the last position
end

-- Runs fn while the writer writes: it starts writing, fn runs once it has
-- committed a batch, and it stops when fn returns. Writing only then, the
-- store grows with what the test exports, not with how long the machine
-- takes over everything else (unpaced throughout, a loaded machine grew
-- the store until an export outlived its hang ceiling).
local function while_writing(dir, w, source, fn)
  local p = last_position(source)
  helpers.write_file(dir .. "/go", "")
  local ok, err = pcall(function()
    helpers.wait_until(function()
      if ph.status(w) then error("the writer ended: " .. ph.tail(dir .. "/writer.log", 20)) end
      return last_position(source) > p
    end, "the writer's next batch", 120)
    fn()
  end)
  os.remove(dir .. "/go")
  if not ok then error(err, 0) end
end

-- Checks that the lines of an export are a consistent cut of the writer's
-- store (and of what an engine did to it): returns the header's position.
local function check_cut(lines, what)
  local header = json.decode(lines[1])
  assert.equal(2, header.eventstore_export, what)
  local P = header.position
  assert.is_true(P > 0, what)
  local batches, per_session, pending, next_pos = {}, {}, {}, 1
  local sessions = {}
  for i = 2, #lines do
    local r = json.decode(lines[i])
    if r.event then
      local e = r.event
      -- positions without gaps, up to the header's and no further (a plain
      -- comparison first: a busted assert per event of a 20,000-line
      -- export costs seconds on a loaded machine)
      if e.position ~= next_pos then
        assert.equal(next_pos, e.position, what .. ": positions must run 1.." .. P .. " without gaps")
      end
      next_pos = next_pos + 1
      per_session[e.session] = (per_session[e.session] or 0) + 1
      if e.status == 0 then pending[e.session] = (pending[e.session] or 0) + 1 end
      if e.type == "t" then
        local b = batches[e.payload.batch] or { total = e.payload.total, n = 0 }
        batches[e.payload.batch] = b
        b.n = b.n + 1
      end
    elseif r.session then
      sessions[#sessions + 1] = r.session
    end
  end
  assert.equal(P, next_pos - 1, what .. ": the last event is at the header's position")
  for tag, b in pairs(batches) do
    if b.total ~= b.n then assert.equal(b.total, b.n, what .. ": batch " .. tag .. " is whole") end
  end
  -- each session row says what its events say (read at the same instant)
  for _, s in ipairs(sessions) do
    assert.equal(per_session[s.session] or 0, s.events, what .. ": session " .. s.session .. " events")
    assert.equal(per_session[s.session] or 0, s.head, what .. ": session " .. s.session .. " head")
    assert.equal(pending[s.session] or 0, s.pending, what .. ": session " .. s.session .. " pending")
    per_session[s.session] = nil
  end
  assert.is_nil(next(per_session), what .. ": every session with events has its row")
  return P
end

-- The source as it was at position P (nothing but appends happened here
-- after the cut) against the target: every event, and each session's read
-- and counts.
local function check_reads_at(source, target, P, what)
  local src = events_upto(source, P)
  assert.equal(P, #src, what)
  assert.same(src, events_upto(target, nil), what .. ": read_all")
  local by_session = {}
  for _, e in ipairs(src) do
    local l = by_session[e.session] or {}
    by_session[e.session] = l
    l[#l + 1] = e
  end
  local listed = target:sessions({ limit = 1000 }).sessions
  local n = 0
  for _, row in ipairs(listed) do
    n = n + 1
    local want = by_session[row.session]
    assert.is_not_nil(want, what .. ": session " .. row.session)
    assert.equal(#want, row.events, what .. ": session " .. row.session .. " events")
    assert.same(want, target:read(row.session), what .. ": read " .. row.session)
  end
  local m = 0
  for _ in pairs(by_session) do m = m + 1 end
  assert.equal(m, n, what .. ": the sessions")
end

local function fresh_target(dir, kind, name)
  if kind == "postgres" then return track(eventstore.open(helpers.pg_fresh_url(pg_url))) end
  return track(eventstore.open("sqlite:" .. dir .. "/" .. name .. ".db"))
end

local function kinds()
  local out = { "sqlite" }
  if pg_url then out[#out + 1] = "postgres" end
  return out
end

for _, kind in ipairs(kinds()) do
  describe("an export while a writer appends (" .. kind .. ":)", function()
    after_each(cleanup)

    it("is a consistent cut, from the CLI and from store:export, and imports as the source was at its position",
      function()
        local dir = workdir()
        local url = kind == "postgres" and helpers.pg_fresh_url(pg_url) or "sqlite:" .. dir .. "/src.db"
        local source = track(eventstore.open(url)) -- creates the store (and its schema) before the writer opens it
        -- 3,000 events first: an export of the writer's few hundred alone
        -- can end, in process on an idle machine, between two of its
        -- commits, so that no export ever meets writes on both sides of
        -- its cut
        for i = 1, 30 do
          local batch = {}
          for j = 1, 100 do batch[j] = { type = "s", payload = { i = i, j = j } } end
          source:append("seed" .. i, batch)
        end
        local w = start_writer(dir, url)
        -- Exports until each way has made one that writes surround (an
        -- event, not a duration): the writer committed after its cut and
        -- before it ended and, for the CLI, also between the start of the
        -- export and its cut. In process, the cut comes microseconds after
        -- the call, so a commit in between is rare luck; the CLI's export
        -- is that same store:export call behind a process start, and the
        -- commits before its cut are the ones that catch a position read
        -- apart from the events.
        local exports = {}
        for _, way in ipairs({ "cli", "lua" }) do
          local overlapped = false
          for round = 1, 50 do
            local before, after, lines
            while_writing(dir, w, source, function()
              before = last_position(source)
              if way == "cli" then
                lines = ch.lines(ch.ok(ch.run(dir, { "export", "--db", url })))
              else
                lines = {}
                source:export(function(line) lines[#lines + 1] = line end)
              end
              after = last_position(source)
            end)
            local what = ("%s export %d"):format(way, round)
            local P = check_cut(lines, what)
            exports[#exports + 1] = { lines = lines, P = P, what = what }
            overlapped = overlapped or ((before < P or way == "lua") and P < after)
            -- five at least: a position read in a transaction apart from the
            -- events is caught only when a commit falls between the two
            if overlapped and round >= 5 then break end
          end
          assert.is_true(overlapped, way .. ": no export was taken while the writer wrote")
        end
        -- --sessions under the writer: only those sessions, each whole
        -- (indexes 1..head, its row agreeing), every batch whole
        local lines
        while_writing(dir, w, source, function()
          lines = ch.lines(ch.ok(ch.run(dir, { "export", "--db", url, "--sessions", "b" })))
        end)
        local idx, rows, batches = {}, {}, {}
        for i = 2, #lines do
          local rec = json.decode(lines[i])
          if rec.event then
            local e = rec.event
            idx[e.session] = idx[e.session] or {}
            table.insert(idx[e.session], e.index)
            batches[e.payload.batch] = (batches[e.payload.batch] or 0) + 1
          elseif rec.session then
            rows[rec.session.session] = rec.session
          end
        end
        assert.is_not_nil(rows.b1, "the writer's session b1")
        for name, row in pairs(rows) do
          assert.equal("b", name:sub(1, 1))
          assert.equal(row.head, row.events)
          local want = {}
          for i = 1, row.head do want[i] = i end
          assert.same(want, idx[name], name)
          idx[name] = nil
        end
        assert.is_nil(next(idx))
        for tag, n in pairs(batches) do assert.equal(4, n, tag) end
        stop_writer(dir, w)
        assert.is_true(last_position(source) > exports[#exports].P)
        -- each cut imports into a fresh store that reads as the source did
        -- at the cut's position
        for i, x in ipairs(exports) do
          if i == 1 or i == #exports then
            local target = fresh_target(dir, kind, "dst" .. i)
            local r = eventstore.import(target, x.lines)
            assert.equal(x.P, r.position, x.what)
            check_reads_at(source, target, x.P, x.what)
          end
        end
        -- and through the CLI's import
        local last = exports[#exports]
        helpers.write_file(dir .. "/cut.ndjson", table.concat(last.lines, "\n") .. "\n")
        local turl = kind == "postgres" and helpers.pg_fresh_url(pg_url) or "sqlite:" .. dir .. "/cli.db"
        local r = json.decode(ch.ok(ch.run(dir, { "import", "--db", turl, "--in", "cut.ndjson" })))
        assert.is_true(r.imported)
        assert.equal(last.P, r.position)
        check_reads_at(source, track(eventstore.open(turl)), last.P, "cli import")
      end)
  end)
end

-- The events of a store's export, by session and index.
local function exported_events(lines)
  local by = {}
  for i = 2, #lines do
    local e = json.decode(lines[i]).event
    if e then
      by[e.session] = by[e.session] or {}
      by[e.session][e.index] = e
    end
  end
  return by
end

describe("eventstore backup while an engine and a writer run on the sqlite: file", function()
  after_each(cleanup)

  it("passes its checks, opens as a store and holds a consistent cut with nothing half-completed", function()
    local dir = workdir()
    local url = "sqlite:" .. dir .. "/src.db"
    local source = track(eventstore.open(url))
    -- a handler whose result goes in with its completion (one transaction)
    os.execute("mkdir -p " .. q(dir .. "/scripts/handlers"))
    helpers.write_file(dir .. "/scripts/handlers/t.lua",
      'return function(event) return { { type = "r", payload = { of = event.index } } } end\n')
    local engine = ph.spawn({ "sh", "-c", "cd " .. q(dir) .. " && exec " .. q(ch.BIN)
      .. " run --db sqlite:src.db --scripts scripts" }, {}, dir .. "/engine.log")
    procs[#procs + 1] = engine
    local w = start_writer(dir, url)
    local function processed()
      local st = source:stats()
      return st.events - st.pending
    end
    helpers.wait_until(function()
      if ph.status(engine) then error("the engine ended: " .. ph.tail(dir .. "/engine.log", 20)) end
      return processed() > 0
    end, "the engine's first completions", 120)

    -- Backups until one was taken while both wrote: the writer appended
    -- and the engine completed between its start and its cut, and again
    -- before it ended.
    local overlapped, handled = false, 0
    for round = 1, 50 do
      local before, done_before, after, done_after, r
      local name = "b" .. round .. ".db"
      while_writing(dir, w, source, function()
        before, done_before = last_position(source), processed()
        r = json.decode(ch.ok(ch.run(dir, { "backup", "--db", "sqlite:src.db", "--to", name })))
        after, done_after = last_position(source), processed()
      end)
      local what = "backup " .. round
      assert.equal("ok", r.integrity, what)
      local copy = track(eventstore.open("sqlite:" .. dir .. "/" .. name .. "?mode=ro"))
      local st = copy:stats()
      assert.same({ r.sessions, r.events }, { st.sessions, st.events }, what)
      local lines = {}
      copy:export(function(line) lines[#lines + 1] = line end)
      local P = check_cut(lines, what)
      -- nothing half-completed: every processed event has its result, and
      -- every result its processed event
      local by = exported_events(lines)
      local done = 0
      for session, events in pairs(by) do
        local results = {}
        for _, e in pairs(events) do
          if e.type == "r" then
            local of = events[e.payload.of]
            assert.is_not_nil(of, what .. ": the event of result " .. session .. "#" .. e.index)
            assert.equal(1, of.status, what .. ": the event of result " .. session .. "#" .. e.index .. " is processed")
            assert.is_nil(results[e.payload.of], what .. ": one result per event")
            results[e.payload.of] = true
          end
        end
        for _, e in pairs(events) do
          if e.type == "t" then
            assert.equal(e.status == 1, results[e.index] == true,
              what .. ": " .. session .. "#" .. e.index .. " (status " .. e.status .. ") and its result")
            if e.status == 1 then done = done + 1 end
          end
        end
      end
      assert.is_true(done >= handled, what .. ": completions only grow")
      handled = done
      if before < P and P < after and done_before < done_after then
        overlapped = true
        break
      end
    end
    assert.is_true(overlapped, "no backup was taken while the writer and the engine wrote")
    assert.is_true(handled > 0)

    stop_writer(dir, w)
    ph.signal(engine, "TERM")
    assert.equal(0, ph.wait(engine, 60), ph.tail(dir .. "/engine.log", 20))
  end)
end)

-- A store at url whose sessions' events interleave: a/1 (a dead letter, a
-- completion, a snapshot), a/2 (fenced), ab and b/1 (named by no prefix
-- "a/"), refs to a/1 and b/1.
local function seed_static(url)
  local s <close> = eventstore.open(url)
  for i = 1, 12 do
    for _, session in ipairs({ "a/1", "ab", "a/2", "b/1" }) do
      s:append(session, { { type = "t", payload = { i = i, session = session } },
                          { type = "u", payload = { i = i } } })
    end
  end
  local c = s:claim("a/1", { holder = "h", ttl_ms = 60000, limit = 2 })
  s:complete("a/1", c.events[1].index, c.events[1].attempt, {})
  s:fail("a/1", c.events[2].index, c.events[2].attempt, { error = "boom", max_failures = 1 })
  c = s:claim("b/1", { holder = "h", ttl_ms = 60000, limit = 1 })
  s:complete("b/1", c.events[1].index, c.events[1].attempt, {})
  s:fence("a/2")
  s:put_snapshot("a/1", "r", 3, "state", "v1")
  s:put_ref("ra", "a/1")
  s:put_ref("rb", "b/1")
end

-- What a store answers (the sessions whose names start with prefix):
-- every session's row, its events, snapshots and dead letters, read_all,
-- the refs and the counts.
local function reads(store, prefix)
  prefix = prefix or ""
  local out = { sessions = store:sessions({ prefix = prefix, limit = 1000 }).sessions, by = {}, all = {}, refs = {} }
  for _, row in ipairs(out.sessions) do
    out.by[row.session] = { events = store:read(row.session), snapshots = store:snapshots(row.session),
                            dead = store:dead_letters({ session = row.session }) }
  end
  for _, e in ipairs(events_upto(store, nil)) do
    if e.session:sub(1, #prefix) == prefix then out.all[#out.all + 1] = e end
  end
  for _, r in ipairs(store:list_refs()) do
    if r.session:sub(1, #prefix) == prefix then out.refs[#out.refs + 1] = r end
  end
  local st = store:stats()
  st.calls = nil
  out.stats = prefix == "" and st or nil
  return out
end

describe("eventstore export --sessions PREFIX", function()
  after_each(cleanup)

  it("carries only the sessions whose names start with it, each whole, and the refs naming them", function()
    local dir = workdir()
    seed_static("sqlite:" .. dir .. "/src.db")
    local text = ch.ok(ch.run(dir, { "export", "--db", "sqlite:src.db", "--sessions", "a/", "--out", "a.ndjson" }))
    assert.equal("", text)
    local lines = ch.lines(helpers.read_file(dir .. "/a.ndjson"))
    local sessions, events, refs = {}, {}, {}
    for i = 2, #lines do
      local r = json.decode(lines[i])
      if r.session then sessions[#sessions + 1] = r.session.session end
      if r.event then
        events[r.event.session] = events[r.event.session] or {}
        table.insert(events[r.event.session], r.event.index)
      end
      if r.ref then refs[#refs + 1] = r.ref.name end
    end
    assert.same({ "a/1", "a/2" }, sessions)
    assert.same({ "ra" }, refs)
    local whole = {}
    for i = 1, 24 do whole[i] = i end
    assert.same({ ["a/1"] = whole, ["a/2"] = whole }, events)
    -- imported, those sessions read as on the source; nothing else is there
    local r = json.decode(ch.ok(ch.run(dir, { "import", "--db", "sqlite:dst.db", "--in", "a.ndjson" })))
    assert.same({ imported = true, sessions = 2, events = 48, position = json.decode(lines[1]).position }, r)
    local src = track(eventstore.open("sqlite:" .. dir .. "/src.db"))
    local dst = track(eventstore.open("sqlite:" .. dir .. "/dst.db"))
    assert.same(reads(src, "a/"), reads(dst, "a/"))
    assert.equal(1, #reads(dst, "a/").by["a/1"].dead)
    assert.same({ sessions = 2, events = 48, pending = 46, dead = 1 },
      (function(st) return { sessions = st.sessions, events = st.events, pending = st.pending, dead = st.dead } end)(dst:stats()))
  end)
end)

describe("eventstore copy (no --follow) between sqlite: and postgres://", function()
  after_each(cleanup)

  it("copies sqlite: to postgres:// and back, each target answering reads as its source", function()
    if not pg_url then
      pending("postgres: copy sqlite: <-> postgres:// needs a postgres URL in ES_TEST_URLS (spec/support/pg_cluster.sh run)")
      return
    end
    local dir = workdir()
    seed_static("sqlite:" .. dir .. "/src.db")
    local pg = helpers.pg_fresh_url(pg_url)
    local r = json.decode(ch.ok(ch.run(dir, { "copy", "--from", "sqlite:src.db", "--to", pg })))
    assert.same({ copied = true, events = 96, position = 96 }, r)
    r = json.decode(ch.ok(ch.run(dir, { "copy", "--from", pg, "--to", "sqlite:back.db" })))
    assert.same({ copied = true, events = 96, position = 96 }, r)
    local src = track(eventstore.open("sqlite:" .. dir .. "/src.db"))
    local want = reads(src)
    assert.same(want, reads(track(eventstore.open(pg))))
    assert.same(want, reads(track(eventstore.open("sqlite:" .. dir .. "/back.db"))))
    -- byte for byte apart from the header's backend
    local function body(url)
      local t = ch.ok(ch.run(dir, { "export", "--db", url }))
      return (t:gsub('^{"eventstore_export":2,"backend":"%a+"', ""))
    end
    assert.equal(body("sqlite:src.db"), body(pg))
    assert.equal(body("sqlite:src.db"), body("sqlite:back.db"))
  end)
end)
