-- Child of spec/33-postgres_restart_spec.lua: appends batches of events
-- with fixed ids to one session while the test restarts the server, the
-- way a careful client does: a batch that fails with STORAGE is sent again
-- with the same ids (batch idempotency: if the failed call did commit, the
-- repeat returns the stored events and adds nothing).
--
--   lua5.4 pg_restart_appender.lua URL SESSION BATCHES SIZE STOP_FILE
--
-- Appends BATCHES batches of SIZE events ("note", ids b<k>-<i>), then goes
-- on appending one batch at a time (numbered on) until STOP_FILE exists,
-- so it is still appending whenever the test stops the server. Prints
-- "acked K N" per batch (N: the events the answer returned), "storage
-- <message>" per STORAGE error, and "done K" at the end. Any other error,
-- or a batch still failing after 60 s, exits 1.
local url, session, batches, size, stop_file = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4]), arg[5]
local eventstore = require("eventstore")

local function wall()
  local ok, system = pcall(require, "system")
  if ok and type(system) == "table" and system.gettime then return system.gettime() end
  return os.time()
end

local store = eventstore.open(url)
local k = 0
while true do
  k = k + 1
  if k > batches then
    local f = io.open(stop_file, "r")
    if f then
      f:close()
      break
    end
  end
  local batch = {}
  for i = 1, size do batch[i] = { type = "note", id = ("b%d-%d"):format(k, i), payload = { k = k, i = i } } end
  local first_failure
  while true do
    local ok, res = pcall(store.append, store, session, batch)
    if ok then
      print(("acked %d %d"):format(k, #res))
      break
    end
    if not eventstore.is_error(res, "STORAGE") then
      print("error " .. tostring(res))
      os.exit(1)
    end
    print("storage " .. tostring(res):gsub("\n", " "))
    first_failure = first_failure or wall()
    if wall() - first_failure > 60 then
      print("gave up after 60 s")
      os.exit(1)
    end
    os.execute("sleep 0.05")
  end
  io.stdout:flush()
  os.execute("sleep 0.02") -- appending all along, but leaving the engine most of the lock
end
store:close()
print(("done %d"):format(k - 1))
os.exit(0)
