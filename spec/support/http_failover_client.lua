-- Child of the failover run (spec/support/failover.lua): an HTTP client of
-- `eventstore serve` while the PostgreSQL primary dies and a standby takes
-- over. It appends batches with fixed ids, as a careful client does (a 503
-- is sent again with the same ids), and asks /healthz between them.
--
--   lua5.4 http_failover_client.lua HOST PORT TOKEN SESSION STOP_FILE
--
-- Prints "acked K" per batch whose answer holds exactly the batch's ids,
-- "503 K" per 503, "healthz STATUS" per health check (only when it
-- changes), and "done K". Any other status, a 2xx whose events are not
-- the batch's ("wrong ..."), or a batch still refused after 120 s exits 1.
local socket = require("socket")
local eventstore = require("eventstore")

local host, port, token, session, stop_file = arg[1], tonumber(arg[2]), arg[3], arg[4], arg[5]
local json = eventstore.json

local function request(method, path, body)
  local c = assert(socket.tcp())
  c:settimeout(30)
  local ok, err = c:connect(host, port)
  if not ok then return nil, err end
  local text = body and json.encode(body) or ""
  c:send(("%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
    .. "Content-Length: %d\r\nConnection: close\r\n\r\n%s"):format(method, path, host, token, #text, text))
  local all = c:receive("*a")
  c:close()
  if not all then return nil, "no answer" end
  local status = tonumber(all:match("^HTTP/1%.1 (%d+)"))
  local rest = all:match("\r\n\r\n(.*)$") or ""
  return status, rest
end

local function wall() return socket.gettime() end

local k, health = 0, nil
-- Prints /healthz's status when it changed since the last look.
local function check_health()
  local st = request("GET", "/healthz")
  if st ~= health then
    health = st
    print(("healthz %s"):format(tostring(st)))
  end
  io.stdout:flush()
end

while true do
  k = k + 1
  local f = io.open(stop_file, "r")
  if f then
    f:close()
    break
  end
  local events = {}
  for i = 1, 3 do events[i] = { type = "web", id = ("w%d-%d"):format(k, i), payload = { k = k, i = i } } end
  local first = wall()
  while true do
    local st, body = request("POST", "/v1/sessions/" .. session .. "/events", { events = events })
    if st == 200 or st == 201 then
      local answer = json.decode(body)
      for i = 1, 3 do
        local e = answer.events and answer.events[i]
        if not e or e.id ~= events[i].id or #answer.events ~= 3 then
          print(("wrong answer to batch %d: %s"):format(k, body))
          os.exit(1)
        end
      end
      print(("acked %d"):format(k))
      break
    elseif st == 503 then
      print(("503 %d"):format(k))
      check_health()
      if wall() - first > 120 then
        print("still 503 after 120 s")
        os.exit(1)
      end
    else
      print(("status %s to batch %d: %s"):format(tostring(st), k, tostring(body)))
      os.exit(1)
    end
    socket.sleep(0.05)
  end
  check_health()
end
print(("done %d"):format(k - 1))
