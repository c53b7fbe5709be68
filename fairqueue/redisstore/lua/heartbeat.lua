-- heartbeat: renew a node's liveness and the leases of its permits.
-- KEYS: the common layout (2-5, 11 used).
-- ARGV: 1 node, 2-5 common, 6 epoch the node knows ('' if none),
--   7 epoch candidate, 8 count n of held tickets, 9..8+n held tickets,
--   9+n.. adopted tickets (admitted while Redis was unreachable).
-- Returns {epoch, rejoined, waiting, holders, nodes, expired}: the last
-- four are the cluster's view (queue length, permits held, live nodes,
-- leases that ended unrenewed since the queue began); rejoined =
-- 1 when the node was not alive
-- here (Redis lost its data, or the node was silent longer than its
-- lease), so its waiters must be queued again.
-- A held ticket whose holder entry is missing is re-added only when the
-- epoch shows that Redis lost its data: after a mere partition longer
-- than the lease the permit may already belong to someone else.
-- Idempotent: it only sets expiries to now + lease.
local node = ARGV[1]
local cur = redis.call('GET', KEYS[5])
local lost = (not cur) or (ARGV[6] ~= '' and cur ~= ARGV[6])
if not cur then
  cur = ARGV[7]
  redis.call('SET', KEYS[5], cur)
end
local rejoined = 0
if not alive(node) then rejoined = 1 end
redis.call('ZADD', KEYS[4], now + lease, node)
local n = tonumber(ARGV[8])
for i = 9, 8 + n do
  if lost then
    redis.call('ZADD', KEYS[3], now + lease, ARGV[i])
  else
    redis.call('ZADD', KEYS[3], 'XX', now + lease, ARGV[i])
  end
end
for i = 9 + n, #ARGV do
  redis.call('ZADD', KEYS[3], now + lease, ARGV[i])
end
return {cur, rejoined, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  redis.call('ZCOUNT', KEYS[4], now, '+inf'), tonumber(redis.call('GET', KEYS[11]) or '0')}
