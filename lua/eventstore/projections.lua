-- eventstore.projections: a projection's row as engine:projections(),
-- engine:stats(), `eventstore projection list` and `eventstore stats`
-- show it (docs/contract.md §8, docs/projections.md): the stored record
-- (store:projections(), which measures the lag in the store:
-- es_store_projection_lag) under the names §8 gives.
--
--   local rows = require("eventstore.projections").rows(store)
local M = {}

-- rows(store) -> {{name, version, position, head, lag, lag_ms, status,
-- error, error_position, error_id, generation, rebuilding, skipped,
-- holder}, ...} by name. position and version are those of the
-- generation being folded (a new one while it is rebuilt); lag the
-- positions after it, lag_ms how long ago the oldest event after it was
-- written (0 when caught up); head nil on shards:.
function M.rows(store)
  local out = {}
  for _, rec in ipairs(store:projections()) do
    out[#out + 1] = {
      name = rec.name, version = rec.building_version or rec.version,
      position = rec.building and rec.building_position or rec.position,
      head = rec.head, lag = rec.lag, lag_ms = rec.lag_ms,
      status = rec.status, error = rec.error, error_position = rec.error_position,
      error_id = rec.error_id, generation = rec.generation,
      rebuilding = rec.building ~= nil or rec.rebuild, skipped = rec.skipped,
      holder = rec.holder,
    }
  end
  return out
end

return M
