-- acquire: grant a ticket at once (fast path) or put it in the queue.
-- KEYS: the common layout (all seven).
-- ARGV: 1 ticket, 2-5 common, 6 node, 7 epoch candidate.
-- Returns {status, seq, grant_no, position, grants, epoch}, status one of
--   'granted', 'queued', 'gone'.
-- Idempotent by ticket: a ticket that already holds a permit answers
-- 'granted' (grant_no 0), one already waiting answers 'queued' with its
-- rank, a cancelled one (tombstone) answers 'gone'; none is changed.
local id, node = ARGV[1], ARGV[6]
local epoch = redis.call('SET', KEYS[5], ARGV[7], 'NX', 'GET') or ARGV[7]
local tomb = redis.call('ZSCORE', KEYS[7], id)
if tomb and tonumber(tomb) > now then
  return {'gone', 0, 0, 0, 0, epoch}
end
redis.call('ZADD', KEYS[4], now + lease, node)
if redis.call('ZSCORE', KEYS[3], id) then
  return {'granted', 0, 0, 0, grants(), epoch}
end
local rank = redis.call('ZRANK', KEYS[2], id)
if rank then
  return {'queued', 0, 0, rank + 1, grants(), epoch}
end
reap()
dispatch()
local seq = redis.call('INCR', KEYS[1])
if redis.call('ZCARD', KEYS[2]) == 0 and redis.call('ZCARD', KEYS[3]) < permits then
  redis.call('ZADD', KEYS[3], now + lease, id)
  local no = redis.call('INCR', KEYS[6])
  return {'granted', seq, no, 0, no, epoch}
end
redis.call('ZADD', KEYS[2], seq, id)
return {'queued', seq, 0, redis.call('ZCARD', KEYS[2]), grants(), epoch}
