-- spec/95-http_presence_shards_spec.lua (docs/http-live.md): presence
-- patches written by another process reach `/v1/presence/{ns}/stream`
-- (sqlite:, postgres:), and `serve` over `shards:` gives `/v1/events` and
-- `/v1/stream` the sharded cursors (the SSE `id:` is the cursor and
-- Last-Event-ID resumes with it).
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")

local json = eventstore.json

-- Every backend a second process can share with the server.
local function shared_templates()
  local t = {}
  for _, url in ipairs(helpers.urls()) do
    if not url:match("^memory:") then t[#t + 1] = url end
  end
  return t
end

for _, template in ipairs(shared_templates()) do
  describe("presence across processes on " .. template:match("^%a+"), function()
    local srv, other
    setup(function()
      srv = hh.serve_on(template, { no_engine = true })
      -- this test process is the other process, on the server's database
      other = eventstore.open(srv.db)
    end)
    teardown(function()
      if other then other:close() end
      assert.equals(0, hh.stop(srv))
    end)

    it("a write by another process reaches the stream as a patch, deletions as null", function()
      other:presence_set("room", "ann", { cursor = 1 }, { ttl_ms = 600000 })
      local s = assert(hh.sse(srv, "/v1/presence/room/stream", { token = "admin-token" }))
      local snap = hh.sse_take(s, 1, 10, "snapshot")[1]
      assert.equals(1, #snap.data.rows)
      other:presence_set("room", "bob", { cursor = 7, typing = true }, { ttl_ms = 600000, seen = 3 })
      local p = hh.sse_take(s, 1, 20, "presence")[1]
      assert.is_table(p, "no patch for another process's write")
      assert.equals("bob", p.data.participant)
      assert.same({ cursor = 7, typing = true }, p.data.values)
      assert.equals(3, p.data.seen)
      other:presence_set("room", "bob", { typing = json.null }, { ttl_ms = 600000 })
      p = hh.sse_take(s, 1, 20, "presence")[1]
      assert.is_table(p, "no patch for another process's deletion")
      assert.same({ typing = json.null }, p.data.values)
      -- a write through the server itself comes once, not again as
      -- "another process's"
      assert.equals(200, (hh.put(srv, "admin-token", "/v1/presence/room/cat", { values = { x = 1 }, ttl_ms = 600000 })))
      other:presence_set("room", "dan", { y = 2 }, { ttl_ms = 600000 })
      local got = hh.sse_take(s, 2, 20, "presence")
      assert.same({ "cat", "dan" }, { got[1] and got[1].data.participant, got[2] and got[2].data.participant })
      local more = s:next(1.5)
      assert.is_nil(more and more.event == "presence" and more or nil)
      -- another namespace's write is not this stream's
      other:presence_set("hall", "eve", { z = 3 }, { ttl_ms = 600000 })
      other:presence_set("room", "fay", { w = 4 }, { ttl_ms = 600000 })
      p = hh.sse_take(s, 1, 20, "presence")[1]
      assert.equals("fay", p and p.data.participant)
      s:close()
    end)
  end)
end
