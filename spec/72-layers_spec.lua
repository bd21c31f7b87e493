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

  it("fails on a planted back-edge, naming file, line and edge, and the cycle it closes", function()
    local core = copy_core()
    plant(core .. "/codec/json.c", '#include "engine/engine.h"')
    local rc, out = check(core)
    assert.equals(1, rc, out)
    assert.truthy(out:find(core .. "/codec/json.c:1: codec -> engine (engine/engine.h): against the layering (codec may include: util)", 1, true), out)
    assert.truthy(out:find("cycle between folders (includes): codec -> engine -> codec", 1, true), out)
  end)

  it("fails on a Lua header planted in the codec (codec is plain C)", function()
    local core = copy_core()
    plant(core .. "/codec/json_doc.c", '#include "bridge/common.h"')
    local rc, out = check(core)
    assert.equals(1, rc, out)
    assert.truthy(out:find(core .. "/codec/json_doc.c:1: codec -> bridge (bridge/common.h): against the layering", 1, true), out)
  end)

  it("fails on another room's internal header even where the room itself is allowed", function()
    local core = copy_core()
    -- module may use store, but not store's internal.h.
    plant(core .. "/module/module.c", '#include "store/internal.h"')
    local rc, out = check(core)
    assert.equals(1, rc, out)
    assert.truthy(out:find(core .. "/module/module.c:1: module -> store (store/internal.h): another room's internal header", 1, true), out)
    assert.falsy(out:find("against the layering", 1, true), out)
  end)

  it("lets a backend include store/backend.h only", function()
    local core = copy_core()
    plant(core .. "/backends/memory.c", '#include "store/shards.h"')
    local rc, out = check(core)
    assert.equals(1, rc, out)
    assert.truthy(out:find(core .. "/backends/memory.c:1: backends -> store (store/shards.h): against the layering", 1, true), out)
  end)

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
