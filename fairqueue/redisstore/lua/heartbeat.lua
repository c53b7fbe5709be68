-- heartbeat: renew a node's liveness and the leases of its permits.
-- KEYS: the common layout (2-5, 11 used).
-- ARGV: 1 node, 2-5 common, 6 epoch the node knows ('' if none; kept for
--   the layout, the reply's epoch tells the node),
--   7 epoch candidate, 8 count n of held tickets, 9..8+n held tickets,
--   9+n.. adopted tickets (admitted while Redis was unreachable).
-- Returns {epoch, rejoined, waiting, holders, nodes, expired, re-added}:
-- waiting to expired are the cluster's view (queue length, permits held,
-- live nodes, leases that ended unrenewed since the queue began);
-- rejoined = 1 when the node was not alive here (Redis lost its data, or
-- the node was silent longer than its lease), so its waiters must be
-- queued again; re-added lists the held tickets whose holder entry was
-- missing.
-- A held ticket is counted again whenever its entry is missing: Redis
-- lost it (restart, or a failover that lost the last writes while the
-- epoch survived), or its lease ended during a partition and the permit
-- went to another waiter. Either way the request still runs on the
-- upstream, so counting it is the truth (the next grant waits for it).
-- A ticket released while this heartbeat was on its way is re-added
-- too: the node releases it again when it sees it in the reply.
-- Idempotent: it only sets expiries to now + lease.
local node = ARGV[1]
local cur = redis.call('GET', KEYS[5])
if not cur then
  cur = ARGV[7]
  redis.call('SET', KEYS[5], cur)
end
local rejoined = 0
if not alive(node) then rejoined = 1 end
redis.call('ZADD', KEYS[4], now + lease, node)
local n = tonumber(ARGV[8])
local readded = {}
for i = 9, 8 + n do
  if redis.call('ZADD', KEYS[3], now + lease, ARGV[i]) == 1 then
    readded[#readded + 1] = ARGV[i]
  end
end
for i = 9 + n, #ARGV do
  redis.call('ZADD', KEYS[3], now + lease, ARGV[i])
end
return {cur, rejoined, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  redis.call('ZCOUNT', KEYS[4], now, '+inf'), tonumber(redis.call('GET', KEYS[11]) or '0'), readded}
