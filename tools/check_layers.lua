-- tools/check_layers.lua: holds core/'s includes to the layer picture of
-- docs/architecture.md (`make check-layers`, run by `make test`).
--
--   lua5.4 tools/check_layers.lua [CORE_DIR [DOC]]   (defaults: core, docs/architecture.md)
--
-- The allowed edges are read from the table in DOC (between its
-- "check-layers: begin" and "end" markers), so the doc and the check
-- cannot disagree. Every `#include "room/..."` in a .c or .h under
-- CORE_DIR is checked; it fails, naming file, line and edge, on
--   * an include of a room that the including room may not use,
--   * an include of another room's internal header (internal.h,
--     *_internal.h: only its own room may include it),
--   * a folder under CORE_DIR that the table does not name,
--   * any cycle between folders (in the includes or in the table itself).
-- Files at CORE_DIR's root (es.h, es.c: the result codes every file
-- shares) count as util; an include without a folder that names no root
-- file is one of the including folder's own.

local core = arg[1] or "core"
local doc = arg[2] or "docs/architecture.md"
local problems = {}

local function problem(fmt, ...)
  problems[#problems + 1] = string.format(fmt, ...)
end

local function readable(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- The table: | `room` | what it is for | `a`, `b/header.h`, ... |
local allowed, order = {}, {}
do
  local f = assert(io.open(doc, "rb"))
  local inside, n = false, 0
  for line in f:lines() do
    n = n + 1
    if line:find("check-layers: begin", 1, true) then
      inside = true
    elseif line:find("check-layers: end", 1, true) then
      inside = false
    elseif inside and line:match("^|%s*`") then
      local cells = {}
      for cell in line:gmatch("|([^|]*)") do cells[#cells + 1] = cell end
      local room = cells[1]:match("`([%w_]+)`")
      local uses = {}
      for dep in (cells[3] or ""):gmatch("`([^`]+)`") do uses[dep] = true end
      if not room then
        problem("%s:%d: a table row without a `room` in its first cell", doc, n)
      elseif allowed[room] then
        problem("%s:%d: room %s is in the table twice", doc, n, room)
      else
        allowed[room] = uses
        order[#order + 1] = room
      end
    end
  end
  f:close()
  if #order == 0 then
    io.stderr:write(("check-layers: no table between the check-layers markers in %s\n"):format(doc))
    os.exit(2)
  end
end

-- May `from` include `header` (a path "room/file.h") of room `to`?
local function may(from, to, header)
  local uses = allowed[from]
  return uses[to] or uses[header]
end

local function internal(header)
  local base = header:match("([^/]+)$")
  return base == "internal.h" or base:match("_internal%.h$") ~= nil
end

-- The files, in a stable order.
local files = {}
do
  local p = assert(io.popen("find '" .. core:gsub("'", "'\\''") .. "' -type f \\( -name '*.c' -o -name '*.h' \\) | LC_ALL=C sort"))
  for path in p:lines() do files[#files + 1] = path end
  p:close()
end

-- edges[a][b] = "file:line" of the first include from room a to room b.
local edges = {}
local n_includes = 0
for _, path in ipairs(files) do
  local rel = path:sub(#core + 2)
  local room = rel:match("^([^/]+)/") or "util"
  if not allowed[room] then
    problem("%s: folder %s/ is not a room of %s's table", path, room, doc)
  else
    local f = assert(io.open(path, "rb"))
    local n = 0
    for line in f:lines() do
      n = n + 1
      local header = line:match('^%s*#%s*include%s*"([^"]+)"')
      if header then
        n_includes = n_includes + 1
        local to = header:match("^([^/]+)/")
        if not to then
          to = readable(core .. "/" .. header) and "util" or room
        end
        local where = path .. ":" .. n
        if to ~= room then
          edges[room] = edges[room] or {}
          edges[room][to] = edges[room][to] or where
          if not allowed[to] then
            problem("%s: %s -> %s (%s): no room %s in %s's table", where, room, to, header, to, doc)
          elseif not may(room, to, header) then
            local list = {}
            for dep in pairs(allowed[room]) do list[#list + 1] = dep end
            table.sort(list)
            problem("%s: %s -> %s (%s): against the layering (%s may include: %s)", where, room, to,
                    header, room, #list > 0 and table.concat(list, ", ") or "nothing")
          end
          if internal(header) then
            problem("%s: %s -> %s (%s): another room's internal header", where, room, to, header)
          end
        end
      end
    end
    f:close()
  end
end

-- Cycles: a depth-first search over a graph {a = {b = where}}; reports
-- each cycle once, as a -> b -> ... -> a.
local function cycles(graph, what)
  local state, stack = {}, {}
  local function visit(a)
    state[a] = "open"
    stack[#stack + 1] = a
    local next_rooms = {}
    for b in pairs(graph[a] or {}) do next_rooms[#next_rooms + 1] = b end
    table.sort(next_rooms)
    for _, b in ipairs(next_rooms) do
      if state[b] == "open" then
        local path, from = {}, nil
        for i = #stack, 1, -1 do
          if stack[i] == b then from = i break end
        end
        for i = from, #stack do path[#path + 1] = stack[i] end
        path[#path + 1] = b
        local via = {}
        for i = 1, #path - 1 do
          local w = graph[path[i]][path[i + 1]]
          if type(w) == "string" then via[#via + 1] = w end
        end
        problem("cycle between folders (%s): %s%s", what, table.concat(path, " -> "),
                #via > 0 and (" (" .. table.concat(via, ", ") .. ")") or "")
      elseif not state[b] then
        visit(b)
      end
    end
    stack[#stack] = nil
    state[a] = "done"
  end
  local rooms = {}
  for a in pairs(graph) do rooms[#rooms + 1] = a end
  table.sort(rooms)
  for _, a in ipairs(rooms) do
    if not state[a] then visit(a) end
  end
end

local table_graph = {}
for room, uses in pairs(allowed) do
  table_graph[room] = {}
  for dep in pairs(uses) do
    local to = dep:match("^([^/]+)/") or dep
    if to ~= room then table_graph[room][to] = true end
  end
end
cycles(table_graph, "the table of " .. doc)
cycles(edges, "includes")

if #problems > 0 then
  for _, p in ipairs(problems) do io.stderr:write("check-layers: ", p, "\n") end
  io.stderr:write(("check-layers: %d problem(s); the picture is in %s\n"):format(#problems, doc))
  os.exit(1)
end
print(("check-layers: %d includes in %d files follow the %d rooms of %s"):format(n_includes, #files, #order, doc))
