-- inventory: stock movements per SKU as seen in one order's session.
--   held      reserved for the order, not yet shipped or released
--   shipped   left the warehouse with the order
--   released  reserved, then given back (the order was cancelled)
-- Summing these over every order session gives the warehouse's view.
local function add(t, sku, n)
  local v = (t[sku] or 0) + n
  t[sku] = v ~= 0 and v or nil -- keep the maps free of zero entries
end

return {
  init = function() return { held = {}, shipped = {}, released = {} } end,
  ["stock.reserved"] = function(s, e)
    for _, item in ipairs(e.payload.items) do add(s.held, item.sku, item.qty) end
  end,
  ["stock.released"] = function(s, e)
    for _, item in ipairs(e.payload.items) do
      add(s.held, item.sku, -item.qty)
      add(s.released, item.sku, item.qty)
    end
  end,
  ["order.shipped"] = function(s)
    -- Everything still held goes out with the parcel.
    for sku, qty in pairs(s.held) do add(s.shipped, sku, qty) end
    s.held = {}
  end,
}
