-- spec/openapi_helpers.lua: the HTTP specs against the OpenAPI document
-- (core/http/openapi.json, served at GET /v1/openapi.json).
--
-- oh.record() makes hh.request note every answer (method, path, status,
-- content type, text) until oh.check(records) validates them: each JSON
-- answer against the schema the document gives for its operation and
-- status (200: the operation's answer; 4xx/5xx: Error), by
-- spec/support/openapi_check.py (python3-jsonschema, Draft 2020-12). A
-- spec records its real answers, and the document cannot drift from what
-- the server says.
local eventstore = require("eventstore")
local helpers = require("helpers")
local hh = require("http_helpers")

local json = eventstore.json
local oh = {}

oh.PATH = "core/http/openapi.json"

local cached
function oh.document()
  if not cached then cached = json.decode(assert(helpers.read_file(oh.PATH))) end
  return cached
end

-- "/v1/sessions/{s}/events" -> JSON Pointer token "~1v1~1sessions~1{s}~1events"
local function token(s) return (s:gsub("~", "~0"):gsub("/", "~1")) end

local function segments(path)
  local out = {}
  for seg in path:gmatch("[^/]+") do out[#out + 1] = seg end
  return out
end

-- The document's path template an actual request path (query stripped,
-- still percent-encoded) falls under for `method`, or nil: every literal
-- segment equal, each {param} any one segment; the template with the most
-- literal segments wins (as the server's table matches).
function oh.template(method, path, doc)
  doc = doc or oh.document()
  local segs = segments(path:gsub("%?.*$", ""))
  local best, best_lit
  for tpl, item in pairs(doc.paths) do
    if item[method:lower()] then
      local t = segments(tpl)
      if #t == #segs then
        local lit, fits = 0, true
        for i, seg in ipairs(t) do
          if seg:match("^{.*}$") then
            fits = fits and segs[i] ~= ""
          elseif seg == segs[i] then
            lit = lit + 1
          else
            fits = false
          end
        end
        if fits and (not best or lit > best_lit) then best, best_lit = tpl, lit end
      end
    end
  end
  return best
end

-- The JSON Pointer of the schema an answer must meet, or nil (not JSON).
function oh.pointer(method, path, status, ctype, doc)
  if not (ctype or ""):find("json", 1, true) then return nil end
  if status ~= 200 then return "#/components/schemas/Error" end
  local tpl = oh.template(method, path, doc)
  if not tpl then return false end
  return ("#/paths/%s/%s/responses/200/content/application~1json/schema"):format(token(tpl), method:lower())
end

-- Starts recording every hh.request answer into the returned list.
function oh.record()
  local records = {}
  hh.recorder = function(method, path, status, headers, text)
    records[#records + 1] = { method = method, path = path, status = status,
      ctype = headers["content-type"], text = text }
  end
  return records
end

function oh.stop() hh.recorder = nil end

-- Runs the checker on {document, items, schemas}; returns the failure lines.
function oh.run(input)
  local file = os.tmpname()
  helpers.write_file(file, json.encode(input))
  local p = assert(io.popen("python3 spec/support/openapi_check.py " .. helpers.sh_quote(file) .. " 2>&1"))
  local out = p:read("a")
  local ok, how, code = p:close()
  os.remove(file)
  local lines = {}
  for line in out:gmatch("[^\n]+") do lines[#lines + 1] = line end
  if not ok and #lines == 0 then lines[1] = ("openapi_check.py failed: %s %s"):format(tostring(how), tostring(code)) end
  return lines
end

-- Validates recorded answers; returns the failure lines (an answer to a
-- path the document lacks is one too) and how many answers were checked.
function oh.check(records)
  local doc = oh.document()
  local items, failures = {}, {}
  for _, r in ipairs(records) do
    local what = ("%s %s -> %s"):format(r.method, r.path, tostring(r.status))
    local ptr = oh.pointer(r.method, r.path, r.status, r.ctype, doc)
    if ptr == false then
      failures[#failures + 1] = what .. ": no operation of the document"
    elseif ptr and r.text ~= "" then
      items[#items + 1] = { what = what, pointer = ptr, instance = r.text }
    end
  end
  if #items > 0 then
    for _, line in ipairs(oh.run({ document = doc, items = items })) do failures[#failures + 1] = line end
  end
  return failures, #items
end

-- Every schema of the document: components, request bodies, answers.
function oh.schema_pointers(doc)
  doc = doc or oh.document()
  local out = {}
  for name in pairs(doc.components.schemas) do out[#out + 1] = "#/components/schemas/" .. token(name) end
  for tpl, item in pairs(doc.paths) do
    for method, op in pairs(item) do
      local base = ("#/paths/%s/%s"):format(token(tpl), method)
      if op.requestBody then
        out[#out + 1] = base .. "/requestBody/content/application~1json/schema"
      end
      for status, resp in pairs(op.responses) do
        for ctype in pairs(resp.content or {}) do
          out[#out + 1] = ("%s/responses/%s/content/%s/schema"):format(base, status, token(ctype))
        end
      end
    end
  end
  table.sort(out)
  return out
end

-- The body of the closing test of a describe that recorded its answers
-- (oh.record()): each met the document's schema for its route, or Error.
-- records() gives the list (made in setup, after the test is declared).
function oh.checks(records)
  return function()
    local luassert = require("luassert")
    local failures, n = oh.check(records())
    luassert.same({}, failures)
    luassert.is_true(n > 0)
  end
end

return oh
