-- Child of spec/17-store_reentry_spec.lua: opens URL (arg[1]) with a Lua
-- clock function that closes its own store once armed, makes one call
-- (arg[2]) and prints one line saying how that call ended and whether the
-- store changed. It runs in its own process because, before the fix, the
-- call never returned (close waited for the very call that ran the clock),
-- and a hang must fail the spec, not stall the suite.
--
-- Output: "result=<CODE or ok or other:...> after=<CODE of a later call>
-- again=<ok|error> state=<unchanged|changed|n/a>"; state is checked by
-- reopening the file, so only for sqlite (a memory store is gone once closed).
package.path = "spec/?.lua;" .. package.path
local eventstore = require("eventstore")
local helpers = require("helpers")

local url, call = arg[1], arg[2]
local T = 1000000

local store
local armed = false
local function clock()
  if armed then store:close() end
  return T
end
store = eventstore.open(url, { clock = clock })

-- A little of everything, so each call has something to change.
store:append("s", { { id = "e1", type = "a" }, { id = "e2", type = "b" } })
local claimed = store:claim("s", { holder = "w", ttl_ms = 1000, limit = 1 })
store:put_snapshot("s", "r", 1, "state", "v1")
store:presence_set("ns", "p", { a = 1 }, { ttl_ms = 1000, at = 5 })

local function state(s)
  return helpers.dump({
    log = s:read_all({}),
    snaps = s:snapshots("s"),
    presence = s:presence_read("ns"),
    sessions = s:sessions({}),
  })
end
local before = state(store)

local attempt = claimed.events[1].attempt
local calls = {
  append = function() return store:append("s", { { type = "c" } }) end,
  claim = function() return store:claim("s", { holder = "w2", ttl_ms = 1000 }) end,
  claim_next = function() return store:claim_next({ holder = "w2", ttl_ms = 1000 }) end,
  renew = function() return store:renew("s", { holder = "w", claims = { { index = 1, attempt = attempt } }, ttl_ms = 5000 }) end,
  complete = function() return store:complete("s", 1, attempt, { { type = "done" } }) end,
  fail = function() return store:fail("s", 1, attempt, { error = "x" }) end,
  put_snapshot = function() return store:put_snapshot("s", "r", 2, "newer", "v1") end,
  presence_set = function() return store:presence_set("ns", "p", { a = 2 }, { ttl_ms = 1000, at = 9 }) end,
  presence_read = function() return store:presence_read("ns") end,
  now = function() return store:now() end,
  presence_subscribe = function() return store:presence_subscribe("ns", function() end) end,
}
local fn = assert(calls[call], "unknown call " .. tostring(call))

local function outcome(ok, err)
  if ok then return "ok" end
  if eventstore.is_error(err) then return err.code end
  return "other:" .. tostring(err)
end

armed = true
local result = outcome(pcall(fn))
armed = false
local after = outcome(pcall(store.head, store, "s"))
local again = pcall(store.close, store) and "ok" or "error"

local verdict = "n/a"
if url:match("^sqlite:") then
  local reopened = eventstore.open(url, { clock = eventstore.manual_clock(T) })
  verdict = state(reopened) == before and "unchanged" or "changed"
  reopened:close()
end
print(("result=%s after=%s again=%s state=%s"):format(result, after, again, verdict))
