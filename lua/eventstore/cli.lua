-- eventstore.cli: every command of the `eventstore` binary (docs/cli.md).
--
--   require("eventstore.cli").main(argv) --> exit code
--
-- argv[1..] are the command line arguments (argv[0] the program name), as
-- core/main/main.c passes them. main parses and checks the whole command line
-- first: a usage error (unknown command or option, a missing or extra
-- argument, a bad number, an invalid JSON argument) prints one line
-- "eventstore: ..." on stderr (plus the synopsis when the shape of the line
-- is wrong) and returns 2 before the store is opened. Then the command runs
-- unprotected: a failure raises, and main.c prints "eventstore: <tostring of
-- the error>" and exits 1. Errors this file raises itself (a bad stdin line,
-- a missing scripts directory) are objects with __tostring, like the store's
-- error objects, so main.c prints them as one line without a traceback.
--
-- Options are parsed by hand (no dependencies beyond Lua): `--name value`
-- or `--name=value`, anywhere after the command; `--` ends the options. An
-- argument is an option only if it looks like one (`-x`, `--xyz`), so a
-- negative JSON number such as `-5` is a positional argument.
local eventstore = require("eventstore")
local json = eventstore.json

local PROG = "eventstore"
local DEFAULT_DB = "sqlite:./eventstore.db"
local DEFAULT_SCRIPTS = "./scripts"
local PAGE = 100             -- rows per store call when listing
local READ_PAGE = 1000       -- events per store:read page
local PROGRESS_EVERY_MS = 500  -- the progress line's redraw period
local SIGNAL_POLL_MS = 100     -- how often run looks for SIGINT/SIGTERM
local PENDING_EVERY_MS = 2000  -- how often the progress line rereads pending (store:stats(): O(1))
local UNHANDLED_EVERY_MS = 30000 -- how often it recounts pending by type (pending_types: a count per type)
local PROGRESS_LOG_EVERY_MS = 5000 -- run --progress off a terminal: one log line this often
local MAX_WORKERS = 256        -- the engine's limit (docs/engine.md)
local RETENTION_EVERY = { int = 1, max = 365 * 24 * 3600 * 1000 } -- run and serve: --retention-every-ms (a year at most)
local DEFAULT_DEADLINE_S = 300 -- run --until-done gives up after this long
local OUTAGE_MS = 60000        -- run's own store calls ride an outage out this long (the engine's outage_ms)
local OUTAGE_WAIT_MAX_MS = 2000 -- ... retrying after 50 ms, doubling up to this

-- The terminal helpers only the binary has (core/main/main.c); a plain lua5.4
-- running this module sees "not a terminal" and no progress line.
local tty do
  local ok, m = pcall(require, "eventstore.tty")
  tty = ok and type(m) == "table" and m or nil
end

-- ---- errors ---------------------------------------------------------------

-- A runtime failure found by the CLI (exit 1 via main.c).
local Failure = { __tostring = function(e) return e.message end }
local function fail(fmt, ...)
  error(setmetatable({ message = fmt:format(...) }, Failure), 0)
end

-- A usage error (exit 2, caught in main). `synopsis` says whether to show
-- the command's synopsis after the message (the shape of the line was wrong,
-- not just one value).
local Usage = { __tostring = function(e) return e.message end }
local function usage_error(cmd, synopsis, fmt, ...)
  error(setmetatable({ message = fmt:format(...), cmd = cmd, synopsis = synopsis }, Usage), 0)
end

-- ---- output ---------------------------------------------------------------

-- Writes one line to stdout. A write error (a full disk, a closed file)
-- is a failure, not a silent exit 0. (A closed pipe ends the process with
-- SIGPIPE first, as for any filter: `eventstore read s | head -1`.)
local function out(line)
  local ok, err = io.stdout:write(line, "\n")
  if not ok then fail("cannot write to stdout: %s", tostring(err)) end
end

-- A text field as printable JSON text. The store keeps text valid UTF-8,
-- but a file written by an older version may hold any bytes in last_error:
-- each byte that does not belong to a valid UTF-8 character is printed as
-- the four characters \xHH, so a listing never fails on what it lists.
local function printable(s)
  if utf8.len(s) then return s end
  local parts, i = {}, 1
  while i <= #s do
    local b = s:byte(i)
    local len = b < 0x80 and 1 or (b >= 0xC2 and b <= 0xDF) and 2 or (b >= 0xE0 and b <= 0xEF) and 3
      or (b >= 0xF0 and b <= 0xF4) and 4 or nil
    local piece = len and s:sub(i, i + len - 1)
    if piece and #piece == len and utf8.len(piece) == 1 then
      parts[#parts + 1] = piece
      i = i + len
    else
      parts[#parts + 1] = ("\\x%02X"):format(b)
      i = i + 1
    end
  end
  return table.concat(parts)
end

-- A copy of a row table (an event, a session, a snapshot, a ref) with its
-- text fields through printable(), also those of the records a row holds
-- (an event's origin, a session's lease); a payload is JSON already.
local NESTED = { origin = true, lease = true }
local function printable_row(r)
  local t = {}
  for k, v in pairs(r) do
    if type(v) == "string" then
      v = printable(v)
    elseif type(v) == "table" and NESTED[k] then
      v = printable_row(v)
    end
    t[k] = v
  end
  return t
end

-- A row that is not an event as one line of JSON.
local function row_json(r)
  return json.encode(printable_row(r))
end

-- One stored event as one line of JSON. A missing payload is JSON null, so
-- every event line has a "payload" key; a payload is always valid JSON.
local function event_json(e)
  local t = printable_row(e)
  if t.payload == nil then t.payload = json.null end
  return json.encode(t)
end

-- The dead letter a revive or settle is about, checked before anything is
-- written: it exists and is dead (the store checks again, atomically; this
-- is so a command that fails has written nothing, whatever the reason).
local function dead_letter(store, session, index)
  local e = store:read(session, { after = index - 1, limit = 1 })[1]
  if e == nil or e.index ~= index then
    fail("NO_SUCH_EVENT: no event at index %d in session '%s'", index, printable(session))
  end
  if e.status ~= "dead" then
    fail("INVALID_ARGUMENT: event %d in session '%s' is not a dead letter", index, printable(session))
  end
  event_json(e) -- what will be printed can be printed
  return e
end

local function print_events(events)
  for _, e in ipairs(events) do out(event_json(e)) end
end

-- ---- helpers --------------------------------------------------------------

-- A whole number >= min (and <= max when given) from an option or argument
-- (usage error otherwise, naming the range).
local function parse_int(cmd, what, text, min, max)
  local n = text:match("^%d+$") and math.tointeger(tonumber(text)) or nil
  if n == nil or n < min or (max ~= nil and n > max) then
    if max ~= nil then
      usage_error(cmd, false, "%s: %s expects a whole number from %d to %d, got '%s'", cmd, what, min, max, text)
    end
    usage_error(cmd, false, "%s: %s expects a whole number >= %d, got '%s'", cmd, what, min, text)
  end
  return n
end

-- Whether dir is an existing directory ("dir/." opens only for one).
local function is_dir(dir)
  local f = io.open(dir .. "/.", "r")
  if f then f:close() return true end
  return false
end

local function file_exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

-- Opens the store. Commands that only look (read, state, ...) refuse a
-- sqlite: file that does not exist instead of creating an empty one. The
-- file is the URL's path without its options (`sqlite:PATH?mode=ro`: the
-- first `?` starts them, as in docs/sqlite.md); the URL, options and all,
-- goes to eventstore.open unchanged.
--
-- The store options every command with --db takes (STORE_OPTIONS) go to
-- eventstore.open: --archive DIR (segment files, docs/retention.md), --keys
-- PATH (the master key file, docs/shredding.md). With --tenant NAME the
-- command works on that tenant's handle (docs/tenants.md); the store under
-- it is closed by its finalizer when the command's Lua state closes.
local function open_store(o, creates)
  local path = o.db:match("^sqlite:([^?]*)")
  if not creates and path and path ~= "" and not file_exists(path) then
    fail("STORAGE: no database at '%s' (--db %s); append or run creates one", path, o.db)
  end
  local store = eventstore.open(o.db, { archive = o.archive, keys = o.keys })
  if o.tenant == nil then return store end
  local ok, handle = pcall(store.tenant, store, o.tenant)
  if not ok then
    store:close()
    error(handle, 0)
  end
  return handle
end

-- The scripts directory, checked: required by run and state; for append,
-- only when --scripts was given (the default ./scripts is optional there).
-- The error says which it is: missing, or a file (`--scripts README.md`);
-- hint adds to "(--scripts DIR".
local function scripts_dir(o, required, hint)
  local dir = o.scripts or DEFAULT_SCRIPTS
  if is_dir(dir) then return dir end
  if required or o.scripts ~= nil then
    fail("scripts directory '%s' %s (--scripts DIR%s)", dir,
      file_exists(dir) and "is not a directory" or "does not exist", hint or "")
  end
  return nil
end

local function need_engine()
  if type(eventstore.engine) ~= "function" then
    fail("this build has no engine (require('eventstore').engine is missing)")
  end
end

-- ---- commands ---------------------------------------------------------------
--
-- Each command: synopsis, help text, positional argument count (min, max),
-- options (name -> "flag" | "string" | {int = minimum, max = maximum?}), an optional check
-- (more usage checks, still before anything is opened) and run (returns the
-- exit code).

-- Every URL scheme eventstore.open takes (docs/cli.md "Common rules").
local DB_HELP = "  --db URL        the store (default " .. DEFAULT_DB .. "): sqlite:PATH,\n"
  .. "                  memory:, postgres://..., or shards:CATALOG_URL\n"
-- Options of every command that opens the store (it has --db), listed in
-- its help after its own.
local STORE_OPTIONS = { archive = "string", keys = "string", tenant = "string" }
local STORE_HELP_COMMON = "  --archive DIR   where archived segments are (sqlite: default PATH.archive)\n"
  .. "  --keys PATH     the master key file, for sealed payloads (docs/shredding.md)\n"
local STORE_HELP = STORE_HELP_COMMON
  .. "  --tenant NAME   work inside that tenant only (docs/tenants.md)\n"
local SCRIPTS_HELP = "  --scripts DIR   the scripts directory (default " .. DEFAULT_SCRIPTS .. ")\n"
local HELP_HELP = "  -h, --help      print this help\n"

local commands = {}
local order = {}
local function command(name, def)
  def.name = name
  commands[name] = def
  order[#order + 1] = name
end

command("run", {
  synopsis = "run [--db URL] [--scripts DIR] [--workers N] [--holder NAME] [--ttl-ms MS] [--retention-every-ms MS]"
    .. " [--until-idle | --until-done [--deadline S]] [--progress]",
  summary = "dispatch pending events to their handlers",
  help = [[
Dispatches every pending event of the store to its handler in the scripts
directory (handlers/<type>.lua), until SIGINT or SIGTERM (handler calls in
flight are interrupted and retried later, exit 0); with --until-idle until
no event is ready now; with --until-done until no pending event will ever
become ready by time alone (it also waits for backoffs and timers). Every
handler and reducer is loaded first: one that does not load stops it, naming
the file and line (exit 1). On a terminal a progress line is kept on stderr.
At the end prints to stdout:
  handled N, failed N, dead N, pending N
]],
  options_help = DB_HELP .. SCRIPTS_HELP .. [[
  --workers N     worker threads, 1 to 256 (default: the engine's, 1)
  --holder NAME   this engine's claim holder name (default:
                  engine-<pid>-<random>); one per engine sharing a store
  --ttl-ms MS     claim TTL in ms (default 30000): how soon another engine
                  takes over the claims of one that died
  --retention-every-ms MS  with DIR/retention.lua: how often (store clock)
                  its rules are applied, 1 to 31536000000 (default 60000;
                  docs/retention.md)
  --until-idle    return once no event is ready now (timers and backoffs
                  stay pending)
  --until-done    also wait for events that become ready later (timers,
                  backoffs); exit 1 naming what is still pending if that
                  would take past the deadline, exit 3 when the run
                  dead-lettered events
  --deadline S    with --until-done: give up after S seconds, 1 to 31536000
                  (default 300)
  --progress      when stderr is not a terminal, log a progress line to it
                  every 5 s (on a terminal the line is always kept)
]],
  args = { 0, 0 },
  options = {
    db = "string", scripts = "string", workers = { int = 1, max = MAX_WORKERS },
    holder = "string", ["ttl-ms"] = { int = 1, max = 100 * 365 * 24 * 3600 * 1000 },
    ["retention-every-ms"] = RETENTION_EVERY,
    ["until-idle"] = "flag", ["until-done"] = "flag", deadline = { int = 1, max = 365 * 24 * 3600 },
    progress = "flag",
  },
})

command("append", {
  synopsis = "append SESSION TYPE [JSON] [--id ID] [--lane LANE] [--key KEY] [--revision N] [--meta JSON]"
    .. " | append SESSION < NDJSON",
  summary = "append one event, or NDJSON events from stdin",
  help = [[
With TYPE: appends one event of that type to SESSION, its payload the JSON
argument (null when omitted).
Without TYPE: reads events from stdin, one JSON object per line
  {"type": "...", "payload": ..., "id": "...", "lane": "...", "key": "...",
   "revision": N, "meta": {...}}
(only type is required; blank lines are skipped). Every line is checked
before anything is written; all of them are appended as one batch (at most
10,000 events), atomically.
Prints the stored events as NDJSON. Every event is stored pending, for
`run` to handle. With --scripts DIR the append goes through the engine of
DIR instead, so events of a type without a handler there are stored
already processed (facts nothing will handle).
]],
  options_help = DB_HELP .. SCRIPTS_HELP .. [[
  --id ID         the event's id (default: generated)
  --lane LANE     the event's lane
  --key KEY       seal the payload under data key KEY (needs --keys; see
                  shred and docs/shredding.md)
  --revision N    the payload's schema revision, 1 to 2147483647 (default 1)
  --meta JSON     the event's metadata, a JSON object (correlation, tracing;
                  never sealed)
]],
  args = { 1, 3 },
  options = { db = "string", scripts = "string", id = "string", lane = "string", key = "string",
    revision = { int = 1, max = 2147483647 }, meta = "string" },
})

command("append-many", {
  synopsis = "append-many < NDJSON [--db URL]",
  summary = "append to several sessions at once, atomically, from NDJSON",
  help = [[
Reads batches from stdin, one JSON object per line
  {"session": "...", "events": [EVENT, ...], "expected": N}
where each EVENT is an object as a line of `append` takes and "expected"
(optional) is the head the session must have. Blank lines are skipped.
Every line is checked before anything is written; then every batch is
appended in one transaction: all of them are stored or none is (a refused
batch names its line). On a shards: store every session must live on one
shard. Prints the stored events of every batch as NDJSON, in the lines'
order.
]],
  options_help = DB_HELP,
  args = { 0, 0 },
  options = { db = "string" },
})

command("read", {
  synopsis = "read SESSION [--after N] [--limit N] [--follow | --at-rest] [--db URL]",
  summary = "print a session's events as NDJSON",
  help = [[
Prints the events of SESSION after index N, one JSON object per line, in
index order. With --follow keeps printing new events as they are appended
(also by other processes) until interrupted.
An event sealed under a data key (append --key) carries "key"; its payload
needs the store's --keys to be read, and once the key was shredded it
prints as "payload": null, "shredded": true. With --at-rest events are
printed as stored, for audits: a sealed event's "ciphertext" instead of its
payload (no --keys needed).
]],
  options_help = DB_HELP .. [[
  --after N       start after index N (default 0)
  --limit N       print at most N events
  --follow        wait for new events
  --at-rest       print sealed payloads as stored (ciphertext)
]],
  args = { 1, 1 },
  options = { db = "string", after = { int = 0 }, limit = { int = 1 }, follow = "flag", ["at-rest"] = "flag" },
})

command("state", {
  synopsis = "state SESSION REDUCER [--at N] [--db URL] [--scripts DIR]",
  summary = "print a reducer's state of a session as JSON",
  help = [[
Folds SESSION's events with reducers/REDUCER.lua of the scripts directory
and prints the state as one line of JSON (through index N with --at). A
state that cannot be printed as JSON (a function, a table mixing integer
and string keys, ...) is an error.
]],
  options_help = DB_HELP .. SCRIPTS_HELP .. [[
  --at N          the state after event N (0: the initial state)
]],
  args = { 2, 2 },
  options = { db = "string", scripts = "string", at = { int = 0 } },
})

command("sessions", {
  synopsis = "sessions [--prefix P] [--after SESSION] [--limit N] [--db URL]",
  summary = "list sessions as NDJSON",
  help = [[
Prints one JSON object per session, in byte order of the session id:
  {"session", "events", "pending", "dead", "attempts", "failures",
   "first_at", "updated_at", "sealed"}
and, when they apply, "sealed_at", "seal_reason", "fence", "lease"
({"holder", "token", "expires_at"}) and "parent" (a fork's source).
]],
  options_help = DB_HELP .. [[
  --prefix P      only sessions whose id starts with P
  --after SESSION start after this session id (to page)
  --limit N       print at most N sessions
]],
  args = { 0, 0 },
  options = { db = "string", prefix = "string", after = "string", limit = { int = 1 } },
})

command("dead", {
  synopsis = "dead [SESSION] [--limit N] [--db URL]",
  summary = "list dead letters as NDJSON",
  help = [[
Prints the dead-lettered events (of SESSION, or of every session) as NDJSON
in position order, with their last_error.
]],
  options_help = DB_HELP .. [[
  --limit N       print at most N events
]],
  args = { 0, 1 },
  options = { db = "string", limit = { int = 1 } },
})

command("revive", {
  synopsis = "revive SESSION INDEX [--db URL]",
  summary = "put a dead letter back to pending",
  help = [[
Puts dead letter INDEX of SESSION back to pending with its failure count
reset, and prints the updated event as JSON.
]],
  options_help = DB_HELP,
  args = { 2, 2 },
  options = { db = "string" },
})

command("settle", {
  synopsis = "settle SESSION INDEX [--reason TEXT] [--db URL]",
  summary = "mark a dead letter processed without handling it",
  help = [[
Marks dead letter INDEX of SESSION processed (it is never handled), and
prints the updated event as JSON.
]],
  options_help = DB_HELP .. [[
  --reason TEXT   why (added to the event's last_error)
]],
  args = { 2, 2 },
  options = { db = "string", reason = "string" },
})

command("cancel", {
  synopsis = "cancel SESSION INDEX [--reason TEXT] [--db URL]",
  summary = "cancel a pending event (a timer, say) so it is never handled",
  help = [[
Cancels pending event INDEX of SESSION (store:cancel): it becomes
processed without being handled, its record showing "cancelled": TEXT
(default "cancelled"). A timer not yet due can be cancelled; an event a
worker holds a live claim on, a processed one or a dead letter cannot
(INVALID_ARGUMENT naming its state). Cancelling a cancelled event changes
nothing. Prints the event as JSON.
]],
  options_help = DB_HELP .. [[
  --reason TEXT   why (default "cancelled")
]],
  args = { 2, 2 },
  options = { db = "string", reason = "string" },
})

command("snapshots", {
  synopsis = "snapshots SESSION [--db URL]",
  summary = "list a session's snapshots as NDJSON",
  help = [[
Prints one JSON object per reducer snapshot of SESSION:
  {"reducer", "index", "version", "updated_at"}
]],
  options_help = DB_HELP,
  args = { 1, 1 },
  options = { db = "string" },
})

command("fork", {
  synopsis = "fork FROM AT TO [--db URL]",
  summary = "start session TO as a copy of FROM's first AT events",
  help = [[
Creates session TO as a branch of FROM: copies events 1..AT of FROM (same
type, payload, lane, index; fresh ids; each with origin {session, index};
stored already processed) and FROM's snapshots at or below AT. FROM is
unchanged. TO must have no events and not be a fork already. AT is a whole
number >= 0 (0: an empty branch). Prints the lineage record as JSON:
  {"session", "parent", "at", "created_at"}
]],
  options_help = DB_HELP,
  args = { 3, 3 },
  options = { db = "string" },
})

command("lineage", {
  synopsis = "lineage SESSION [--db URL]",
  summary = "print where a forked session comes from, up to its root",
  help = [[
Prints SESSION's lineage record, then its parent's, and so on up to the
first session that is not a fork, one JSON object per line:
  {"session", "parent", "at", "created_at"}
A session that is not a fork (or does not exist) prints nothing.
]],
  options_help = DB_HELP,
  args = { 1, 1 },
  options = { db = "string" },
})

command("children", {
  synopsis = "children SESSION [--after S] [--limit N] [--db URL]",
  summary = "list the sessions forked from a session as NDJSON",
  help = [[
Prints the lineage record of each session forked from SESSION, one JSON
object per line, in byte order of the session id:
  {"session", "parent", "at", "created_at"}
]],
  options_help = DB_HELP .. [[
  --after S       start after this session id (to page)
  --limit N       print at most N sessions
]],
  args = { 1, 1 },
  options = { db = "string", after = "string", limit = { int = 1 } },
})

command("refs", {
  synopsis = "refs [--after NAME] [--limit N] [--db URL]",
  summary = "list refs as NDJSON",
  help = [[
Prints one JSON object per ref, in byte order of the name:
  {"name", "session", "head", "created_at", "updated_at"}
(head: the head of the session the ref names, now; 0 without events).
]],
  options_help = DB_HELP .. [[
  --after NAME    start after this ref name (to page)
  --limit N       print at most N refs
]],
  args = { 0, 0 },
  options = { db = "string", after = "string", limit = { int = 1 } },
})

command("ref", {
  synopsis = "ref NAME [SESSION] [--db URL]",
  summary = "show a ref, or point it at a session",
  help = [[
Without SESSION: prints ref NAME as one JSON object
  {"name", "session", "head", "created_at", "updated_at"}
or fails with NOT_FOUND (exit 1) when there is no such ref.
With SESSION: points ref NAME at SESSION (creating the ref, or moving it
whatever it named; SESSION need not exist yet) and prints the ref.
]],
  options_help = DB_HELP,
  args = { 1, 2 },
  options = { db = "string" },
})

command("promote", {
  synopsis = "promote FROM TO [--expect SESSION | --expect-none] [--db URL]",
  summary = "point ref TO at the session ref FROM names",
  help = [[
Points ref TO at the session ref FROM names, and prints ref TO as JSON.
Without --expect the last writer wins. With --expect SESSION, TO must name
SESSION now; with --expect-none, TO must not exist. Otherwise nothing
moves and it fails (exit 1) with
  REF_CONFLICT: promote onto ref 'TO' refused: expected ..., found ...
A missing ref FROM is NOT_FOUND.
]],
  options_help = DB_HELP .. [[
  --expect SESSION  compare-and-set: only if TO names SESSION now
  --expect-none     compare-and-set: only if TO does not exist
]],
  args = { 2, 2 },
  options = { db = "string", expect = "string", ["expect-none"] = "flag" },
})

command("seal", {
  synopsis = "seal SESSION [--reason TEXT] [--db URL]",
  summary = "close a session to new events",
  help = [[
Seals SESSION: appending to it (and completing a handler call with new
events) then fails with SEALED; its pending events are still dispatched.
Sealing a sealed session changes nothing (the first reason stays). Prints
the session's row as `sessions` does, with "sealed": true.
]],
  options_help = DB_HELP .. [[
  --reason TEXT   why (kept as the session's seal_reason)
]],
  args = { 1, 1 },
  options = { db = "string", reason = "string" },
})

command("truncate", {
  synopsis = "truncate SESSION THROUGH [--db URL]",
  summary = "drop a session's processed events 1..THROUGH",
  help = [[
Drops events 1..THROUGH of SESSION from the live store (docs/contract.md §3.9):
indexes and positions never shift, the head stays, reads then start after
THROUGH. Only processed events may go: a pending or dead event in the range
fails it (INVALID_ARGUMENT, exit 1) and nothing is dropped. With --scripts,
every reducer there is first snapshotted at THROUGH (engine:truncate), so
`state` stays readable; without it, a reducer with no snapshot at or past
THROUGH is TRUNCATED from then on. THROUGH is a whole number >= 0;
already dropped: nothing to do. Prints the session's row as `sessions` does
(its "first_index" is where reads start).
]],
  options_help = DB_HELP .. [[
  --scripts DIR   snapshot the reducers of DIR/reducers at THROUGH first
]],
  args = { 2, 2 },
  options = { db = "string", scripts = "string" },
})

command("delete", {
  synopsis = "delete SESSION --yes [--db URL]",
  summary = "remove a session: events, snapshots, refs naming it",
  help = [[
Removes SESSION: its events (pending ones are never dispatched), snapshots,
the refs naming it, its lineage record, fence, lease and seal. Its name and
event ids may be used again. There is no undo, so it asks for --yes (exit 2
without it). Prints {"session", "deleted"}: deleted is false when there was
no such session.
]],
  options_help = DB_HELP .. [[
  --yes           really delete
]],
  args = { 1, 1 },
  options = { db = "string", yes = "flag" },
})

command("archive", {
  synopsis = "archive SESSION THROUGH [--db URL] [--archive DIR]",
  summary = "move a session's processed events 1..THROUGH into a segment file",
  help = [[
Moves events of SESSION up to THROUGH that are not archived yet out of the
database into one compressed, checksummed segment file under the archive
directory (docs/contract.md §3.9; docs/retention.md, "Archive"): the file is
written and synced before the rows are dropped, in one step. Reads stay
transparent: `read`, `state` and the engine see archived events as before.
Only processed events may go: a pending or dead event in the range fails it
(INVALID_ARGUMENT, exit 1) and nothing changes. Archiving is idempotent:
with nothing new through THROUGH it writes nothing. Prints the new segment
  {"session", "written": true, "from", "through", "count", "bytes",
   "checksum", "file", "created_at"}
or {"session", "written": false} when there was nothing to archive.
A memory: store needs --archive DIR; sqlite:PATH defaults to PATH.archive.
]],
  options_help = DB_HELP,
  args = { 2, 2 },
  options = { db = "string" },
})

command("segments", {
  synopsis = "segments SESSION [--db URL] [--archive DIR]",
  summary = "list a session's archive segments as NDJSON",
  help = [[
Prints one JSON object per segment file of SESSION, in index order:
  {"session", "from", "through", "count", "bytes", "checksum", "file",
   "created_at"}
("file" is relative to the archive directory). Nothing when none.
]],
  options_help = DB_HELP,
  args = { 1, 1 },
  options = { db = "string" },
})

command("verify-archive", {
  synopsis = "verify-archive [SESSION] [--db URL] [--archive DIR]",
  summary = "re-read every segment file and check its checksum",
  help = [[
Re-reads every segment file (of SESSION, or of every session), recomputes
its checksum and checks its header against what the store recorded. Each
file that is missing, damaged or does not match is named on stderr:
  eventstore: bad segment FILE (session 'S'): PROBLEM
and the exit status is then 1. Files in the archive directory that no
segment names (orphans: left by a crash, cleaned by the next archive of
that session; never read) are printed as notes:
  eventstore: note: orphan FILE: WHY
Prints one summary line on stdout either way:
  {"checked", "problems", "orphans"}
]],
  options_help = DB_HELP,
  args = { 0, 1 },
  options = { db = "string" },
})

command("compact-archive", {
  synopsis = "compact-archive SESSION [--db URL] [--archive DIR]",
  summary = "merge a session's adjacent segment files",
  help = [[
Merges adjacent segment files of SESSION into as few files as the size cap
allows (64 MiB of decoded events each; docs/retention.md), with
compare-and-set on the segment list: if an archive, truncate or delete
changes it meanwhile the merge is built again. Reads give the same events
before and after. Prints {"session", "before", "after"} (segment counts);
nothing to merge: before = after and nothing is written.
]],
  options_help = DB_HELP,
  args = { 1, 1 },
  options = { db = "string" },
})

command("retain", {
  synopsis = "retain [--db URL] [--scripts DIR] [--dry-run]",
  summary = "apply the retention rules of DIR/retention.lua once",
  help = [[
Applies the retention rules of DIR/retention.lua once, now (docs/contract.md
§3.9, docs/retention.md "Retention policies"): for each session the first
rule whose prefix matches decides; events beyond the newest keep_last or
older than max_age_ms are truncated (every reducer of DIR/reducers is
snapshotted first, as truncate --scripts does) or archived, and a delete
rule removes whole sessions whose newest event is older than max_age_ms. A
rule never drops a pending or dead event (it stops below the first one) and
never touches a session with a live lease. Prints one JSON line per action
({"action", "session", "from", "through"}, "stopped_at" and
"stopped_status" when a pending or dead event ended the range, "error" when
the store refused it); nothing to do: nothing printed. Exit 1 when an
action failed (the others are still applied). `run` and `serve` apply the
same rules by themselves, every 60 s of the store's clock (the engine's
retention_every_ms), one engine per store at a time.
]],
  options_help = DB_HELP .. SCRIPTS_HELP .. [[
  --dry-run       print what it would do, change nothing
]],
  args = { 0, 0 },
  options = { db = "string", scripts = "string", ["dry-run"] = "flag" },
})

command("shred", {
  synopsis = "shred KEY --yes [--db URL]",
  summary = "destroy a data key: its sealed payloads become unreadable",
  help = [[
Destroys data key KEY (docs/contract.md §3.10): every payload sealed under it (append
--key KEY) reads from then on as "payload": null, "shredded": true, the
snapshots that folded such events are dropped, and the name can never seal
new data. The events themselves stay. Needs no master key (--keys). There is
no undo, so it asks for --yes (exit 2 without it). Shredding twice is
harmless. Prints {"key", "shredded"}: shredded is true when a live key was
destroyed now, false when it was already shredded or never used (the name is
burned either way). docs/shredding.md says what is and is not guaranteed
(backups made before, copies elsewhere).
]],
  options_help = DB_HELP .. [[
  --yes           really shred
]],
  args = { 1, 1 },
  options = { db = "string", yes = "flag" },
})

command("export", {
  synopsis = "export [--db URL] [--sessions PREFIX] [--out FILE]",
  summary = "write the whole store as NDJSON (docs/moving.md)",
  help = [[
Writes the store (docs/contract.md §10, docs/moving.md): a header line
{"eventstore_export": 2, "backend", "position"}, then every session's rows,
its events with their whole dispatch record and positions, its archived
events (each with its segment's range, read from the segment files),
snapshots,
refs, lineage, fence and lease tokens, seals, truncation, and data keys as
stored (sealed payloads stay ciphertext, keys stay wrapped), ending with an
{"end": {...counts}} line. Two exports of equal stores are byte-identical
apart from the header's backend. Consistent while writers run: one read
transaction per backend (on shards:, one per shard). Presence is not
exported (it is ephemeral).
]],
  options_help = DB_HELP .. [[
  --sessions PREFIX  only the sessions whose names start with PREFIX
  --out FILE      write to FILE (default: stdout)
]],
  args = { 0, 0 },
  options = { db = "string", sessions = "string", out = "string" },
})

command("import", {
  synopsis = "import [--db URL] [--in FILE]",
  summary = "recreate an exported store in an empty store",
  help = [[
Reads an export (eventstore export; default: stdin) and recreates the store
in the empty store --db: ids, positions, dispatch records, tokens, seals,
snapshots, refs and wrapped keys as they were (--keys: the source's master
key file), archived events as the same segments (--archive DIR: a memory:
or postgres:// store needs one when the export has archived events; else
exit 1, nothing written). A non-empty store, a newer format, or a stream cut short (no end
line): exit 1, nothing written. The whole import is one transaction (on
shards:, one per shard), so an import killed halfway wrote nothing there,
and a rerun ends with the same store; a rerun on a finished import changes
nothing (exit 0). Prints {"imported", "sessions", "events", "position"}
(imported false: the store already held this export).
]],
  options_help = DB_HELP .. [[
  --in FILE       read from FILE (default: stdin)
]],
  args = { 0, 0 },
  options = { db = "string", ["in"] = "string" },
})

command("copy", {
  synopsis = "copy --from URL --to URL [--sessions PREFIX] [--keys PATH] [--follow]",
  summary = "copy a store into an empty one, optionally following it",
  help = [[
Copies the store --from into the empty store --to, as export then import
would. With --follow it then keeps copying: the events appended after the
cut (by position), their sessions' rows and keys, as they come, until
SIGINT or SIGTERM; then a last full pass brings every dispatch record,
snapshot and ref up to date, and it exits 0. docs/moving.md is the runbook
(copy --follow, fence the old store, let it drain, stop the copy, switch
the URL). Prints {"copied", "events", "position"} at the end.
]],
  options_help = [[
  --from URL      the store to copy (any URL --db takes)
  --to URL        the empty store to copy into
  --sessions PREFIX  only the sessions whose names start with PREFIX
  --keys PATH     the master key file, opened on both sides
  --follow        keep copying new events until SIGINT or SIGTERM
]],
  args = { 0, 0 },
  options = { from = "string", to = "string", sessions = "string", keys = "string", follow = "flag" },
})

command("backup", {
  synopsis = "backup --to FILE [--db sqlite:PATH]",
  summary = "copy a sqlite: store into a new, verified file",
  help = [[
Copies the sqlite: store into the new file FILE with SQLite's online
backup API: consistent while an engine or another process writes. Then
checks the copy: SQLite's integrity check, and its counts (sessions and
events as the store's counters say) against its rows. Prints {"backup",
"integrity", "sessions", "events"}. The master key file (--keys) is not in
the database: back it up apart (docs/moving.md "Backups"). For postgres://
use pg_basebackup or pg_dump of the store's schema.
]],
  options_help = DB_HELP .. [[
  --to FILE       the backup file to create (must not exist)
]],
  args = { 0, 0 },
  options = { db = "string", to = "string" },
})

command("stats", {
  synopsis = "stats [--json] [--db URL]",
  summary = "print the store's counts and call statistics",
  help = [[
Prints the store's counts (docs/stats.md): sessions, events (readable ones:
live and archived), pending (not processed, not dead) and dead (dead
letters), read from counters the store keeps (no walk over the sessions),
then the calls this process made on the store, one line per call name with
count, errors and latency percentiles in microseconds (p50, p99, max). A
fresh process has made none: the call figures are a live process's (a
program's store:stats(), an engine's engine:stats()). With --tenant, the
tenant's counts. With --json, one JSON object:
  {"sessions", "events", "pending", "dead",
   "calls": {"<call>": {"count", "errors", "p50_us", "p99_us", "max_us"}}}
]],
  options_help = DB_HELP .. [[
  --json          print one JSON object
]],
  args = { 0, 0 },
  options = { db = "string", json = "flag" },
})

command("projection", {
  synopsis = "projection list | state NAME KEY | keys NAME [--prefix P] [--after KEY] [--limit N] | rebuild NAME | retry NAME | skip NAME [--db URL]",
  summary = "show projections and their states; rebuild, retry or skip one",
  help = [[
Projections are folds of the whole store into keyed states, kept up to
date by the engine (docs/projections.md).
  list          one JSON object per projection: {"name", "version",
                "position", "head", "lag", "lag_ms", "status", "error",
                "error_position", "error_id", "generation", "rebuilding",
                "skipped", "holder"}
  state NAME KEY  the live generation's state of KEY as JSON, or null
                (exit 1) when it has none
  keys NAME     its keys, one a line, in byte order
  rebuild NAME  build a new generation from the first position; the live
                one answers reads until the new one has caught up
  retry NAME    a failed projection folds the event it stopped at again
  skip NAME     a failed projection records that event as skipped and
                goes on
rebuild, retry and skip print the projection's record as JSON and take
effect at the engine's next pass (an engine that runs it: `eventstore run`
or `serve`). With --tenant, state and keys read that tenant's keys only;
rebuild, retry and skip need the root handle.
]],
  options_help = DB_HELP .. [[
  --prefix P      keys: only keys starting with P
  --after KEY     keys: start after this key (to page)
  --limit N       keys: print at most N keys
]],
  args = { 1, 3 },
  options = { db = "string", prefix = "string", after = "string", limit = { int = 1 } },
})

command("replay", {
  synopsis = "replay --scripts NEW [--baseline OLD [--reducers-only]] [--sessions PREFIX] [--limit N] [--format text|ndjson|html] [--out FILE] [--db URL]",
  summary = "run changed scripts over the store's history and show what differs",
  help = [[
Replays each session's outside inputs (events without a cause) through the
scripts NEW on a scratch in-memory store whose clock is set to each input's
time, timers and retries firing in virtual time (docs/replay.md), and
compares with the session as stored, or with the same replay of the
scripts OLD (--baseline). The store is only read (sqlite: opened
?mode=ro). Per session: identical, diverged (the first divergence: index,
baseline and replayed event; each reducer's state diff by JSON path) or
failed (a script over a budget, a reducer that raised); then a summary.
Text prints the sessions that are not identical and the summary; NDJSON
one object per session and a last {"summary": ...} line; HTML one
self-contained page (the summary, a table of the sessions that are not
identical, each divergence side by side). With --reducers-only no handler
runs: each session's stored events are folded with OLD's reducers and
NEW's, and the states compared. On a terminal, progress on stderr. Exit 0 when every session is identical, 1 when one
diverged or failed, 2 on an error (usable as a CI gate).
]],
  options_help = DB_HELP .. [[
  --scripts NEW   the scripts under test (required)
  --baseline OLD  compare with a replay of these scripts, not with history
  --sessions P    only sessions whose name starts with P
  --limit N       at most N sessions
  --reducers-only fold the stored events with OLD's and NEW's reducers
                  and compare the states, running no handler (needs
                  --baseline)
  --format F      text (default), ndjson or html
  --out FILE      write the report to FILE instead of stdout
]],
  args = { 0, 0 },
  options = {
    db = "string", scripts = "string", baseline = "string", sessions = "string",
    limit = { int = 1 }, format = "string", out = "string", ["reducers-only"] = "flag",
  },
})

-- ---- serve and token (docs/http.md) --------------------------------------

local DEFAULT_LISTEN = "127.0.0.1:8080"

command("serve", {
  synopsis = "serve --tokens FILE [--db URL] [--scripts DIR] [--listen ADDR] [--tls-cert FILE --tls-key FILE] [--no-engine] [--static DIR] [limits]",
  store_help = STORE_HELP_COMMON
    .. "  --tenant NAME   not taken: each token names its tenant (a usage error)\n",
  summary = "serve the store over HTTP (JSON API, live tails, metrics, inspector)",
  help = [[
Serves the store over HTTP/1.1 (docs/http.md): the JSON API, Server-Sent
Events live tails, /metrics, /healthz and the browser inspector at /.
Requests need a bearer token from the tokens file, one token a line:
  TOKEN TENANT RIGHTS
TOKEN is sha256:<hex> (what `eventstore token hash TOKEN` prints; `token new`
makes a token and its line) or the token in plain text (warned about);
TENANT a tenant name or * (every tenant); RIGHTS a comma list of read,
append, work, admin (admin implies the others).
The engine runs beside the server (handlers of the scripts directory), until
SIGINT or SIGTERM (exit 0); with --no-engine it does not, but the scripts
directory's reducers still answer state requests when it exists. Once the
socket listens, prints one line to stdout:
  listening on http://HOST:PORT
(https:// with --tls-cert and --tls-key: HTTPS only, plain HTTP is refused).
]],
  options_help = DB_HELP .. SCRIPTS_HELP .. [[
  --listen ADDR   HOST:PORT, [IPV6]:PORT or :PORT (every IPv4 address);
                  port 0 picks a free one (default ]] .. DEFAULT_LISTEN .. [[)
  --tokens FILE   the tokens file (required)
  --tls-cert FILE         serve HTTPS only, with this PEM certificate (the
                          server's first, then its chain); needs --tls-key
  --tls-key FILE          that certificate's unencrypted PEM private key
  --no-engine     do not run handlers here (remote workers claim through
                  the API); the scripts directory may then be missing
  --static DIR    the inspector's files (default: the ones installed with
                  the binary)
  --workers N     engine worker threads, 1 to 256 (default 1)
  --fold-runners N  threads that fold reducers for state requests, in
                  parallel, 1 to 256 (default: the cores, at least 2)
  --retention-every-ms MS  with DIR/retention.lua: how often (store clock)
                  its rules are applied, 1 to 31536000000 (default 60000;
                  docs/retention.md)
  --max-body BYTES        largest request body (default 16777216)
  --max-batch N           most events in one append or complete (default 1000)
  --max-connections N     open connections at once (default 256)
  --request-timeout S     close a connection idle this long, mid-request
                          or between requests (default 30)
  --header-timeout-ms MS  close a connection whose request headers have not
                          all come this long after its accept (default 10000)
  --max-per-client N      open connections from one address (default half
                          of --max-connections)
  --max-streams N         open live tails at once (default 128)
  --max-response-bytes BYTES  a listing's page ends before the item that
                          would take its answer past this, marked
                          "capped" (default 8388608; one item always)
]],
  args = { 0, 0 },
  options = {
    db = "string", scripts = "string", listen = "string", tokens = "string",
    ["tls-cert"] = "string", ["tls-key"] = "string", ["no-engine"] = "flag", static = "string", workers = { int = 1, max = MAX_WORKERS },
    ["fold-runners"] = { int = 1, max = MAX_WORKERS }, ["retention-every-ms"] = RETENTION_EVERY,
    ["max-body"] = { int = 1, max = 1 << 40 }, ["max-batch"] = { int = 1, max = 1000000 },
    ["max-connections"] = { int = 1, max = 100000 }, ["request-timeout"] = { int = 1, max = 86400 },
    ["max-streams"] = { int = 1, max = 100000 },
    ["header-timeout-ms"] = { int = 1, max = 86400000 }, ["max-per-client"] = { int = 1, max = 100000 },
    ["max-response-bytes"] = { int = 1, max = 1 << 40 },
  },
})

command("token", {
  synopsis = "token hash TOKEN | token new TENANT RIGHTS",
  summary = "make bearer tokens for serve's tokens file",
  help = [[
token hash TOKEN: prints the tokens-file form of TOKEN, sha256:<64 hex>
(its SHA-256), for a line `sha256:... TENANT RIGHTS`: the file then holds no
usable secret.
token new TENANT RIGHTS: prints a fresh random token (32 random bytes as 64
hex digits) on the first line, for the client, and on the second the line
to add to the tokens file:
  sha256:<hex> TENANT RIGHTS
TENANT is a tenant name or * (every tenant), RIGHTS a comma list of read,
append, work, admin. The token itself is printed once and kept nowhere.
]],
  args = { 0, 3 },
  options = {},
})

command("help", {
  synopsis = "help [COMMAND]",
  summary = "print help (also: COMMAND --help)",
  help = "Prints the list of commands, or the help of COMMAND.\n",
  args = { 0, 1 },
  options = {},
})

-- ---- help -----------------------------------------------------------------

-- The exit codes (docs/cli.md "Exit codes and errors" and the man page's
-- EXIT STATUS say the same; spec/71 compares them).
local EXIT_STATUS = {
  { 0, "done (also run or serve stopped by SIGINT or SIGTERM, and --help)" },
  { 1, "a runtime error: the store failed or refused, a script does not load, ...;"
    .. " replay: a session diverged or failed" },
  { 2, "a usage error: unknown command or option, a bad argument; replay: an error" },
  { 3, "run --until-done dead-lettered events (the summary says how many)" },
}

local function global_usage()
  local lines = {
    ("usage: %s COMMAND [ARGS] [OPTIONS]"):format(PROG),
    "",
    "commands:",
  }
  local width = 10 -- the longest command name sets the column
  for _, name in ipairs(order) do width = math.max(width, #name) end
  for _, name in ipairs(order) do
    lines[#lines + 1] = ("  %-" .. width .. "s %s"):format(name, commands[name].summary)
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "exit status:"
  for _, e in ipairs(EXIT_STATUS) do lines[#lines + 1] = ("  %d: %s"):format(e[1], e[2]) end
  lines[#lines + 1] = ""
  lines[#lines + 1] = ("Run '%s COMMAND --help' for a command's options; '%s --version' for the version.")
    :format(PROG, PROG)
  return table.concat(lines, "\n") .. "\n"
end

local function command_help(def)
  local store = def.options.db and (def.store_help or STORE_HELP) or ""
  return ("usage: %s %s\n\n%s\noptions:\n%s%s%s"):format(PROG, def.synopsis, def.help,
    def.options_help or "", store, HELP_HELP)
end

-- ---- parsing --------------------------------------------------------------

local function looks_like_option(a)
  return a:match("^%-%a") ~= nil or a:match("^%-%-%a") ~= nil
end

-- The names of a command's positional arguments, from its synopsis
-- ("fork FROM AT TO [--db URL]": FROM, AT, TO; up to a "|").
local function arg_names(def)
  local names = {}
  -- "projection list | state NAME KEY | ...": the first argument is a
  -- subcommand, named so when it is missing
  local second = def.synopsis:match("^%S+%s+(%S+)")
  if second and second:match("^[a-z]") then names[1] = "SUBCOMMAND" end
  for word in def.synopsis:gmatch("%S+") do
    if word == "|" then break end
    local n = word:gsub("[%[%]]", "")
    if n:match("^[A-Z]+$") then names[#names + 1] = n end
  end
  return names
end

-- Parses argv[i..] for command def: returns opts (option values, plus
-- opts.help) and the positional arguments. Raises Usage.
local function parse(def, argv, i)
  local name = def.name
  local o, args = {}, {}
  local only_args = false
  -- The first usage error met among the options, raised after them unless
  -- --help came too (docs/cli.md: it wins over any other argument).
  local bad
  local function later(fmt, ...)
    if not bad then bad = table.pack(fmt, ...) end
  end
  while i <= #argv do
    local a = argv[i]
    if only_args or not looks_like_option(a) then
      if a == "--" and not only_args then
        only_args = true
      else
        args[#args + 1] = a
      end
    elseif a == "-h" or a == "--help" then
      o.help = true
    else
      local key, value = a:match("^%-%-([^=]+)=(.*)$")
      key = key or a:match("^%-%-(.+)$")
      local kind = key and (def.options[key] or (def.options.db and STORE_OPTIONS[key]))
      if kind == nil then
        later("%s: unknown option '%s'", name, a)
      elseif kind == "flag" then
        if value ~= nil then later("%s: option --%s takes no value", name, key) end
        o[key] = true
      else
        -- only an argument that does not look like an option is a value:
        -- `--after --help` is --after without one, and help
        if value == nil and argv[i + 1] ~= nil and not looks_like_option(argv[i + 1]) then
          i = i + 1
          value = argv[i]
        end
        if value == nil then later("%s: option --%s needs a value", name, key) end
        o[key] = value -- numbers are checked below, so --help still wins
      end
    end
    i = i + 1
  end
  if o.help then return o, args end
  if bad then usage_error(name, true, table.unpack(bad, 1, bad.n)) end
  for key, kind in pairs(def.options) do
    if type(kind) == "table" and o[key] ~= nil then
      o[key] = parse_int(name, "--" .. key, o[key], kind.int, kind.max)
    end
  end
  local min, max = def.args[1], def.args[2]
  if #args < min then
    local missing = {}
    for j = #args + 1, min do missing[#missing + 1] = arg_names(def)[j] end
    usage_error(name, true, "%s: missing argument%s %s", name, min - #args > 1 and "s" or "",
      table.concat(missing, ", "))
  elseif #args > max then
    usage_error(name, true, "%s: unexpected argument '%s'", name, args[max + 1])
  end
  o.db = o.db or DEFAULT_DB
  return o, args
end

-- ---- command bodies -------------------------------------------------------

-- Builds an engine on an open store (the engine leaves it open).
local function new_engine(store, dir, extra)
  need_engine()
  local opts = { store = store, scripts = dir }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return eventstore.engine(opts)
end

-- The pending events of the whole store (for run's summary and progress
-- line), and how many of them are of types `engine` has no handler for
-- (store:pending_types: one row per type, not a walk over the sessions).
local function count_pending(store, engine)
  local total, unhandled = 0, 0
  for event_type, n in pairs(store:pending_types()) do
    total = total + n
    if engine and not engine:has_handler(event_type) then unhandled = unhandled + n end
  end
  return total, unhandled
end

function commands.run.check(o)
  if o["until-idle"] and o["until-done"] then
    usage_error("run", true, "run: --until-idle and --until-done exclude each other")
  end
  if o.deadline ~= nil and not o["until-done"] then
    usage_error("run", true, "run: --deadline needs --until-done")
  end
end

-- When the next pending event becomes ready by time alone, for run
-- --until-done: walks the sessions that have pending events (only those)
-- and their events. An event's ready time is the latest of its not_before
-- (a timer), retry_at (a backoff) and claim_expires_at (another holder's
-- claim). Pending events already ready are not counted: after a run until
-- idle, nothing here took them (no handler here), and time will not
-- change that. Returns the earliest ready time (nil: none), how many
-- events wait for a time, and the first of them.
local function next_wake(store, now)
  local wake, waiting, first = nil, 0, nil
  local after
  repeat
    local page = store:sessions({ after = after, limit = PAGE })
    for _, s in ipairs(page.sessions) do
      if (s.pending or 0) > 0 then
        local from = 0
        while true do
          local events = store:read(s.session, { after = from, limit = READ_PAGE })
          for _, e in ipairs(events) do
            if e.status == "pending" then
              local t = math.max(e.not_before or 0, e.retry_at or 0, e.claim_expires_at or 0)
              if t > now then
                waiting = waiting + 1
                if wake == nil or t < wake then wake, first = t, e end
              end
            end
          end
          if #events < READ_PAGE then break end
          from = events[#events].index
        end
      end
    end
    after = page.cursor
  until after == nil
  return wake, waiting, first
end

-- fn(...) with a store outage ridden out as the engine rides out its own
-- (docs/cli.md "run", docs/engine.md "When the store fails"): a call that
-- fails with STORAGE is tried again, after 50 ms doubling up to 2 s, until
-- it answers or has failed for OUTAGE_MS; one line when the store begins
-- failing, one when it answers again. `what` names the call in that line;
-- stopped() (a signal) gives the call up. For run's own store calls around
-- the engine's runs (the clock, the look for the next timer, the wait, the
-- summary's count): without it a run that rode a restart out in the engine
-- ended with exit 1 on its summary's count when the server went down.
local function ride_out(what, stopped, fn, ...)
  local first, wait
  while true do
    local r = table.pack(pcall(fn, ...))
    if r[1] then
      if first then
        io.stderr:write(("%s: the store answers again (it failed for %d ms)\n"):format(PROG, tty.now_ms() - first))
      end
      return table.unpack(r, 2, r.n)
    end
    local err = r[2]
    -- Without the binary's clock and sleep (a plain lua5.4) nothing waits.
    if not (tty and eventstore.is_error(err, "STORAGE")) then error(err, 0) end
    local now = tty.now_ms()
    if not first then
      first, wait = now, 50
      io.stderr:write(("%s: %s failed: %s; retrying with backoff until the store answers\n")
        :format(PROG, what, (tostring(err):gsub("[\n\t]", " "))))
    end
    local left = first + OUTAGE_MS - now
    if left <= 0 or stopped() then error(err, 0) end
    tty.sleep_ms(math.min(wait, left))
    wait = math.min(wait * 2, OUTAGE_WAIT_MAX_MS)
  end
end

function commands.run.run(o)
  local dir = scripts_dir(o, true)
  need_engine()
  local store <close> = open_store(o, true)
  local until_done = o["until-done"] == true
  local now_ms = (tty and tty.now_ms) or function() return store:now() end

  -- Totals over the engine runs (--until-done runs it until idle, again
  -- after each wait).
  local total = { handled = 0, failed = 0, dead = 0 }

  -- The progress line: engine:run calls `progress` on this thread every
  -- SIGNAL_POLL_MS with {handled, failed, dead, busy} of that run; pending
  -- is the store's own count (store:stats(), O(1), never a walk), reread
  -- at most every PENDING_EVERY_MS. On a terminal the line is redrawn in place with \r
  -- every PROGRESS_EVERY_MS and cleared before the summary; otherwise, with
  -- --progress, it is logged as a plain line every PROGRESS_LOG_EVERY_MS.
  local on_tty = tty ~= nil and tty.isatty(2)
  local draw = on_tty or o.progress == true
  local drawn = false
  local pending, unhandled, counted, typed, shown = 0, 0, nil, nil, nil
  local engine
  local function show(stats)
    if not draw then return end
    local now = now_ms()
    if shown and now - shown < (on_tty and PROGRESS_EVERY_MS or PROGRESS_LOG_EVERY_MS) then return end
    shown = now
    if counted == nil or now - counted >= PENDING_EVERY_MS then
      -- A store that fails now (a database restarting) keeps the last
      -- figures: the engine rides the outage out, the progress line must
      -- not end the run.
      local ok, st = pcall(store.stats, store)
      if ok then pending = st.pending end
      counted = now
    end
    -- "N without a handler here" needs the pending counts by type, which
    -- the store counts from its index by type: less often.
    if typed == nil or now - typed >= UNHANDLED_EVERY_MS then
      local ok, _, u = pcall(count_pending, store, engine)
      if ok then unhandled = u end
      typed = now
    end
    local line = ("handled %d, failed %d, dead %d, pending %d"):format(total.handled + (stats.handled or 0),
      total.failed + (stats.failed or 0), total.dead + (stats.dead or 0), pending)
    if unhandled > 0 then line = line .. (", %d without a handler here"):format(unhandled) end
    if on_tty then
      io.stderr:write("\r\27[K", line)
      drawn = true
    else
      io.stderr:write(PROG, ": progress: ", line, "\n")
    end
    io.stderr:flush()
  end

  engine = new_engine(store, dir, { workers = o.workers, holder = o.holder, ttl_ms = o["ttl-ms"],
    retention_every_ms = o["retention-every-ms"] })
  -- SIGINT/SIGTERM (counted by the binary, which owns signals) stop the
  -- engine: running handlers are interrupted and retried later.
  local stopping = false
  local function poll_signals(busy)
    if not stopping and tty and tty.signals and tty.signals() ~= 0 then
      stopping = true
      engine:stop()
      if drawn then io.stderr:write("\r\27[K") drawn = false end
      busy = busy or 0
      if busy > 0 then
        io.stderr:write(("stopping: interrupting %d running handler%s (press Ctrl-C again to quit now)\n")
          :format(busy, busy == 1 and "" or "s"))
        io.stderr:flush()
      end
    end
    return stopping
  end
  local function progress(stats)
    if not poll_signals(stats.busy) then show(stats) end
  end
  if tty and tty.watch_signals then tty.watch_signals() end

  -- run's own store calls ride an outage out as the engine's do.
  local function stopped() return poll_signals(0) end
  local function clock() return ride_out("reading the store's clock", stopped, store.now, store) end
  local deadline_at = clock() + (o.deadline or DEFAULT_DEADLINE_S) * 1000
  local overdue -- {waiting, first, wake}: --until-done could not finish in time
  while true do
    local stats = engine:run({
      until_idle = o["until-idle"] == true or until_done,
      progress = progress,
      progress_ms = SIGNAL_POLL_MS,
    }) or {}
    for k in pairs(total) do total[k] = total[k] + (stats[k] or 0) end
    if not until_done or stopping then break end
    local now = clock()
    local wake, waiting, first = ride_out("looking for the next timer", stopped, next_wake, store, now)
    if wake == nil then break end
    if wake > deadline_at then
      overdue = { waiting = waiting, first = first, wake = wake, now = now }
      break
    end
    -- Sleep until the next event is due, polling signals (store:wait
    -- after the last possible position is a plain sleep on the store).
    while not poll_signals(0) do
      local left = wake - clock()
      if left <= 0 then break end
      ride_out("waiting", stopped, store.wait, store, nil, math.maxinteger, math.min(left, SIGNAL_POLL_MS))
      show({})
    end
    if stopping then break end
  end
  engine:close()
  if drawn then io.stderr:write("\r\27[K") io.stderr:flush() end
  -- The summary's count; the line is printed whatever comes of it (after a
  -- stop the count is not waited for; the engine is closed: no poll_signals).
  local function signalled() return stopping or (tty.signals ~= nil and tty.signals() ~= 0) end
  local ok, st = pcall(ride_out, "counting pending events", signalled, store.stats, store)
  out(("handled %d, failed %d, dead %d, pending %s"):format(
    total.handled, total.failed, total.dead, ok and tostring(st.pending) or "unknown"))
  if not ok then error(st, 0) end
  if overdue then
    local e = overdue.first
    fail("run --until-done: %d pending event%s will not be ready before the deadline (--deadline %d s); "
      .. "the next: session '%s' #%d (%s), ready in %d s", overdue.waiting, overdue.waiting == 1 and "" or "s",
      o.deadline or DEFAULT_DEADLINE_S, printable(e.session), e.index, printable(e.type),
      (overdue.wake - overdue.now + 999) // 1000)
  end
  -- docs/contract.md §4: a script running --until-done can tell that work was
  -- dead-lettered (the summary line says how much).
  if until_done and total.dead > 0 then return 3 end
  return 0
end

local LINE_FIELDS = { type = true, payload = true, id = true, lane = true, key = true, revision = true, meta = true }
local MAX_REVISION = 2147483647
-- §3.1: an event's meta is at most 8 KiB of canonical JSON (the store's
-- rule, docs/limits.md), checked here too so that --meta is a usage error
-- and a line's names its line, before the store is opened.
local MAX_META_BYTES = 8192

-- Whether v is a decoded JSON object (a table without the array mark).
local function is_object(v)
  local array_mt = getmetatable(json.array({}))
  return type(v) == "table" and (array_mt == nil or getmetatable(v) ~= array_mt)
end

-- Checks one stdin line; returns the event or raises "stdin line N: why".
local function parse_line(n, text)
  local ok, v = pcall(json.decode, text)
  if not ok then
    fail("stdin line %d: invalid JSON: %s", n, type(v) == "table" and tostring(v.message) or tostring(v))
  end
  if not is_object(v) then
    fail("stdin line %d: expected a JSON object {\"type\": ..., \"payload\": ...}", n)
  end
  for k in pairs(v) do
    if not LINE_FIELDS[k] then
      fail("stdin line %d: unknown field '%s' (expected type, payload, id, lane, key, revision, meta)", n,
        tostring(k))
    end
  end
  if v.revision ~= nil and (math.type(v.revision) ~= "integer" or v.revision < 1 or v.revision > MAX_REVISION) then
    fail("stdin line %d: \"revision\" must be a whole number from 1 to %d", n, MAX_REVISION)
  end
  if v.meta == json.null then v.meta = nil end
  if v.meta ~= nil and not is_object(v.meta) then
    fail("stdin line %d: \"meta\" must be a JSON object", n)
  end
  if v.meta ~= nil and #json.encode(v.meta) > MAX_META_BYTES then
    fail("stdin line %d: \"meta\" is over %d bytes of JSON", n, MAX_META_BYTES)
  end
  if type(v.type) ~= "string" or v.type == "" then
    fail("stdin line %d: \"type\" must be a non-empty string", n)
  end
  for _, f in ipairs({ "id", "lane", "key" }) do
    if v[f] ~= nil and type(v[f]) ~= "string" then
      fail("stdin line %d: \"%s\" must be a string", n, f)
    end
  end
  return { type = v.type, payload = v.payload, id = v.id, lane = v.lane, key = v.key, revision = v.revision,
    meta = v.meta }
end

function commands.append.check(o, args)
  if #args == 1 then
    if o.id or o.lane then
      usage_error("append", true, "append: --id and --lane need TYPE (stdin lines carry their own)")
    elseif o.key then
      usage_error("append", true, "append: --key needs TYPE (stdin lines carry their own \"key\")")
    elseif o.revision or o.meta then
      usage_error("append", true, "append: --revision and --meta need TYPE (stdin lines carry their own)")
    end
  elseif args[3] ~= nil then
    local ok, v = pcall(json.decode, args[3])
    if not ok then
      usage_error("append", false, "append: invalid JSON payload: %s",
        type(v) == "table" and tostring(v.message) or tostring(v))
    end
    o.payload = v
  end
  if o.meta then
    local ok, v = pcall(json.decode, o.meta)
    if not ok or not is_object(v) then
      usage_error("append", false, "append: --meta expects a JSON object, got '%s'", o.meta)
    end
    if #json.encode(v) > MAX_META_BYTES then
      usage_error("append", false, "append: --meta is over %d bytes of JSON", MAX_META_BYTES)
    end
    o.meta = v
  end
end

function commands.append.run(o, args)
  local session = args[1]
  local events
  if #args == 1 then
    -- Every line is checked before the store is even opened. A user at a
    -- terminal is told what the command is waiting for.
    if tty and tty.isatty(0) then
      io.stderr:write(PROG, ": reading NDJSON events from stdin, Ctrl-D to end\n")
      io.stderr:flush()
    end
    events = {}
    local n = 0
    for line in io.stdin:lines() do
      n = n + 1
      line = line:gsub("\r$", "")
      if line:match("%S") then events[#events + 1] = parse_line(n, line) end
    end
  else
    events = { { type = args[2], payload = o.payload, id = o.id, lane = o.lane, key = o.key, revision = o.revision,
      meta = o.meta } }
  end
  -- Only an explicit --scripts: a ./scripts that belongs to another app
  -- must not decide that this app's events need no handling (docs/contract.md §4).
  local dir = o.scripts ~= nil and scripts_dir(o, true) or nil
  local store <close> = open_store(o, true)
  local stored
  if dir ~= nil then
    need_engine()
    local engine = new_engine(store, dir)
    stored = engine:append(session, events)
    engine:close()
  else
    stored = store:append(session, events)
  end
  print_events(stored)
  return 0
end

local BATCH_FIELDS = { session = true, events = true, expected = true }

-- Checks one append-many line; returns the batch or raises "stdin line N: why".
local function parse_batch_line(n, text)
  local ok, v = pcall(json.decode, text)
  if not ok then
    fail("stdin line %d: invalid JSON: %s", n, type(v) == "table" and tostring(v.message) or tostring(v))
  end
  local array_mt = getmetatable(json.array({}))
  local function is_array(x) return array_mt ~= nil and getmetatable(x) == array_mt end
  if type(v) ~= "table" or is_array(v) then
    fail("stdin line %d: expected a JSON object {\"session\": ..., \"events\": [...]}", n)
  end
  for k in pairs(v) do
    if not BATCH_FIELDS[k] then
      fail("stdin line %d: unknown field '%s' (expected session, events, expected)", n, tostring(k))
    end
  end
  if type(v.session) ~= "string" or v.session == "" then
    fail("stdin line %d: \"session\" must be a non-empty string", n)
  end
  if type(v.events) ~= "table" or (next(v.events) ~= nil and not is_array(v.events)) then
    fail("stdin line %d: \"events\" must be an array of events", n)
  end
  if v.expected ~= nil and (math.type(v.expected) ~= "integer" or v.expected < 0) then
    fail("stdin line %d: \"expected\" must be an integer >= 0", n)
  end
  -- each event by append's rule for one stdin line, so both take the same fields
  local events = {}
  for i, e in ipairs(v.events) do
    local ok_e, ev = pcall(parse_line, n, type(e) == "table" and json.encode(e) or "[]")
    if not ok_e then
      local why = tostring(type(ev) == "table" and ev.message or ev):gsub("^stdin line %d+: ", "")
      fail("stdin line %d: events[%d]: %s", n, i, why)
    end
    events[i] = ev
  end
  return { session = v.session, events = events, opts = { expected = v.expected } }
end

commands["append-many"].run = function(o)
  if tty and tty.isatty(0) then
    io.stderr:write(PROG, ": reading NDJSON batches from stdin, Ctrl-D to end\n")
    io.stderr:flush()
  end
  local batches, lines = {}, {}
  local n = 0
  for line in io.stdin:lines() do
    n = n + 1
    line = line:gsub("\r$", "")
    if line:match("%S") then
      batches[#batches + 1] = parse_batch_line(n, line)
      lines[#batches] = n
    end
  end
  local store <close> = open_store(o, true)
  local ok, res = pcall(store.append_many, store, batches)
  if not ok then
    -- the store names the batch; the user wrote lines
    local e = res
    if eventstore.is_error(e) then
      local i = tonumber(tostring(e.message):match("^batches%[(%d+)%]"))
      if i and lines[i] then
        local rest = tostring(e.message):gsub("^batches%[%d+%]", "")
        fail("%s: stdin line %d%s%s", e.code, lines[i], rest:match("^[:%s]") and "" or " ", rest)
      end
    end
    error(e, 0)
  end
  for _, r in ipairs(res) do print_events(r.events) end
  return 0
end

function commands.read.check(o)
  if o.follow and o["at-rest"] then
    usage_error("read", true, "read: --follow and --at-rest exclude each other")
  end
end

function commands.read.run(o, args)
  local session = args[1]
  local store <close> = open_store(o, false)
  local read = o["at-rest"] and store.read_at_rest or store.read
  local left = o.limit
  local after = o.after or 0
  if o.follow then
    io.stdout:setvbuf("line") -- each event shows up as it comes
    for e in store:stream(session, { after = after }) do
      out(event_json(e))
      if left ~= nil then
        left = left - 1
        if left == 0 then break end
      end
    end
    return 0
  end
  while true do
    local n = left ~= nil and math.min(left, READ_PAGE) or READ_PAGE
    if n == 0 then break end
    local page = read(store, session, { after = after, limit = n })
    print_events(page)
    if #page > 0 then after = page[#page].index end
    if left ~= nil then left = left - #page end
    if #page < n then break end
  end
  return 0
end

function commands.state.run(o, args)
  local session, reducer = args[1], args[2]
  local dir = scripts_dir(o, true)
  need_engine()
  local store <close> = open_store(o, false)
  local engine = new_engine(store, dir)
  local state = engine:state(session, reducer, { at = o.at })
  engine:close()
  local ok, text = pcall(json.encode, state)
  if not ok then
    fail("the state of reducer '%s' cannot be printed as JSON: %s", reducer,
      type(text) == "table" and tostring(text.message) or tostring(text))
  end
  out(text)
  return 0
end

function commands.stats.run(o)
  local store <close> = open_store(o, false)
  local st = store:stats()
  -- §8: each projection's lag (events and ms behind the head)
  local projections = {}
  for _, r in ipairs(require("eventstore.projections").rows(store)) do
    projections[r.name] = { lag = r.lag, lag_ms = r.lag_ms, status = r.status, position = r.position }
  end
  if o.json then
    out(json.encode({ sessions = st.sessions, events = st.events, pending = st.pending, dead = st.dead,
      calls = st.calls, projections = next(projections) and projections or nil }))
    return 0
  end
  out(("sessions %d\nevents %d\npending %d\ndead %d"):format(st.sessions, st.events, st.pending, st.dead))
  local pnames = {}
  for name in pairs(projections) do pnames[#pnames + 1] = name end
  table.sort(pnames)
  for _, name in ipairs(pnames) do
    local r = projections[name]
    out(("projection %s %s lag %d lag_ms %d"):format(name, r.status, r.lag, r.lag_ms))
  end
  local names = {}
  for name in pairs(st.calls) do names[#names + 1] = name end
  table.sort(names)
  if #names > 0 then
    out(("%-16s %10s %8s %10s %10s %10s"):format("call", "count", "errors", "p50_us", "p99_us", "max_us"))
    for _, name in ipairs(names) do
      local c = st.calls[name]
      out(("%-16s %10d %8d %10.1f %10.1f %10.1f"):format(name, c.count, c.errors, c.p50_us, c.p99_us, c.max_us))
    end
  end
  return 0
end

-- projection SUBCOMMAND: how many arguments each takes after its name.
local PROJECTION_ARGS = { list = 0, state = 2, keys = 1, rebuild = 1, retry = 1, skip = 1 }

function commands.projection.check(o, args)
  local want = PROJECTION_ARGS[args[1]]
  if want == nil then
    usage_error("projection", true,
      "projection: expected list, state, keys, rebuild, retry or skip, got '%s'", args[1])
  end
  if #args - 1 ~= want then
    usage_error("projection", true, "projection %s: expected %d argument%s, got %d", args[1], want,
      want == 1 and "" or "s", #args - 1)
  end
end

function commands.projection.run(o, args)
  local store <close> = open_store(o, false)
  local sub, name = args[1], args[2]
  if sub == "list" then
    for _, r in ipairs(require("eventstore.projections").rows(store)) do out(row_json(r)) end
  elseif sub == "state" then
    local state = store:projection(name, args[3])
    out(json.encode(state == nil and json.null or state))
    if state == nil then return 1 end
  elseif sub == "keys" then
    local left, after = o.limit, o.after
    repeat
      local n = left ~= nil and math.min(left, PAGE) or PAGE
      local page = store:projection_keys(name, { prefix = o.prefix, after = after, limit = n })
      for _, k in ipairs(page.keys) do out(k) end
      if left ~= nil then left = left - #page.keys end
      after = page.cursor
    until after == nil or left == 0
  else
    out(row_json(store:projection_control(name, sub)))
  end
  return 0
end

local REPLAY_FORMATS = { text = true, ndjson = true, html = true }

function commands.replay.check(o)
  if o.scripts == nil then usage_error("replay", true, "replay: --scripts NEW is required") end
  if o.format ~= nil and not REPLAY_FORMATS[o.format] then
    usage_error("replay", false, "replay: --format expects text, ndjson or html, got '%s'", o.format)
  end
  if o["reducers-only"] and o.baseline == nil then
    usage_error("replay", false, "replay: --reducers-only needs --baseline OLD (the reducers to compare with)")
  end
end

-- One replayed session as text lines (only what is not identical).
local function replay_text(s, write)
  local head = ("%s  %s"):format(printable(s.session), s.status)
  if s.divergence then head = head .. ("  first divergence at #%d"):format(s.divergence.index) end
  if s.failure then head = head .. ": " .. printable(s.failure):gsub("\n.*", "") end
  write(head)
  if s.divergence then
    local d = s.divergence
    write("  baseline: " .. json.encode(d.baseline))
    write("  replayed: " .. json.encode(d.replayed))
    local b = d.baseline ~= json.null and d.baseline or {}
    local r = d.replayed ~= json.null and d.replayed or {}
    for _, p in ipairs(require("eventstore.replay").diff(b, r)) do
      write(("    %s: %s -> %s"):format(p.path, json.encode(p.baseline), json.encode(p.replayed)))
    end
  end
  local names = {}
  for name in pairs(s.states) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    for _, p in ipairs(s.states[name]) do
      write(("  state %s %s: %s -> %s"):format(name, p.path, json.encode(p.baseline), json.encode(p.replayed)))
    end
  end
  for _, e in ipairs(s.errors) do
    local where = e.index and ("#%d %s "):format(e.index, e.type) or ""
    local what = e.dead and "dead-lettered" or (e.failures and ("failed %d times"):format(e.failures) or "error")
    local first = tostring(e.error ~= json.null and e.error or ""):match("[^\n]*")
    write(("  %s%s%s: %s"):format(e.baseline and "(baseline) " or "", where, what, printable(first)))
  end
end

-- An NDJSON line of a session: §9's shape (states an object, errors an
-- array, also when empty; no divergence when there is none).
local function replay_json(s)
  return json.encode({ session = s.session, status = s.status, divergence = s.divergence,
    states = s.states, errors = json.array(s.errors), failure = s.failure })
end

function commands.replay.run(o)
  local sink, close_sink = io.stdout, function() end
  if o.out then
    local f, err = io.open(o.out, "wb")
    if not f then
      io.stderr:write(("%s: replay: cannot write --out %s: %s\n"):format(PROG, o.out, tostring(err)))
      return 2
    end
    sink, close_sink = f, function() return f:close() end
  end
  local function write(line)
    local ok, err = sink:write(line, "\n")
    if not ok then fail("cannot write the report: %s", tostring(err)) end
  end
  local ndjson = o.format == "ndjson"
  local html = o.format == "html" and require("eventstore.replay_html").writer(function(text)
    local ok, err = sink:write(text)
    if not ok then fail("cannot write the report: %s", tostring(err)) end
  end) or nil
  local on_tty = tty ~= nil and tty.isatty(2)
  local started = on_tty and tty.now_ms() or 0
  local function progress(done, total)
    if not on_tty then return end
    local secs = (tty.now_ms() - started) / 1000
    local rate = secs > 0 and done / secs or 0
    local left = rate > 0 and (total - done) / rate or 0
    io.stderr:write(("\r%s: replay: %d of %d sessions, %.1f/s, %.0f s left   "):format(PROG, done, total, rate, left))
    if done == total then io.stderr:write("\n") end
  end
  local ok, report = pcall(function()
    local replay = require("eventstore.replay")
    local db = replay.read_only(o.db)
    local store <close> = open_store({ db = db, archive = o.archive, keys = o.keys, tenant = o.tenant }, false)
    return replay.replay({ store = store, scripts = o.scripts, baseline = o.baseline, sessions = o.sessions,
      limit = o.limit, progress = progress, reducers_only = o["reducers-only"],
      each = function(s)
        if html then
          html.session(s)
        elseif ndjson then
          write(replay_json(s))
        elseif s.status ~= "identical" then
          replay_text(s, write)
        end
      end })
  end)
  if not ok then
    close_sink()
    io.stderr:write(("%s: replay: %s\n"):format(PROG, printable(tostring(report))))
    return 2
  end
  local m = report.summary
  -- The report is the answer: one that cannot be written (a full disk) is
  -- an error, exit 2, so that 1 still means only "not identical".
  local wrote, werr = pcall(function()
    if html then
      html.finish(m)
    elseif ndjson then
      write(json.encode({ summary = m }))
    else
      write(("replayed %d, identical %d, diverged %d, failed %d (%.1f sessions/s)"):format(m.replayed,
        m.identical, m.diverged, m.failed, m.rate))
    end
    local ok, err = sink:flush()
    if not ok then fail("cannot write the report: %s", tostring(err)) end
  end)
  local closed, cerr = close_sink()
  if not wrote or (o.out and not closed) then
    io.stderr:write(("%s: replay: %s\n"):format(PROG, printable(tostring(wrote and
      ("cannot write --out %s: %s"):format(o.out, tostring(cerr)) or werr))))
    return 2
  end
  return (m.diverged > 0 or m.failed > 0) and 1 or 0
end

function commands.sessions.run(o)
  local store <close> = open_store(o, false)
  local left, after = o.limit, o.after
  repeat
    local n = left ~= nil and math.min(left, PAGE) or PAGE
    local page = store:sessions({ prefix = o.prefix, after = after, limit = n })
    for _, s in ipairs(page.sessions) do out(row_json(s)) end
    if left ~= nil then left = left - #page.sessions end
    after = page.cursor
  until after == nil or left == 0
  return 0
end

function commands.dead.run(o, args)
  local store <close> = open_store(o, false)
  local left, after = o.limit, 0
  while true do
    local n = left ~= nil and math.min(left, PAGE) or PAGE
    local page = store:dead_letters({ session = args[1], after = after, limit = n })
    print_events(page)
    if #page > 0 then after = page[#page].position end
    if left ~= nil then left = left - #page end
    if #page < n or left == 0 then break end
  end
  return 0
end

function commands.revive.check(o, args)
  o.index = parse_int("revive", "INDEX", args[2], 1)
end

function commands.revive.run(o, args)
  local store <close> = open_store(o, false)
  dead_letter(store, args[1], o.index)
  out(event_json(store:revive(args[1], o.index)))
  return 0
end

function commands.settle.check(o, args)
  o.index = parse_int("settle", "INDEX", args[2], 1)
end

function commands.settle.run(o, args)
  local store <close> = open_store(o, false)
  dead_letter(store, args[1], o.index)
  out(event_json(store:settle(args[1], o.index, o.reason)))
  return 0
end

function commands.cancel.check(o, args)
  o.index = parse_int("cancel", "INDEX", args[2], 1)
end

function commands.cancel.run(o, args)
  local store <close> = open_store(o, false)
  out(event_json(store:cancel(args[1], o.index, { reason = o.reason })))
  return 0
end

function commands.snapshots.run(o, args)
  local store <close> = open_store(o, false)
  for _, s in ipairs(store:snapshots(args[1])) do out(row_json(s)) end
  return 0
end

-- Pages through a listing call (children, list_refs) that takes
-- {after, limit} and returns a list ordered by `key`: prints every row
-- after o.after, at most o.limit of them.
local function print_listing(o, call, key)
  local left, after = o.limit, o.after
  repeat
    local n = left ~= nil and math.min(left, PAGE) or PAGE
    local page = call({ after = after, limit = n })
    for _, r in ipairs(page) do out(row_json(r)) end
    if left ~= nil then left = left - #page end
    if #page > 0 then after = page[#page][key] end
  until #page < n or left == 0
end

function commands.fork.check(o, args)
  o.at = parse_int("fork", "AT", args[2], 0)
end

function commands.fork.run(o, args)
  local store <close> = open_store(o, false)
  out(row_json(store:fork(args[1], o.at, args[3])))
  return 0
end

-- The chain of forks from SESSION up to its root. A lineage can only be
-- walked this way if it has no cycle; a cycle (which the store should not
-- let form) ends the walk where a session comes back.
function commands.lineage.run(o, args)
  local store <close> = open_store(o, false)
  local seen, session = {}, args[1]
  while session ~= nil and not seen[session] do
    seen[session] = true
    local l = store:lineage(session)
    if l == nil then break end
    out(row_json(l))
    session = l.parent
  end
  return 0
end

function commands.children.run(o, args)
  local store <close> = open_store(o, false)
  print_listing(o, function(opts) return store:children(args[1], opts) end, "session")
  return 0
end

function commands.refs.run(o)
  local store <close> = open_store(o, false)
  print_listing(o, function(opts) return store:list_refs(opts) end, "name")
  return 0
end

function commands.ref.run(o, args)
  local store <close> = open_store(o, false)
  local ref
  if args[2] ~= nil then
    ref = store:put_ref(args[1], args[2])
  else
    ref = store:get_ref(args[1])
    if ref == nil then fail("NOT_FOUND: no ref '%s'", printable(args[1])) end
  end
  out(row_json(ref))
  return 0
end

function commands.promote.check(o)
  if o.expect ~= nil and o["expect-none"] then
    usage_error("promote", true, "promote: --expect and --expect-none exclude each other")
  end
end

function commands.promote.run(o, args)
  local store <close> = open_store(o, false)
  local opts
  if o.expect ~= nil then
    opts = { expect = o.expect }
  elseif o["expect-none"] then
    opts = { expect = false }
  end
  local ok, ref = pcall(store.promote, store, args[1], args[2], opts)
  if not ok then
    local e = ref
    if eventstore.is_error(e, "REF_CONFLICT") then
      -- The store's message names both; said here from the error's fields
      -- so the line always shows what was expected and what was found.
      local function show(v) return v and ("'" .. printable(v) .. "'") or "no ref" end
      fail("REF_CONFLICT: promote onto ref '%s' refused: expected %s, found %s",
        printable(args[2]), show(e.expected), show(e.actual))
    end
    error(e, 0)
  end
  out(row_json(ref))
  return 0
end

-- A session's row as `sessions` lists it (nil when it has none).
local function session_row(store, session)
  local row = store:sessions({ prefix = session, limit = 1 }).sessions[1]
  if row ~= nil and row.session == session then return row end
  return nil
end

function commands.seal.run(o, args)
  local store <close> = open_store(o, false)
  store:seal(args[1], { reason = o.reason })
  -- (the store lists every session with a row, a sealed one included;
  -- the fallback keeps a command that has written from failing)
  out(row_json(session_row(store, args[1]) or { session = args[1], sealed = true }))
  return 0
end

function commands.truncate.check(o, args)
  o.through = parse_int("truncate", "THROUGH", args[2], 0)
end

function commands.truncate.run(o, args)
  local store <close> = open_store(o, false)
  if o.scripts ~= nil then
    local engine <close> = new_engine(store, o.scripts)
    engine:truncate(args[1], o.through)
  else
    store:truncate(args[1], o.through)
  end
  out(row_json(session_row(store, args[1]) or { session = args[1], first_index = 1 }))
  return 0
end

-- The check of a command that cannot be undone: it runs only with --yes.
local function needs_yes(name, what)
  return function(o)
    if not o.yes then
      usage_error(name, true, "%s: this %s for good; add --yes to do it", name, what)
    end
  end
end

commands.delete.check = needs_yes("delete", "removes the session")

function commands.delete.run(o, args)
  local store <close> = open_store(o, false)
  out(row_json({ session = args[1], deleted = store:delete(args[1]) }))
  return 0
end

function commands.archive.check(o, args)
  o.through = parse_int("archive", "THROUGH", args[2], 0)
end

local function segment_row(session, g)
  local t = { session = session }
  for k, v in pairs(g) do t[k] = v end
  return t
end

function commands.archive.run(o, args)
  local store <close> = open_store(o, false)
  local g = store:archive(args[1], { through = o.through })
  if g == nil then
    out(row_json({ session = args[1], written = false }))
  else
    local row = segment_row(args[1], g)
    row.written = true
    out(row_json(row))
  end
  return 0
end

function commands.segments.run(o, args)
  local store <close> = open_store(o, false)
  for _, g in ipairs(store:segments(args[1])) do out(row_json(segment_row(args[1], g))) end
  return 0
end

commands["verify-archive"].run = function(o, args)
  local store <close> = open_store(o, false)
  local r = store:verify_archive(args[1])
  for _, p in ipairs(r.problems) do
    io.stderr:write(("%s: bad segment %s (session '%s'): %s\n"):format(PROG, printable(p.file),
      printable(p.session or ""), printable(p.problem)))
  end
  for _, p in ipairs(r.orphans) do
    io.stderr:write(("%s: note: orphan %s: %s\n"):format(PROG, printable(p.file), printable(p.problem)))
  end
  out(row_json({ checked = r.checked, problems = #r.problems, orphans = #r.orphans }))
  return #r.problems > 0 and 1 or 0
end

commands["compact-archive"].run = function(o, args)
  local store <close> = open_store(o, false)
  local r = store:compact_archive(args[1])
  out(row_json({ session = args[1], before = r.before, after = r.after }))
  return 0
end

function commands.retain.run(o)
  local dir = scripts_dir(o, true)
  local store <close> = open_store(o, false)
  local engine <close> = new_engine(store, dir)
  local failed = false
  local actions = engine:retain({
    dry_run = o["dry-run"],
    on_action = function(a)
      failed = failed or a.error ~= nil
      out(row_json({
        action = a.action, session = a.session, from = a.from, through = a.through,
        newest_at = a.newest_at, stopped_at = a.stopped_at, stopped_status = a.stopped_status,
        error = a.error, dry_run = o["dry-run"] or nil,
      }))
    end,
  })
  if actions == nil then
    fail("no retention rules: '%s/retention.lua' does not exist (docs/retention.md)", dir)
  end
  return failed and 1 or 0
end

commands.shred.check = needs_yes("shred", "destroys the key")

function commands.shred.run(o, args)
  local store <close> = open_store(o, false)
  out(row_json({ key = args[1], shredded = store:shred(args[1]) }))
  return 0
end

-- ---- moving a store (docs/moving.md) ----------------------------------------

local move = require("eventstore.move")

function commands.export.run(o)
  local store <close> = open_store(o, false)
  local f, where = io.stdout, "stdout"
  if o.out then
    local err
    f, err = io.open(o.out, "wb")
    if not f then fail("cannot write --out %s: %s", o.out, tostring(err)) end
    where = o.out
  end
  local lines = {}
  store:export(function(line) lines[#lines + 1] = line end, { sessions = o.sessions })
  -- A full disk must not pass for an export: every write, and the flush or
  -- close that writes the rest, is checked.
  local ok, err = true, nil
  for i = 1, #lines do
    ok, err = f:write(lines[i], "\n")
    if not ok then break end
  end
  if ok then
    if o.out then ok, err = f:close() else ok, err = f:flush() end
  elseif o.out then
    f:close()
  end
  if not ok then fail("cannot write the export to %s: %s", where, tostring(err)) end
  return 0
end

function commands.import.run(o)
  -- The input first, then the store: a command that fails writes nothing,
  -- and opening a sqlite: target makes its file (docs/cli.md).
  local f = io.stdin
  if o["in"] then
    local err
    f, err = io.open(o["in"], "rb")
    if not f then fail("cannot read --in %s: %s", o["in"], err) end
  end
  local next_line = f:lines()
  local header = next_line()
  if header == nil then fail("import: the stream is empty") end
  local ok, h = pcall(json.decode, header)
  if not ok or type(h) ~= "table" or math.type(h.eventstore_export) ~= "integer"
      or math.type(h.position) ~= "integer" or h.backend == nil then
    fail("import: line 1: not an eventstore export (the first line is its header)")
  end
  local store <close> = open_store(o, true)
  local first = true
  local r = eventstore.import(store, function()
    if first then
      first = false
      return header
    end
    return next_line()
  end)
  if o["in"] then f:close() end
  out(row_json({ imported = not r.already, sessions = r.sessions, events = r.events, position = r.position }))
  return 0
end

function commands.copy.check(o)
  if not o.from or not o.to then usage_error("copy", true, "copy: --from URL and --to URL are required") end
end

function commands.copy.run(o)
  local from <close> = open_store({ db = o.from, keys = o.keys }, false)
  local to <close> = open_store({ db = o.to, keys = o.keys }, true)
  local r = eventstore.copy(from, to, { sessions = o.sessions })
  local after, events = r.position, r.events
  if o.follow then
    -- Woken by the source's appends (wait on every session after the
    -- position copied last), checking for SIGINT/SIGTERM in between.
    if tty and tty.watch_signals then tty.watch_signals() end
    while not (tty and tty.signals and tty.signals() ~= 0) do
      from:wait(nil, after, SIGNAL_POLL_MS)
      local n
      after, n = move.catch_up(from, to, after, { sessions = o.sessions })
      events = events + n
    end
    move.sync(from, to, { sessions = o.sessions })
  end
  out(row_json({ copied = true, events = events, position = after }))
  return 0
end

function commands.backup.check(o)
  if not o.to then usage_error("backup", true, "backup: --to FILE is required") end
end

function commands.backup.run(o)
  if not o.db:match("^sqlite:") then
    fail("backup copies a sqlite: store (--db %s): for postgres:// use pg_basebackup or pg_dump "
      .. "of the store's schema, or eventstore export (docs/moving.md)", o.db)
  end
  local store <close> = open_store(o, false)
  store:backup(o.to)
  -- the copy's counters against its rows: every session listed, every event read
  local copy <close> = eventstore.open("sqlite:" .. o.to .. "?mode=ro")
  local st = copy:stats()
  local sessions, events, cursor = 0, 0, nil
  repeat
    local page = copy:sessions({ after = cursor, limit = PAGE })
    sessions = sessions + #page.sessions
    cursor = page.cursor
  until not cursor
  local after = 0
  repeat
    local batch = copy:read_all({ after = after, limit = READ_PAGE })
    events = events + #batch
    if #batch > 0 then after = batch[#batch].position end
  until #batch == 0
  if st.sessions ~= sessions or st.events ~= events then
    fail("backup %s: its counts (%d sessions, %d events) do not match its rows (%d, %d)",
      o.to, st.sessions, st.events, sessions, events)
  end
  out(row_json({ backup = o.to, integrity = "ok", sessions = sessions, events = events }))
  return 0
end

-- ---- serve and token -------------------------------------------------------

-- The binary's HTTP module (core/main/lua_http.c); a plain lua5.4 has none.
local function http_module()
  local ok, m = pcall(require, "eventstore.http")
  if not ok or type(m) ~= "table" then
    fail("serve and token need the eventstore binary (its HTTP server is not in the Lua module)")
  end
  return m
end

-- HOST is a numeric address or localhost (the server resolves no names).
local LISTEN_SHAPES = { "^%[([%x:%.]+)%]:(%d+)$", "^([%d%.]*):(%d+)$", "^(localhost):(%d+)$" }

function commands.serve.check(o)
  if o.tokens == nil then
    usage_error("serve", true, "serve: --tokens FILE is required (one token a line: TOKEN TENANT RIGHTS; "
      .. "'%s token new TENANT RIGHTS' makes one)", PROG)
  end
  if o.tenant ~= nil then
    usage_error("serve", false, "serve: --tenant does not apply: each token names its tenant")
  end
  if (o["tls-cert"] == nil) ~= (o["tls-key"] == nil) then
    usage_error("serve", false, "serve: --tls-cert and --tls-key go together (a certificate and its key), got only %s",
      o["tls-cert"] and "--tls-cert" or "--tls-key")
  end
  local listen = o.listen or DEFAULT_LISTEN
  local port
  for _, shape in ipairs(LISTEN_SHAPES) do
    local _, p = listen:match(shape)
    port = port or p
  end
  if port == nil or #port > 5 or tonumber(port) > 65535 then
    usage_error("serve", false, "serve: --listen expects HOST:PORT, [IPV6]:PORT or :PORT (port 0 to 65535), got '%s'",
      listen)
  end
end

function commands.serve.run(o)
  local http = http_module()
  -- The engine needs the scripts directory; with --no-engine it is
  -- optional (its reducers answer state requests when it is there).
  local dir = scripts_dir(o, not o["no-engine"], "; or --no-engine to serve without handlers")
  local store <close> = open_store(o, true)
  local engine
  if dir ~= nil then
    engine = new_engine(store, dir, { workers = o.workers, fold_runners = o["fold-runners"],
      retention_every_ms = o["retention-every-ms"] })
  end
  -- Signals are counted from before the line below, so a SIGTERM sent as
  -- soon as it is read stops the server cleanly.
  if tty and tty.watch_signals then tty.watch_signals() end
  local ok, server = pcall(http.start, {
    store = store, engine = engine, listen = o.listen or DEFAULT_LISTEN, tokens = o.tokens,
    static = o.static or http.default_static(),
    max_body = o["max-body"], max_batch = o["max-batch"], max_connections = o["max-connections"],
    request_timeout = o["request-timeout"], max_streams = o["max-streams"],
    header_timeout_ms = o["header-timeout-ms"], max_per_client = o["max-per-client"],
    max_response_bytes = o["max-response-bytes"],
    tls_cert = o["tls-cert"], tls_key = o["tls-key"],
  })
  if not ok then
    if engine then engine:close() end
    error(server, 0)
  end
  local host = (o.listen or DEFAULT_LISTEN):match("^(.*):%d+$")
  if host == "" then host = "0.0.0.0" end
  out(("listening on %s://%s:%d"):format(server:tls() and "https" or "http", host, server:port()))
  io.stdout:flush()
  local function signalled() return tty ~= nil and tty.signals ~= nil and tty.signals() ~= 0 end
  local ran, err = pcall(function()
    if engine and not o["no-engine"] then
      engine:run({
        progress = function() if signalled() then engine:stop() end end,
        progress_ms = SIGNAL_POLL_MS,
      })
    else
      -- Nothing to do but answer requests: sleep until a signal. Not a
      -- wait on the store, whose failure (a PostgreSQL restart) would end
      -- a server that rides it out (its requests get 503 meanwhile).
      while not signalled() do tty.sleep_ms(SIGNAL_POLL_MS) end
    end
  end)
  server:stop()
  if engine then engine:close() end
  if not ran then error(err, 0) end
  return 0
end

function commands.token.check(_, args)
  local sub = args[1]
  if sub == "hash" then
    if #args ~= 2 then usage_error("token", true, "token hash: expects one TOKEN") end
  elseif sub == "new" then
    if #args ~= 3 then usage_error("token", true, "token new: expects TENANT and RIGHTS") end
    for right in (args[3] .. ","):gmatch("([^,]*),") do
      if right ~= "read" and right ~= "append" and right ~= "work" and right ~= "admin" then
        usage_error("token", false, "token new: unknown right '%s' (rights are a comma list of read, append, work, admin)",
          right)
      end
    end
    if args[2] ~= "*" and (args[2] == "" or args[2]:find("[%s%c]")) then
      usage_error("token", false, "token new: a tenant name has no spaces or control characters, got '%s'",
        printable(args[2]))
    end
  elseif sub == nil then
    usage_error("token", true, "token: expected 'hash TOKEN' or 'new TENANT RIGHTS'")
  else
    usage_error("token", true, "token: expected 'hash' or 'new', got '%s'", printable(sub))
  end
end

function commands.token.run(_, args)
  local http = http_module()
  if args[1] == "hash" then
    out(http.hash_token(args[2]))
  else
    local tok = http.new_token()
    out(tok)
    out(("%s %s %s"):format(http.hash_token(tok), args[2], args[3]))
  end
  return 0
end

function commands.help.check(_, args)
  if args[1] ~= nil and commands[args[1]] == nil then
    usage_error(nil, true, "unknown command '%s'", args[1])
  end
end

function commands.help.run(_, args)
  if args[1] == nil then
    io.stdout:write(global_usage())
  else
    io.stdout:write(command_help(commands[args[1]]))
  end
  return 0
end

-- ---- main -----------------------------------------------------------------

-- Prints a usage error on stderr; returns 2.
local function report_usage(e)
  io.stderr:write(PROG, ": ", e.message, "\n")
  if e.synopsis then
    if e.cmd ~= nil and commands[e.cmd] then
      io.stderr:write(("usage: %s %s\nRun '%s %s --help' for details.\n")
        :format(PROG, commands[e.cmd].synopsis, PROG, e.cmd))
    else
      io.stderr:write(global_usage())
    end
  end
  return 2
end

local M = {}

-- Runs one command line; returns the exit code (0 ok, 2 usage error).
-- Runtime failures are raised (core/main/main.c reports them and exits 1).
function M.main(argv)
  argv = argv or {}
  -- Phase 1, protected: parse and check. Nothing is opened yet. A usage
  -- error comes back as is; anything else is a bug, kept with its
  -- traceback and re-raised as one printable object.
  local ok, def, o, args = xpcall(function()
    -- --db, --scripts and the store options may also come before the
    -- command; they are parsed as if they came right after it (so a later
    -- one wins).
    local i, lead = 1, {}
    while argv[i] ~= nil and looks_like_option(argv[i]) do
      local a = argv[i]
      if a == "-h" or a == "--help" then return "help" end
      if a == "--version" then return "version" end
      local key = a:match("^%-%-(%a+)=") or a:match("^%-%-(%a+)$")
      if key ~= "db" and key ~= "scripts" and not STORE_OPTIONS[key] then
        usage_error(nil, true, "unknown option '%s'", a)
      end
      lead[#lead + 1] = a
      if not a:find("=", 1, true) then
        i = i + 1
        if argv[i] == nil then usage_error(nil, true, "option %s needs a value", a) end
        lead[#lead + 1] = argv[i]
      end
      i = i + 1
    end
    local first = argv[i]
    if first == nil then usage_error(nil, true, "no command given") end
    local d = commands[first]
    if d == nil then usage_error(nil, true, "unknown command '%s'", first) end
    for j = i + 1, #argv do lead[#lead + 1] = argv[j] end
    local opts, positional = parse(d, lead, 1)
    if not opts.help and d.check then d.check(opts, positional) end
    return d, opts, positional
  end, function(e)
    if getmetatable(e) == Usage then return e end
    return setmetatable({ message = debug.traceback(tostring(e), 2) }, Failure)
  end)
  if not ok then
    if getmetatable(def) == Usage then return report_usage(def) end
    error(def, 0)
  end
  -- Phase 2: failures reach core/main/main.c (exit 1). An expected failure (an
  -- error object with __tostring: the store's, the engine's, this file's)
  -- is re-raised as one line: the engine appends a reducer's traceback to
  -- its message, which belongs in a log, not in a command's error line. A
  -- string error is a bug and keeps its traceback.
  local ran, code = xpcall(function()
    if def == "help" then
      io.stdout:write(global_usage())
    elseif def == "version" then
      out(eventstore._VERSION or PROG)
    elseif o.help then
      io.stdout:write(command_help(def))
    else
      return def.run(o, args)
    end
    return 0
  end, function(e)
    local mt = getmetatable(e)
    if type(e) ~= "string" and mt ~= nil and mt.__tostring ~= nil then
      return setmetatable({ message = M.one_line(tostring(e)) }, Failure)
    end
    return setmetatable({ message = debug.traceback(tostring(e), 2) }, Failure)
  end)
  if not ran then error(code, 0) end
  local flushed, err = io.stdout:flush()
  if not flushed then fail("cannot write to stdout: %s", tostring(err)) end
  return code or 0
end

-- An error message as one line: without the traceback the engine appends
-- to a script's error ("\nstack traceback:\n..."), other line breaks as
-- spaces.
function M.one_line(msg)
  msg = msg:gsub("\n?stack traceback:\n.*$", "")
  return (msg:gsub("%s*\n%s*", " "))
end

return M
