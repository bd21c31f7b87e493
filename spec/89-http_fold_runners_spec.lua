-- Several fold runners (docs/engine.md "Fold runners"): state requests of
-- `eventstore serve` fold in parallel, so a long fold of one tenant does
-- not hold up another's short one; an edited reducer reaches every runner.
-- The long fold is held open by a reducer step that waits for a file the
-- test writes (a gate), so every order below is observed, never timed.
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")

local json = eventstore.json

-- `add` counts; `gate` writes payload.started, then waits until
-- payload.flag exists. `version` tells which text of the file folded.
local function reducer(version)
  return ([[
return {
  init = function() return {n = 0, version = %d} end,
  add = function(state) state.n = state.n + 1; return state end,
  gate = function(state, event)
    local s = assert(io.open(event.payload.started, "w"))
    s:close()
    while true do
      local f = io.open(event.payload.flag, "r")
      if f then f:close(); break end
      os.execute("sleep 0.02")
    end
    state.n = state.n + 1
    return state
  end,
}
]]):format(version)
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

-- Appends n `add` events and then a gate on session (as token); returns
-- the gate's started and flag paths.
local function gated_session(srv, token, session, n, name)
  local adds = {}
  for i = 1, n do adds[i] = { type = "add" } end
  for i = 1, n, 500 do
    hh.append_ok(srv, token, session, { table.unpack(adds, i, math.min(n, i + 499)) })
  end
  local gate = { started = srv.dir .. "/" .. name .. ".started", flag = srv.dir .. "/" .. name .. ".open" }
  hh.append_ok(srv, token, session, { { type = "gate", payload = gate } })
  return gate
end

-- Sends the state request on a connection of its own and returns it
-- unread.
local function ask_state(srv, token, session)
  local c = hh.connect(srv, 60)
  assert(c:send(("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n")
    :format(hh.spath(session, "state", "count"), token)))
  return c
end

-- Reads a state answer from c: status, decoded body.
local function read_state(c)
  local status, headers = hh.read_head(c)
  assert(status, "no answer: " .. tostring(headers))
  local text = assert(c:receive(math.tointeger(tonumber(headers["content-length"]))))
  c:close()
  return status, json.decode(text)
end

-- The state of session through a short request (as token).
local function state_of(srv, token, session)
  local st, body = hh.get(srv, token, hh.spath(session, "state", "count"))
  return hh.check_ok(st, body, "state of " .. session)
end

-- Runs fn(srv) on a server with the count reducer and opts.args; every
-- gate in gates is opened when fn ends (so the server can stop), then
-- the server is stopped and must exit 0.
local function with_server(args, fn)
  local scripts = hh.scripts({ ["reducers/count.lua"] = reducer(1) })
  local srv = hh.serve({ db = "memory:", no_engine = true, scripts = scripts, args = args })
  local gates = {}
  local ok, err = pcall(fn, srv, scripts, gates)
  for _, g in ipairs(gates) do helpers.write_file(g.flag, "") end
  if not ok then
    hh.stop(srv)
    hh.rm(scripts)
    error(err, 0)
  end
  hh.stop_clean(srv)
  hh.rm(scripts)
end

describe("eventstore serve fold runners", function()
  it("answers a 1-event state while another tenant's long fold is still running", function()
    with_server({}, function(srv, _, gates)
      local gate = gated_session(srv, "acme-rw", "long", 2000, "long")
      gates[1] = gate
      hh.append_ok(srv, "globex-rw", "short", { { type = "add" } })
      local long = ask_state(srv, "acme-rw", "long")
      helpers.wait_until(function() return exists(gate.started) end, "the long fold to reach its gate", 60)
      -- the long fold holds a runner; the short state is answered meanwhile
      local short = state_of(srv, "globex-rw", "short")
      assert.same({ n = 1, version = 1 }, short.state)
      -- and the long request is still open, its answer not written yet
      long:settimeout(0)
      local got, why = long:receive(1)
      assert.is_nil(got)
      assert.equal("timeout", why)
      helpers.write_file(gate.flag, "")
      long:settimeout(60)
      local status, body = read_state(long)
      assert.equal(200, status)
      assert.same({ n = 2001, version = 1 }, body.state)
      assert.equal(2001, body.index)
    end)
  end)

  it("an edited reducer reaches every runner", function()
    with_server({ "--fold-runners", "2" }, function(srv, scripts, gates)
      hh.append_ok(srv, "admin-token", "s", { { type = "add" }, { type = "add" } })
      -- Both runners start: one held at a gate, the other answers.
      local g1 = gated_session(srv, "admin-token", "g1", 1, "g1")
      gates[1] = g1
      local held = ask_state(srv, "admin-token", "g1")
      helpers.wait_until(function() return exists(g1.started) end, "the first gate", 60)
      assert.same({ n = 2, version = 1 }, state_of(srv, "admin-token", "s").state)
      helpers.write_file(g1.flag, "")
      assert.equal(200, (read_state(held)))
      -- The reducer is edited (a new size, so the loader sees the change).
      helpers.write_file(scripts .. "/reducers/count.lua", reducer(2) .. "-- edited\n")
      -- Hold the first idle runner at a gate: the state call after it runs
      -- on the other one, which folded version 1 before.
      local g2 = gated_session(srv, "admin-token", "g2", 1, "g2")
      gates[2] = g2
      held = ask_state(srv, "admin-token", "g2")
      helpers.wait_until(function() return exists(g2.started) end, "the second gate", 60)
      hh.append_ok(srv, "admin-token", "s", { { type = "add" } })
      assert.same({ n = 3, version = 2 }, state_of(srv, "admin-token", "s").state)
      helpers.write_file(g2.flag, "")
      local status, body = read_state(held)
      assert.equal(200, status)
      assert.same({ n = 2, version = 2 }, body.state)
    end)
  end)
end)
