-- heartbeat: renew a node's liveness and the leases of its permits.
-- KEYS: the common layout (2-5, 11 used).
-- ARGV: 1 node, 2-5 common, 6 epoch the node knows ('' if none),
--   7 epoch candidate, 8 count n of held tickets, 9..8+n held tickets,
--   9+n.. adopted tickets (admitted while Redis was unreachable).
-- Returns {epoch, rejoined, waiting, holders, nodes, expired, re-added}:
-- waiting to expired are the cluster's view (queue length, permits held,
-- live nodes, leases that ended unrenewed since the queue began);
-- rejoined = 1 when the node was not alive here (Redis lost its data, or
-- the node was silent longer than its lease), so its waiters must be
-- queued again; re-added lists the held tickets whose holder entry was
-- missing.
-- A held ticket whose entry is missing is counted again when Redis lost
-- it: the data set is new (the epoch changed), or the node is still
-- alive here (a failover that lost the last writes kept the epoch key).
-- Its request still runs on the upstream, so counting it is the truth.
-- A node that is not alive re-adds nothing in this heartbeat: it may have
-- left (a heartbeat delayed past its leave, while other nodes keep the
-- queue). A node back from a partition longer than its lease is alive
-- again after this heartbeat, and its next one counts its running
-- requests again. A ticket released while this heartbeat was on its way
-- is re-added too: the node releases it again when it sees it in the
-- reply (or, if the reply is lost, its reconcile finds the ghost).
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
local readd = lost or rejoined == 0
redis.call('ZADD', KEYS[4], now + lease, node)
local n = tonumber(ARGV[8])
local readded = {}
for i = 9, 8 + n do
  if not readd then
    redis.call('ZADD', KEYS[3], 'XX', now + lease, ARGV[i])
  elseif redis.call('ZADD', KEYS[3], now + lease, ARGV[i]) == 1 then
    readded[#readded + 1] = ARGV[i]
  end
end
for i = 9 + n, #ARGV do
  redis.call('ZADD', KEYS[3], now + lease, ARGV[i])
end
return {cur, rejoined, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  redis.call('ZCOUNT', KEYS[4], now, '+inf'), tonumber(redis.call('GET', KEYS[11]) or '0'), readded}
