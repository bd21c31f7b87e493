-- `eventstore replay` (docs/cli.md, docs/replay.md, docs/contract.md §9):
-- exit 0 identical / 1 diverged / 2 error, text and NDJSON reports,
-- --out, and a source store left byte for byte as it was. Runs on each
-- durable backend of ES_TEST_URLS (a memory: store cannot be reopened by
-- another process).
local eventstore = require("eventstore")
local helpers = require("helpers")
local eh = require("engine_helpers")
local ch = require("cli_helpers")
local rh = require("replay_helpers")

local json = eventstore.json

-- A changed pricing handler: orders of more than two items 10% off.
local function changed_scripts()
  return rh.scripts({ handlers = { ["order.placed"] =
    (rh.APP.handlers["order.placed"]:gsub("p.qty %* 10", "p.qty * (p.qty > 2 and 9 or 10)")) } })
end

local read_all = helpers.read_file

for _, url in ipairs(helpers.urls()) do
  if url:sub(1, 7) ~= "memory:" then
    describe(url, function()
      after_each(eh.cleanup)

      -- History made live, its store closed (so nothing of this process is
      -- left to flush into the file), and a working directory.
      local function setup()
        local store, live, concrete = rh.history(url)
        local rows = #store:read_all()
        store:close()
        return { db = concrete, live = live, work = ch.mkdtemp(), rows = rows }
      end

      it("exits 0 and prints the summary when the same scripts replay identical", function()
        local t = setup()
        local r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", t.live })
        local out = ch.ok(r)
        assert.truthy(out:find("^replayed 3, identical 3, diverged 0, failed 0 %("), out)
      end)

      it("exits 1 with the first divergence and the state diff, as text and as NDJSON", function()
        local t = setup()
        local new = changed_scripts()
        local r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", new })
        assert.equal(1, r.code, r.err)
        assert.truthy(r.out:find("order-2  diverged  first divergence at #2\n", 1, true), r.out)
        assert.truthy(r.out:find("    $.payload.total: 30 -> 27\n", 1, true), r.out)
        assert.truthy(r.out:find("  state order $.total: 40 -> 37\n", 1, true), r.out)
        assert.is_nil(r.out:find("order-1", 1, true), "identical sessions are not listed: " .. r.out)

        r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", new, "--format", "ndjson" })
        assert.equal(1, r.code, r.err)
        assert.equal("", r.err)
        local lines = ch.ndjson(r.out)
        assert.equal(4, #lines)
        assert.same({ summary = { replayed = 3, identical = 2, diverged = 1, failed = 0, rate = lines[4].summary.rate } },
          lines[4])
        local by = {}
        for i = 1, 3 do by[lines[i].session] = lines[i] end
        assert.equal("identical", by["order-1"].status)
        local d = by["order-2"]
        assert.equal("diverged", d.status)
        assert.equal(2, d.divergence.index)
        assert.equal(30, d.divergence.baseline.payload.total)
        assert.equal(27, d.divergence.replayed.payload.total)
        assert.same({ { path = "$.total", baseline = 40, replayed = 37 } }, d.states.order)
        assert.same({}, by["order-3"].states)
      end)

      it("writes the report to --out, nothing to stdout", function()
        local t = setup()
        local file = t.work .. "/report.ndjson"
        local r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", t.live, "--format", "ndjson", "--out", file })
        assert.equal("", ch.ok(r))
        local lines = ch.ndjson(read_all(file))
        assert.equal(3, lines[#lines].summary.identical)
      end)

      -- A report that cannot be written is an error (exit 2): 1 means
      -- only "not identical", and 0 must not hide a lost report.
      it("exits 2 when the report cannot be written, to stdout or to --out", function()
        local t = setup()
        for _, format in ipairs({ "text", "ndjson", "html" }) do
          local _, _, code = os.execute(("cd %s && %s replay --db %s --scripts %s --format %s >/dev/full 2>.err")
            :format(helpers.sh_quote(t.work), helpers.sh_quote(ch.BIN), helpers.sh_quote(t.db),
              helpers.sh_quote(t.live), format))
          assert.equal(2, code, format)
          assert.truthy(read_all(t.work .. "/.err"):match("^eventstore: replay: cannot write the report: "), format)
        end
        local r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", t.live, "--out", "/dev/full" })
        assert.equal(2, r.code, r.err)
        assert.truthy(r.err:match("^eventstore: replay: cannot write"), r.err)
      end)

      it("writes one self-contained HTML page with the summary and the divergence", function()
        local t = setup()
        local file = t.work .. "/report.html"
        local r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", changed_scripts(), "--format", "html",
          "--out", file })
        assert.equal(1, r.code, r.err)
        assert.equal("", r.out)
        local page = read_all(file)
        assert.truthy(page:find("^<!DOCTYPE html>"))
        assert.truthy(page:find("replayed 3</strong>", 1, true), page)
        assert.truthy(page:find("first divergence at #2", 1, true), page)
        assert.truthy(page:find("order-2", 1, true), page)
        -- nothing fetched from elsewhere
        assert.is_nil(page:find("https?://"), "the page names a URL")
        assert.is_nil(page:find("<script", 1, true))
        assert.is_nil(page:find("<link", 1, true))
        assert.is_nil(page:find("<img", 1, true))
        -- A browser shows the summary and the divergence side by side.
        local wd = require("webdriver")
        if wd.missing() then
          pending("chromium: " .. wd.missing())
          return
        end
        local d = wd.start()
        finally(function() d:quit() end)
        d:navigate("file://" .. file)
        local summary = d:text(d:find("#summary"))
        assert.truthy(summary:find("replayed 3: identical 2, diverged 1, failed 0", 1, true), summary)
        local sides = d:find_all(".side > div")
        assert.equal(2, #sides)
        assert.truthy(d:text(sides[1]):find('"total":30', 1, true), d:text(sides[1]))
        assert.truthy(d:text(sides[2]):find('"total":27', 1, true), d:text(sides[2]))
      end)

      it("shows progress on a terminal's stderr, nothing on a pipe", function()
        local t = setup()
        -- On a pipe (ch.run): stderr stays empty.
        local r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", t.live, "--format", "ndjson",
          "--out", t.work .. "/r.ndjson" })
        assert.equal("", ch.ok(r))
        -- On a terminal: script(1) gives the binary a pseudo-terminal.
        local cmd = table.concat({ helpers.sh_quote(ch.BIN), "replay", "--db", helpers.sh_quote(t.db), "--scripts",
          helpers.sh_quote(t.live), "--format", "ndjson", "--out", helpers.sh_quote(t.work .. "/r.ndjson") }, " ")
        local p = assert(io.popen("cd " .. helpers.sh_quote(t.work) .. " && timeout 60 script -qec "
          .. helpers.sh_quote(cmd) .. " /dev/null"))
        local shown = p:read("a")
        p:close()
        assert.truthy(shown:find("replay: 1 of 3 sessions", 1, true), shown)
        assert.truthy(shown:find("replay: 3 of 3 sessions, [%d.]+/s, 0 s left"), shown)
      end)

      it("exits 2 on an error, before replaying anything", function()
        local t = setup()
        local bad = rh.scripts({ handlers = { ["order.placed"] = "return function(" } })
        local r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", bad })
        assert.equal(2, r.code)
        assert.truthy(r.err:find("order.placed.lua", 1, true), r.err)
        r = ch.run(t.work, { "replay", "--db", t.db })
        assert.equal(2, r.code)
        assert.truthy(r.err:find("--scripts NEW is required", 1, true), r.err)
        r = ch.run(t.work, { "replay", "--db", t.db, "--scripts", t.live, "--format", "xml" })
        assert.equal(2, r.code)
      end)

      it("leaves the source store unchanged", function()
        local t = setup()
        local path = t.db:match("^sqlite:([^?]*)")
        local before = path and read_all(path)
        local before_wal = path and read_all(path .. "-wal")
        local new = changed_scripts()
        ch.run(t.work, { "replay", "--db", t.db, "--scripts", new, "--baseline", t.live })
        if path then
          assert.is_true(before == read_all(path), "the SQLite file changed")
          -- A read-only open may leave an empty -wal beside the file
          -- (SQLite's own, holding nothing); never one with frames in it.
          local wal = read_all(path .. "-wal")
          assert.is_true(wal == before_wal or wal == "", "the -wal file holds writes")
        end
        local store = helpers.open_same(t.db)
        assert.equal(t.rows, #store:read_all())
      end)
    end)
  end
end
