-- bench/move_bench.lua DIR [EVENTS] [PG_URL]: moving a store (docs/moving.md).
--
-- In one run: export and import rates of an EVENTS-event sqlite: store
-- (default 100,000 events, ~95-byte payloads, over 1,000 sessions, a tenth
-- of them dispatched) beside `sqlite3 .dump` of the same file and, with
-- PG_URL, import into postgres:// beside `pg_dump` of the store's schema;
-- then the switch-over of `eventstore copy --follow` under a writer
-- appending about 1,000 events/s: from the writer's last append to the
-- copy caught up, and from SIGTERM to the copy's exit (its last full pass).
local eventstore = require("eventstore")

local dir = assert(arg[1], "usage: move_bench.lua DIR [EVENTS] [PG_URL]")
local N = math.tointeger(tonumber(arg[2] or "100000"))
local pg = arg[3]
local BIN = os.getenv("ES_BIN") or "build/bin/eventstore"

local function now()
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("l"))
  p:close()
  return t
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local src_path = dir .. "/move_src.db"
local follow_only = os.getenv("MOVE_BENCH_FOLLOW_ONLY") ~= nil -- reuse DIR/move_src.db
for _, f in ipairs(follow_only and {} or { src_path, dir .. "/move_dst.db", dir .. "/move.dump", dir .. "/move.ndjson" }) do
  os.remove(f)
  os.remove(f .. "-wal")
  os.remove(f .. "-shm")
end

local function seed()
  local s <close> = eventstore.open("sqlite:" .. src_path)
  local per = N // 1000
  for k = 1, 1000 do
    local batch = {}
    for i = 1, per do
      batch[i] = { type = "order-placed", payload = { customer = "c-" .. k, items = { { qty = 2, sku = "SKU-42" } },
        note = "deliver to the back door" }, settled = i % 10 ~= 0 }
    end
    s:append(("session-%04d"):format(k), batch)
  end
  for k = 1, 100 do
    local c = s:claim(("session-%04d"):format(k), { holder = "bench", ttl_ms = 60000, limit = 1 })
    if c.outcome == "claimed" then s:complete(("session-%04d"):format(k), c.events[1].index, c.events[1].attempt, {}) end
  end
end

local function rate(label, seconds, extra)
  print(("%-40s %8.2f s  %10.0f events/s%s"):format(label, seconds, N / seconds, extra or ""))
end

local src = eventstore.open("sqlite:" .. src_path)

local function rates()

local t0 = now()
local lines = {}
src:export(function(l) lines[#lines + 1] = l end)
local t_export = now() - t0
local f = assert(io.open(dir .. "/move.ndjson", "wb"))
for i = 1, #lines do f:write(lines[i], "\n") end
f:close()
local bytes = 0
for i = 1, #lines do bytes = bytes + #lines[i] + 1 end
rate("export (sqlite:)", t_export, ("  %6.1f MB"):format(bytes / 1e6))

t0 = now()
assert(os.execute("sqlite3 " .. q(src_path) .. " .dump > " .. q(dir .. "/move.dump")))
rate("sqlite3 .dump (same file)", now() - t0)

t0 = now()
local dst = eventstore.open("sqlite:" .. dir .. "/move_dst.db")
eventstore.import(dst, lines)
rate("import into sqlite:", now() - t0)
dst:close()

t0 = now()
local mem = eventstore.open("memory:")
eventstore.import(mem, lines)
rate("import into memory:", now() - t0)
mem:close()

if pg then
  local url = pg .. (pg:find("?", 1, true) and "&" or "?") .. "schema=move_bench_" .. os.time()
  t0 = now()
  local p = eventstore.open(url)
  eventstore.import(p, lines)
  rate("import into postgres:", now() - t0)
  t0 = now()
  local again = {}
  p:export(function(l) again[#again + 1] = l end)
  rate("export (postgres:)", now() - t0)
  p:close()
  local schema = url:match("schema=([%w_]+)")
  local conn = pg:gsub("%?.*$", "")
  local host = pg:match("host=([^&]+)")
  t0 = now()
  assert(os.execute(("pg_dump %s -n %s %s > /dev/null"):format(host and ("-h " .. q(host)) or "", schema,
    q((conn:gsub("^postgres://", "postgresql://"))))))
  rate("pg_dump of the schema", now() - t0)
end

end

if not follow_only then
  seed()
  rates()
end

-- switch-over: copy --follow under a writer of ~1000 events/s
local follow_dst = dir .. "/move_follow.db"
os.remove(follow_dst)
local copy_log = dir .. "/move_copy.log"
assert(os.execute(("%s copy --from %s --to %s --follow > %s 2>&1 & echo $! > %s"):format(
  q(BIN), q("sqlite:" .. src_path), q("sqlite:" .. follow_dst), q(copy_log), q(dir .. "/move_copy.pid"))))
local pid = io.open(dir .. "/move_copy.pid"):read("l")
local function copied()
  local ok, n = pcall(function()
    local d <close> = eventstore.open("sqlite:" .. follow_dst .. "?mode=ro")
    return d:stats().events
  end)
  return ok and n or 0
end
local base = src:stats().events
while copied() < base do os.execute("sleep 0.05") end
-- the writer: 3,000 events in batches of 10, paced to 1,000 events/s
-- (every 10 batches it waits until its schedule, on a session nobody
-- writes); every 50th batch also completes a claimed event
local written, start = 0, now()
for b = 1, 300 do
  local batch = {}
  for i = 1, 10 do batch[i] = { type = "w", payload = { i = written + i } } end
  src:append("writer-" .. (b % 20), batch)
  written = written + 10
  if b % 50 == 0 then
    local c = src:claim("writer-" .. (b % 20), { holder = "bench", ttl_ms = 60000, limit = 1 })
    src:complete(c.events[1].session, c.events[1].index, c.events[1].attempt, {})
  end
  if b % 10 == 0 then
    local ahead = start + b * 0.01 - now()
    if ahead > 0 then src:wait("bench-pause", 0, math.floor(ahead * 1000)) end
  end
end
local t_stop = now()
local want = base + written
while copied() < want do os.execute("sleep 0.01") end
local t_caught = now()
-- the runbook's step 4: stop the copy; NEW holds everything once the copy
-- prints its last line (after its last pass committed), before it exits
os.execute("kill -TERM " .. pid)
local t_term = now()
while not (io.open(copy_log):read("a")):find('"copied":true', 1, true) do os.execute("sleep 0.01") end
local t_done = now()
while os.execute("kill -0 " .. pid .. " 2>/dev/null") do os.execute("sleep 0.01") end
local t_exit = now()
print(("copy --follow: writer %d events in %.2f s (%.0f/s); caught up %.3f s after the last append; "
  .. "SIGTERM to last pass done %.3f s (to exit %.3f s); switch-over (last append to NEW complete) %.3f s"):format(
  written, t_stop - start, written / (t_stop - start), t_caught - t_stop, t_done - t_term, t_exit - t_term,
  t_done - t_stop))
src:close()
