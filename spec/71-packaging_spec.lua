-- Packaging (issue 13 #7): the rockspec and `make install` install the same
-- files; what they install works without the source tree; `make uninstall`
-- removes exactly what `make install` put there; and every command of the
-- binary is covered by `eventstore help`, docs/cli.md and the man page
-- docs/eventstore.1.
--
-- `luarocks make` builds with the Makefile in this checkout, reusing the
-- build tree (BUILD) the suite runs on, so it costs a link at most.
local helpers = require("helpers")
local sh_quote, read_file, write_file = helpers.sh_quote, helpers.read_file, helpers.write_file

local BUILD = os.getenv("BUILD") or "build"
local ROOT = assert(io.popen("pwd")):read("l")
local ROCKSPEC = (function()
  local p = assert(io.popen("ls eventstore-*.rockspec"))
  local names = {}
  for l in p:lines() do names[#names + 1] = l end
  p:close()
  assert(#names == 1, "exactly one rockspec at the repository root, found " .. #names)
  return names[1]
end)()

-- The interpreter that runs luarocks: the real lua5.4 (under make
-- check-sanitize `lua5.4` on PATH preloads the ASan runtime, which luarocks
-- does not need).
local PLAIN_LUA = os.getenv("ES_SAN_LUA") or "lua5.4"
-- luarocks finds Lua's headers from the `lua5.4` it finds on PATH; under
-- check-sanitize that is spec/sanitize's wrapper, whose directory has no
-- include/: name the real interpreter's prefix (/usr/bin/lua5.4 -> /usr).
local LUA_DIR_OPT = ""
if os.getenv("ES_SAN_LUA") then
  local prefix = os.getenv("ES_SAN_LUA"):match("^(.*)/bin/[^/]+$")
  if prefix then LUA_DIR_OPT = "--lua-dir=" .. sh_quote(prefix) end
end

local function sh(cmd)
  local p = assert(io.popen("(" .. cmd .. ") 2>&1; echo \"rc=$?\""))
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)\n?$"))
  return rc, out:gsub("rc=%d+\n?$", "")
end

local function must(cmd)
  local rc, out = sh(cmd)
  assert(rc == 0, ("command failed (exit %s): %s\n%s"):format(tostring(rc), cmd, out))
  return out
end

local function mkdtemp()
  return (must("mktemp -d"):gsub("%s+$", ""))
end

-- The files (and symlinks) under dir, as paths relative to it, sorted.
local function files_under(dir)
  local list = {}
  if os.execute("test -d " .. sh_quote(dir)) ~= true then return list end
  local p = assert(io.popen("cd " .. sh_quote(dir) .. " && find . \\( -type f -o -type l \\) | LC_ALL=C sort"))
  for l in p:lines() do list[#list + 1] = l:gsub("^%./", "") end
  p:close()
  return list
end

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

-- The environment a user's shell would have: no LUA_PATH pointing into
-- this checkout.
local CLEAN_ENV = "env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4 "

-- What the rockspec says: its version and the module's.
local function rockspec_version()
  local text = assert(read_file(ROCKSPEC))
  return text:match('\nversion%s*=%s*"([^"]+)"')
end

local trees = {} -- made once, removed in teardown
local function luarocks_tree()
  if trees.rocks then return trees.rocks end
  local t = mkdtemp()
  trees.rocks = t
  must(("BUILD=%s %s %s --lua-version 5.4 %s make --tree %s %s"):format(sh_quote(BUILD), PLAIN_LUA,
    sh_quote(must("command -v luarocks"):gsub("%s+$", "")), LUA_DIR_OPT, sh_quote(t), sh_quote(ROCKSPEC)))
  return t
end

-- make install into a fresh DESTDIR; returns DESTDIR and the prefix in it.
local function make_install(extra)
  local d = mkdtemp()
  trees[#trees + 1] = d
  must(("make --no-print-directory install BUILD=%s DESTDIR=%s PREFIX=/usr/local %s"):format(
    sh_quote(BUILD), sh_quote(d), extra or ""))
  return d, d .. "/usr/local"
end

-- The files of a luarocks tree with luarocks' own bookkeeping taken out and
-- the files it leaves inside the rock's directory (the man page) moved to
-- where they sit under a prefix. luarocks keeps a copy of each binary it
-- deploys to bin/ in the rock directory too: that copy is bookkeeping.
local function normalized_rock_files(tree, version)
  local rockdir = ("lib/luarocks/rocks-5.4/eventstore/%s/"):format(version)
  local out = {}
  for _, f in ipairs(files_under(tree)) do
    if f:sub(1, #rockdir) == rockdir then
      local rest = f:sub(#rockdir + 1)
      local meta = rest == "rock_manifest" or rest:match("%.rockspec$") or rest:match("^doc/")
        or rest:match("^bin/")
      if not meta then out[#out + 1] = rest end
    elseif f ~= "lib/luarocks/rocks-5.4/manifest" then
      out[#out + 1] = f
    end
  end
  table.sort(out)
  return out
end

teardown(function()
  for _, d in pairs(trees) do os.execute("rm -rf " .. sh_quote(d)) end
end)

describe("the rockspec", function()
  it("is named after the module's version", function()
    local eventstore = require("eventstore")
    local v = eventstore._VERSION:match("^eventstore (%d+%.%d+%.%d+)$")
    assert.truthy(v, "_VERSION is 'eventstore X.Y.Z': " .. tostring(eventstore._VERSION))
    assert.are.equal(("eventstore-%s-1.rockspec"):format(v), ROCKSPEC:match("[^/]+$"):gsub("%-%d+%.rockspec$", "-1.rockspec"))
    assert.are.equal(v, rockspec_version():match("^(.-)%-%d+$"))
    assert.are.equal(ROCKSPEC, ("eventstore-%s.rockspec"):format(rockspec_version()))
  end)

  it("luarocks make and make install install the same files", function()
    local tree = luarocks_tree()
    local _, prefix = make_install()
    local rock = normalized_rock_files(tree, rockspec_version())
    local made = files_under(prefix)
    assert.are.same(made, rock)
    -- and what that list is: the module, its Lua files, the binary, the
    -- man page and the inspector's files
    local s = set_of(made)
    assert.is_true(s["lib/lua/5.4/eventstore/core.so"])
    assert.is_true(s["bin/eventstore"])
    assert.is_true(s["share/man/man1/eventstore.1"])
    for _, f in ipairs(files_under("lua/eventstore")) do
      assert.is_true(s["share/lua/5.4/eventstore/" .. f], f)
    end
    for _, f in ipairs(files_under("web/inspector")) do
      assert.is_true(s["share/lua/5.4/eventstore/inspector/" .. f], "inspector file " .. f)
    end
    -- the installed copies are the built ones
    assert.are.equal(read_file(BUILD .. "/bin/eventstore"), read_file(tree .. "/bin/eventstore"))
    assert.are.equal(read_file("docs/eventstore.1"), read_file(tree .. "/lib/luarocks/rocks-5.4/eventstore/"
      .. rockspec_version() .. "/share/man/man1/eventstore.1"))
  end)

  it("installs a module a plain lua5.4 loads from the tree alone", function()
    local tree = luarocks_tree()
    local elsewhere = mkdtemp()
    trees[#trees + 1] = elsewhere
    local lpath = tree .. "/share/lua/5.4/?.lua;" .. tree .. "/share/lua/5.4/?/init.lua"
    local cpath = tree .. "/lib/lua/5.4/?.so"
    -- Under check-sanitize lua5.4 preloads the build tree's core.so (see the
    -- Makefile): loading the installed copy beside it would be two copies
    -- of one module (ASan: odr-violation). Keep the ASan runtime only.
    local preload = ""
    if os.getenv("ES_SAN_PRELOAD") then
      local keep = {}
      for p in os.getenv("ES_SAN_PRELOAD"):gmatch("[^:]+") do
        if not p:match("/eventstore/core%.so$") then keep[#keep + 1] = p end
      end
      preload = "ES_SAN_PRELOAD=" .. sh_quote(table.concat(keep, ":")) .. " "
    end
    local out = must(("cd %s && %sLUA_PATH=%s LUA_CPATH=%s lua5.4 -e %s"):format(sh_quote(elsewhere),
      preload, sh_quote(lpath), sh_quote(cpath), sh_quote([[
        local es = require("eventstore")
        local s = es.open("memory:")
        s:append("a", {{type = "t", payload = {n = 1}}})
        print(es._VERSION, s:read("a")[1].payload.n, package.searchpath("eventstore.core", package.cpath))]])))
    local eventstore = require("eventstore")
    assert.are.equal(("%s\t1\t%s/lib/lua/5.4/eventstore/core.so\n"):format(eventstore._VERSION, tree), out)
  end)

  it("installs a binary whose serve finds the installed inspector", function()
    local hh = require("http_helpers")
    local tree = luarocks_tree()
    local elsewhere = mkdtemp()
    trees[#trees + 1] = elsewhere
    local dir = tree .. "/share/lua/5.4/eventstore/inspector"
    local expected = read_file("web/inspector/index.html")
    if expected == nil then
      -- no inspector in this tree yet: the lookup is what is tested here
      expected = "<!doctype html><title>installed inspector</title>\n"
      must("mkdir -p " .. sh_quote(dir))
      write_file(dir .. "/index.html", expected)
    end
    assert.are.equal(expected, read_file(dir .. "/index.html"))
    -- started from another directory, without a Lua path into this checkout
    local wrapper = elsewhere .. "/eventstore"
    write_file(wrapper, ("#!/bin/sh\ncd %s && exec %s%s \"$@\"\n"):format(sh_quote(elsewhere), CLEAN_ENV,
      sh_quote(tree .. "/bin/eventstore")))
    must("chmod +x " .. sh_quote(wrapper))
    local bin = hh.BIN
    hh.BIN = wrapper
    local ok, srv = pcall(hh.serve, { no_engine = true })
    hh.BIN = bin
    assert(ok, srv)
    finally(function() hh.stop(srv) end)
    local status, body = hh.request(srv, "GET", "/")
    assert.are.equal(200, status)
    assert.are.equal(expected, body)
    assert.are.equal(0, hh.stop(srv))
  end)

  it("installs a binary that runs from another directory on its installed Lua files", function()
    local tree = luarocks_tree()
    local elsewhere = mkdtemp()
    trees[#trees + 1] = elsewhere
    local bin = sh_quote(tree .. "/bin/eventstore")
    local run = "cd " .. sh_quote(elsewhere) .. " && " .. CLEAN_ENV
    local eventstore = require("eventstore")
    assert.are.equal(eventstore._VERSION .. "\n", must(run .. bin .. " --version"))
    assert.are.equal(must(helpers.BIN .. " help"), must(run .. bin .. " help"))
    assert.are.equal(must(helpers.BIN .. " help stats"), must(run .. bin .. " help stats"))
    must(run .. bin .. " append s t '{\"n\": 1}' --db memory:")
    -- it ran the tree's Lua files: without them it cannot start
    must("rm " .. sh_quote(tree .. "/share/lua/5.4/eventstore/cli.lua"))
    finally(function() -- the next test builds a whole tree again
      trees[#trees + 1] = trees.rocks
      trees.rocks = nil
    end)
    local rc = sh(run .. bin .. " --version")
    assert.are_not.equal(0, rc)
  end)
end)

describe("make uninstall", function()
  it("removes exactly the files make install put there", function()
    local dest, prefix = make_install()
    -- another package's files in the shared directories stay
    local foreign = { "bin/other-tool", "share/lua/5.4/other.lua", "lib/lua/5.4/other.so",
      "share/man/man1/other.1" }
    for _, f in ipairs(foreign) do write_file(prefix .. "/" .. f, "x") end
    local installed = files_under(prefix)
    assert.is_true(#installed > #foreign + 6)
    must(("make --no-print-directory uninstall BUILD=%s DESTDIR=%s PREFIX=/usr/local"):format(
      sh_quote(BUILD), sh_quote(dest)))
    assert.are.same(files_under(prefix), (function() table.sort(foreign); return foreign end)())
    -- the package's own directories are gone, the shared ones stay
    for _, d in ipairs({ "share/lua/5.4/eventstore", "lib/lua/5.4/eventstore" }) do
      assert.is_nil(io.open(prefix .. "/" .. d), d)
    end
    for _, d in ipairs({ "bin", "share/man/man1", "share/lua/5.4", "lib/lua/5.4" }) do
      local rc = sh("test -d " .. sh_quote(prefix .. "/" .. d))
      assert.are.equal(0, rc, d)
    end
    -- a second uninstall finds nothing to do and does not fail
    must(("make --no-print-directory uninstall BUILD=%s DESTDIR=%s PREFIX=/usr/local"):format(
      sh_quote(BUILD), sh_quote(dest)))
  end)

  it("follows the same layout variables as install", function()
    local dest = mkdtemp()
    trees[#trees + 1] = dest
    local vars = ("BUILD=%s DESTDIR=%s PREFIX=/opt/es BINDIR=/opt/es/sbin MANDIR=/opt/man "
      .. "LUA_CMOD_DIR=/opt/lua/c LUA_LMOD_DIR=/opt/lua/l"):format(sh_quote(BUILD), sh_quote(dest))
    must("make --no-print-directory install " .. vars)
    local s = set_of(files_under(dest))
    assert.is_true(s["opt/es/sbin/eventstore"])
    assert.is_true(s["opt/man/man1/eventstore.1"])
    assert.is_true(s["opt/lua/c/eventstore/core.so"])
    assert.is_true(s["opt/lua/l/eventstore/cli.lua"])
    must("make --no-print-directory uninstall " .. vars)
    assert.are.same({}, files_under(dest))
  end)
end)

-- ---- help coverage -----------------------------------------------------------

-- cli.lua's command table (name -> definition), order and store options,
-- found among the upvalues of its main function and of the functions those
-- lead to: the table the binary dispatches on, so a command cannot be
-- added without this spec seeing it.
local function cli_commands()
  local cli = require("eventstore.cli")
  local found, seen = {}, {}
  local function walk(fn)
    if seen[fn] then return end
    seen[fn] = true
    local i = 1
    while true do
      local name, value = debug.getupvalue(fn, i)
      if name == nil then break end
      if found[name] == nil then found[name] = value end
      if type(value) == "function" then walk(value) end
      i = i + 1
    end
  end
  walk(cli.main)
  assert(type(found.commands) == "table" and type(found.order) == "table"
    and type(found.STORE_OPTIONS) == "table",
    "cli.lua's command table (commands, order, STORE_OPTIONS) is reachable from cli.main")
  return found.commands, found.order, found.STORE_OPTIONS
end

-- `eventstore help [CMD]`'s output.
local function help_of(cmd)
  local rc, out = sh(sh_quote(helpers.BIN) .. " help" .. (cmd and " " .. sh_quote(cmd) or ""))
  assert(rc == 0, "eventstore help " .. (cmd or "") .. " failed: " .. out)
  return out
end

-- The option names (without dashes) an `eventstore help CMD` text lists.
local function help_options(text)
  local opts = {}
  for name in text:gmatch("\n%s+%-%-([%w%-]+)") do opts[name] = true end
  return opts
end

-- The man page as {sections = {NAME = {options...}}, store_options = {...},
-- sh = {...}}: .SS sections (commands) and the .TP items in each, options
-- taken from the first line after each .TP.
local function parse_man(text)
  local man = { sections = {}, order = {}, sh = {}, store_options = {} }
  local lines = {}
  for l in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local current, current_sh
  for i, l in ipairs(lines) do
    local sh_name = l:match("^%.SH%s+(.+)$")
    local ss = l:match("^%.SS%s+(.+)$")
    if sh_name then
      current_sh = sh_name:gsub('"', "")
      man.sh[current_sh] = true
      current = nil
    elseif ss then
      local name = ss:gsub('"', ""):gsub("\\%-", "-"):match("^(%S+)")
      current = { options = {} }
      man.sections[name] = current
      man.order[#man.order + 1] = name
    elseif l:match("^%.TP") and lines[i + 1] then
      local target = current and current.options
        or (current_sh == "STORE OPTIONS" and man.store_options) or nil
      if target then
        for o in lines[i + 1]:gsub("\\%-", "-"):gmatch("%-%-([%w%-]+)") do target[o] = true end
        if lines[i + 1]:match("^%.BR? \\%-h") then target.h = true end
      end
    end
  end
  return man
end

describe("help coverage", function()
  local commands, order, store_options = cli_commands()
  local man = parse_man(assert(read_file("docs/eventstore.1")))
  local cli_md = assert(read_file("docs/cli.md"))

  it("eventstore help lists every command with its summary, in the table's order", function()
    local listed = {}
    for name, summary in help_of():gmatch("\n  ([%w%-]+)%s+([^\n]+)") do
      listed[#listed + 1] = name
      assert.are.equal(commands[name] and commands[name].summary, summary, name)
    end
    assert.are.same(order, listed)
  end)

  it("every command has help text naming its synopsis and every option it takes", function()
    for _, name in ipairs(order) do
      local def = commands[name]
      local text = help_of(name)
      assert.truthy(text:find("usage: eventstore " .. def.synopsis, 1, true), name)
      assert.truthy(#def.help > 20, name .. " has a description")
      local listed = help_options(text)
      for opt in pairs(def.options) do
        assert.is_true(listed[opt], ("%s: --%s is in its help"):format(name, opt))
      end
      if def.options.db then
        -- --db names every scheme the store opens, not two of four
        local db = assert(text:match("\n  %-%-db URL (.-)\n  %-%-[%w]"), name .. ": --db in its help")
        for _, scheme in ipairs({ "sqlite:PATH", "memory:", "postgres://", "shards:" }) do
          assert.truthy(db:find(scheme, 1, true), ("%s: --db lists %s: %s"):format(name, scheme, db))
        end
        for opt in pairs(store_options) do
          assert.is_true(listed[opt], ("%s: store option --%s is in its help"):format(name, opt))
        end
      end
      assert.truthy(text:find("\n  -h, --help ", 1, true), name .. ": -h, --help")
      -- and COMMAND --help prints the same
      assert.are.equal(text, must(sh_quote(helpers.BIN) .. " " .. sh_quote(name) .. " --help"))
    end
  end)

  it("every command is documented in docs/cli.md", function()
    -- a ### heading whose code spans name it (`revive ...`, `settle ...`)
    local headed = {}
    for heading in cli_md:gmatch("\n###%s+([^\n]+)") do
      for span in heading:gmatch("`([^`]+)`") do headed[span:match("^(%S+)")] = true end
    end
    for _, name in ipairs(order) do
      if name == "help" then
        -- help is documented with the common rules
        assert.truthy(cli_md:find("`eventstore help [COMMAND]`", 1, true))
      else
        assert.is_true(headed[name], "docs/cli.md has a ### section for " .. name)
      end
    end
    -- and the listing at its top is `eventstore help`'s
    local listing = cli_md:match("```text\neventstore COMMAND %[ARGS%] %[OPTIONS%]\n\n(.-)```")
    assert.truthy(listing, "docs/cli.md starts with the list of commands")
    local expected = help_of():match("\ncommands:\n(.-)\n\n")
    assert.are.equal(expected .. "\n", listing)
  end)

  it("the man page has a section for every command, and each of its options", function()
    for _, name in ipairs(order) do
      local sec = man.sections[name]
      assert.truthy(sec, "docs/eventstore.1 has a .SS section for " .. name)
      for opt in pairs(commands[name].options) do
        local common = opt == "db" or store_options[opt]
        if not common then
          assert.is_true(sec.options[opt], ("docs/eventstore.1: .SS %s has a .TP item for --%s"):format(name, opt))
        end
      end
    end
    -- the options every store command takes, once
    for _, opt in ipairs({ "db", "help" }) do
      assert.is_true(man.store_options[opt], "STORE OPTIONS: --" .. opt)
    end
    for opt in pairs(store_options) do
      assert.is_true(man.store_options[opt], "STORE OPTIONS: --" .. opt)
    end
    -- no section for a command that does not exist
    for _, name in ipairs(man.order) do
      assert.truthy(commands[name], "docs/eventstore.1 documents a command the binary lacks: " .. name)
    end
    for _, s in ipairs({ "NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXIT STATUS", "FILES" }) do
      assert.is_true(man.sh[s], ".SH " .. s)
    end
  end)

  it("eventstore help, the man page and docs/cli.md list the same exit codes", function()
    local function codes(text, pattern)
      local list = {}
      for c in text:gmatch(pattern) do list[#list + 1] = tonumber(c) end
      table.sort(list)
      return list
    end
    local help = codes(assert(help_of():match("\nexit status:\n(.-)\n\n"), "help lists exit codes"), "\n?  (%d+): ")
    local man_text = assert(read_file("docs/eventstore.1"))
    local man_exit = assert(man_text:match("\n%.SH EXIT STATUS\n(.-)\n%.SH"), "man: EXIT STATUS")
    local in_man = codes(man_exit, "%.TP\n%.B (%d+)\n")
    local table_md = assert(cli_md:match("\n## Exit codes and errors\n(.-)\n\n[^|]"), "cli.md: exit codes")
    local in_md = codes(table_md, "\n| (%d+) |")
    assert.are.same({ 0, 1, 2, 3 }, help) -- §4 defines 3 for run --until-done
    assert.are.same(help, in_man)
    assert.are.same(help, in_md)
  end)

  it("the man page names the module's version", function()
    local eventstore = require("eventstore")
    local th = assert(read_file("docs/eventstore.1")):match("\n%.TH ([^\n]+)")
    assert.truthy(th and th:find('"' .. eventstore._VERSION .. '"', 1, true), th)
  end)

  it("the man page renders without warnings", function()
    -- groff (Debian groff-base, which man-db needs) when the machine has it
    if sh("command -v groff") ~= 0 then
      pending("no groff on this machine: rendering not checked")
      return
    end
    local rc, out = sh("groff -man -ww -z -Tutf8 docs/eventstore.1")
    assert.are.equal(0, rc, out)
    assert.are.equal("", out)
    local text = must("groff -man -Tutf8 -P-c docs/eventstore.1 2>/dev/null | col -b 2>/dev/null || true")
    if text ~= "" then
      for _, name in ipairs(order) do
        assert.truthy(text:find("\n   " .. name .. "\n", 1, true), "rendered section " .. name)
      end
    end
  end)
end)
