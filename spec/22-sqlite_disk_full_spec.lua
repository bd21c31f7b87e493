-- A full disk under a running server (issue 29 item 3, docs/http.md
-- "Errors", docs/engine.md "When the store fails").
--
-- `eventstore serve` (with its engine) on a sqlite: file in a small
-- tmpfs the spec mounts. Jobs due a few seconds later are appended, then
-- the filesystem is filled to the last byte:
-- - appends get 503 with code STORAGE, and write nothing;
-- - reads (events, head, /healthz) keep working;
-- - the engine, meeting the full disk when the jobs fall due, logs the
--   outage once and backs off (it does not spin nor die);
-- - once space is freed, the same batches sent again are stored once,
--   every job is processed with one result, and the engine says the
--   store answers again.
-- Mounting needs root (CI runs as root); without it the test is skipped
-- ("root: ..."), counted as skipped.
local helpers = require("helpers")
local hh = require("http_helpers")
local ph = require("proc_helpers")

local q = helpers.sh_quote
local TOKEN = "admin-token"

local function is_root()
  local p = io.popen("id -u")
  local uid = p:read("l")
  p:close()
  return uid == "0"
end

if not is_root() then
  describe("sqlite: a full disk under serve", function()
    pending("root: mounting a small tmpfs needs root (CI runs as root)")
  end)
  return
end

local HANDLER = [[
return function(event, ctx)
  return { { type = "job.done", payload = { of = event.index } } }
end
]]

describe("sqlite: a full disk under serve", function()
  local mnt, srv, scripts

  before_each(function()
    mnt = os.tmpname()
    os.remove(mnt)
    assert(os.execute("mkdir -p " .. q(mnt)))
    assert(os.execute(("mount -t tmpfs -o size=4m tmpfs %s"):format(q(mnt))), "cannot mount a tmpfs")
  end)

  after_each(function()
    if srv then hh.stop(srv) end
    srv = nil
    os.execute(("umount %s 2>/dev/null; rmdir %s 2>/dev/null"):format(q(mnt), q(mnt)))
    hh.rm(scripts)
    helpers.cleanup()
  end)

  it("appends get 503 STORAGE, reads go on, the engine backs off; after space is freed nothing is lost or doubled", function()
    scripts = hh.scripts({ ["handlers/job.lua"] = HANDLER })
    srv = hh.serve({ db = "sqlite:" .. mnt .. "/es.db", scripts = scripts })
    local function append(session, events)
      return hh.post(srv, TOKEN, hh.spath(session, "events"), { events = events })
    end
    local function batch(tag, n, extra)
      local events = {}
      for i = 1, n do
        events[i] = { type = "note", id = ("%s-%d"):format(tag, i), payload = { i = i, pad = ("x"):rep(200) } }
        for k, v in pairs(extra or {}) do events[i][k] = v end
      end
      return events
    end
    hh.append_ok(srv, TOKEN, "before", batch("a", 5))
    -- jobs the engine may take only after the disk is full
    local due = math.floor(helpers.wall() * 1000) + 4000
    local jobs = {}
    for i = 1, 10 do jobs[i] = { type = "job", id = "job-" .. i, payload = { i = i }, not_before = due } end
    hh.append_ok(srv, TOKEN, "jobs", jobs)

    -- Fill the filesystem to its last byte.
    os.execute(("dd if=/dev/zero of=%s bs=16k 2>/dev/null"):format(q(mnt .. "/filler")))
    os.execute(("dd if=/dev/zero of=%s bs=512 2>/dev/null"):format(q(mnt .. "/filler2")))
    local filled_at = helpers.wall() * 1000
    assert.is_true(filled_at < due, "filling the disk took until the jobs fell due: the test proves nothing")

    -- Appends: 503 STORAGE (the first few may still fit in the WAL's
    -- pages; a bounded number of tries).
    local refused, stored_before = nil, 0
    for k = 1, 200 do
      local st, body = append("full", batch("f" .. k, 3))
      if st == 503 then
        hh.check_error(503, "STORAGE", st, body, "append on a full disk")
        refused = k
        break
      end
      hh.check_ok(st, body, "append " .. k)
      stored_before = k
    end
    assert.is_not_nil(refused, "200 appends fitted on a full 4 MB disk")
    -- sent again, still refused; nothing of it stored
    local st, body = append("full", batch("f" .. refused, 3))
    hh.check_error(503, "STORAGE", st, body, "append again on a full disk")

    -- Reads go on.
    local events = hh.check_ok(hh.get(srv, TOKEN, hh.spath("before", "events")))
    assert.equal(5, #events.events)
    local full = hh.check_ok(hh.get(srv, TOKEN, hh.spath("full", "events")))
    assert.equal(stored_before * 3, #full.events)
    assert.equal(200, (hh.get(srv, nil, "/healthz")))

    -- The engine meets the full disk when the jobs fall due: one log line,
    -- then backoff.
    helpers.wait_until(function()
      assert.is_nil(ph.status(srv.proc), "serve died:\n" .. helpers.read_file(srv.log))
      return (helpers.read_file(srv.log) or ""):find("retrying with backoff until the store answers", 1, true)
    end, "the engine to meet the full disk", 120)
    local pending_jobs = hh.check_ok(hh.get(srv, TOKEN, hh.spath("jobs", "events")))
    local done = 0
    for _, e in ipairs(pending_jobs.events) do
      if e.type == "job.done" then done = done + 1 end
    end
    assert.equal(0, done, "a result was stored on a full disk")

    -- Free the space: everything resumes.
    os.remove(mnt .. "/filler")
    os.remove(mnt .. "/filler2")
    local again = hh.check_ok(append("full", batch("f" .. refused, 3)))
    assert.equal(3, #again.events)
    assert.equal("f" .. refused .. "-1", again.events[1].id)
    helpers.wait_until(function()
      local b = hh.check_ok(hh.get(srv, TOKEN, hh.spath("jobs", "events")))
      local n = 0
      for _, e in ipairs(b.events) do
        if e.type == "job.done" then n = n + 1 end
      end
      return n >= 10
    end, "every job processed after space was freed", 120)
    local all = hh.check_ok(hh.get(srv, TOKEN, hh.spath("jobs", "events"))).events
    local results = {}
    for _, e in ipairs(all) do
      if e.type == "job" then assert.equal("processed", e.status) end
      if e.type == "job.done" then
        assert.is_nil(results[e.cause.index], "two results for job " .. e.cause.index)
        results[e.cause.index] = true
      end
    end
    assert.equal(20, #all)
    -- every acknowledged batch once, the refused one once, nothing else
    local ids = helpers.pluck(hh.check_ok(hh.get(srv, TOKEN, hh.spath("full", "events"))).events, "id")
    assert.equal((stored_before + 1) * 3, #ids)
    local seen = {}
    for _, id in ipairs(ids) do
      assert.is_nil(seen[id], id .. " stored twice")
      seen[id] = true
    end
    assert.matches("the store answers again", helpers.read_file(srv.log))
    print(("# %d appends fitted after the fill, then 503 STORAGE"):format(stored_before))
  end)
end)
