-- Listings cut at max_response_bytes (docs/http-api.md "Pages cut at
-- max_response_bytes", docs/limits.md "Answers"): the answer a slow client holds open is
-- bounded by the cap, not by `limit` times the events' size, and a client
-- that pages on with the route's cursor gets every item exactly once.
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")

local null = eventstore.json.null

local MIB = 1024 * 1024

local rss_kib = hh.rss_kib

-- Runs fn(srv) on a fresh server on one backend template (opts as
-- hh.serve_on).
local function with_server(template, opts, fn)
  local o = { db = hh.backend_db(template) }
  for k, v in pairs(opts) do o[k] = v end
  hh.with_server(o, fn)
end

-- An event whose payload's canonical text is about `bytes` long.
local function blob(bytes, tag)
  return { type = "blob", payload = { tag = tag, data = ("x"):rep(bytes) } }
end

-- Appends events (a list) in batches whose bodies stay under max_body.
local function append_all(srv, session, events, per_batch)
  for i = 1, #events, per_batch do
    local batch = {}
    for k = i, math.min(#events, i + per_batch - 1) do batch[#batch + 1] = events[k] end
    hh.append_ok(srv, "admin-token", session, batch)
  end
end

-- GET path; returns the decoded answer and its raw text (asserting 200).
local function get_ok(srv, path)
  local st, body, _, text = hh.get(srv, "admin-token", path)
  hh.check_ok(st, body, path)
  return body, text
end

-- Asserts what every cut page must be: within the cap unless it holds one
-- item only; marked capped when it ended before limit with more to come.
local function check_page(body, text, items, cap, what)
  assert(#items >= 1 or not body.capped, what .. ": a capped page with nothing in it")
  assert(#text <= cap or #items == 1,
    ("%s: %d bytes in %d items, over the cap of %d"):format(what, #text, #items, cap))
end

for _, template in ipairs(helpers.urls()) do
  if template:match("^memory:") or template:match("^sqlite:") then
    describe("eventstore serve listings capped at max_response_bytes on " .. template, function()
      it("keeps slow readers of pages of large events from holding whole pages in memory", function()
        with_server(template, { no_engine = true }, function(srv)
          -- 100 events of about 1 MB: a page of limit=100 is 100 MB of JSON.
          local events = {}
          for i = 1, 100 do events[i] = blob(1000 * 1000, i) end
          append_all(srv, "big", events, 8)
          local before = rss_kib(srv)
          -- Six readers ask for the whole page at once, read its first
          -- bytes and then stall: whatever the server built for them it
          -- holds until they read on.
          local readers = {}
          for i = 1, 6 do
            local c = hh.connect(srv, 60)
            local path = i % 2 == 0 and "/v1/events?limit=100" or hh.spath("big", "events") .. "?limit=100"
            assert(c:send(("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n\r\n"):format(path)))
            readers[i] = c
          end
          for i, c in ipairs(readers) do
            local status = hh.read_head(c)
            assert.equal(200, status, "reader " .. i)
            assert(c:receive(16))
          end
          local grown = rss_kib(srv) - before
          for _, c in ipairs(readers) do c:close() end
          -- Whole pages would be 6 x 100 MB; capped pages are 6 x (8 MiB
          -- + one event), plus what a page reads from the store at once.
          assert.is_true(grown < 256 * 1024, ("the server grew by %d KiB"):format(grown))
          -- The readers were served capped pages: a client reading on
          -- gets one too.
          local body, text = get_ok(srv, hh.spath("big", "events") .. "?limit=100")
          assert.is_true(body.capped)
          assert.is_true(#body.events >= 1 and #body.events < 100)
          check_page(body, text, body.events, 8 * MIB, "read")
        end)
      end)

      it("pages on with each route's cursor and gets every item exactly once with a small cap", function()
        local cap = 300000
        with_server(template, { no_engine = true, args = { "--max-response-bytes", tostring(cap) } }, function(srv)
          -- Sizes that fill a page now and then, and one event over the cap
          -- on its own (a page then holds it alone rather than stall).
          local sizes = { 1000, 120000, 50, 90000, 600000, 10, 70000, 70000, 70000, 70000, 200, 150000 }
          local events = {}
          for i = 1, 36 do events[i] = blob(sizes[(i - 1) % #sizes + 1], i) end
          append_all(srv, "a", events, 6)
          append_all(srv, "b", { blob(400000, "b1"), blob(5, "b2") }, 2)
          local cut = 0

          -- read: after = the last index, through pinned by the first page
          local seen, after, through = {}, 0, nil
          repeat
            local q = "?limit=1000&after=" .. after .. (through and ("&through=" .. through) or "")
            local body, text = get_ok(srv, hh.spath("a", "events") .. q)
            check_page(body, text, body.events, cap, "read")
            through = through or body.through
            assert.equal(through, body.through)
            if body.capped then cut = cut + 1 end
            for _, e in ipairs(body.events) do
              assert.equal(after + 1, e.index)
              seen[#seen + 1] = e.payload.tag
              after = e.index
            end
          until not body.capped
          assert.equal(36, #seen)
          for i = 1, 36 do assert.equal(i, seen[i]) end
          assert.is_true(cut >= 3, "pages cut: " .. cut)

          -- read_all: after = the last position
          local tags, pos, pages = {}, 0, 0
          repeat
            local body, text = get_ok(srv, "/v1/events?limit=1000&after=" .. pos)
            check_page(body, text, body.events, cap, "read_all")
            pages = pages + 1
            for _, e in ipairs(body.events) do
              assert.is_true(e.position > pos)
              tags[#tags + 1] = e.session .. ":" .. tostring(e.payload.tag)
              pos = e.position
            end
          until not body.capped
          assert.equal(38, #tags)
          assert.is_true(pages >= 4, "read_all pages: " .. pages)

          -- an uncut page is written as before: no capped field
          local body = get_ok(srv, hh.spath("a", "events") .. "?limit=2")
          assert.equal(2, #body.events)
          assert.is_nil(body.capped)

          -- claims: a claim stops where the next event could pass the cap,
          -- and what it did not take stays ready for the next one
          local claimed = {}
          for _ = 1, 60 do
            local st, c, _, text = hh.post(srv, "admin-token", "/v1/claims",
              { holder = "w", ttl_ms = 600000, limit = 1000 })
            hh.check_ok(st, c, "claim")
            if #c.events == 0 then break end
            assert.is_true(#text <= cap + 1100000, "a claim answer of " .. #text .. " bytes")
            for _, e in ipairs(c.events) do
              local k = e.session .. ":" .. e.index
              assert.is_nil(claimed[k], "claimed twice: " .. k)
              claimed[k] = e
            end
          end
          local n = 0
          for _, e in pairs(claimed) do
            n = n + 1
            -- dead-letter each (max_failures 1), for the dead letters' pages
            local st, f = hh.post(srv, "admin-token", hh.spath(e.session, "events", e.index, "fail"),
              { attempt = e.attempt, error = "boom", max_failures = 1 })
            hh.check_ok(st, f, "fail")
            assert.equal("dead_lettered", f.outcome)
          end
          assert.equal(38, n)

          -- dead letters: after = the last position
          local dead, dpos = 0, 0
          repeat
            local page, text = get_ok(srv, "/v1/dead-letters?limit=1000&after=" .. dpos)
            check_page(page, text, page.events, cap, "dead letters")
            for _, e in ipairs(page.events) do
              assert.is_true(e.position > dpos)
              dead, dpos = dead + 1, e.position
            end
          until not page.capped
          assert.equal(38, dead)
        end)
      end)

      it("pages session and ref listings on with their cursor, one row a page at the smallest cap", function()
        with_server(template, { no_engine = true, args = { "--max-response-bytes", "1" } }, function(srv)
          local names = { "s1", "s2", "s3", "s4", "s5" }
          for _, s in ipairs(names) do
            hh.append_ok(srv, "admin-token", s, { { type = "t" } })
            hh.check_ok(hh.put(srv, "admin-token", "/v1/refs/r-" .. s, { session = s }))
          end
          for _, route in ipairs({ { "/v1/sessions", "sessions", "session" }, { "/v1/refs", "refs", "name" } }) do
            local got, after = {}, nil
            repeat
              local body = get_ok(srv, route[1] .. "?limit=1000" .. (after and ("&after=" .. after) or ""))
              local rows = body[route[2]]
              -- one row a page: any page is over a cap of one byte; a cut
              -- one goes on after its row
              assert.is_true(#rows <= 1)
              if #rows == 1 then got[#got + 1] = rows[1][route[3]] end
              if body.capped then assert.equal(rows[1][route[3]], body.cursor) end
              after = body.cursor
            until after == null
            assert.equal(5, #got, route[1])
            for i, s in ipairs(names) do
              assert.equal(route[2] == "refs" and ("r-" .. s) or s, got[i])
            end
          end
        end)
      end)
    end)
  end
end
