-- spec/proc_helpers.lua: background processes for the specs that run
-- several engines at once and kill or stop them (spec/32-*, spec/33-*).
--
-- ph.spawn starts a command in the background through sh and returns a
-- process record: its pid is the command's own (not a shell's), so a
-- `kill -9` reaches the engine itself, and its exit status is written to a
-- file by the shell that waits for it, so ph.wait reads it even after the
-- command was killed.
local helpers = require("helpers")

local q = helpers.sh_quote
local ph = {}

-- Starts argv (a list of words, quoted here) with env (name -> value)
-- added, stdout and stderr appended to log. Returns {pid, log, rc_file}.
function ph.spawn(argv, env, log)
  local base = os.tmpname()
  local words = {}
  for name, value in pairs(env or {}) do words[#words + 1] = name .. "=" .. q(value) end
  for _, w in ipairs(argv) do words[#words + 1] = q(w) end
  local p = { log = log, pid_file = base .. ".pid", rc_file = base .. ".rc", base = base }
  local script = ("%s </dev/null >>%s 2>&1 & echo $! >%s; wait $!; echo $? >%s.tmp; mv %s.tmp %s")
    :format(table.concat(words, " "), q(log), q(p.pid_file), q(p.rc_file), q(p.rc_file), q(p.rc_file))
  assert(os.execute("sh -c " .. q(script) .. " >/dev/null 2>&1 &"))
  p.pid = helpers.wait_until(function()
    local text = helpers.read_file(p.pid_file)
    return text and math.tointeger(tonumber(text:match("^(%d+)\n")))
  end, "the pid of " .. table.concat(argv, " "), 60, 0.01)
  return p
end

-- The exit status of p (128 + N for a signal N), or nil while it runs.
function ph.status(p)
  local text = helpers.read_file(p.rc_file)
  return text and math.tointeger(tonumber(text:match("^(%d+)")))
end

-- Waits up to `seconds` for p to end; returns its exit status or nil.
function ph.wait(p, seconds)
  local deadline = helpers.wall() + seconds
  repeat
    local rc = ph.status(p)
    if rc then return rc end
    helpers.sleep(0.05)
  until helpers.wall() > deadline
  return ph.status(p)
end

function ph.signal(p, sig)
  os.execute(("kill -%s %d 2>/dev/null"):format(sig, p.pid))
end

-- Kills what is still running and removes p's files (the log stays: the
-- caller owns it).
function ph.reap(p)
  if not ph.status(p) and helpers.alive(p.pid) then
    ph.signal(p, "KILL")
    ph.wait(p, 5)
  end
  os.remove(p.pid_file)
  os.remove(p.rc_file)
  os.remove(p.base)
end

-- The last `n` lines of a file (for failure messages).
function ph.tail(path, n)
  local text = helpers.read_file(path) or ""
  local lines = {}
  for line in text:gmatch("[^\n]*\n?") do
    if line ~= "" then lines[#lines + 1] = line end
  end
  return table.concat(lines, "", math.max(1, #lines - (n or 20) + 1))
end

return ph
