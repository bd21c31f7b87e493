-- The script loader (lua/eventstore/loader.lua) on its own: what it keeps
-- is bounded by the scripts directory, not by the names it is asked for
-- (docs/limits.md "Caches keyed by what a client sends").
local helpers = require("helpers")
local new_loader = require("eventstore.loader")

describe("the script loader", function()
  local dir
  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. helpers.sh_quote(dir .. "/reducers") .. " " ..
      helpers.sh_quote(dir .. "/handlers")))
  end)
  after_each(function() os.execute("rm -rf " .. helpers.sh_quote(dir)) end)

  -- A stat that counts its calls and sees the files the test wrote.
  local function counting_stat()
    local calls = 0
    local function stat(path)
      calls = calls + 1
      local f = io.open(path, "rb")
      if not f then return nil end
      local n = #f:read("a")
      f:close()
      return "sig-" .. n
    end
    return stat, function() return calls end
  end

  it("keeps nothing for names without a file, however many are asked for", function()
    local stat = counting_stat()
    local loader = new_loader(dir, stat, function(src) return #src end)
    local filler = ("n"):rep(240)
    -- warm up, so what the first calls allocate once is not counted
    for i = 1, 100 do loader.reducer(filler .. i, 0) end
    collectgarbage("collect")
    local before = collectgarbage("count")
    for i = 1, 20000 do
      local value, err = loader.reducer(filler .. "-" .. i, 0)
      assert(value == nil and err == nil)
      loader.handler(filler .. "." .. i, 0)
    end
    collectgarbage("collect")
    local grown = collectgarbage("count") - before
    -- 40,000 kept names of 250 bytes would be over 10 MiB
    assert.is_true(grown < 256, ("the loader kept %.0f KiB"):format(grown))
  end)

  it("finds a file made after its name was asked for, and still caches names that have one", function()
    local stat, calls = counting_stat()
    local loader = new_loader(dir, stat, function(src) return #src end)
    assert.is_nil((loader.reducer("late", 0)))
    helpers.write_file(dir .. "/reducers/late.lua", "return {init = function() return 0 end}")
    local value = loader.reducer("late", 1)
    assert.is_table(value)
    -- a name with a file is looked at again at most once a second
    local n = calls()
    for t = 2, 500 do assert.equal(value, (loader.reducer("late", t))) end
    assert.equal(n, calls())
    assert.equal(value, (loader.reducer("late", 1500)))
    assert.equal(n + 1, calls())
  end)
end)
