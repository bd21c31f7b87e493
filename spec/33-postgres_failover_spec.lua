-- PostgreSQL failover under load (issue 29 item 1, docs/contract.md §5
-- "High availability", docs/postgres.md "Failover").
--
-- One run of spec/support/failover.lua with a synchronous standby: three
-- engines, `serve` and two appending clients on a multi-host URL
-- (target_session_attrs=read-write); the primary killed with -9 mid-run,
-- the standby promoted once /healthz says 503. Then:
-- - every acknowledged append is stored exactly once (through the store
--   and through HTTP), none lost;
-- - every job is processed with exactly one result;
-- - the HTTP client got only right answers or 503 (never another status,
--   never a wrong body), saw /healthz go 200 -> 503 -> 200, and appended
--   again after the switch.
-- - the engines' two projections (one keyed by session, one global)
--   equal a fold from scratch of what the new primary holds.
-- `make failover-demo` repeats the run (and runs it asynchronous), printing
-- each report. Needs PostgreSQL (pg_basebackup) and LuaSocket.
local F = require("support.failover")

if not F.available() then
  describe("postgres: failover", function()
    pending("postgres: PostgreSQL (pg_basebackup) is not installed: make deps installs it")
  end)
  return
end
if not pcall(require, "socket") then
  describe("postgres: failover", function()
    pending("lua-socket: LuaSocket is not installed (make deps installs it)")
  end)
  return
end

describe("postgres: failover", function()
  it("a synchronous standby promoted after kill -9 of the primary: nothing acknowledged lost, nothing doubled, HTTP 503 then right again", function()
    local r = F.run({ mode = "sync", jobs = 2000 })
    print("# " .. F.summary(r))
    local why = F.summary(r) .. "\n" .. r.logs
    assert.equal(0, r.appender_rc, why)
    assert.equal(0, r.web_rc, why)
    assert.is_true(r.pending_at_kill > 0, "every job was done before the kill: the run proves nothing\n" .. why)
    assert.equal(r.jobs, r.processed, why)
    assert.equal(0, r.no_result, why)
    assert.equal(0, r.doubled, why)
    assert.is_true(r.acked >= 5, why)
    assert.equal(0, r.lost, why)
    assert.equal(0, r.dup_events, why)
    assert.is_true(r.web_acked >= 6, why)
    assert.equal(0, r.web_lost, why)
    assert.equal(0, r.web_dup, why)
    assert.is_false(r.web_wrong, why)
    assert.is_true(r.web_503 >= 1, "the HTTP client never met the switch\n" .. why)
    assert.same({ "200", "503", "200" }, r.health, why)
    assert.equal(r.jobs // 50, r.proj_keys, why)
    assert.equal(0, r.proj_wrong, why)
    assert.is_false(r.proj_total_wrong, why)
  end)
end)
