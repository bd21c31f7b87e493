-- eventstore.replay_html: a replay report (lua/eventstore/replay.lua) as
-- one self-contained HTML file (docs/replay.md): the summary, a table of
-- the sessions that are not identical, and each divergence side by side.
-- Nothing is fetched from elsewhere (no script, no font, no image), so the
-- file can be kept as a CI artifact and opened anywhere.
--
--   local html = require("eventstore.replay_html")
--   local w = html.writer(write)   -- write(text) appends to the file
--   w.session(session_report) ...  -- as the replay hands them over
--   w.finish(summary)
--
-- Sessions are written as they come, each a row of the table with its
-- details folded in it (memory stays flat however many are replayed); the
-- summary is written last and shown first by CSS order.
local json = require("eventstore.core").json

local M = {}

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
    ['"'] = "&quot;", ["'"] = "&#39;" }))
end

local function js(v)
  if v == nil or v == json.null then return "null" end
  local ok, text = pcall(json.encode, v)
  return ok and text or tostring(v)
end

-- A compared event view as indented lines, the differing paths marked.
local function event_block(view, changed)
  if view == nil or view == json.null then return "<pre class=\"none\">(no event)</pre>" end
  local lines = {}
  for _, k in ipairs({ "type", "payload", "lane", "cause", "timer" }) do
    local cls = changed[k] and " class=\"changed\"" or ""
    lines[#lines + 1] = ("<span%s>%s: %s</span>"):format(cls, esc(k), esc(js(view[k])))
  end
  return "<pre>" .. table.concat(lines, "\n") .. "</pre>"
end

local HEAD = [[<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>eventstore replay</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; display: flex; flex-direction: column; }
#summary { order: -1; padding: 1em; background: #f4f4f4; border-radius: 6px; margin-bottom: 1em; }
table { border-collapse: collapse; margin-bottom: 1em; }
#sessions { width: 100%; table-layout: fixed; } #sessions th:last-child { width: 55%; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; overflow-wrap: break-word; vertical-align: top; }
.diverged { color: #b35c00; } .failed { color: #b00020; } .identical { color: #2e7d32; }
.side { display: flex; gap: 1em; } .side > div { flex: 1; min-width: 0; }
pre { background: #fafafa; border: 1px solid #ddd; padding: 6px; overflow-x: auto; white-space: pre-wrap; }
.changed { background: #ffe0b2; } section { border-top: 1px solid #ddd; padding-top: .5em; }
</style></head><body>
<h1>eventstore replay</h1>
<table id="sessions"><thead><tr><th>session</th><th>status</th><th>diverges at</th><th>state paths</th><th>errors</th><th>details</th></tr></thead><tbody>
]]

function M.writer(write)
  local w = {}
  local shown = 0
  write(HEAD)
  function w.session(s)
    if s.status == "identical" then return end
    shown = shown + 1
    local paths = 0
    for _, list in pairs(s.states) do paths = paths + #list end
    local parts = { ("<tr><td>%s</td><td class=\"%s\">%s</td><td>%s</td><td>%d</td><td>%d</td><td><details%s>"
      .. "<summary>show</summary>"):format(esc(s.session), s.status, s.status,
      s.divergence and ("#" .. s.divergence.index) or "", paths, #s.errors, shown <= 20 and " open" or "") }
    if s.failure then parts[#parts + 1] = "<pre class=\"failed\">" .. esc(s.failure) .. "</pre>" end
    if s.divergence then
      local d = s.divergence
      local changed = {}
      local b = d.baseline ~= json.null and d.baseline or {}
      local r = d.replayed ~= json.null and d.replayed or {}
      for _, k in ipairs({ "type", "payload", "lane", "cause", "timer" }) do
        if js(b[k]) ~= js(r[k]) then changed[k] = true end
      end
      parts[#parts + 1] = ("<h3>first divergence at #%d</h3><div class=\"side\"><div><h4>baseline</h4>%s</div>"
        .. "<div><h4>replayed</h4>%s</div></div>"):format(d.index, event_block(d.baseline, changed),
        event_block(d.replayed, changed))
    end
    local names = {}
    for name in pairs(s.states) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      parts[#parts + 1] = ("<h3>state of %s</h3><table><tr><th>path</th><th>baseline</th><th>replayed</th></tr>")
        :format(esc(name))
      for _, p in ipairs(s.states[name]) do
        parts[#parts + 1] = ("<tr><td>%s</td><td>%s</td><td>%s</td></tr>"):format(esc(p.path),
          esc(js(p.baseline)), esc(js(p.replayed)))
      end
      parts[#parts + 1] = "</table>"
    end
    if #s.errors > 0 then
      parts[#parts + 1] = "<h3>errors met</h3><ul>"
      for _, e in ipairs(s.errors) do
        local first = tostring(e.error ~= json.null and e.error or ""):match("[^\n]*")
        parts[#parts + 1] = ("<li>%s%s%s</li>"):format(e.baseline and "(baseline) " or "",
          e.index and esc(("#%d %s %s: "):format(e.index, e.type, e.dead and "dead-lettered" or
            ("failed %d times"):format(e.failures))) or "", esc(first))
      end
      parts[#parts + 1] = "</ul>"
    end
    parts[#parts + 1] = "</details></td></tr>\n"
    write(table.concat(parts))
  end
  function w.finish(m)
    write("</tbody></table>\n")
    if shown == 0 then write("<p>Every session replayed identical.</p>\n") end
    write(("<div id=\"summary\"><strong>replayed %d</strong>: <span class=\"identical\">identical %d</span>, "
      .. "<span class=\"diverged\">diverged %d</span>, <span class=\"failed\">failed %d</span> "
      .. "(%.1f sessions/s)</div>\n</body></html>\n"):format(m.replayed, m.identical, m.diverged, m.failed, m.rate))
  end
  return w
end

return M
