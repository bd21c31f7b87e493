-- tenant_events.lua: what `GET /v1/events` of a tenant with no events costs
-- while another tenant holds many (bench/README.md "A small tenant's
-- reads"). For memory: and sqlite:, starts the built `eventstore serve
-- --no-engine` (spec/http_helpers.lua's hh.serve: $BUILD/bin/eventstore),
-- appends EVENTS events to tenant acme in batches of 1,000, then times
-- ROUNDS requests `GET /v1/events?limit=100` with tenant globex's token,
-- one at a time, and prints the median and p90 in ms.
--
--   LUA_PATH='lua/?.lua;lua/?/init.lua;spec/?.lua;;' LUA_CPATH='build/lib/?.so;;' \
--     BUILD=build lua5.4 bench/tenant_events.lua [EVENTS] [ROUNDS]
local hh = require("http_helpers")
local helpers = require("helpers")

local events, rounds = tonumber(arg[1]) or 200000, tonumber(arg[2]) or 200
for _, db in ipairs({ "memory:", "sqlite:" }) do
  -- hh.serve makes a fresh sqlite file in the server's directory for nil
  local srv = hh.serve({ db = db == "memory:" and db or nil, no_engine = true })
  local batch = {}
  for i = 1, 1000 do batch[i] = { type = "seed", payload = { i = i } } end
  for i = 1, events // 1000 do assert(hh.append(srv, "acme-rw", "load-" .. i, batch) == 200) end
  local took = {}
  for i = 1, rounds do
    local t0 = helpers.wall()
    assert(hh.get(srv, "globex-rw", "/v1/events?limit=100") == 200)
    took[i] = (helpers.wall() - t0) * 1000
  end
  table.sort(took)
  print(("%s %s: %d events of another tenant; GET /v1/events of an empty tenant: median %.2f ms, p90 %.2f ms")
    :format(hh.BIN, db, events, took[rounds // 2], took[math.floor(rounds * 0.9)]))
  hh.stop(srv)
end
