-- `make install` puts the module, its Lua files and the binary where a
-- system Lua 5.4 looks for them (its default package.path / cpath).
local helpers = require("helpers")

describe("make install", function()
  it("installs where lua5.4's default search paths find require('eventstore')", function()
    local dest = os.tmpname()
    os.remove(dest)
    local build = os.getenv("BUILD") or "build"
    local cmd = ("make --no-print-directory install BUILD=%s DESTDIR=%s >/dev/null 2>&1"):format(
      helpers.sh_quote(build), helpers.sh_quote(dest))
    local ok = os.execute(cmd)
    finally(function() os.execute("rm -rf " .. helpers.sh_quote(dest)) end)
    assert.is_true(ok == true or ok == 0, "make install failed")
    -- The interpreter's own defaults, before any LUA_PATH of this run.
    local p = io.popen("env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4 "
      .. "lua5.4 -e 'print(package.path); print(package.cpath)'")
    local lpath, cpath = p:read("l"), p:read("l")
    p:close()
    local function under_dest(templates)
      local out = {}
      for t in templates:gmatch("[^;]+") do
        if t:sub(1, 1) == "/" then out[#out + 1] = dest .. t end
      end
      return table.concat(out, ";")
    end
    assert.truthy(package.searchpath("eventstore", under_dest(lpath)), "init.lua not on the default path")
    assert.truthy(package.searchpath("eventstore.engine", under_dest(lpath)))
    assert.truthy(package.searchpath("eventstore.cli", under_dest(lpath)))
    assert.truthy(package.searchpath("eventstore.core", under_dest(cpath)), "core.so not on the default cpath")
    local f = io.open(dest .. "/usr/local/bin/eventstore", "rb")
    assert.truthy(f, "the binary is installed in PREFIX/bin")
    f:close()
  end)
end)
