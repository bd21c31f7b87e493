-- spec/support/sqlite_promote_worker.lua: one of the racing processes of
-- spec/24-sqlite_promote_race_spec.lua.
--
--   lua5.4 spec/support/sqlite_promote_worker.lua DB ID ROUNDS DIR
--
-- Opens DB, writes DIR/ready-ID, then for each round r = 1..ROUNDS waits
-- for the file DIR/go-r (the start barrier: every worker is spinning on it
-- when the spec creates it) and at once promotes its ref "cand-ID":
--   odd r:  promote("cand-ID", "main", {expect = "base-r"})
--   even r: promote("cand-ID", "fresh-r", {expect = false})
-- and writes the outcome to DIR/res-r-ID (written to a temporary name, then
-- renamed, so the spec never reads half a file), one line:
--   "won"                        the promote returned
--   "conflict EXPECTED ACTUAL"   REF_CONFLICT (false printed as "false")
--   "error TEXT"                 anything else
-- Prints "done" at the end. Exits at once when DIR/stop appears (the spec
-- failed a round and will start no more).
local eventstore = require("eventstore")

local db, id, rounds, dir = arg[1], arg[2], math.tointeger(tonumber(arg[3])), arg[4]
assert(db and id and rounds and dir, "usage: sqlite_promote_worker.lua DB ID ROUNDS DIR")

local store = eventstore.open("sqlite:" .. db)

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

local function put(path, text)
  local tmp = path .. ".tmp"
  local f = assert(io.open(tmp, "w"))
  f:write(text)
  f:close()
  assert(os.rename(tmp, path))
end

put(dir .. "/ready-" .. id, "ready\n")

for r = 1, rounds do
  local go = dir .. "/go-" .. r
  -- Spin: the promotes of all workers should start within microseconds of
  -- each other. A worker left behind for more than 60 s gives up.
  local started = os.time()
  while not exists(go) do
    if exists(dir .. "/stop") then os.exit(2) end -- the spec failed and gives up
    if os.time() - started > 60 then
      io.stdout:write("timeout waiting for round " .. r .. "\n")
      os.exit(1)
    end
  end
  local to, expect
  if r % 2 == 1 then
    to, expect = "main", "base-" .. r
  else
    to, expect = "fresh-" .. r, false
  end
  local ok, res = pcall(store.promote, store, "cand-" .. id, to, { expect = expect })
  local line
  if ok then
    line = "won"
  elseif eventstore.is_error(res, "REF_CONFLICT") then
    line = ("conflict %s %s"):format(tostring(res.expected), tostring(res.actual))
  else
    line = "error " .. tostring(res):gsub("\n", " ")
  end
  put(dir .. "/res-" .. r .. "-" .. id, line .. "\n")
end

store:close()
io.stdout:write("done\n")
