-- cancel: take a ticket out of the queue (client gone, timeout, drain);
-- if it was granted meanwhile, release its permit and hand it on.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-5 common, 6 tombstone TTL ms (0: no tombstone).
-- Returns the grants dispatch made to the cancelling node's own waiters
-- ({ticket, grant no, ...}; see dispatch in common.lua).
-- Idempotent: a second cancel finds nothing to remove. The tombstone
-- makes an acquire of the same ticket that reaches Redis later a no-op.
if tonumber(ARGV[6]) > 0 then
  redis.call('ZADD', K.gone, now + tonumber(ARGV[6]), ARGV[1])
end
local w = redis.call('ZREM', K.waiting, ARGV[1])
if w == 1 then left_queue(ARGV[1]) end
redis.call('ZREM', K.holders, ARGV[1])
reap()
return dispatch(owner_of(ARGV[1]))
