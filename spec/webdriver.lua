-- spec/webdriver.lua: a small W3C WebDriver client for the browser specs
-- (spec/86-http_inspector_spec.lua), over LuaSocket (hh.request).
--
-- wd.start() runs Debian's chromedriver on a free loopback port and opens
-- one headless Chromium session; the returned driver has the few commands
-- a page test needs (navigate, find, click, type, text, execute script),
-- wait_until (polls with a deadline: a slow machine waits longer, it
-- never fails an assertion on a fixed sleep) and screenshots for failure
-- messages. d:quit() deletes the session and ends chromedriver and every
-- process it started (by pid), also when the session never came up.
--
-- Missing chromium or chromedriver: wd.missing() says which, and the spec
-- reports a skip "chromium: ..." that fails make test unless ES_ALLOW_SKIP
-- names chromium (spec/run.sh): `make deps` installs both (Debian
-- `chromium`, `chromium-driver`), and CI must run the browser test.
local socket = require("socket")
local mime = require("mime")
local eventstore = require("eventstore")
local helpers = require("helpers")
local ph = require("proc_helpers")
local hh = require("http_helpers")

local json = eventstore.json
local q = helpers.sh_quote

local wd = {}

wd.CHROMIUM = os.getenv("ES_CHROMIUM") or "/usr/bin/chromium"
wd.CHROMEDRIVER = os.getenv("ES_CHROMEDRIVER") or "chromedriver"
-- How long wait_until waits unless told: generous, since it returns as
-- soon as the condition holds.
wd.WAIT = 60

-- The W3C element reference key.
local ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

local function executable(path)
  if path:find("/", 1, true) then
    return os.execute("test -x " .. q(path)) == true
  end
  local p = io.popen("command -v " .. q(path) .. " 2>/dev/null")
  local found = p:read("l")
  p:close()
  return found ~= nil and found ~= ""
end

-- A loopback port nobody listens on now (bind-probe). Another process may
-- take it before chromedriver does: start() retries with a new one.
local function free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return math.tointeger(tonumber(port))
end

-- Every descendant of pid (children first found, depth first), from ps.
local function descendants(pid, out)
  out = out or {}
  local p = io.popen("ps -o pid= --ppid " .. math.tointeger(pid) .. " 2>/dev/null")
  for line in p:lines() do
    local child = math.tointeger(tonumber(line:match("%d+")))
    if child then
      out[#out + 1] = child
      descendants(child, out)
    end
  end
  p:close()
  return out
end

local Driver = {}
Driver.__index = Driver

-- One WebDriver command: method, path under the session (or absolute when
-- it starts with "/"), body (a table, sent as JSON). Returns the answer's
-- `value`; raises with the driver's error and message.
function Driver:cmd(method, path, body, timeout)
  if path:sub(1, 1) ~= "/" then path = "/session/" .. self.session .. "/" .. path end
  local status, resp, _, text = hh.request(self.srv, method, path,
    { body = body and json.encode(body) or (method == "POST" and "{}" or nil), timeout = timeout or 60 })
  if not status then error(("webdriver %s %s: no answer (%s)"):format(method, path, tostring(resp)), 2) end
  if type(resp) ~= "table" then
    error(("webdriver %s %s: %d %s"):format(method, path, status, tostring(text)), 2)
  end
  local value = resp.value
  if status ~= 200 then
    local e = type(value) == "table" and value or {}
    error(("webdriver %s %s: %d %s: %s"):format(method, path, status, tostring(e.error),
      tostring(e.message):sub(1, 600)), 2)
  end
  return value
end

local function elem_id(e)
  if type(e) == "table" and e[ELEMENT] then return e[ELEMENT] end
  if type(e) == "string" then return e end
  error("not an element: " .. tostring(e), 3)
end

function Driver:navigate(url) return self:cmd("POST", "url", { url = url }) end

function Driver:url() return self:cmd("GET", "url") end

-- The first element matching css, or an error naming css.
function Driver:find(css, from)
  local path = from and ("element/" .. elem_id(from) .. "/element") or "element"
  return self:cmd("POST", path, { using = "css selector", value = css })
end

-- Every element matching css (possibly none).
function Driver:find_all(css, from)
  local path = from and ("element/" .. elem_id(from) .. "/elements") or "elements"
  return self:cmd("POST", path, { using = "css selector", value = css })
end

local function target(self, e)
  if type(e) == "string" then return self:find(e) end
  return e
end

-- e: an element or a css selector (its first match).
function Driver:click(e) return self:cmd("POST", "element/" .. elem_id(target(self, e)) .. "/click", {}) end

function Driver:clear(e) return self:cmd("POST", "element/" .. elem_id(target(self, e)) .. "/clear", {}) end

function Driver:send_keys(e, text)
  return self:cmd("POST", "element/" .. elem_id(target(self, e)) .. "/value", { text = text })
end

-- Clears an input and types text into it.
function Driver:type(e, text)
  e = target(self, e)
  self:clear(e)
  return self:send_keys(e, text)
end

function Driver:text(e) return self:cmd("GET", "element/" .. elem_id(target(self, e)) .. "/text") end

function Driver:attr(e, name)
  local v = self:cmd("GET", "element/" .. elem_id(target(self, e)) .. "/attribute/" .. hh.enc(name))
  if v == json.null then return nil end
  return v
end

-- Runs script (a function body: `return ...;`) in the page with args (a
-- list; elements may be passed) and returns its value (json.null -> nil).
function Driver:execute(script, args)
  local v = self:cmd("POST", "execute/sync", { script = script, args = json.array(args or {}) })
  if v == json.null then return nil end
  return v
end

-- Polls fn() (every 0.1 s) until it returns a truthy value, which it
-- returns. Errors fn raises count as "not yet" (the page may be between
-- renders: a stale element). After `timeout` seconds (wd.WAIT) it fails
-- with `what`, the last error, and a screenshot's path.
function Driver:wait_until(what, fn, timeout)
  local deadline = helpers.wall() + (timeout or wd.WAIT)
  local last_err
  while true do
    local ok, v = pcall(fn)
    if ok and v then return v end
    if not ok then last_err = v end
    if helpers.wall() > deadline then
      error(self:failure("timed out waiting for " .. what ..
        (last_err and ("\nlast error: " .. tostring(last_err)) or "")), 2)
    end
    helpers.sleep(0.1)
  end
end

-- A PNG of the page, written to a fresh temporary file; returns its path.
function Driver:screenshot()
  local b64 = self:cmd("GET", "screenshot")
  local base = os.tmpname()
  os.remove(base)
  local path = base .. ".png"
  helpers.write_file(path, (mime.unb64(b64)))
  return path
end

-- The browser console's messages since the last call (chromedriver's
-- logging extension), as text; "" when unavailable.
function Driver:console()
  local ok, logs = pcall(self.cmd, self, "POST", "se/log", { type = "browser" })
  if not ok or type(logs) ~= "table" then return "" end
  local lines = {}
  for _, l in ipairs(logs) do lines[#lines + 1] = tostring(l.level) .. " " .. tostring(l.message) end
  return table.concat(lines, "\n")
end

-- A failure message: msg, the page's error banner, the console, and a
-- screenshot's path (each part only when it can be had).
function Driver:failure(msg)
  local parts = { tostring(msg) }
  local ok, banner = pcall(self.execute, self,
    "var e = document.getElementById('error'); return e && !e.hidden ? e.textContent : null;")
  if ok and banner then parts[#parts + 1] = "page error banner: " .. banner end
  local console = self:console()
  if console ~= "" then parts[#parts + 1] = "browser console:\n" .. console end
  local ok2, path = pcall(self.screenshot, self)
  parts[#parts + 1] = ok2 and ("screenshot: " .. path) or ("(no screenshot: " .. tostring(path) .. ")")
  return table.concat(parts, "\n")
end

-- Runs fn(); when it fails, fails again with the same error plus the
-- page's state (banner, console, screenshot path).
function Driver:check(fn)
  local ok, err = xpcall(fn, debug.traceback)
  if not ok then
    if type(err) == "string" and err:find("screenshot: ", 1, true) then error(err, 0) end
    error(self:failure(err), 0)
  end
end

-- Deletes the session, then ends chromedriver and whatever it started.
-- Safe to call twice and on a half-started driver.
function Driver:quit()
  if self.done then return end
  self.done = true
  if self.session then pcall(self.cmd, self, "DELETE", "/session/" .. self.session, nil, 20) end
  if self.proc then
    -- Chromium's processes are chromedriver's descendants: collect their
    -- pids before chromedriver goes (orphans are re-parented to init).
    local pids = descendants(self.proc.pid)
    ph.signal(self.proc, "TERM")
    if not ph.wait(self.proc, 5) then ph.signal(self.proc, "KILL") end
    for _, pid in ipairs(pids) do
      if helpers.alive(pid) then os.execute("kill -9 " .. pid .. " 2>/dev/null") end
    end
    ph.reap(self.proc)
  end
  if self.dir then os.execute("rm -rf " .. q(self.dir)) end
end

-- Which program is missing (a sentence naming the package to install), or
-- nil when both are there.
function wd.missing()
  if not executable(wd.CHROMIUM) then
    return wd.CHROMIUM .. " is missing: install Debian's chromium (make deps)"
  end
  if not executable(wd.CHROMEDRIVER) then
    return wd.CHROMEDRIVER .. " is missing: install Debian's chromium-driver (make deps)"
  end
end

-- Starts chromedriver and a headless Chromium session. opts.trust_spki:
-- the base64 SHA-256 of a test server's public key (hh.tls_files), whose
-- certificate Chromium then accepts: Chromium on Linux trusts a CA only
-- through an NSS database (certutil, which Debian's chromium does not
-- bring), so the test server's one key is trusted instead, and every
-- other certificate error still fails (not --ignore-certificate-errors;
-- Chromium honours the list only beside --user-data-dir, given below).
-- Raises (loudly, naming what to install) when either program is missing
-- or the session cannot start; in that case nothing is left running.
function wd.start(opts)
  opts = opts or {}
  local missing = wd.missing()
  if missing then error(missing, 2) end
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. q(dir .. "/profile")))
  local log = dir .. "/chromedriver.log"
  local last_err
  for _ = 1, 3 do
    local port = free_port()
    local d = setmetatable({ srv = { host = "127.0.0.1", port = port }, log = log }, Driver)
    d.proc = ph.spawn({ wd.CHROMEDRIVER, "--port=" .. port }, nil, log)
    local ready = false
    local deadline = helpers.wall() + 60 -- ends when it is ready; only a hang runs out
    repeat
      local ok, status, body = pcall(hh.request, d.srv, "GET", "/status", { timeout = 2 })
      if ok and status == 200 and type(body) == "table" and type(body.value) == "table" and body.value.ready then
        ready = true
        break
      end
      if ph.status(d.proc) then break end
      helpers.sleep(0.1)
    until helpers.wall() > deadline
    if ready then
      local caps = {
        capabilities = {
          alwaysMatch = {
            browserName = "chrome",
            ["goog:chromeOptions"] = {
              binary = wd.CHROMIUM,
              -- Without the background-networking flags Chromium tries
              -- to reach Google (updates, sync, field trials), and a
              -- machine without outside network stalls on it.
              args = json.array({ "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps",
                "--window-size=1280,900", "--user-data-dir=" .. dir .. "/profile",
                opts.trust_spki and ("--ignore-certificate-errors-spki-list=" .. opts.trust_spki) or nil }),
            },
            ["goog:loggingPrefs"] = { browser = "ALL" },
            timeouts = { pageLoad = 30000, script = 30000, implicit = 0 },
          },
        },
      }
      local ok, v = pcall(d.cmd, d, "POST", "/session", caps, 90)
      if ok and type(v) == "table" and v.sessionId then
        d.session = v.sessionId
        d.dir = dir
        return d
      end
      last_err = v
    else
      last_err = "chromedriver did not become ready on port " .. port
    end
    d.dir = nil
    d:quit()
  end
  local text = ph.tail(log, 40)
  os.execute("rm -rf " .. q(dir))
  error("could not start a headless Chromium session: " .. tostring(last_err) .. "\nchromedriver log:\n" .. text, 2)
end

return wd
