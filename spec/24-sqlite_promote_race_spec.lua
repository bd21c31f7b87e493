-- docs/contract.md §3.7: "Two concurrent promotes with the same expect: exactly one
-- wins, on every backend and across processes." SQLite only (memory stores
-- are per process): four real processes (spec/support/sqlite_promote_worker.lua)
-- on one file, released together by a start barrier (a file they spin on),
-- promote onto the same ref with the same `expect`, 20 rounds: half with
-- expect = the session the ref names, half with expect = false onto a ref
-- that does not exist yet. Every round exactly one process wins; every
-- other one gets REF_CONFLICT naming what it expected and the winner's
-- session as `actual`; the ref names the winner's session.
local eventstore = require("eventstore")
local helpers = require("helpers")

local LUA = os.getenv("LUA") or "lua5.4"
local spec_dir = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local WORKER = spec_dir .. "support/sqlite_promote_worker.lua"
local q = helpers.sh_quote

local WORKERS, ROUNDS = 4, 20

describe("sqlite: promote races between processes", function()
  local base, db, dir
  local procs = {}

  before_each(function()
    base = os.tmpname()
    db = base .. ".db"
    dir = base .. ".race"
    assert(os.execute("mkdir " .. q(dir)))
  end)

  after_each(function()
    -- workers still waiting for a round (after a failed one) stop at once
    helpers.write_file(dir .. "/stop", "stop\n")
    for i = #procs, 1, -1 do
      pcall(function() procs[i]:close() end)
      procs[i] = nil
    end
    os.execute("rm -rf " .. q(dir))
    helpers.remove_db(db)
    os.remove(base)
  end)

  local function exists(path)
    local f = io.open(path, "r")
    if f then f:close() end
    return f ~= nil
  end

  -- Waits (up to 60 s) until every path exists; sleeps by waiting on the store.
  local function wait_for(store, paths, what)
    local deadline = os.time() + 60
    while true do
      local missing
      for _, p in ipairs(paths) do
        if not exists(p) then missing = p; break end
      end
      if not missing then return end
      assert(os.time() < deadline, "timed out waiting for " .. what .. " (" .. missing .. ")")
      store:wait(nil, math.maxinteger, 2)
    end
  end

  it("exactly one of four processes wins each round; the others get REF_CONFLICT", function()
    local store = eventstore.open("sqlite:" .. db)
    for i = 1, WORKERS do store:put_ref("cand-" .. i, "sess-" .. i) end

    local ready = {}
    for i = 1, WORKERS do
      procs[i] = assert(io.popen(("%s %s %s %d %d %s 2>&1"):format(LUA, q(WORKER), q(db), i, ROUNDS, q(dir)), "r"))
      ready[i] = dir .. "/ready-" .. i
    end
    wait_for(store, ready, "the workers to open the store")

    local wins = {}
    for r = 1, ROUNDS do
      local to, expected
      if r % 2 == 1 then
        to, expected = "main", "base-" .. r
        store:put_ref("main", expected)
      else
        to, expected = "fresh-" .. r, "false"
        assert.is_nil(store:get_ref(to))
      end
      local results = {}
      for i = 1, WORKERS do results[i] = dir .. "/res-" .. r .. "-" .. i end
      helpers.write_file(dir .. "/go-" .. r, "go\n")
      wait_for(store, results, "round " .. r)

      local winner, lines = nil, {}
      for i = 1, WORKERS do
        local line = assert(helpers.read_file(results[i])):gsub("\n$", "")
        lines[#lines + 1] = i .. ": " .. line
        if line == "won" then
          assert.is_nil(winner, ("round %d: two winners (%d and %d)\n%s"):format(r, winner or 0, i,
            table.concat(lines, "\n")))
          winner = i
        end
      end
      local report = table.concat(lines, "\n")
      assert.is_not_nil(winner, ("round %d: nobody won\n%s"):format(r, report))
      for i = 1, WORKERS do
        if i ~= winner then
          local line = helpers.read_file(results[i]):gsub("\n$", "")
          assert.equal(("conflict %s sess-%d"):format(expected, winner), line,
            ("round %d, worker %d\n%s"):format(r, i, report))
        end
      end
      local ref = store:get_ref(to)
      assert.is_not_nil(ref, "round " .. r .. ": no ref " .. to)
      assert.equal("sess-" .. winner, ref.session)
      wins[winner] = (wins[winner] or 0) + 1
    end

    for i = 1, WORKERS do
      local out = procs[i]:read("a")
      procs[i]:close()
      procs[i] = nil
      assert.truthy(out:match("done\n$"), ("worker %d did not finish cleanly:\n%s"):format(i, out))
    end
    local spread = {}
    for i = 1, WORKERS do spread[#spread + 1] = ("%d:%d"):format(i, wins[i] or 0) end
    print("# promote race winners per worker: " .. table.concat(spread, " "))
    store:close()
  end)
end)
