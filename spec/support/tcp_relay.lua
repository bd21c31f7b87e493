-- spec/support/tcp_relay.lua: a TCP relay whose faults a spec controls
-- (spec/33-postgres_silent_net_spec.lua): the network between a client
-- and PostgreSQL going quiet without closing, or slow.
--
--   lua5.4 tcp_relay.lua TARGET CONTROL STATE
--
-- Listens on 127.0.0.1 (a port the kernel picks) and forwards each
-- connection to TARGET (`unix:/dir/.s.PGSQL.5432` or `host:port`). It
-- writes "port N" to STATE once listening. CONTROL is a file the spec
-- writes "SEQ MODE [MS]" to (whole, by rename); the relay applies it and
-- appends "ack SEQ" to STATE, so the spec waits on that, not on a clock:
--
--   pass          forward both ways (the start)
--   silent        forward nothing either way, close nothing; connections
--                 accepted meanwhile stay silent too (a partition)
--   silent-up     forward nothing from the client to the server
--   silent-down   forward nothing from the server to the client
--   delay MS      forward everything, each chunk MS ms after it came
--
-- Held bytes are not lost: when forwarding resumes they go on, as TCP
-- retransmits them when a partition heals (a client that gave up and
-- closed meanwhile may thus still have its last request run). Needs
-- LuaSocket (Debian lua-socket, which `make deps` installs).
local socket = require("socket")
local unix_ok, unix = pcall(require, "socket.unix")

local target, control, state = arg[1], arg[2], arg[3]
assert(target and control and state, "usage: tcp_relay.lua TARGET CONTROL STATE")

local function connect_target()
  local path = target:match("^unix:(.+)$")
  local s, err
  if path then
    assert(unix_ok, "socket.unix is missing")
    s = unix.stream and unix.stream() or unix()
    local ok
    ok, err = s:connect(path)
    if not ok then return nil, err end
  else
    local host, port = target:match("^(.+):(%d+)$")
    s, err = socket.connect(host, tonumber(port))
    if not s then return nil, err end
  end
  s:settimeout(0)
  return s
end

local server = assert(socket.bind("127.0.0.1", 0))
server:settimeout(0)
local _, port = server:getsockname()

local function say(line)
  local f = assert(io.open(state, "a"))
  f:write(line, "\n")
  f:close()
end
say("port " .. port)

local mode, delay, seq = "pass", 0, nil
local pairs_ = {} -- {c = client, u = upstream, up = {chunks}, down = {chunks}}

local function read_control()
  local f = io.open(control, "r")
  if not f then return end
  local text = f:read("a")
  f:close()
  local s, m, ms = text:match("^(%d+) (%S+) ?(%d*)")
  if not s or s == seq then return end
  seq = s
  mode, delay = m, tonumber(ms) or 0
  say("ack " .. s)
end

-- may this direction move bytes now? ("up": client to server)
local function flowing(dir)
  if mode == "silent" then return false end
  if mode == "silent-up" and dir == "up" then return false end
  if mode == "silent-down" and dir == "down" then return false end
  return true
end

local function close_pair(p)
  p.c:close()
  if p.u then p.u:close() end
  p.dead = true
end

while true do
  read_control()
  local now = socket.gettime()
  local readers, writers = { server }, {}
  local wait = 0.05
  for _, p in ipairs(pairs_) do
    if p.eof and #p.up == 0 and #p.down == 0 then close_pair(p) end
  end
  for _, p in ipairs(pairs_) do
    if not p.dead and not p.eof then
      if flowing("up") then readers[#readers + 1] = p.c end
      if flowing("down") then readers[#readers + 1] = p.u end
    end
    for dir, q in pairs({ up = p.up, down = p.down }) do
      local first = q[1]
      if first and not p.dead and flowing(dir) then
        local due = first.at + delay / 1000
        if due <= now then
          writers[#writers + 1] = dir == "up" and p.u or p.c
        else
          wait = math.min(wait, due - now)
        end
      end
    end
  end
  local r, w = socket.select(readers, writers, wait)
  now = socket.gettime()
  for _, s in ipairs(r) do
    if s == server then
      local c = server:accept()
      if c then
        c:settimeout(0)
        local u = connect_target()
        if u then
          pairs_[#pairs_ + 1] = { c = c, u = u, up = {}, down = {} }
        else
          c:close()
        end
      end
    else
      for _, p in ipairs(pairs_) do
        if not p.dead and (s == p.c or s == p.u) then
          local data, err, partial = s:receive(65536)
          data = data or partial
          if data and #data > 0 then
            local q = s == p.c and p.up or p.down
            q[#q + 1] = { at = now, data = data, i = 1 }
          end
          -- one side closed: what it sent before still goes on (as TCP
          -- delivers the bytes before a FIN), then both close
          if err == "closed" then p.eof = true end
        end
      end
    end
  end
  for _, s in ipairs(w) do
    for _, p in ipairs(pairs_) do
      if not p.dead then
        local q = s == p.u and p.up or s == p.c and p.down or nil
        local first = q and q[1]
        if first then
          local last, err, partial = s:send(first.data, first.i)
          last = last or partial
          if last then first.i = last + 1 end
          if first.i > #first.data then table.remove(q, 1) end
          if err == "closed" then close_pair(p) end
        end
      end
    end
  end
  local live = {}
  for _, p in ipairs(pairs_) do
    if not p.dead then live[#live + 1] = p end
  end
  pairs_ = live
end
