-- The rooms and layers of core/ (docs/architecture.md): `make check-layers`
-- (tools/check_layers.lua) passes on the tree, and fails, naming file,
-- line and edge, on a copy of core/ with a planted back-edge, an include
-- of another room's internal header, a folder the table does not name, and
-- on a table that itself allows a cycle.
local helpers = require("helpers")
local sh_quote, read_file, write_file = helpers.sh_quote, helpers.read_file, helpers.write_file

local LUA = os.getenv("ES_SAN_LUA") or "lua5.4"
local DOC = "docs/architecture.md"

-- Runs the check on core_dir with doc; returns its exit status and its
-- output (stdout and stderr).
local function check(core_dir, doc)
  local p = assert(io.popen(("%s tools/check_layers.lua %s %s 2>&1; echo \"rc=$?\""):format(
    LUA, sh_quote(core_dir), sh_quote(doc or DOC))))
  local out = p:read("a")
  p:close()
  return tonumber(out:match("rc=(%d+)\n?$")), out
end

-- A fresh copy of core/ in a temporary directory; returns its core/.
local tmp
local function copy_core()
  tmp = assert(io.popen("mktemp -d")):read("l")
  assert(os.execute("cp -R core " .. sh_quote(tmp .. "/core")))
  return tmp .. "/core"
end

-- Puts line at the top of file (so it is line 1).
local function plant(file, line)
  write_file(file, line .. "\n" .. read_file(file))
end

describe("make check-layers", function()
  after_each(function()
    if tmp then os.execute("rm -rf " .. sh_quote(tmp)) end
    tmp = nil
  end)

  it("passes on the tree: every include follows the table of docs/architecture.md", function()
    local rc, out = check("core")
    assert.equals(0, rc, out)
    assert.matches("includes in %d+ files follow the 9 rooms of docs/architecture.md", out)
  end)

  it("is what make check-layers and make test run", function()
    local mk = read_file("Makefile")
    assert.matches("\ncheck%-layers:\n\t@%$%(LUA%) tools/check_layers.lua core docs/architecture.md\n", mk)
    assert.matches("\ntest:[^\n]* check%-layers", mk)
  end)

  -- One line planted at the top of a file of a copy of core/: what the
  -- check must say about it (found verbatim after the file's path and
  -- ":1: "), and what else it must or must not say.
  local planted = {
    {
      what = "a back-edge, naming file, line and edge, and the cycle it closes",
      file = "codec/json.c", line = '#include "engine/engine.h"',
      says = "codec -> engine (engine/engine.h): against the layering (codec may include: util)",
      also = "cycle between folders (includes): codec -> engine -> codec",
    },
    {
      what = "a Lua header in the codec (codec is plain C)",
      file = "codec/json_doc.c", line = '#include "bridge/common.h"',
      says = "codec -> bridge (bridge/common.h): against the layering",
    },
    {
      what = "another room's internal header, even where the room itself is allowed",
      file = "module/module.c", line = '#include "store/internal.h"', -- module may use store
      says = "module -> store (store/internal.h): another room's internal header",
      never = "against the layering",
    },
    {
      what = "a store header not written for backends in a backend",
      file = "backends/memory.c", line = '#include "store/shards.h"',
      says = "backends -> store (store/shards.h): against the layering",
    },
  }
  for _, case in ipairs(planted) do
    it("fails on " .. case.what, function()
      local core = copy_core()
      plant(core .. "/" .. case.file, case.line)
      local rc, out = check(core)
      assert.equals(1, rc, out)
      assert.truthy(out:find(core .. "/" .. case.file .. ":1: " .. case.says, 1, true), out)
      if case.also then assert.truthy(out:find(case.also, 1, true), out) end
      if case.never then assert.falsy(out:find(case.never, 1, true), out) end
    end)
  end

  it("fails on a folder that the table does not name", function()
    local core = copy_core()
    assert(os.execute("mkdir " .. sh_quote(core .. "/extra")))
    write_file(core .. "/extra/x.c", '#include "es.h"\n')
    local rc, out = check(core)
    assert.equals(1, rc, out)
    assert.truthy(out:find(core .. "/extra/x.c: folder extra/ is not a room of", 1, true), out)
  end)

  it("fails on a table that allows a cycle", function()
    local core = copy_core()
    local doc = tmp .. "/architecture.md"
    local text, n = read_file(DOC):gsub("(\n| `util` |[^\n]*| )nothing |", "%1`codec` |")
    assert.equals(1, n)
    write_file(doc, text)
    local rc, out = check(core, doc)
    assert.equals(1, rc, out)
    assert.truthy(out:find("cycle between folders (the table of " .. doc .. "): codec -> util -> codec", 1, true), out)
  end)
end)
