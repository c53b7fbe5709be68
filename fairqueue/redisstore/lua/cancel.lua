-- cancel: take a ticket out of the queue (client gone, timeout, drain);
-- if it was granted meanwhile, release its permit and hand it on.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-7 common, 8 tombstone TTL ms (0: no tombstone), 9
--   the correction added to its flow's counter if it was granted (a
--   grant nobody used: minus its cost; absent: 0).
-- Returns the grants dispatch made to the cancelling node's own waiters
-- ({ticket, grant no, upstream, Redis ms, ...}; see dispatch in
-- dispatch.lua).
-- Expired leases are reaped by dispatch where they keep a waiter out.
-- Idempotent: a second cancel finds nothing to remove. The tombstone
-- makes an acquire of the same ticket that reaches Redis later a no-op.
clock()
local id = ARGV[1]
if tonumber(ARGV[8]) > 0 then
  tombstone(id, tonumber(ARGV[8]))
end
-- A fair ticket the index (K.fticket) lacks, not granted, is looked for
-- in its flow's order (unqueue): Redis may have evicted the index.
if redis.call('ZREM', K.waiting, id) == 0 then
  unqueue(id, redis.call('ZSCORE', K.holders, id) == false)
end
take_weight(id)
if redis.call('ZREM', K.holders, id) == 1 then unheld(id, tonumber(ARGV[9]) or 0) end
return (dispatch(owner_of(id)))
