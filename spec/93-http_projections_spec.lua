-- spec/93: the projection routes of §6 (docs/http-api.md "Projections")
-- on every backend: GET /v1/projections (rows with lag), .../keys (pages),
-- .../state/{key}, POST .../rebuild|retry|skip (admin, '*' tokens only);
-- tenants' tokens see only their tenant's keys; /metrics has the lag.
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")

local json = eventstore.json
local ADMIN = "admin-token"

local TOTAL = [[
return { ["add"] = function(s, e) s.sum = (s.sum or 0) + e.payload.v end }
]]

local BY_SESSION = [[
return { key = function(e) return e.session end,
         ["add"] = function(s, e) s.n = (s.n or 0) + 1; s.sum = (s.sum or 0) + e.payload.v end }
]]

for _, template in ipairs(helpers.urls()) do
  describe("HTTP projections on " .. template, function()
    local srv, scripts
    before_each(function()
      scripts = hh.scripts({})
      assert(os.execute("mkdir -p " .. helpers.sh_quote(scripts .. "/projections")))
      helpers.write_file(scripts .. "/projections/by_session.lua", BY_SESSION)
      helpers.write_file(scripts .. "/projections/total.lua", TOTAL)
      srv = hh.serve({ db = hh.backend_db(template), scripts = scripts })
    end)
    after_each(function()
      hh.stop(srv)
      hh.rm(scripts)
    end)

    local function add(token, session, v)
      hh.check_ok(hh.append(srv, token, session, { { type = "add", payload = { v = v } } }), nil, "append")
    end

    -- the projection folded everything the root token can see
    local function caught_up()
      local st, b = hh.get(srv, ADMIN, "/v1/projections")
      hh.check_ok(st, b, "GET /v1/projections")
      local row
      for _, r in ipairs(b.projections) do
        if r.name == "by_session" then row = r end
        if r.lag ~= 0 or r.generation == 0 or r.rebuilding then return false end
      end
      return row
    end

    it("list, keys, states and control, scoped by the token's tenant", function()
      add("acme-rw", "s1", 1)
      add("acme-rw", "s1", 2)
      add("acme-rw", "s2", 5)
      add("globex-rw", "s1", 7)
      add(ADMIN, "root", 11)
      local row = helpers.wait_until(caught_up, "the projection to catch up")
      assert.equal("by_session", row.name)
      assert.equal("running", row.status)
      assert.equal(row.head, row.position)
      assert.is_string(row.version)

      local st, b = hh.get(srv, "acme-read", "/v1/projections/by_session/state/s1")
      hh.check_ok(st, b, "acme state")
      assert.same({ n = 2, sum = 3 }, b.state)
      assert.equal(row.position, b.position)
      assert.equal(row.generation, b.generation)
      st, b = hh.get(srv, "globex-rw", "/v1/projections/by_session/state/s1")
      assert.same({ n = 1, sum = 7 }, hh.check_ok(st, b, "globex state").state)
      st, b = hh.get(srv, "globex-rw", "/v1/projections/by_session/state/s2")
      assert.equal(json.null, hh.check_ok(st, b, "globex s2").state)
      st, b = hh.get(srv, ADMIN, "/v1/projections/by_session/state/root")
      assert.same({ n = 1, sum = 11 }, hh.check_ok(st, b, "root state").state)

      -- the one state of a projection without a key function: no key segment
      st, b = hh.get(srv, ADMIN, "/v1/projections/total/state")
      assert.same({ sum = 11 }, hh.check_ok(st, b, "root total").state)
      st, b = hh.get(srv, "acme-read", "/v1/projections/total/state")
      assert.same({ sum = 8 }, hh.check_ok(st, b, "acme total").state)

      st, b = hh.get(srv, "acme-read", "/v1/projections/by_session/keys?limit=1")
      hh.check_ok(st, b, "acme keys")
      assert.same({ "s1" }, b.keys)
      assert.equal("s1", b.cursor)
      st, b = hh.get(srv, "acme-read", "/v1/projections/by_session/keys?after=s1")
      assert.same({ "s2" }, hh.check_ok(st, b, "acme keys page 2").keys)
      st, b = hh.get(srv, "globex-rw", "/v1/projections/by_session/keys")
      assert.same({ "s1" }, hh.check_ok(st, b, "globex keys").keys)
      st, b = hh.get(srv, ADMIN, "/v1/projections/by_session/keys")
      assert.same({ "root" }, hh.check_ok(st, b, "root keys").keys)
      st = hh.get(srv, ADMIN, "/v1/projections/by_session/keys?limit=0")
      assert.equal(400, st)

      -- control: admin of '*' only
      st, b = hh.post(srv, "acme-admin", "/v1/projections/by_session/rebuild")
      assert.equal(403, st, json.encode(b))
      st = hh.post(srv, "acme-rw", "/v1/projections/by_session/rebuild")
      assert.equal(403, st)
      st, b = hh.post(srv, ADMIN, "/v1/projections/by_session/retry")
      assert.equal(400, st, json.encode(b))
      assert.equal("INVALID_ARGUMENT", b.code)
      st, b = hh.post(srv, ADMIN, "/v1/projections/nope/retry")
      assert.equal(404, st, json.encode(b))
      st, b = hh.post(srv, ADMIN, "/v1/projections/by_session/rebuild")
      hh.check_ok(st, b, "rebuild")
      assert.is_true(b.projection.rebuilding)
      local after = helpers.wait_until(function()
        local r = caught_up()
        return r and r.generation > row.generation and r
      end, "the rebuilt generation")
      st, b = hh.get(srv, "acme-read", "/v1/projections/by_session/state/s1")
      assert.same({ n = 2, sum = 3 }, hh.check_ok(st, b, "acme state after rebuild").state)
      assert.equal(after.generation, b.generation)

      -- /metrics: the lag of each projection
      local m = hh.metrics(srv, ADMIN)
      local found = false
      local fam = m.families.eventstore_projection_lag_events
      assert.is_table(fam, "the family eventstore_projection_lag_events")
      assert.equal("gauge", fam.type)
      for _, s in ipairs(fam.samples) do
        if s.labels.projection == "by_session" then
          found = true
          assert.equal(0, s.value)
        end
      end
      assert.is_true(found, "eventstore_projection_lag_events{projection=\"by_session\"}")
    end)
  end)
end
