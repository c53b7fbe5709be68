-- leave: a node stops. Its permits are released and handed on, its
-- liveness entry removed (its waiters, if any remain, are dropped when
-- they reach the head; those of nodes forgotten here are dropped now). When no live node is then left, its counters,
-- epoch, tombstones and fairness state are deleted too: nothing is left
-- (but the tombstones, where '!late' says a call may still come: a key
-- that expires by itself within a tombstone's life).
-- What remains then belongs to dead nodes (waiters the last dispatch
-- could not drop: every upstream cooling, or more than it drops in one
-- call), and nobody would be left to drop it; a node only partitioned
-- comes back as after a Redis restart (a new epoch: it puts back its
-- permits and waiters).
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-7 common, 8 the node's tombstone TTL ms: a call of the
--   node that reaches Redis after this one (sent before it, late)
--   changes nothing while it lives (left in common.lua); 9 '1' when a
--   call of the node got no answer in that time (it may still run): the
--   mark '!late' in K.gone, for as long, keeps the last leave from
--   deleting the tombstones (K.gone then expires by itself).
-- Returns the number of permits released, 1 when every key of the queue
-- was deleted (no live node left), else 0, and then 1 where '!late' kept
-- the tombstones (a register too may still come: Store.Leave).
-- Idempotent: a second run finds nothing of the node.
clock()
local held = mine(ARGV[1])
for _, id in ipairs(held) do
  redis.call('ZREM', K.holders, id)
  unheld(id, 0)
end
redis.call('ZREM', K.nodes, ARGV[1])
redis.call('HDEL', K.members, ARGV[1])
redis.call('HDEL', K.upool, ARGV[1])
tombstone(ARGV[1], tonumber(ARGV[8]))
if ARGV[9] == '1' then tombstone('!late', tonumber(ARGV[8])) end
reap()
dispatch('')
drop_waiters_of(forget_dead())
redis.call('ZREMRANGEBYSCORE', K.fidle, '-inf', num(vtime()))
if redis.call('ZCOUNT', K.nodes, now, '+inf') == 0 then
  local late = redis.call('ZSCORE', K.gone, '!late')
  if late and tonumber(late) > now then
    -- A call of a node that left may still reach Redis: the tombstones
    -- stay for it to find (it then changes nothing), and expire with the
    -- longest of them: also a key written while nodes lived, which has
    -- no expiry (tombstone in common.lua).
    redis.call('ZREMRANGEBYSCORE', K.gone, '-inf', now)
    local last = redis.call('ZRANGE', K.gone, -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', K.gone, math.max(tonumber(last[2]) - now, 1))
    local others = {}
    for _, k in ipairs(KEYS) do
      if k ~= K.gone then others[#others + 1] = k end
    end
    redis.call('DEL', unpack(others))
    return {#held, 1, 1}
  end
  redis.call('DEL', unpack(KEYS))
  return {#held, 1}
end
return {#held, 0}
