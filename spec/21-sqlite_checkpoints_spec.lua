-- SQLite checkpoints off the commit path (issue 26; docs/sqlite.md
-- "Checkpoints"). A read-write handle has a checkpointer thread that copies
-- the WAL into the main file after commits, instead of the commit that
-- crosses 1000 WAL pages doing it with the write lock held. What a user
-- relies on, and what these tests hold it to:
--
--   - the -wal file stays bounded under a writer that never pauses (the
--     checkpointer's copies alone cannot restart a WAL that a writer keeps
--     appending to; the write path restarts it at four times the
--     threshold): 20,000 events in 2,000 commits, the WAL's size looked at
--     after each;
--   - a handle that stops writing has its commits copied into the main
--     file without another write (polled, bounded: no sleep on the clock);
--   - everything reads back after close and reopen, the last close still
--     removes the WAL, and a read-only handle reads it all;
--   - the thread ends with its handle (no thread left behind), and a
--     read-only handle starts none.
-- SQLite only: these are files.
local eventstore = require("eventstore")
local helpers = require("helpers")

local q = helpers.sh_quote

local PAGE = 4096
local FRAME = PAGE + 24 -- a WAL frame: its header and one page
-- SQLite's default threshold, which the checkpointer keeps, and the bound
-- the write path keeps the WAL under (four times it), with room for the
-- commits that land while the restart is retried
local THRESHOLD = 1000
local BOUND = (4 * THRESHOLD + 1000) * FRAME

local size = helpers.file_size

-- Threads of this process (the checkpointer is one of them).
local threads = helpers.threads

-- Pages of the database as a read-only connection of the sqlite3 shell
-- sees it (through the WAL): what the main file holds once every commit
-- is copied into it.
local function page_count(db)
  local p = assert(io.popen("sqlite3 -readonly " .. q(db) .. " 'PRAGMA page_count'", "r"))
  local out = p:read("a")
  p:close()
  return assert(tonumber(out:match("%d+")), "the sqlite3 shell is needed (make deps installs it)")
end

local function batch(i, n)
  local evs = {}
  for j = 1, n do
    evs[j] = { type = "t", payload = { i = i, j = j, pad = string.rep("x", 100) } }
  end
  return evs
end

describe("sqlite: checkpoints", function()
  local base, db

  before_each(function()
    base = os.tmpname()
    db = base .. ".db"
  end)

  after_each(function()
    helpers.remove_db(db)
    os.remove(base)
  end)

  it("keeps the WAL bounded under many small commits, and everything reads back", function()
    local before = threads()
    local store = eventstore.open("sqlite:" .. db)
    assert.equal(before + 1, threads(), "a read-write handle has one checkpointer thread")
    local largest = 0
    for i = 1, 2000 do
      store:append("s" .. (i % 50), batch(i, 10))
      local w = size(db .. "-wal") or 0
      if w > largest then largest = w end
    end
    assert.is_true(largest > THRESHOLD * FRAME,
      ("the test must take the WAL past the threshold (largest %d bytes)"):format(largest))
    assert.is_true(largest <= BOUND,
      ("the -wal file grew to %d bytes, more than %d"):format(largest, BOUND))
    store:close()
    assert.equal(before, threads(), "close ends the checkpointer")
    assert.is_nil(size(db .. "-wal"), "the last close checkpoints and removes the WAL")

    local ro = eventstore.open("sqlite:" .. db .. "?mode=ro")
    assert.equal(before, threads(), "a read-only handle has no checkpointer")
    local all = ro:read_all({ after = 0, limit = 100000 })
    assert.equal(20000, #all)
    for k, e in ipairs(all) do
      local i, j = (k - 1) // 10 + 1, (k - 1) % 10 + 1
      assert.equal(i, e.payload.i)
      assert.equal(j, e.payload.j)
    end
    ro:close()

    store = eventstore.open("sqlite:" .. db)
    assert.equal(20000, #store:read_all({ after = 0, limit = 100000 }))
    store:append("s0", batch(2001, 10))
    store:close()
    assert.equal(before, threads())
  end)

  it("copies commits into the main file without another write", function()
    local store = eventstore.open("sqlite:" .. db)
    -- until the commit that takes the WAL to the threshold (about 15
    -- pages a commit): until then nothing is copied
    local i = 0
    repeat
      i = i + 1
      store:append("s" .. (i % 50), batch(i, 10))
    until (size(db .. "-wal") or 0) >= 32 + THRESHOLD * FRAME
    local pages = page_count(db)
    assert.is_true(pages > 20, "pages: " .. pages)
    -- that commit woke the checkpointer; with no write after it, the main
    -- file comes to hold every page
    helpers.wait_until(function() return size(db) == pages * PAGE end,
      "the checkpointer to copy every commit into the main file")
    -- a read-only handle beside the writer sees every commit
    local ro = eventstore.open("sqlite:" .. db .. "?mode=ro")
    assert.equal(i * 10, #ro:read_all({ after = 0, limit = 100000 }))
    ro:close()
    store:close()
  end)
end)
