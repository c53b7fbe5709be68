-- heartbeat: renew a node's liveness and the leases of its permits, and
-- tell it which of its waiters Redis no longer has.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-6 common, 7 epoch the node knows ('' if none),
--   8 epoch candidate, 9 this heartbeat's number (per node, increasing),
--   10 count n of held tickets, 11 count m of pending tickets, then the n
--   held tickets, the m pending tickets, and the adopted tickets
--   (admitted while Redis was unreachable) to the end.
-- Returns {epoch, rejoined, waiting, holders, nodes, expired, re-added,
-- missing}: waiting to expired are the cluster's view (queue length,
-- permits held, live nodes, leases that ended unrenewed since the queue
-- began); rejoined = 1 when Redis had forgotten the node (it lost its
-- data, the node was silent longer than its lease, or an acquire brought
-- the node back since its last heartbeat): its waiters may be gone, so it
-- should name them in a heartbeat; re-added lists the held tickets whose
-- holder entry was missing; missing lists the pending tickets that are
-- neither waiting nor holding here: the node queues them again.
-- The node's lease is recorded with its membership: grants made to its
-- waiters by any node expire after it.
-- A held ticket whose entry is missing is counted again when Redis lost
-- it: the data set is new (the epoch changed), or the node is alive here
-- and was not forgotten (a failover that lost the last writes kept the
-- epoch key). Its request still runs on the upstream, so counting it is
-- the truth. A forgotten node re-adds nothing in this heartbeat: it may
-- have left (a heartbeat delayed past its leave, while other nodes keep
-- the queue); its next heartbeat counts its running requests again. A
-- ticket released while this heartbeat was on its way is re-added too:
-- the node releases again every ticket it released meanwhile.
-- Idempotent: expiries are set to now + lease, and a re-sent heartbeat
-- (same number) reports rejoined as its first run did (the mark).
local node, beat = ARGV[1], ARGV[9]
local cur = redis.call('GET', K.epoch)
local lost = (not cur) or (ARGV[7] ~= '' and cur ~= ARGV[7])
if not cur then
  cur = ARGV[8]
  redis.call('SET', K.epoch, cur)
end
local info = redis.call('HGET', K.members, node)
local mark = info and string.match(info, ' (%S+)$')
if lost or not mark or mark == '0' or not alive(node) then mark = beat end
local rejoined = 0
if mark == beat then rejoined = 1 end
redis.call('HSET', K.members, node, lease .. ' ' .. mark)
redis.call('ZADD', K.nodes, now + lease, node)
local readd = lost or rejoined == 0
local n, m = tonumber(ARGV[10]), tonumber(ARGV[11])
local readded = {}
for i = 12, 11 + n do
  if not readd then
    redis.call('ZADD', K.holders, 'XX', now + lease, ARGV[i])
  elseif redis.call('ZADD', K.holders, now + lease, ARGV[i]) == 1 then
    readded[#readded + 1] = ARGV[i]
    held(ARGV[i])
  end
end
local missing = {}
for i = 12 + n, 11 + n + m do
  local id = ARGV[i]
  if not redis.call('ZSCORE', K.waiting, id) and redis.call('HEXISTS', K.fticket, id) == 0 and
     not redis.call('ZSCORE', K.holders, id) then
    missing[#missing + 1] = id
  end
end
for i = 12 + n + m, #ARGV do
  if redis.call('ZADD', K.holders, now + lease, ARGV[i]) == 1 then held(ARGV[i]) end
end
return {cur, rejoined, waiting(), redis.call('ZCARD', K.holders),
  redis.call('ZCOUNT', K.nodes, now, '+inf'), tonumber(redis.call('GET', K.expired) or '0'), readded, missing}
