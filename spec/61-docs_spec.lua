-- Every fenced code block of README.md, docs/*.md and scripts/README.md is
-- run here, so the docs cannot drift from the program (issue 14 #7).
--
--   ```lua      run with lua5.4 in a fresh temporary directory holding a
--               copy of scripts/ (`eventstore` is required first when the
--               block does not do it); it must exit 0, twice in a row (a
--               reader runs a snippet again).
--   ```sh       each command (a line, with its `\` continuations; comments
--               dropped) run with sh in such a directory, `build/bin/
--               eventstore` meaning the built binary; each must exit 0.
--   ```console  `$ eventstore ...` lines run through the built binary; the
--               lines after each are what it must print (stdout and
--               stderr together), exactly.
--   ```text, ```sql   not run: listings (signatures, layouts, output, the
--               schema) that are not programs.
-- Any other tag, or none, fails: say what a block is.
--
-- SKIP below lists, with the reason, the only runnable blocks not run.
local helpers = require("helpers")
local sh_quote, read_file, write_file = helpers.sh_quote, helpers.read_file, helpers.write_file

local BIN = helpers.BIN
local ROOT = os.getenv("PWD") or "."
local HAS_ENGINE = type(require("eventstore").engine) == "function"

-- Blocks not run, by a string they contain, each with why.
local SKIP = {
  ["make demo"] = "builds and runs the demo: spec/60-examples_spec.lua runs examples/demo.lua",
  ["make test"] = "the suite itself",
  ["make install"] = "installs into the system: spec/70-install_spec.lua covers make install",
  ["' lua5.4\n"] = "starts an interactive lua5.4",
  ["/media/cdrom/"] = "needs read-only media (spec/22-sqlite_faults_spec.lua covers it)",
}

-- Setup a console command needs before it runs, by a string it contains.
local SETUP = {
  -- a database to look in (commands that only look refuse a missing one)
  ["revive order-1 9"] = "%s append other x >/dev/null",
  -- another application's SQLite file
  ["sessions --db sqlite:app.db"] = "sqlite3 app.db 'create table sessions(id); create index sessions_id on sessions(id)'",
  -- the demo's log (make demo leaves it)
  ["demo.db"] = "DEMO_DB=demo.db DEMO_SCRIPTS=scripts lua5.4 %s/examples/demo.lua >/dev/null 2>&1",
}

local DOCS = { "README.md", "scripts/README.md" }
do
  local p = assert(io.popen("ls docs/*.md"))
  for f in p:lines() do DOCS[#DOCS + 1] = f end
  p:close()
end

-- The fenced blocks of a markdown text: {tag, body, line}.
local function blocks(text)
  local t, inside, n = {}, nil, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if inside then
      if line:match("^```%s*$") then
        t[#t + 1] = inside
        inside = nil
      else
        inside.body = inside.body .. line .. "\n"
      end
    else
      local tag = line:match("^```(.*)$")
      if tag then inside = { tag = tag, body = "", line = n } end
    end
  end
  assert(inside == nil, "an unclosed code block")
  return t
end

local function skipped(body)
  for needle, why in pairs(SKIP) do
    if body:find(needle, 1, true) then return why end
  end
end

local function mkdtemp()
  local p = assert(io.popen("mktemp -d"))
  local dir = p:read("l")
  p:close()
  os.execute(("cp -r %s %s"):format(sh_quote(ROOT .. "/scripts"), sh_quote(dir .. "/scripts")))
  return dir
end

-- Runs a shell command in dir; returns ok, output (stdout and stderr).
local function run(dir, cmd)
  local out = dir .. "/.out"
  local ok = os.execute(("cd %s && (%s) >%s 2>&1 </dev/null"):format(sh_quote(dir), cmd, sh_quote(out)))
  local text = read_file(out) or ""
  os.remove(out)
  return ok == true, text
end

local LUA_ENV = ("LUA_PATH=%s LUA_CPATH=%s "):format(
  sh_quote(ROOT .. "/lua/?.lua;" .. ROOT .. "/lua/?/init.lua;;"), sh_quote(ROOT .. "/build/lib/?.so;;"))

local function setup(dir, body)
  for needle, cmd in pairs(SETUP) do
    if body:find(needle, 1, true) then
      local ok, out = run(dir, LUA_ENV .. cmd:format(needle == "demo.db" and sh_quote(ROOT) or sh_quote(BIN)))
      assert(ok, "setup failed: " .. out)
    end
  end
end

local runners = {}

function runners.lua(dir, body)
  if not body:find('require("eventstore")', 1, true) then
    body = 'local eventstore = require("eventstore")\n' .. body
  end
  write_file(dir .. "/block.lua", body)
  for i = 1, 2 do
    local ok, out = run(dir, LUA_ENV .. "timeout 20 lua5.4 block.lua")
    assert(ok, ("run %d failed:\n%s"):format(i, out))
  end
end

function runners.sh(dir, body)
  setup(dir, body)
  body = body:gsub("\\\n", " ")
  for line in body:gmatch("[^\n]+") do
    local cmd = line:gsub("%s+#.*$", "")
    if cmd:match("%S") then
      cmd = cmd:gsub("^build/bin/eventstore", sh_quote(BIN))
      local ok, out = run(dir, LUA_ENV .. "timeout 20 " .. cmd)
      assert(ok, ("%s failed:\n%s"):format(line, out))
    end
  end
end

function runners.console(dir, body)
  setup(dir, body)
  local cmd, want = nil, {}
  local function check()
    if cmd == nil then return end
    local _, out = run(dir, "timeout 20 " .. sh_quote(BIN) .. cmd)
    assert.are.equal(table.concat(want), out, "$ eventstore" .. cmd)
  end
  for line in body:gmatch("[^\n]*\n") do
    local c = line:match("^%$ eventstore(.*)\n$")
    if c then
      check()
      cmd, want = c, {}
    else
      assert(cmd, "a console block must start with '$ eventstore'")
      want[#want + 1] = line
    end
  end
  check()
end

describe("code blocks in the docs", function()
  for _, file in ipairs(DOCS) do
    local text = assert(read_file(file), file)
    for _, b in ipairs(blocks(text)) do
      local name = ("%s:%d (%s)"):format(file, b.line, b.tag)
      if b.tag == "text" or b.tag == "sql" then
        -- listings, not programs (see the header)
      elseif skipped(b.body) then
        pending(name .. ": " .. skipped(b.body))
      elseif runners[b.tag] == nil then
        it(name .. " says what it is", function()
          error("untagged or unknown code block: tag it lua, sh, console, text or sql")
        end)
      else
        local needs_engine = b.tag ~= "console" and (b.body:find("engine", 1, true) or b.body:find(" run", 1, true))
        ;(needs_engine and not HAS_ENGINE and pending or it)(name .. " runs", function()
          local dir = mkdtemp()
          finally(function() os.execute("rm -rf " .. sh_quote(dir)) end)
          runners[b.tag](dir, b.body)
        end)
      end
    end
  end
end)

describe("the README's HTTP steps", function()
  it("write the token and the tokens file under build/, never in the directory they run in", function()
    local body
    for _, b in ipairs(blocks(assert(read_file("README.md")))) do
      if b.tag == "sh" and b.body:find("token new", 1, true) then body = b.body end
    end
    assert.truthy(body, "README.md has an sh block making a token")
    local dir = mkdtemp()
    finally(function() os.execute("rm -rf " .. sh_quote(dir)) end)
    runners.sh(dir, body)
    local p = assert(io.popen("ls -A " .. sh_quote(dir)))
    local top = {}
    for name in p:lines() do top[#top + 1] = name end
    p:close()
    table.sort(top)
    -- scripts/ is the copy every block gets
    assert.are.same({ "build", "scripts" }, top)
    local token = read_file(dir .. "/build/http-demo/new-token") or ""
    assert.truthy(token:match("^%x+\n"), "build/http-demo/new-token starts with the token: " .. token)
  end)

  it(".gitignore keeps a token written by older steps out of the repository", function()
    -- read, not asked of git: a tarball of the sources has no repository
    local ignored = {}
    for line in (assert(read_file(".gitignore")) .. "\n"):gmatch("([^\n]*)\n") do ignored[line] = true end
    assert.is_true(ignored["/new-token"], ".gitignore: /new-token")
    assert.is_true(ignored["/tokens"], ".gitignore: /tokens")
  end)
end)
