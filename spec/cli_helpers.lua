-- spec/cli_helpers.lua: what the specs of the `eventstore` binary
-- (spec/5N-cli_*_spec.lua) share: a fresh working directory per test, the
-- built binary run there as a real process, and the checks of its output.
local eventstore = require("eventstore")
local helpers = require("helpers")
local assert = require("luassert")

local json = eventstore.json
local sh_quote, read_file, write_file = helpers.sh_quote, helpers.read_file, helpers.write_file

local ch = {}

ch.BIN = helpers.BIN
ch.HAS_ENGINE = type(eventstore.engine) == "function"

-- A fresh empty directory.
function ch.mkdtemp()
  local p = assert(io.popen("mktemp -d"))
  local dir = p:read("l")
  p:close()
  return dir
end

-- What a test makes and must undo: temporary directories (workdir()),
-- child processes (put in .procs, reaped), stores (track(store), closed);
-- cleanup() undoes them all, for after_each.
function ch.scratch()
  local ph = require("proc_helpers")
  local t = { procs = {}, dirs = {}, opened = {} }
  function t.workdir()
    local d = ch.mkdtemp()
    t.dirs[#t.dirs + 1] = d
    return d
  end
  function t.track(store)
    t.opened[#t.opened + 1] = store
    return store
  end
  function t.cleanup()
    for i = #t.procs, 1, -1 do
      ph.reap(t.procs[i])
      t.procs[i] = nil
    end
    for i = #t.opened, 1, -1 do
      pcall(function() t.opened[i]:close() end)
      t.opened[i] = nil
    end
    for i = #t.dirs, 1, -1 do
      os.execute("rm -rf " .. sh_quote(t.dirs[i]))
      t.dirs[i] = nil
    end
  end
  return t
end

-- Runs the binary in directory `work` with the arguments (a list) and
-- stdin text; returns {code, how, out, err, ms} (code: the exit status,
-- ms: wall time).
function ch.run(work, args, stdin)
  local parts = { "cd", sh_quote(work), "&&", "timeout", "-k", "2", "30", sh_quote(ch.BIN) }
  for _, a in ipairs(args) do parts[#parts + 1] = sh_quote(a) end
  local o, e, i = work .. "/.out", work .. "/.err", work .. "/.in"
  write_file(i, stdin or "")
  local cmd = table.concat(parts, " ") .. (" <%s >%s 2>%s"):format(sh_quote(i), sh_quote(o), sh_quote(e))
  local t0 = helpers.wall()
  local _, how, code = os.execute(cmd)
  local r = { code = code, how = how, out = read_file(o) or "", err = read_file(e) or "",
              ms = (helpers.wall() - t0) * 1000 }
  os.remove(o)
  os.remove(e)
  os.remove(i)
  return r
end

-- The lines of a text, without their "\n".
function ch.lines(text)
  local t = {}
  for l in text:gmatch("([^\n]*)\n") do t[#t + 1] = l end
  return t
end

-- Decodes NDJSON output into a list of values.
function ch.ndjson(text)
  local t = {}
  for _, l in ipairs(ch.lines(text)) do t[#t + 1] = json.decode(l) end
  return t
end

-- Asserts a successful run (exit 0, nothing on stderr); returns stdout.
function ch.ok(r)
  assert.are.equal("", r.err, "unexpected stderr")
  assert.are.equal(0, r.code, "exit code")
  return r.out
end

-- Asserts a failed run: exit code, nothing on stdout, and stderr whose
-- first line starts with "eventstore: " .. prefix. Returns stderr.
function ch.fails(r, code, prefix)
  assert.are.equal(code, r.code, "exit code; stderr: " .. r.err)
  assert.are.equal("", r.out, "nothing on stdout")
  local want = "eventstore: " .. prefix
  assert.are.equal(want, r.err:match("^[^\n]*"):sub(1, #want), "stderr: " .. r.err)
  return r.err
end

-- ch.fails, and the error is exactly one line (no synopsis, no traceback).
function ch.fails_one_line(r, code, prefix)
  local err = ch.fails(r, code, prefix)
  assert.are.equal(1, #ch.lines(err), err)
  assert.is_nil(err:find("traceback", 1, true), err)
  return err
end

-- A sharded store in directory `work`: catalog.db and three shards
-- a.db, b.db, c.db (SQLite files), its plan installed. Returns the --db
-- URL that opens it ("shards:sqlite:WORK/catalog.db") and the shards'
-- database paths.
function ch.sharded(work)
  local paths = { a = work .. "/a.db", b = work .. "/b.db", c = work .. "/c.db" }
  local plan = { version = 1, shards = {} }
  for name, path in pairs(paths) do plan.shards[name] = "sqlite:" .. path end
  eventstore.open("shards:", { catalog = "sqlite:" .. work .. "/catalog.db", plan = plan }):close()
  return "shards:sqlite:" .. work .. "/catalog.db", paths
end

return ch
