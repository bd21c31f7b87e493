-- /metrics and /healthz (docs/contract.md §6, docs/http-live.md): the Prometheus
-- text format 0.0.4 checked line by line by a strict parser
-- (hh.parse_metrics: every line a comment or a sample, TYPE before
-- samples, families together, label escapes, histograms cumulative with
-- +Inf = _count); figures that move with the work done (calls, pending,
-- the engine's per-type counts); what a tenant token sees; /healthz with
-- and without a working store.
local hh = require("http_helpers")
local helpers = require("helpers")

local PG, PG_DIR = os.getenv("ES_PG_URL"), os.getenv("ES_PG_DIR")

describe("http live: /metrics", function()
  local srv, scripts
  setup(function()
    scripts = os.tmpname()
    os.remove(scripts)
    assert(os.execute("mkdir -p " .. helpers.sh_quote(scripts .. "/handlers") .. " " ..
      helpers.sh_quote(scripts .. "/reducers")))
    helpers.write_file(scripts .. "/handlers/ping.lua", "return function(event) return {} end\n")
    helpers.write_file(scripts .. "/handlers/boom.lua", "return function(event) error('boom') end\n")
    -- a type whose name needs the format's escapes (quote and backslash)
    helpers.write_file(scripts .. '/handlers/we"ird\\type.lua', "return function(event) return {} end\n")
    srv = hh.serve({ scripts = scripts })
  end)
  teardown(function()
    assert.equals(0, hh.stop(srv))
    os.execute("rm -rf " .. helpers.sh_quote(scripts))
  end)

  it("is the text format 0.0.4, every family typed, histograms well formed", function()
    local m, text = hh.metrics(srv, "admin-token")
    for _, name in ipairs({ "eventstore_sessions", "eventstore_events", "eventstore_pending",
      "eventstore_dead", "eventstore_calls_total", "eventstore_call_errors_total",
      "eventstore_call_duration_seconds", "eventstore_http_responses_total",
      "eventstore_http_streams_open", "eventstore_http_streams_dropped_total",
      "eventstore_http_connections_refused_total" }) do
      assert.is_table(m.families[name], name)
      assert.is_string(m.families[name].help, name)
    end
    assert.equals("histogram", m.families.eventstore_call_duration_seconds.type)
    assert.equals("counter", m.families.eventstore_calls_total.type)
    assert.equals("gauge", m.families.eventstore_pending.type)
    -- buckets from 2^10 ns, by powers of two, then +Inf
    assert.matches('eventstore_call_duration_seconds_bucket{op="stats",le="0.000001024"} %d+\n', text)
    assert.matches('eventstore_call_duration_seconds_bucket{op="stats",le="%+Inf"} %d+\n', text)
    -- the parser itself refuses what breaks the rules (so passing it means something)
    assert.has_error(function() hh.parse_metrics("eventstore_x 1\n") end)
    assert.has_error(function() hh.parse_metrics("# TYPE a histogram\na_bucket{le=\"1\"} 2\na_bucket{le=\"+Inf\"} 1\na_count 1\n") end)
    assert.has_error(function() hh.parse_metrics("# TYPE a gauge\na{b=\"x\\q\"} 1\n") end)
    assert.has_error(function() hh.parse_metrics("# TYPE a counter\n# TYPE b counter\na 1\nb 1\na 2\n") end)
  end)

  it("moves with the work: append calls, pending, the engine's per-type counts", function()
    local m0 = hh.metrics(srv, "admin-token")
    local appends0 = m0.value("eventstore_calls_total", { op = "append" }) or 0
    local events0 = m0.value("eventstore_events")
    local ok2xx0 = m0.value("eventstore_http_responses_total", { class = "2xx" })
    for i = 1, 3 do
      assert.equals(200, (hh.append(srv, "admin-token", "m" .. i, { { type = "nohandler" }, { type = "nohandler" } })))
    end
    for _ = 1, 4 do assert.equals(200, (hh.append(srv, "admin-token", "pings", { { type = "ping" } }))) end
    assert.equals(200, (hh.append(srv, "admin-token", "weird", { { type = 'we"ird\\type' } })))
    assert.equals(200, (hh.append(srv, "admin-token", "booms", { { type = "boom" } })))
    -- the engine handles what it has handlers for; wait for it
    local m
    local deadline = helpers.wall() + 30
    repeat
      helpers.sleep(0.2)
      m = hh.metrics(srv, "admin-token")
    until (m.value("eventstore_handler_handled_total", { type = "ping" }) or 0) >= 4 and
      (m.value("eventstore_handler_handled_total", { type = 'we"ird\\type' }) or 0) >= 1 and
      (m.value("eventstore_handler_failed_total", { type = "boom" }) or 0) +
      (m.value("eventstore_handler_dead_total", { type = "boom" }) or 0) >= 1 or
      helpers.wall() > deadline
    assert.is_true(m.value("eventstore_calls_total", { op = "append" }) >= appends0 + 9)
    assert.equals(events0 + 12, m.value("eventstore_events"))
    assert.is_true(m.value("eventstore_http_responses_total", { class = "2xx" }) >= ok2xx0 + 9)
    assert.equals(4, m.value("eventstore_handler_handled_total", { type = "ping" }))
    assert.equals(4, m.value("eventstore_handler_runs_total", { type = "ping" }))
    assert.equals(4, m.value("eventstore_handler_duration_seconds_count", { type = "ping" }))
    assert.equals(1, m.value("eventstore_handler_handled_total", { type = 'we"ird\\type' }))
    assert.is_true(m.value("eventstore_handler_run_errors_total", { type = "boom" }) >= 1)
    -- pending: the 6 events with no handler, and boom's (retried) one
    local _, stats = hh.get(srv, "admin-token", "/v1/stats")
    assert.equals(stats.pending, m.value("eventstore_pending"))
    assert.is_true(m.value("eventstore_pending") >= 6)
  end)

  it("a tenant token sees its tenant's counts and calls, nothing server-wide", function()
    local st = hh.append(srv, "acme-rw", "t1", { { type = "nohandler" }, { type = "nohandler" } })
    assert.equals(200, st)
    assert.equals(200, (hh.append(srv, "acme-rw", "t2", { { type = "nohandler", settled = true } })))
    assert.equals(200, (hh.append(srv, "globex-rw", "t1", { { type = "nohandler" } })))
    local m, text = hh.metrics(srv, "acme-read")
    assert.equals(2, m.value("eventstore_sessions"))
    assert.equals(3, m.value("eventstore_events"))
    assert.equals(2, m.value("eventstore_pending"))
    assert.equals(0, m.value("eventstore_dead"))
    assert.equals(2, m.value("eventstore_calls_total", { op = "append" }))
    assert.is_nil(text:find("eventstore_http_", 1, true))
    assert.is_nil(text:find("eventstore_handler_", 1, true))
    local g = hh.metrics(srv, "globex-rw")
    assert.equals(1, g.value("eventstore_events"))
    assert.equals(1, g.value("eventstore_calls_total", { op = "append" }))
  end)

  it("needs a token with the read right", function()
    local status, body = hh.request(srv, "GET", "/metrics", {})
    assert.equals(401, status)
    assert.equals("UNAUTHORIZED", body.code)
    status = hh.request(srv, "GET", "/metrics", { token = "nope" })
    assert.equals(401, status)
  end)
end)

describe("http live: /healthz", function()
  it("is 200 {ok = true} without a token", function()
    local srv = hh.serve({ no_engine = true })
    local status, body, headers = hh.request(srv, "GET", "/healthz", {})
    assert.equals(200, status)
    assert.same({ ok = true }, body)
    assert.matches("application/json", headers["content-type"], 1, true)
    assert.equals(0, hh.stop(srv))
  end)

  if PG and PG ~= "" and PG_DIR and PG_DIR ~= "" then
    it("is 503 with the store's error while PostgreSQL is down, 200 again after", function()
      local q = helpers.sh_quote
      local spec_dir = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
      local cluster = spec_dir .. "support/pg_cluster.sh"
      -- with the engine, which rides a store outage out (docs/engine.md
      -- "When the store fails"), as a deployed server runs
      local srv = hh.serve({ db = helpers.pg_fresh_url(PG) })
      local ok, err = pcall(function()
        assert.equals(200, (hh.request(srv, "GET", "/healthz", {})))
        assert(os.execute(("sh %s stop-server %s"):format(q(cluster), q(PG_DIR))))
        local status, body = hh.request(srv, "GET", "/healthz", { timeout = 30 })
        assert.equals(503, status)
        assert.equals("STORAGE", body.code)
        assert.is_string(body.message)
        assert(os.execute(("sh %s start-server %s"):format(q(cluster), q(PG_DIR))))
        local deadline = helpers.wall() + 30
        repeat
          status = hh.request(srv, "GET", "/healthz", { timeout = 30 })
          if status ~= 200 then helpers.sleep(0.3) end
        until status == 200 or helpers.wall() > deadline
        assert.equals(200, status)
      end)
      -- the cluster must be up for whatever runs next
      os.execute(("sh %s start-server %s >/dev/null 2>&1"):format(q(cluster), q(PG_DIR)))
      local rc = hh.stop(srv)
      assert(ok, err)
      assert.equals(0, rc)
    end)
  else
    pending("postgres: healthz while PostgreSQL is down: needs ES_PG_URL and ES_PG_DIR (make test sets them)")
  end
end)
