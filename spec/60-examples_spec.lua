-- The examples, run the way a user runs them: each as a subprocess from the
-- repository root with the module on LUA_PATH / LUA_CPATH, checking the exit
-- code and the lines that tell the story (every paid order shipped, the
-- flaky payment retried once, lanes kept each ticket in order, ...), so a
-- broken example or a broken sample app in scripts/ fails the suite.
--
-- Not a conformance spec: the examples choose their backend (SQLite, in
-- temporary files), so this file does not loop over helpers.urls().
local BUILD = os.getenv("BUILD") or "build" -- build-san under make check-sanitize
local LUA = os.getenv("LUA") or "lua5.4"

-- The repository root: this file lives in <root>/spec/.
local spec_dir = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "spec"
local ROOT = spec_dir .. "/.."

local helpers = require("helpers")
local q = helpers.sh_quote

local temp = {} -- files to remove after each test

local function tmpfile()
  local name = os.tmpname()
  temp[#temp + 1] = name
  return name
end

-- Runs `command` (a shell command line) from the repository root with the
-- module's paths set; returns its exit code and its stdout + stderr.
local function run(command, env)
  local out = tmpfile()
  local line = ("cd %s && LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH=%s %s timeout 60 %s >%s 2>&1")
    :format(q(ROOT), q(BUILD .. "/lib/?.so;;"), env or "", command, q(out))
  local _, _, code = os.execute(line)
  local f = assert(io.open(out, "rb"))
  local text = f:read("a")
  f:close()
  return code, text
end

-- Asserts `text` contains `needle` (a plain string), showing the output if not.
local function has(text, needle)
  if not text:find(needle, 1, true) then
    error(("expected the output to contain %q; it was:\n%s"):format(needle, text), 2)
  end
end

local function has_not(text, needle)
  if text:find(needle, 1, true) then
    error(("expected the output NOT to contain %q; it was:\n%s"):format(needle, text), 2)
  end
end

-- The block of lines from the one starting with `first` to the next blank line.
local function block(text, first)
  local start = text:find("\n" .. first, 1, true)
  assert(start, ("no block starting with %q in:\n%s"):format(first, text))
  local stop = text:find("\n\n", start + 1, true) or #text
  return text:sub(start + 1, stop)
end

describe("examples", function()
  after_each(function()
    for _, name in ipairs(temp) do
      for _, suffix in ipairs({ "", ".db", ".db-wal", ".db-shm", ".db-journal" }) do os.remove(name .. suffix) end
    end
    temp = {}
  end)

  it("make demo's script runs the order app in scripts/ end to end on SQLite", function()
    local db = tmpfile() .. ".db"
    local code, out = run(LUA .. " examples/demo.lua", "DEMO_DB=" .. q(db))
    assert.equal(0, code, out)

    -- An ordinary order: accepted, reserved, paid, shipped after its timer.
    local o1 = block(out, "order-1001 (ada)")
    has(o1, "#2 order.accepted     total 29.00  <- #1")
    -- §3.2: the payment's handler cancelled the reminder timer (ctx.cancel)
    has(o1, "#5 payment.reminder   timer cancelled: paid  <- #1")
    has(o1, "#7 shipment.due       timer: due 300 ms after it was written  <- #6")
    has(o1, "#8 order.shipped      tortoise-post, tracking TRK-ORDER-1001  <- #7")
    has(o1, "=> shipped, paid 29.00 after 1 payment attempt(s), tracking TRK-ORDER-1001")
    has(o1, "inventory: held none; shipped MUG-02 x1, TEA-01 x2; released none")

    -- The flaky gateway: attempt 1 failed, the retry captured, then shipped.
    local o2 = block(out, "order-1002 (grace)")
    has(o2, "1 failed attempt(s) (payment gateway timed out), retried: 2 attempts in all")
    has(o2, "#5 payment.reminder   timer cancelled: paid  <- #1")
    has(o2, "#6 payment.captured   34.00 on attempt 2  <- #4")
    has(o2, "=> shipped, paid 34.00 after 2 payment attempt(s), tracking TRK-ORDER-1002")

    -- The declined card: stock released, order cancelled, nothing shipped.
    local o3 = block(out, "order-1003 (linus)")
    has(o3, "#5 payment.reminder   timer cancelled: order cancelled  <- #1")
    has(o3, "#7 stock.released     TEA-01 x5  <- #6")
    has(o3, "=> cancelled (card declined)")
    has(o3, "inventory: held none; shipped none; released TEA-01 x5")

    has(out, "orders:    3 placed, 2 shipped, 1 cancelled")
    has(out, "payments:  1 retried (order-1002: payment gateway timed out, 2 attempts); 63.00 captured")
    has(out, "warehouse: shipped MUG-02 x1, POT-03 x1, TEA-01 x2; released TEA-01 x5; still held none")
    has(out, "engine:    11 events handled, 1 failed attempt(s), 0 dead letter(s)")
    has(out, "captured 3400 cents on attempt 2") -- ctx.log reaches stderr

    -- The binary commands the demo and the README suggest work on its file.
    code, out = run(BUILD .. "/bin/eventstore state order-1002 order --db " .. q("sqlite:" .. db))
    assert.equal(0, code, out)
    has(out, '"payment_attempts":2')
    has(out, '"status":"shipped"')
    code, out = run(BUILD .. "/bin/eventstore read order-1003 --db " .. q("sqlite:" .. db))
    assert.equal(0, code, out)
    has(out, '"type":"order.cancelled"')
  end)

  it("examples/embedded: a Lua host using the store API and engine:state directly", function()
    local code, out = run(LUA .. " examples/embedded/host.lua")
    assert.equal(0, code, out)
    has(out, "[subscriber] #3 withdrawal.requested (pending)")
    has(out, "retried the request with id wd-0001: still event #3, head still 3")
    has(out, "claimed #3 withdrawal.requested 30.00 (attempt 1, balance 100.00) -> withdrawn")
    has(out, "completed #3: completed, appended #4")
    has(out, "claimed #5 withdrawal.requested 90.00 (attempt 1, balance 70.00) -> withdrawal.refused")
    has(out, "nothing to claim: settled")
    has(out, "balance now 70.00 (1 deposit(s), 1 withdrawal(s), 1 refused); at #2 it was 100.00")
    has(out, "[stream] #7 deposited 50.00 by teller")
    has(out, "balance now 120.00")
    has(out, "\ndone\n")
  end)

  it("examples/support: lanes keep each ticket in order, presence tracks the agents", function()
    local code, out = run(LUA .. " examples/support/run.lua")
    assert.equal(0, code, out)
    has(out, "routed to the agents online: ana, bo")

    -- Before the operator steps in: T-3 is stuck behind its dead letter,
    -- the other tickets are done.
    local before = block(out, "5. the engine runs")
    has(before, "T-1: 3 message(s), replies to 1, 2, 3 (in order), closed")
    has(before, "T-2: 3 message(s), replies to 1, 2, 3 (in order), closed")
    has(before, "T-3: 3 message(s), replies to 1 (in order), open")
    has(before, "dead letter: #9 message.received T-3 message 2 after 2 failures: cannot read attachment scan.tiff")
    has(before, "blocked behind it in lane T-3: #12 message 3")

    local after = block(out, "6. ana answers")
    has(after, "T-3: 3 message(s), replies to 1, 2, 3 (in order), open")

    -- Presence: typing expired by TTL; bo's tombstone beats a late heartbeat.
    has(out, "present: ana online, typing on T-1; bo online; cy away")
    has(out, "typing field has expired (nobody refreshed it); present: ana online; bo online; cy away")
    has(out, "presence: bo name=(deleted) status=(deleted)")
    has(out, "ignored, the tombstone is newer")
    has(out, "present: ana online; cy away")
    has(out, "every ticket answered in order")
    has_not(out, "OUT OF ORDER")
  end)
  it("examples/replay: a changed pricing handler replayed over a day of orders", function()
    local db, dir = tmpfile(), tmpfile()
    finally(function()
      os.execute("rm -rf " .. q(dir) .. " " .. q(db) .. "-wal " .. q(db) .. "-shm")
    end)
    local env = ("REPLAY_DB=%s REPLAY_SCRIPTS=%s ORDERS=60"):format(q(db), q(dir))
    local code, out = run(LUA .. " examples/replay/run.lua", env)
    assert.equal(0, code, out)
    has(out, "history: 60 orders, 480 events in ")
    -- Lines of 3 or more items: every second order (qty = i % 4 + 1).
    has(out, "replayed 60, identical 30, diverged 30, failed 0")
    has(out, "  order-0002: first divergence at #2 (order.accepted): total_cents 11050 -> 10030")
    has(out, "    state order $.total_cents: 11050 -> 10030")
    -- The unchanged scripts replay the same history identical: retried
    -- payments, shipping timers, charge ids and all.
    has(out, "replay of scripts (unchanged): replayed 60, identical 60")
  end)

  it("examples/branches: two plans on forks of a conversation, the winner promoted onto main", function()
    local code, out = run(LUA .. " examples/branches/run.lua")
    assert.equal(0, code, out)
    -- The forks copy #1..#2; each branch's handlers ran on it alone.
    has(out, 'fork("conv-1", 2, "conv-1/try-a") -> parent conv-1 at #2, head 2')
    has(out, 'fork("conv-1", 2, "conv-1/try-b") -> parent conv-1 at #2, head 2')
    has(out, "#1 user.message      Get me from Lisbon to Porto on Friday, under 60 EUR, there by 13:00. (copy of conv-1 #1, processed)")
    has(out, "conv-1/try-b  evt-000000000005, evt-000000000006") -- counter ids: fresh for the copies
    has(out, "conv-1 got none of them: head 2")

    -- The winner by reducer state, promoted with a compare-and-set.
    has(out, "try-a (train): score 34: over budget by 12 EUR, arrives 12:58, 169 min on the road; 3 messages")
    has(out, "try-b (bus): score 78: within budget, arrives 12:10, 220 min on the road")
    has(out, "winner: try/b (conv-1/try-b, score 78)")
    has(out, 'promote("try/b", "main", {expect = "conv-1"}) -> main names conv-1/try-b')
    has(out, "-> REF_CONFLICT: expected conv-1, actual conv-1/try-b")

    -- Lineage, and the sealed loser.
    has(out, 'children("conv-1"): conv-1/try-a (at #2), conv-1/try-b (at #2)')
    has(out, "conv-1/try-a: 6 events, sealed (lost to try/b)")
    has(out, "append to conv-1/try-a -> refused, SEALED")

    -- The conversation goes on on the session main names.
    has(out, "conv-1/try-b: booked BUS-0830; main -> conv-1/try-b (head 9)")

    -- The README shows this run's output (stdout) exactly.
    local f = assert(io.open(ROOT .. "/examples/branches/README.md", "rb"))
    local readme = f:read("a")
    f:close()
    local shown = readme:match("\nOutput[^\n]*\n\n```\n(.-)```\n")
    assert(shown, "examples/branches/README.md shows no output block")
    local code2, stdout = run("sh -c " .. q(LUA .. " examples/branches/run.lua 2>/dev/null"))
    assert.equal(0, code2, stdout)
    assert.equal(shown, stdout)
  end)

  it("examples/projections: a keyed and a global projection, and an edit rebuilt blue/green while reads go on", function()
    local code, out = run(LUA .. " examples/projections/run.lua")
    assert.equal(0, code, out)
    has(out, "  open_orders  generation 1  position 7500  lag 0  running")
    has(out, "open_orders cust-04: 100 open, worth 5780")
    has(out, "first keys: cust-00, cust-01, cust-02  (next page after cust-02)")
    has(out, "revenue 2026-03-01: 32040  (generation 1)")
    -- every read during the rebuild answered the old generation, whole
    has(out, "reads answer generation 1: 2026-03-01 = 32040")
    has(out, "  all reads answered from the old generation while the new one was built")
    has(out, '  then generation 2: 2026-03-01 = {"orders":600,"total":32040}')
    has(out, "  revenue      generation 2  position 7500  lag 0  running")
  end)
end)
