-- A short run of the Lua module through every kind of call, on memory and
-- sqlite (and postgres when ES_PG_URL names a test database: make
-- check-valgrind starts one), for valgrind (spec/valgrind.sh): leaks and
-- memory errors fail it.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = (os.getenv("BUILD") or "build") .. "/lib/?.so;" .. package.cpath
local eventstore = require("eventstore")
local json = eventstore.json

local path = os.tmpname()
local urls = {"memory:", "sqlite:" .. path}
local pg = os.getenv("ES_PG_URL")
if pg and pg ~= "" then
  -- a schema of its own (a fresh one per run of the smoke)
  urls[#urls + 1] = pg .. (pg:find("?", 1, true) and "&" or "?") .. "schema=valgrind_"
    .. os.tmpname():match("[%w]+$"):lower()
end
for _, url in ipairs(urls) do
  local clock = eventstore.manual_clock(1000)
  local store <close> = eventstore.open(url, {clock = clock})
  local seen = 0
  local unsub = store:subscribe(nil, function() seen = seen + 1 end)
  store:append("a", {{type = "t", payload = {n = 1, f = 0.5, s = "x\0y", arr = json.array{}}},
                     {type = "t", lane = "l"}, {type = "t", lane = "l"}})
  local got = store:claim("a", {holder = "h", ttl_ms = 100})
  for _, e in ipairs(got.events) do
    if e.index == 1 then
      store:complete("a", e.index, e.attempt, {{type = "done"}})
    else
      store:fail("a", e.index, e.attempt, {error = "boom", max_failures = 1})
    end
  end
  store:settle("a", 2, "skip")
  -- many completions: one completed with a cancel, one item's error, and
  -- a list refused half-way through reading it (nothing kept)
  store:append("m", {{type = "t"}, {type = "t"}, {type = "t"}})
  local m = store:claim("m", {holder = "h", ttl_ms = 100, limit = 2}).events
  store:complete_many{{session = "m", index = m[1].index, attempt = m[1].attempt,
                       events = {{type = "done", id = "m-done", payload = {k = "v"}}}, cancel = {{index = 3, reason = "r"}}},
                      {session = "m", index = 99, attempt = 1}}
  pcall(store.complete_many, store, {{session = "m", index = m[2].index, attempt = m[2].attempt,
                                      events = {{type = "done", payload = {1, 2}}}},
                                     {session = "m", index = 1, attempt = 1, events = {{type = "x\0"}}}})
  store:renew("a", {holder = "h", ttl_ms = 10, claims = {{index = 3, attempt = 1}}})
  store:claim_next{holder = "h", ttl_ms = 10, limit = 5}
  store:dead_letters{}
  store:put_snapshot("a", "r", 1, "state\0bytes", "v1")
  store:read_state("a", "r")
  store:snapshots("a")
  store:sessions{prefix = ""}
  store:events_page("a", {limit = 2})
  store:read_all{after = 0}
  store:wait("a", 0, 0)
  for _ in store:stream("a", {timeout_ms = 0}) do end
  local punsub = store:presence_subscribe("ns", function() end)
  store:presence_set("ns", "p", {x = 1, y = json.null}, {ttl_ms = 100})
  store:presence_read("ns")
  punsub()
  unsub()
  pcall(store.append, store, "a", {{type = "t", payload = {[1] = 1, x = 2}}})
  pcall(store.append, store, "", {{type = "t"}})
  assert(seen > 0)
end
-- Lua code that cancels, re-enters or closes its store mid-call
-- (spec/17-store_reentry_spec.lua): subscriptions cancelled twice and after
-- close, a subscriber and a clock function that close their store, a
-- result that no longer decodes.
for _, url in ipairs(urls) do
  local store = eventstore.open(url, {clock = eventstore.manual_clock(1000)})
  local unsub = store:subscribe("r", function() store:close() end)
  local punsub = store:presence_subscribe("ns", function() end)
  store:subscribe(nil, function() end)
  store:append("r", {{type = "t"}, {type = "t"}})
  unsub(); unsub(); punsub(); punsub()
  local armed, clocked = false, nil
  clocked = eventstore.open(url, {clock = function()
    if armed then clocked:close() end
    return 1000
  end})
  armed = true
  assert(not pcall(clocked.append, clocked, "r", {{type = "t"}}))
  assert(not pcall(eventstore.open, "nope:", {clock = eventstore.manual_clock(1)}))
end
os.execute(("sqlite3 %s \"UPDATE events SET payload = '{'\""):format(path))
do
  local store <close> = eventstore.open("sqlite:" .. path)
  assert(not pcall(store.read, store, "r"))
end
-- The engine: worker threads, a handler, a reducer with snapshots, a
-- failing handler and a budget, on sqlite.
local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir .. "/handlers " .. dir .. "/reducers")
local function write(name, text)
  local f = assert(io.open(dir .. "/" .. name, "w"))
  f:write(text)
  f:close()
end
write("handlers/ping.lua", [[return function(e, ctx)
  ctx.state("count")
  return {{type = "pong", payload = {n = e.payload.n}, delay_ms = 0}}
end]])
write("handlers/boom.lua", "return function() error('boom') end")
write("handlers/spin.lua", "return function() while true do end end")
write("reducers/count.lua", "return {init = function() return {n = 0} end, ping = function(s) s.n = s.n + 1 end}")
for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end
do
  local engine <close> = eventstore.engine{store = "sqlite:" .. path, scripts = dir, workers = 2,
    max_failures = 1, instruction_budget = 100000, snapshot_every = 2}
  for i = 1, 5 do engine:append("e", {{type = "ping", payload = {n = i}}}) end
  engine:append("e", {{type = "boom"}, {type = "spin"}, {type = "unknown"}})
  local r = engine:run{until_idle = true}
  assert(r.handled == 5 and r.dead == 2, "handled " .. r.handled .. ", dead " .. r.dead)
  assert(engine:state("e", "count").n == 5)
end
-- The engine riding out a server outage (docs/engine.md "When the store
-- fails"): the handler stops the test server and starts it again a second
-- later, so the completion fails with STORAGE, is retried, and reconnects.
local pg_dir = os.getenv("ES_PG_DIR")
if pg and pg ~= "" and pg_dir and pg_dir ~= "" then
  write("handlers/outage.lua", ([[return function()
  os.execute("sh spec/support/pg_cluster.sh stop-server '%s' >/dev/null 2>&1; " ..
    "(sleep 1; sh spec/support/pg_cluster.sh start-server '%s' >/dev/null 2>&1) &")
  return {{type = "after"}}
end]]):format(pg_dir, pg_dir))
  local engine <close> = eventstore.engine{store = urls[3], scripts = dir, workers = 2}
  engine:append("outage", {{type = "outage"}})
  local r = engine:run{until_idle = true}
  assert(r.handled == 1, "handled " .. r.handled)
  assert(#engine.store:read("outage") == 2)
end
os.execute("rm -rf " .. dir)
for _, s in ipairs({"", "-wal", "-shm"}) do os.remove(path .. s) end
collectgarbage()
print("ok")
