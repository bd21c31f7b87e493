-- eventstore.projections: a projection's row as engine:projections(),
-- engine:stats(), `eventstore projection list` and `eventstore stats`
-- show it (docs/contract.md §8, docs/projections.md): the stored record
-- (store:projections()) with its head and lag.
--
--   local rows = require("eventstore.projections").rows(store)
--
-- lag is the events stored after the checkpoint (read from the store, at
-- most LAG_CAP counted), lag_ms how long ago the oldest of them was
-- written (store clock); both 0 when it is caught up. head is the
-- position of the newest event (not on shards:, which have no store-wide
-- position).
local M = {}

local LAG_CAP = 10000

local function lag_of(store, rec, sharded)
  local after = rec.building and (sharded and rec.building_cursor or rec.building_position)
    or (sharded and rec.cursor or rec.position)
  if sharded and after == nil then after = 0 end
  local events = store:read_all{after = after, limit = LAG_CAP}
  local lag_ms, head = 0, nil
  if events[1] then
    lag_ms = math.max(0, store:now() - events[1].created_at)
    head = events[#events].position
  end
  return #events, lag_ms, head
end

-- rows(store) -> {{name, version, position, head, lag, lag_ms, status,
-- error, error_position, error_id, generation, rebuilding, skipped,
-- holder}, ...} by name
function M.rows(store)
  local sharded = store:capabilities().sharded
  local out = {}
  for _, rec in ipairs(store:projections()) do
    local lag, lag_ms, head = lag_of(store, rec, sharded)
    local position = rec.building and rec.building_position or rec.position
    out[#out + 1] = {
      name = rec.name, version = rec.building_version or rec.version,
      position = position, head = not sharded and (head or position) or nil,
      lag = lag, lag_ms = lag_ms,
      status = rec.status, error = rec.error, error_position = rec.error_position,
      error_id = rec.error_id, generation = rec.generation,
      rebuilding = rec.building ~= nil or rec.rebuild, skipped = rec.skipped,
      holder = rec.holder,
    }
  end
  return out
end

return M
