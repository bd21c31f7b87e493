-- http_wrk.lua: the wrk script of bench/http_bench.sh (bench/README.md,
-- "HTTP (issue 13)"). One script, three operations, picked by the first
-- argument after wrk's `--`:
--
--   wrk ... -s bench/http_wrk.lua URL -- append TOKEN LABEL BATCH [SESSIONS]
--       POST /v1/sessions/{s}/events with BATCH events; every event has an
--       id no other request of any run uses (LABEL, the thread, a counter),
--       so each request appends and none is an idempotent replay. Sessions
--       rotate over SESSIONS per thread (default 64), as store_bench does.
--   wrk ... -- read TOKEN LABEL SESSION EVENTS
--       GET /v1/sessions/{SESSION}/events?after=R&limit=100, R drawn from
--       0..EVENTS-100 (a session of EVENTS events), so pages differ.
--   wrk ... -- head TOKEN LABEL SESSION
--       GET /v1/sessions/{SESSION}/head.
--
-- done() prints one line the shell script reads:
--   RESULT LABEL requests req/s p50_ms p99_ms non2xx socket_errors
-- wrk runs this file in LuaJIT, one state per thread plus the main one
-- (setup/done); a thread's globals are read back with thread:get.

-- The payload store_bench.c and stats_bench.c append: the figures compare.
local PAYLOAD = '{"customer":"c-000123","items":[{"qty":2,"sku":"SKU-42"}],"note":"leave at the door"}'

local threads = {}
local next_tid = 0

function setup(thread)
  next_tid = next_tid + 1
  thread:set("tid", next_tid)
  threads[#threads + 1] = thread
end

local op, label, batch, sessions, session, events
local counter = 0

function init(args)
  op, label = args[1], args[3]
  run_label = label -- a global: done() reads it with thread:get
  wrk.headers["Authorization"] = "Bearer " .. args[2]
  if op == "append" then
    batch = tonumber(args[4])
    sessions = tonumber(args[5] or "64")
    wrk.method = "POST"
    wrk.headers["Content-Type"] = "application/json"
  elseif op == "read" or op == "head" then
    session = args[4]
    events = tonumber(args[5] or "0")
    math.randomseed(tid * 7919)
  else
    error("http_wrk.lua: unknown operation " .. tostring(op))
  end
end

function request()
  counter = counter + 1
  if op == "append" then
    local parts = {}
    for i = 1, batch do
      parts[i] = ('{"type":"order.placed","id":"%s-%d-%d-%d","payload":%s}')
        :format(label, tid, counter, i, PAYLOAD)
    end
    local s = ("%s-%d-%d"):format(label, tid, counter % sessions)
    return wrk.format("POST", "/v1/sessions/" .. s .. "/events", nil,
      '{"events":[' .. table.concat(parts, ",") .. "]}")
  elseif op == "read" then
    local after = math.random(0, events - 100)
    return wrk.format("GET", ("/v1/sessions/%s/events?after=%d&limit=100"):format(session, after))
  else
    return wrk.format("GET", ("/v1/sessions/%s/head"):format(session))
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(("RESULT %s %d %.1f %.3f %.3f %d %d\n"):format(threads[1]:get("run_label"),
    summary.requests, summary.requests / seconds, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, e.status, e.connect + e.read + e.write + e.timeout))
end
