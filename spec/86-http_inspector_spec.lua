-- spec/86-http_inspector_spec.lua: the browser inspector (web/inspector,
-- docs/inspector.md) in a real headless Chromium, driven over WebDriver
-- (spec/webdriver.lua): the page as a user sees it, against a real
-- `eventstore serve`. One browser and one server for the whole file; the
-- tests run in order and build on each other's data. One test runs the
-- page over HTTPS too, from a second server on the same database started
-- with a throwaway certificate (hh.tls_files) whose key the browser
-- trusts (wd.start's trust_spki).
--
-- Without chromium or chromedriver the file reports one skip "chromium:
-- ...", naming the package to install (make deps installs both), which
-- fails make test unless ES_ALLOW_SKIP names chromium (spec/run.sh).
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")
local wd = require("webdriver")

local json = eventstore.json
local ADMIN = "admin-token"

-- A reducer for the state view: counts the order's events and keeps the
-- last value of each.
local SUMMARY = [[
return {
  init = function() return {count = 0} end,
  ["order.placed"] = function(s, e) s.count = s.count + 1; s.item = e.payload.item end,
  ["order.shipped"] = function(s, e) s.count = s.count + 1; s.carrier = e.payload.carrier end,
  ["order.note"] = function(s, e) s.count = s.count + 1; s.note = e.payload.text end,
}
]]

local XSS_NAME = [[<img src=x onerror="window.__xss='name'">]]
local XSS_PAYLOAD = [[<img src=x onerror=window.__xss='payload'>]]
local XSS_SCRIPT = [[<script>window.__xss='script'</script>]]

if wd.missing() then
  describe("the inspector in a headless browser", function()
    pending("chromium: " .. wd.missing())
  end)
  return
end

describe("the inspector in a headless browser", function()
  local srv, d, scripts, tls

  local function path_of(session, rest)
    return "/v1/sessions/" .. hh.enc(session) .. (rest or "")
  end

  local function append(session, events)
    local status, body = hh.post(srv, ADMIN, path_of(session, "/events"), { events = json.array(events) })
    assert.are.equal(200, status, json.encode(body))
    return body.events
  end

  local function event_of(session, index)
    local status, body = hh.get(srv, ADMIN, path_of(session, "/events?after=" .. (index - 1) .. "&limit=1"))
    assert.are.equal(200, status, json.encode(body))
    return body.events[1]
  end

  -- Claims every ready event for `holder` and returns the one of session.
  local function claim(session, holder)
    local status, body = hh.post(srv, ADMIN, "/v1/claims", { holder = holder, ttl_ms = 60000, limit = 100 })
    assert.are.equal(200, status, json.encode(body))
    for _, e in ipairs(body.events) do
      if e.session == session then return e end
    end
    error("no claimable event of " .. session .. " in " .. json.encode(body))
  end

  local function dead_letter(session, holder, message)
    local e = claim(session, holder)
    local status, body = hh.post(srv, ADMIN, path_of(session, "/events/" .. e.index .. "/fail"),
      { attempt = e.attempt, error = message, max_failures = 1 })
    assert.are.equal(200, status, json.encode(body))
    assert.are.equal("dead_lettered", body.outcome)
    return e
  end

  -- Evaluates a JS expression in the page.
  local function js(expr, ...)
    return d:execute("return (" .. expr .. ");", { ... })
  end

  local function row_sel(index)
    return ('#events li[data-test="event-row"][data-index="%d"]'):format(index)
  end

  local function row_text(index)
    return js("(function(s){var e=document.querySelector(s);return e?e.textContent:null;})(arguments[0])",
      row_sel(index))
  end

  local function banner()
    return js("document.getElementById('error').hidden ? null : document.getElementById('error-text').textContent")
  end

  lazy_setup(function()
    scripts = os.tmpname()
    os.remove(scripts)
    assert(os.execute("mkdir -p " .. helpers.sh_quote(scripts .. "/handlers") .. " " ..
      helpers.sh_quote(scripts .. "/reducers")))
    helpers.write_file(scripts .. "/reducers/summary.lua", SUMMARY)
    -- No engine dispatching: the test is the only worker (through
    -- /v1/claims), so which event is claimed when is the test's choice.
    srv = hh.serve({ scripts = scripts, no_engine = true })
    tls = hh.tls_files()
    d = wd.start({ trust_spki = tls.spki })
  end)

  lazy_teardown(function()
    if d then d:quit() end
    if srv then hh.stop(srv) end
    if scripts then os.execute("rm -rf " .. helpers.sh_quote(scripts)) end
    if tls then hh.rm(tls.dir) end
  end)

  it("serves the page and its files, with nothing from elsewhere", function()
    local status, body, headers = hh.request(srv, "GET", "/")
    assert.are.equal(200, status)
    assert.truthy((headers["content-type"] or ""):find("text/html", 1, true), headers["content-type"])
    assert.truthy(body:find('src="/app.js"', 1, true))
    assert.truthy(body:find('href="/style.css"', 1, true))
    local files = { ["/"] = body }
    for path, ctype in pairs({ ["/app.js"] = "javascript", ["/style.css"] = "text/css" }) do
      local st, text, h = hh.request(srv, "GET", path)
      assert.are.equal(200, st, path)
      assert.truthy((h["content-type"] or ""):find(ctype, 1, true), path .. ": " .. tostring(h["content-type"]))
      files[path] = text
    end
    for path, text in pairs(files) do
      assert.is_nil(text:find("https?://"), path .. " names an outside URL")
      assert.is_nil(text:find("@import", 1, true), path .. " imports a stylesheet")
      -- data reaches the page as text only (docs/inspector.md)
      assert.is_nil(text:find("innerHTML%s*%+?="), path .. " assigns innerHTML")
      assert.is_nil(text:find("outerHTML%s*=") or text:find("insertAdjacentHTML", 1, true)
        or text:find("document.write", 1, true), path .. " writes HTML")
    end
  end)

  it("asks for a token, shows a 401 for a wrong one, and lists sessions with the right one", function()
    -- order-1: #1 placed (claimed, completed by attempt 1), #2 shipped
    -- (its consequence: cause = {index 1, attempt 1}).
    append("order-1", { { type = "order.placed", id = "o-1", payload = { item = "book", n = 9007199254740993 } } })
    local e = claim("order-1", "worker-1")
    local status, body = hh.post(srv, ADMIN, path_of("order-1", "/events/1/complete"),
      { attempt = e.attempt, events = json.array({ { type = "order.shipped", payload = { carrier = "post" } } }) })
    assert.are.equal(200, status, json.encode(body))
    assert.are.equal("completed", body.outcome)
    d:check(function()
      d:navigate(srv.url .. "/")
      d:wait_until("the token form", function()
        return js("!document.getElementById('login').hidden")
      end)
      d:type("#token-input", "not-a-token")
      d:click("#token-submit")
      local text = d:wait_until("the 401 banner", function() return banner() end)
      assert.truthy(text:find("401", 1, true), text)
      assert.truthy(text:find("UNAUTHORIZED", 1, true), text)
      d:wait_until("the token form again", function()
        return js("!document.getElementById('login').hidden")
      end)
      d:type("#token-input", ADMIN)
      d:click("#token-submit")
      d:wait_until("order-1 in the sessions list", function()
        return js([[document.querySelector('#sessions li[data-test="session-row"][data-session="order-1"]') !== null]])
      end)
      assert.is_nil(banner())
      -- kept for the tab, never in localStorage
      assert.are.equal(ADMIN, js("sessionStorage.getItem('eventstore.inspector.token')"))
      assert.are.equal(0, js("localStorage.length"))
    end)
  end)

  it("opens signed in from a #token= fragment, which leaves the address bar at once", function()
    local function login_shown() return js("!document.getElementById('login').hidden") end
    local function clean_url()
      local url = d:url()
      assert.is_nil(url:find("token", 1, true), "the token stays in the address bar: " .. url)
    end
    d:check(function()
      d:click("#sign-out")
      d:wait_until("signed out", login_shown)
      assert.is_nil(js("sessionStorage.getItem('eventstore.inspector.token')"))
      -- a wrong one: the API's 401, and the form
      d:navigate(srv.url .. "/#token=not-a-token")
      local text = d:wait_until("the 401 banner", function() return banner() end)
      assert.truthy(text:find("401", 1, true), text)
      d:wait_until("the token form", login_shown)
      clean_url()
      -- the right one (percent-encoded, as a link would carry it), from a fresh page load
      d:navigate("about:blank")
      d:navigate(srv.url .. "/#token=" .. hh.enc(ADMIN))
      d:wait_until("order-1 in the sessions list", function()
        return js([[document.querySelector('#sessions li[data-test="session-row"][data-session="order-1"]') !== null]])
      end)
      assert.is_nil(banner())
      assert.is_false(login_shown())
      assert.is_false(js("document.getElementById('app').hidden"))
      clean_url()
      assert.are.equal(ADMIN, js("sessionStorage.getItem('eventstore.inspector.token')"))
      -- the signed-in view, as a headless run can now show it
      local shot = d:screenshot()
      local png = helpers.read_file(shot)
      os.remove(shot)
      assert.are.equal("\137PNG\r\n\26\n", png:sub(1, 8))
      local keep = (os.getenv("BUILD") or "build") .. "/inspector-signed-in.png"
      helpers.write_file(keep, png)
      print("# the signed-in inspector: " .. keep)
    end)
  end)

  it("opens a session: its events with exact payloads, and a cause link that jumps to its event", function()
    d:check(function()
      d:click('#sessions li[data-session="order-1"] a')
      d:wait_until("events #1 and #2", function()
        return d:text("#session-title") == "order-1" and row_text(1) and row_text(2)
      end)
      local first = row_text(1)
      -- int64 beyond 2^53 exactly as stored (JSON.parse would round it)
      assert.truthy(first:find("9007199254740993", 1, true), first)
      assert.truthy(first:find("order.placed", 1, true), first)
      assert.truthy(first:find("processed", 1, true), first)
      assert.truthy(first:find("attempts 1", 1, true), first)
      d:execute("window.__page = 'same'; return null;")
      local link = d:find(row_sel(2) .. ' a[data-test="cause-link"]')
      assert.are.equal("1", d:attr(link, "data-cause-index"))
      d:click(link)
      d:wait_until("event #1 highlighted", function()
        return js("document.querySelector(arguments[0]).classList.contains('highlight')", row_sel(1))
      end)
      -- scrolled into view, and no page load
      assert.is_true(js([[(function(r){var b=r.getBoundingClientRect();
        return b.bottom > 0 && b.top < window.innerHeight;})(document.querySelector(arguments[0]))]], row_sel(1)))
      assert.are.equal("same", js("window.__page"))
    end)
  end)

  it("shows an event appended through the API live, without a reload", function()
    d:check(function()
      d:wait_until("the live tail connected", function()
        return js("document.getElementById('live-status').textContent") == "live"
      end)
      assert.is_nil(row_text(3))
      append("order-1", { { type = "order.note", payload = { text = "hello live" }, settled = true } })
      local text = d:wait_until("event #3 live", function() return row_text(3) end)
      assert.truthy(text:find("hello live", 1, true), text)
      assert.truthy(text:find("order.note", 1, true), text)
      assert.are.equal("same", js("window.__page"))
      -- in index order
      assert.are.same({ "1", "2", "3" }, js([[Array.prototype.map.call(
        document.querySelectorAll('#events li[data-test="event-row"]'), function(e){return e.dataset.index;})]]))
    end)
  end)

  it("shows a reducer's state", function()
    d:check(function()
      d:type("#reducer-input", "summary")
      d:click("#state-button")
      local text = d:wait_until("the state", function()
        return js("document.getElementById('state-output').hidden ? null : document.getElementById('state-json').textContent")
      end)
      assert.truthy(text:find('"count": 3', 1, true), text)
      assert.truthy(text:find('"note": "hello live"', 1, true), text)
      assert.truthy(d:text("#state-meta"):find("index 3", 1, true))
      -- an unknown reducer: the API's 404, as text
      d:type("#reducer-input", "nope")
      d:click("#state-button")
      local err = d:wait_until("the 404 banner", function() return banner() end)
      assert.truthy(err:find("404", 1, true), err)
      d:click("#error-close")
    end)
  end)

  it("revives and settles a dead letter from the dead letters view", function()
    append("job-1", { { type = "job.run", payload = { n = 1 } } })
    dead_letter("job-1", "worker-2", "boom: disk on fire")
    assert.are.equal("dead", event_of("job-1", 1).status)
    d:check(function()
      d:click("#nav-dead")
      local row = '#dead-letters li[data-test="dead-row"][data-session="job-1"][data-index="1"]'
      local text = d:wait_until("job-1 #1 among the dead letters", function()
        return js("(function(e){return e ? e.textContent : null;})(document.querySelector(arguments[0]))", row)
      end)
      assert.truthy(text:find("boom: disk on fire", 1, true), text)
      d:click(row .. ' button[data-test="revive"]')
      d:wait_until("the list refreshed without it", function()
        return js("document.querySelector(arguments[0]) === null", row)
      end)
      local e = event_of("job-1", 1)
      assert.are.equal("pending", e.status)
      assert.are.equal(0, e.failures)
      assert.is_nil(banner())

      -- dead again; then settled with a reason
      dead_letter("job-1", "worker-3", "boom again")
      d:click("#dead-refresh")
      d:wait_until("job-1 #1 dead again", function()
        return js("document.querySelector(arguments[0]) !== null", row)
      end)
      d:type("#settle-reason", "handled by hand")
      d:click(row .. ' button[data-test="settle"]')
      d:wait_until("the list refreshed without it", function()
        return js("document.querySelector(arguments[0]) === null", row)
      end)
      assert.are.equal("processed", event_of("job-1", 1).status)
    end)
  end)

  it("cancels a pending timer from its session's view", function()
    append("reminder-1", { { type = "reminder.due", payload = { n = 1 }, delay_ms = 3600000 } })
    assert.are.equal("pending", event_of("reminder-1", 1).status)
    d:check(function()
      d:click("#nav-sessions")
      d:type("#session-open-input", "reminder-1")
      d:click('#session-open button[type="submit"]')
      d:wait_until("the timer with its Cancel button", function()
        return js("document.querySelector(arguments[0]) !== null", row_sel(1) .. ' button[data-test="cancel"]')
      end)
      d:click(row_sel(1) .. ' button[data-test="cancel"]')
      local text = d:wait_until("the row refreshed as cancelled", function()
        local t = row_text(1)
        return t and t:find("cancelled: cancelled from the inspector", 1, true) and t
      end)
      assert.truthy(text:find("processed", 1, true), text)
      assert.is_true(js("document.querySelector(arguments[0]) === null", row_sel(1) .. ' button[data-test="cancel"]'))
      assert.is_nil(banner())
    end)
    local e = event_of("reminder-1", 1)
    assert.are.equal("processed", e.status)
    assert.are.equal("cancelled from the inspector", e.cancelled)
  end)

  it("lists refs and shows one", function()
    local status = hh.put(srv, ADMIN, "/v1/refs/" .. hh.enc("release/v1"), { session = "order-1" })
    assert.are.equal(200, status)
    d:check(function()
      d:click("#nav-refs")
      local sel = '#refs li[data-test="ref-row"][data-ref="release/v1"] a'
      d:wait_until("ref release/v1", function() return js("document.querySelector(arguments[0]) !== null", sel) end)
      d:click(sel)
      local text = d:wait_until("the ref's detail", function()
        local t = d:text("#ref-detail")
        return t:find("order-1", 1, true) and t
      end)
      assert.truthy(text:find("#3", 1, true), text)
      -- its session link opens the session
      d:click('#ref-detail a[data-test="session-link"]')
      d:wait_until("order-1 open", function() return d:text("#session-title") == "order-1" and row_text(3) end)
    end)
  end)

  it("shows lineage, and origin links of a fork's copies lead to the originals", function()
    -- fork is not an HTTP call: the CLI forks in the same database
    local cmd = ("%s fork order-1 2 %s --db %s >/dev/null"):format(helpers.sh_quote(hh.BIN),
      helpers.sh_quote("order-1/alt"), helpers.sh_quote(srv.db))
    assert.is_true(os.execute(cmd) == true, cmd)
    d:check(function()
      d:click("#nav-sessions")
      -- a name with '/' is one path segment
      d:type("#session-open-input", "order-1/alt")
      d:click('#session-open button[type="submit"]')
      d:wait_until("the fork's events", function()
        return d:text("#session-title") == "order-1/alt" and row_text(1) and row_text(2)
      end)
      local parent = d:wait_until("its parent", function()
        local e = d:find_all('#lineage [data-test="lineage-parent"]')
        return e[1] and d:text(e[1])
      end)
      assert.truthy(parent:find("order-1", 1, true) and parent:find("#2", 1, true), parent)
      assert.is_nil(row_text(3))
      local link = d:find(row_sel(2) .. ' a[data-test="origin-link"]')
      assert.are.equal("order-1", d:attr(link, "data-origin-session"))
      d:click(link)
      d:wait_until("order-1 #2 highlighted", function()
        return d:text("#session-title") == "order-1" and
          js("(function(e){return e !== null && e.classList.contains('highlight');})(document.querySelector(arguments[0]))",
            row_sel(2))
      end)
      local kids = d:wait_until("order-1's forks", function()
        local e = d:find_all('#lineage [data-test="lineage-children"]')
        return e[1] and d:text(e[1])
      end)
      assert.truthy(kids:find("order-1/alt", 1, true), kids)
    end)
  end)

  it("shows a presence namespace, and its changes live", function()
    local function put(who, values)
      local status, body = hh.put(srv, ADMIN, "/v1/presence/lobby/" .. hh.enc(who), { values = values, ttl_ms = 600000 })
      assert.are.equal(200, status, json.encode(body))
    end
    put("alice", { status = "online" })
    d:check(function()
      d:click("#nav-presence")
      d:type("#presence-ns", "lobby")
      d:click("#presence-button")
      local prow = 'tr[data-test="presence-row"][data-participant="%s"]'
      d:wait_until("alice present", function() return js("document.querySelector(arguments[0]) !== null", prow:format("alice")) end)
      d:wait_until("the presence stream connected", function()
        return js("document.getElementById('presence-live').textContent") == "live"
      end)
      put("bob", { status = "away" })
      local text = d:wait_until("bob present, live", function()
        return js("(function(e){return e ? e.textContent : null;})(document.querySelector(arguments[0]))", prow:format("bob"))
      end)
      assert.truthy(text:find("away", 1, true), text)
    end)
  end)

  it("follows every session in the live feed, from now on", function()
    d:check(function()
      d:click("#nav-feed")
      d:wait_until("the feed connected", function() return d:text("#feed-status") == "live" end)
      -- it starts after the newest event: nothing older shows
      local _, all = hh.get(srv, ADMIN, "/v1/events?limit=1000")
      local last = all.events[#all.events].position
      assert.are.equal("from position " .. last, d:text("#feed-from"))
      assert.are.equal(0, #d:find_all("#feed li"))
      append("feed-a", { { type = "a.one", settled = true } })
      append("feed-b", { { type = "b.one", settled = true } })
      local rows = d:wait_until("both new events", function()
        local r = d:find_all('#feed li[data-test="feed-row"]')
        return #r == 2 and r
      end)
      assert.are.equal("feed-a", d:attr(rows[1], "data-session"))
      assert.are.equal(tostring(last + 1), d:attr(rows[1], "data-position"))
      assert.are.equal("feed-b", d:attr(rows[2], "data-session"))
    end)
  end)

  it("shows markup in names, payloads and errors as text, never running it", function()
    append(XSS_NAME, { { type = "<b>bold</b>", payload = { html = XSS_PAYLOAD, s = XSS_SCRIPT } } })
    d:check(function()
      d:click("#nav-sessions")
      d:type("#session-prefix", "<img")
      d:click("#session-search-button")
      local row = d:wait_until("the session with markup in its name", function()
        local rows = d:find_all('#sessions li[data-test="session-row"]')
        return #rows == 1 and rows[1]
      end)
      assert.are.equal(XSS_NAME, d:attr(row, "data-session"))
      d:click(d:find("a", row))
      -- the click opens the session asynchronously: until the title changes,
      -- the rows on the page are still the previously open session's
      local text = d:wait_until("its event", function()
        return d:text("#session-title") == XSS_NAME and row_text(1)
      end)
      assert.truthy(text:find(XSS_PAYLOAD, 1, true), text)
      assert.truthy(text:find(XSS_SCRIPT, 1, true), text)
      assert.truthy(text:find("<b>bold</b>", 1, true), text)
      -- an error message that quotes the name (a reducer named with markup)
      d:type("#reducer-input", XSS_PAYLOAD)
      d:click("#state-button")
      d:wait_until("the error banner", function() return banner() end)
      assert.are.equal(0, js("document.querySelectorAll('main img, main b, main script, #error img').length"))
      assert.is_nil(js("window.__xss"))
    end)
  end)

  it("shows projections: status and lag, keys with paging, a key's state", function()
    -- a second server on the same database, with an engine to fold
    -- scripts/projections (the first runs none)
    local pscripts = os.tmpname()
    os.remove(pscripts)
    assert(os.execute("mkdir -p " .. helpers.sh_quote(pscripts .. "/projections")))
    helpers.write_file(pscripts .. "/projections/tally.lua", [[
return { key = function(e) return e.session end, sessions = "tally-",
         ["tally"] = function(s, e) s.n = (s.n or 0) + 1; s.last = e.payload.v end }
]])
    helpers.write_file(pscripts .. "/projections/stuck.lua", [[
return { ["tally"] = function(s, e) if e.payload.v == 3 then error("v 3 refused") end end }
]])
    local psrv = hh.serve({ db = srv.db, scripts = pscripts })
    local ok, err = pcall(d.check, d, function()
      local batches = {}
      for i = 1, 105 do
        batches[i] = { session = ("tally-%03d"):format(i), events = json.array({ { type = "tally", payload = { v = i }, settled = true } }) }
      end
      local st, b = hh.post(psrv, ADMIN, "/v1/events", { batches = json.array(batches) })
      assert.are.equal(200, st, json.encode(b))
      helpers.wait_until(function()
        local s2, list = hh.get(psrv, ADMIN, "/v1/projections")
        if s2 ~= 200 then return false end
        for _, r in ipairs(list.projections) do
          if r.name == "tally" then return r.lag == 0 and r.generation > 0 end
        end
        return false
      end, "tally to catch up")
      d:navigate(psrv.url .. "/#token=" .. hh.enc(ADMIN))
      d:click("#nav-projections")
      local row = '#projections tr[data-test="projection-row"][data-projection="tally"]'
      local status = d:wait_until("tally's row", function()
        return js("(function(e){return e ? e.querySelector('[data-test=status]').textContent : null;})(document.querySelector(arguments[0]))", row)
      end)
      assert.are.equal("running", status)
      assert.are.equal("0", d:text(row .. ' [data-test="lag"]'))
      -- the failed one names the event it stopped at
      local stuck = '#projections tr[data-projection="stuck"]'
      local stuck_text = d:wait_until("stuck's row", function()
        return js("(function(e){return e ? e.textContent : null;})(document.querySelector(arguments[0]))", stuck)
      end)
      assert.truthy(stuck_text:find("failed", 1, true), stuck_text)
      assert.truthy(stuck_text:find("v 3 refused", 1, true), stuck_text)
      -- keys, a page of 100 then the rest
      d:click(row .. " a")
      local keys = '#projection-keys li[data-test="key-row"]'
      d:wait_until("a page of keys", function() return js("document.querySelectorAll(arguments[0]).length", keys) == 100 end)
      d:click("#projection-keys-more")
      d:wait_until("all 105 keys", function() return js("document.querySelectorAll(arguments[0]).length", keys) == 105 end)
      assert.is_true(js("document.getElementById('projection-keys-more').hidden"))
      -- a prefix, and a key's state
      d:type("#projection-prefix", "tally-10")
      d:click("#projection-keys-button")
      d:wait_until("the keys tally-100..105", function() return js("document.querySelectorAll(arguments[0]).length", keys) == 6 end)
      d:click('#projection-keys li[data-key="tally-104"] button')
      local text = d:wait_until("tally-104's state", function()
        return js("document.getElementById('projection-state').hidden ? null : document.getElementById('projection-state-json').textContent")
      end)
      assert.truthy(text:find('"last": 104', 1, true), text)
      assert.truthy(text:find('"n": 1', 1, true), text)
      assert.truthy(d:text("#projection-state-meta"):find("generation 1", 1, true))
      assert.is_nil(banner())
    end)
    hh.stop(psrv)
    os.execute("rm -rf " .. helpers.sh_quote(pscripts))
    if not ok then error(err, 0) end
  end)

  it("works over HTTPS: signs in, opens a session, shows an event live, and cannot be framed", function()
    -- a second server on the same database, serving HTTPS only
    local tsrv = hh.serve({ db = srv.db, scripts = scripts, no_engine = true,
      args = { "--tls-cert", tls.cert, "--tls-key", tls.key } })
    local ok, err = pcall(d.check, d, function()
      assert.are.equal("https", tsrv.scheme)
      d:navigate(tsrv.url .. "/#token=" .. hh.enc(ADMIN))
      d:wait_until("order-1 in the sessions list over HTTPS", function()
        return js([[document.querySelector('#sessions li[data-test="session-row"][data-session="order-1"]') !== null]])
      end)
      assert.is_nil(banner())
      assert.are.equal("https:", js("location.protocol"))
      d:click('#sessions li[data-session="order-1"] a')
      d:wait_until("events #1 to #3", function() return row_text(1) and row_text(3) end)
      d:wait_until("the live tail connected", function()
        return js("document.getElementById('live-status').textContent") == "live"
      end)
      -- an append over HTTPS (curl trusting the test CA) reaches the page
      -- through its live tail on the same server
      local after = js([[document.querySelectorAll('#events li[data-test="event-row"]').length]])
      local rc, status, _, body, cerr = hh.curl({ "--cacert", tls.ca, "-X", "POST",
        "-H", "Authorization: Bearer " .. ADMIN, "-H", "Content-Type: application/json",
        "--data-binary", json.encode({ events = json.array({ { type = "order.note",
          payload = { text = "hello over tls" }, settled = true } }) }),
        tsrv.url .. path_of("order-1", "/events") })
      assert.are.equal(0, rc, cerr)
      assert.are.equal(200, status, body)
      local text = d:wait_until("the new event live", function() return row_text(after + 1) end)
      assert.truthy(text:find("hello over tls", 1, true), text)
      -- frame-ancestors 'none' (a header: a meta tag cannot say it): even
      -- the page's own origin gets no inspector in a frame, only the
      -- browser's error page, which the page cannot read
      d:execute([[var f = document.createElement('iframe'); f.id = '__frame'; f.src = '/';
        document.body.appendChild(f); return null;]])
      d:wait_until("the frame refused or loaded", function()
        return js([[(function(f){ var doc = f.contentDocument;
          return doc === null || (doc.readyState === 'complete' && doc.URL !== 'about:blank'); })
          (document.getElementById('__frame'))]])
      end)
      assert.is_nil(js([[(function(f){ return f.contentDocument && f.contentDocument.title; })
        (document.getElementById('__frame'))]]))
    end)
    hh.stop_clean(tsrv)
    if not ok then error(err, 0) end
  end)

  it("follows a shards: store's feed from its read_all cursor", function()
    local sdir = os.tmpname()
    os.remove(sdir)
    assert(os.execute("mkdir -p " .. helpers.sh_quote(sdir)))
    local catalog = "sqlite:" .. sdir .. "/catalog.db"
    eventstore.open("shards:", { catalog = catalog,
      plan = { version = 1, shards = { a = "sqlite:" .. sdir .. "/a.db", b = "sqlite:" .. sdir .. "/b.db" } } }):close()
    local ssrv = hh.serve({ db = "shards:" .. catalog, no_engine = true })
    local ok, err = pcall(d.check, d, function()
      for i = 1, 3 do
        assert.are.equal(200, (hh.post(ssrv, ADMIN, path_of("old-" .. i, "/events"),
          { events = json.array({ { type = "old", settled = true } }) })))
      end
      d:navigate(ssrv.url .. "/#token=" .. hh.enc(ADMIN))
      d:wait_until("signed in", function()
        return js([[document.querySelector('#sessions li[data-test="session-row"]') !== null]])
      end)
      d:click("#nav-feed")
      d:wait_until("the feed connected", function() return d:text("#feed-status") == "live" end)
      local from = d:text("#feed-from")
      assert.truthy(from:find("^from cursor c1"), from)
      assert.are.equal(0, #d:find_all("#feed li"))
      assert.are.equal(200, (hh.post(ssrv, ADMIN, path_of("new-1", "/events"),
        { events = json.array({ { type = "new", settled = true } }) })))
      local rows = d:wait_until("the new event", function()
        local r = d:find_all('#feed li[data-test="feed-row"]')
        return #r == 1 and r
      end)
      assert.are.equal("new-1", d:attr(rows[1], "data-session"))
      assert.is_nil(banner())
    end)
    hh.stop_clean(ssrv)
    hh.rm(sdir)
    if not ok then error(err, 0) end
  end)

  it("leaves a server that stops cleanly with the page's live streams still open", function()
    -- the page holds streams open (the session's tail, the feed): SIGTERM
    -- must still end the server with status 0 (under ASan: no leak)
    assert.are.equal(0, hh.stop(srv))
  end)
end)
