-- balance: an account's balance and history, folded from its events.
-- Amounts are integer cents.
return {
  init = function() return { owner = nil, balance = 0, deposits = 0, withdrawals = 0, refused = 0 } end,
  ["account.opened"] = function(s, e) s.owner = e.payload.owner end,
  ["deposited"] = function(s, e)
    s.balance = s.balance + e.payload.amount
    s.deposits = s.deposits + 1
  end,
  -- A request changes nothing yet: only its outcome does.
  ["withdrawn"] = function(s, e)
    s.balance = s.balance - e.payload.amount
    s.withdrawals = s.withdrawals + 1
  end,
  ["withdrawal.refused"] = function(s) s.refused = s.refused + 1 end,
}
