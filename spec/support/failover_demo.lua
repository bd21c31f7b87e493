-- `make failover-demo`: PostgreSQL failover shown to a person (and
-- repeated): runs spec/support/failover.lua FAILOVER_RUNS times (default
-- 1) in FAILOVER_MODE (sync, async, or both; default both), prints each
-- run's report and, at the end, the totals: acknowledged appends lost,
-- duplicates, jobs without or with two results, HTTP answers other than
-- right or 503. Exits 1 when a synchronous run lost or doubled anything
-- (an asynchronous one may lose what the standby had not received: that
-- is what it shows; docs/postgres.md "Failover" records the figures).
package.path = "spec/?.lua;" .. package.path
local F = require("support.failover")

local runs = tonumber(os.getenv("FAILOVER_RUNS") or "") or 1
local which = os.getenv("FAILOVER_MODE") or "both"
local modes = which == "both" and { "sync", "async" } or { which }
local bad = false
for _, mode in ipairs(modes) do
  local tot = { runs = 0, lost = 0, dup = 0, no_result = 0, doubled = 0, web_lost = 0, web_dup = 0, wrong = 0, acked = 0 }
  for i = 1, runs do
    local ok, r = pcall(F.run, { mode = mode })
    if not ok then
      print(("%s run %d failed: %s"):format(mode, i, tostring(r)))
      bad = true
    else
      print(("%s run %d: %s"):format(mode, i, F.summary(r)))
      tot.runs = tot.runs + 1
      tot.acked = tot.acked + r.acked + r.web_acked
      tot.lost = tot.lost + r.lost + r.web_lost
      tot.dup = tot.dup + r.dup_events + r.web_dup
      tot.no_result = tot.no_result + r.no_result
      tot.doubled = tot.doubled + r.doubled
      tot.wrong = tot.wrong + (r.web_wrong and 1 or 0)
      if mode == "sync" and (r.lost + r.web_lost + r.dup_events + r.web_dup + r.no_result + r.doubled > 0 or r.web_wrong) then
        bad = true
      end
    end
    io.stdout:flush()
  end
  print(("%s: %d runs; %d acknowledged batches, %d lost, %d duplicate ids; jobs: %d without result, %d with two; "
    .. "%d runs with a wrong HTTP answer"):format(mode, tot.runs, tot.acked, tot.lost, tot.dup, tot.no_result,
      tot.doubled, tot.wrong))
end
os.exit(bad and 1 or 0)
