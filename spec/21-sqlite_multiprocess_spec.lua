-- SQLite shared by several processes (docs/sqlite.md "Several processes").
--
-- Two worker processes (spec/support/sqlite_worker.lua) claim (claim_next)
-- and complete the same 2,000 events on one file. Every event must be
-- completed exactly once: processed, with exactly one result event carrying
-- cause {index, attempt} of the completing attempt, and every completion a
-- worker was told about is in the file. Some claims are left to expire on
-- purpose, so the other process re-takes the event and the late completion
-- must come back superseded. Every seventh event carries a payload over
-- 512 bytes, and its result event one too (docs/sqlite.md "Long payloads
-- apart": kept beside the row that the other process's claims and
-- completions rewrite); both must read back whole.
--
-- And: store:wait in one process wakes for an append made by another
-- (how soon is a figure of bench/wait_latency.lua, not a test: latency
-- depends on the machine's load).
-- SQLite, and PostgreSQL when ES_TEST_URLS names a postgres:// template
-- (a fresh schema; docs/postgres.md "Concurrency"): memory stores are per
-- process.
local eventstore = require("eventstore")

local LUA = os.getenv("LUA") or "lua5.4"
local spec_dir = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local WORKER = spec_dir .. "support/sqlite_worker.lua"
local APPENDER = spec_dir .. "support/sqlite_append_later.lua"

local helpers = require("helpers")
local sh_quote = helpers.sh_quote

local remove_db = helpers.remove_db

-- Wall-clock milliseconds (the same clock the store uses for created_at).
local function now_ms()
  local p = assert(io.popen("date +%s%3N", "r"))
  local ms = math.tointeger(tonumber(p:read("l")))
  p:close()
  return ms
end

-- Every seventh work event's payload carries 600 bytes more (kept apart
-- on sqlite:), different from event to event; nil for the others.
local function long_pad(s, i)
  if (s * 1000 + i) % 7 ~= 0 then return nil end
  return (("%02d/%03d:"):format(s, i)):rep(100):sub(1, 600)
end

-- The shared stores to run on: a SQLite file (db: its path, url: its URL)
-- and a postgres schema (db = url: the workers take either).
local targets = { { name = "sqlite: several processes on one file" } }
for _, u in ipairs(helpers.urls()) do
  if u:match("^postgres") then
    targets[#targets + 1] = { name = "postgres: several processes on one schema", template = u }
  end
end
if #targets == 1 then
  -- a visible skip, which spec/run.sh fails unless ES_ALLOW_SKIP names postgres
  describe("postgres: several processes on one schema", function()
    pending("no postgres:// URL in ES_TEST_URLS (make test provides one)")
  end)
end

for _, target in ipairs(targets) do
describe(target.name, function()
  local base, db, url

  before_each(function()
    base = os.tmpname()
    if target.template then
      url = helpers.pg_fresh_url(target.template)
      db = url
    else
      db = base .. ".db"
      url = "sqlite:" .. db
    end
  end)

  after_each(function()
    if not target.template then remove_db(db) end
    os.remove(base)
  end)

  it("two processes complete 2,000 events, each exactly once, losing no completion", function()
    local N, SESSIONS = 2000, 20
    local store = eventstore.open(url)
    for s = 1, SESSIONS do
      local batch = {}
      for i = 1, N // SESSIONS do
        -- a few lanes too: their events must still go one after another
        batch[i] = { type = "work", payload = { s = s, i = i, pad = long_pad(s, i) },
          lane = (s % 4 == 0) and "l" or nil }
      end
      store:append(("mp-%02d"):format(s), batch)
    end
    store:close()

    -- both workers start together and run concurrently; A holds every
    -- 150th claim past its TTL so B can take those events over
    local function start(holder, ttl, slow_every)
      return assert(io.popen(("%s %s %s %s %d %d 2>&1"):format(LUA, sh_quote(WORKER), sh_quote(db),
        holder, ttl, slow_every), "r"))
    end
    local pa = start("A", 400, 150)
    local pb = start("B", 400, 0)
    local outputs = { A = pa:read("a"), B = pb:read("a") }
    pa:close()
    pb:close()

    local told = {} -- "session/index" -> {holder, attempt}
    local counts = { A = 0, B = 0 }
    local superseded = 0
    for holder, text in pairs(outputs) do
      assert.truthy(text:match("\ndone\n$") or text:match("^done\n$"),
        ("worker %s did not finish cleanly:\n%s"):format(holder, text))
      for session, index, attempt in text:gmatch("completed (%S+) (%d+) (%d+)\n") do
        local key = session .. "/" .. index
        assert.is_nil(told[key], ("%s completed twice (by %s and %s)"):format(key,
          told[key] and told[key].holder or "", holder))
        told[key] = { holder = holder, attempt = tonumber(attempt) }
        counts[holder] = counts[holder] + 1
      end
      superseded = superseded + tonumber(text:match("superseded (%d+)"))
    end
    assert.equal(N, counts.A + counts.B)
    assert.is_true(counts.A > 0 and counts.B > 0, "both processes must have done work")

    store = eventstore.open(url)
    local completed = 0
    for s = 1, SESSIONS do
      local session = ("mp-%02d"):format(s)
      local events = store:read(session)
      local results = {}
      for _, e in ipairs(events) do
        if e.type == "done" then
          assert.is_not_nil(e.cause)
          assert.is_nil(results[e.cause.index], ("%s/%d has two result events"):format(session, e.cause.index))
          results[e.cause.index] = e
        end
      end
      for _, e in ipairs(events) do
        if e.type == "work" then
          local key = session .. "/" .. e.index
          assert.equal("processed", e.status, key .. " not processed")
          local r = results[e.index]
          assert.is_not_nil(r, key .. " has no result event")
          assert.same({ index = e.index, attempt = e.attempts }, r.cause)
          local t = told[key]
          assert.is_not_nil(t, key .. " completed, but no worker was told")
          assert.equal(t.attempt, r.cause.attempt)
          assert.equal(t.holder, r.payload.by)
          -- the long payloads, through the other processes' rewrites
          assert.equal(long_pad(e.payload.s, e.payload.i), e.payload.pad)
          assert.equal(e.payload.pad and ("r"):rep(600) or nil, r.payload.pad)
          completed = completed + 1
        end
      end
    end
    assert.equal(N, completed)
    store:close()
    print(("# completions: A %d, B %d; superseded late completions: %d"):format(counts.A, counts.B, superseded))
  end)

  it("subscribe(nil) is called for another process's append while the host waits", function()
    local store = eventstore.open(url)
    local seen = {}
    local unsubscribe = store:subscribe(nil, function(e) seen[#seen + 1] = { e = e, at = now_ms() } end)
    local p = assert(io.popen(("%s %s %s %s 150 2>&1"):format(LUA, sh_quote(APPENDER), sh_quote(db),
      "elsewhere"), "r"))
    -- The host waits on something else; subscriptions are delivered at its
    -- calls, and wait() returns at least every timeout. The deadline only
    -- catches a hang (the append comes after 150 ms).
    local deadline = now_ms() + 60000
    while #seen == 0 and now_ms() < deadline do store:wait("unrelated", 0, 100) end
    local out = p:read("a")
    p:close()
    unsubscribe()
    store:close()
    assert.equal(1, #seen, "the subscriber never saw the other process's event: " .. out)
    assert.equal("elsewhere", seen[1].e.session)
    assert.equal("ping", seen[1].e.type)
  end)

  it("store:wait wakes for another process's append, long before its timeout", function()
    local store = eventstore.open(url)
    for round = 1, 3 do
      local session = "ping-" .. round
      local p = assert(io.popen(("%s %s %s %s 150 2>&1"):format(LUA, sh_quote(APPENDER), sh_quote(db),
        session), "r"))
      local started = now_ms()
      local got = store:wait(session, 0, 120000)
      local waited = now_ms() - started
      local out = p:read("a")
      p:close()
      assert.equal(1, #got, "wait returned no event: " .. out)
      assert.equal("ping", got[1].type)
      -- a hang ceiling, not a latency figure (bench/wait_latency.lua):
      -- a wait that did not wake would return at its timeout (120 s)
      assert.is_true(waited < 60000, "the wait woke only after " .. waited .. " ms")
    end
    store:close()
  end)

  -- A second handle on the same file in one process used to read the
  -- file's header with open()/close(), which drops every POSIX lock the
  -- process holds on the file: another process closing its own handle then
  -- took itself for the last user and deleted the -wal and -shm under the
  -- first handle (its next read: "disk I/O error").
  if not target.template then
    it("a second handle opened and closed in one process leaves the first handle's file intact", function()
      local first = eventstore.open(url)
      first:append("s", { { type = "a", settled = true } })
      local second = eventstore.open(url)
      assert.are.equal(1, second:head("s"))
      second:close()
      local code = ([[
        package.path = %q
        package.cpath = %q
        local s = require("eventstore").open(%q)
        s:append("other", { { type = "b", settled = true } })
        s:close()
      ]]):format(package.path, package.cpath, url)
      local script = base .. ".lua"
      local f = assert(io.open(script, "w"))
      f:write(code)
      f:close()
      assert.is_true(os.execute(LUA .. " " .. sh_quote(script)))
      os.remove(script)
      assert.is_truthy(io.open(db .. "-shm", "r"), "the -shm file of an open handle was deleted")
      first:append("s", { { type = "a", settled = true } })
      assert.are.equal(2, first:head("s"))
      assert.are.equal(1, first:head("other"))
      first:close()
    end)
  end
end)
end
