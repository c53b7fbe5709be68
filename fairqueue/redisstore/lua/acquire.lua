-- acquire: grant a ticket at once (fast path) or put it in the queue.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-5 common, 6 node, 7 epoch candidate, 8 the ticket's
--   cost / its tenant's weight (fair queueing; a ticket without a tenant
--   is ordered by arrival), 9 max waiting (0: no cap), 10 max waiting per
--   tenant (0: no cap).
-- A node that is not alive here (new, idle past its lease, or forgotten)
-- is made alive, with its lease, and marked (mark 0) so that its next
-- heartbeat reports it rejoined: Redis may have dropped its waiters, and
-- only the heartbeat can tell the node to check them. An alive node's
-- liveness is left to its heartbeats.
-- Returns {status, seq, grant_no, position, grants, epoch, own grants},
--   status one of 'granted', 'queued', 'gone', 'full' (a cap refused it);
--   own grants: {ticket, grant no, ...} made to the node's earlier waiters
--   by this call's dispatch (see dispatch in common.lua).
-- Order: FIFO by seq; with a tenant, self-clocked fair queueing:
--   tag = max(vtime, tlast[tenant]) + cost / weight, so tenants interleave
--   and FIFO holds inside each tenant.
-- Idempotent by ticket: a ticket that already holds a permit answers
-- 'granted' (grant_no 0), one already waiting answers 'queued' with its
-- rank, a cancelled one (tombstone) answers 'gone'; none is changed.
local id, node = ARGV[1], ARGV[6]
local epoch = redis.call('SET', K.epoch, ARGV[7], 'NX', 'GET') or ARGV[7]
-- answer builds the reply (decoded by decodeAcquire in replies.go).
local function answer(status, seq, no, position, own)
  return {status, seq, no, position, grants(), epoch, own or {}}
end
local tomb = redis.call('ZSCORE', K.gone, id)
if tomb and tonumber(tomb) > now then
  return answer('gone', 0, 0, 0)
end
if not alive(node) then
  redis.call('ZADD', K.nodes, now + lease, node)
  redis.call('HSET', K.members, node, lease .. ' 0')
end
if redis.call('ZSCORE', K.holders, id) then
  return answer('granted', 0, 0, 0)
end
local rank = redis.call('ZRANK', K.waiting, id)
if rank then
  return answer('queued', 0, 0, rank + 1)
end
reap()
local own = dispatch(node)
local tenant = flow_of(id) -- the flow: a tenant in one band
local waiting = redis.call('ZCARD', K.waiting)
local free = waiting == 0 and redis.call('ZCARD', K.holders) < permits
if not free then
  local cap, tcap = tonumber(ARGV[9]), tonumber(ARGV[10])
  if (cap > 0 and waiting >= cap) or
     (tenant and tcap > 0 and tonumber(redis.call('HGET', K.twait, tenant) or '0') >= tcap) then
    return answer('full', 0, 0, waiting + 1, own)
  end
end
local seq = redis.call('INCR', K.seq)
local score = seq
if tenant then
  local v = tonumber(redis.call('GET', K.vtime) or '0')
  local last = tonumber(redis.call('HGET', K.tlast, tenant) or '0')
  score = math.max(v, last) + tonumber(ARGV[8])
end
if free then
  redis.call('ZADD', K.holders, now + lease, id)
  if tenant then advance(score) end
  local no = redis.call('INCR', K.grants)
  return answer('granted', seq, no, 0, own)
end
redis.call('ZADD', K.waiting, score, id)
if tenant then
  redis.call('HSET', K.tlast, tenant, tostring(score))
  redis.call('HINCRBY', K.twait, tenant, 1)
end
return answer('queued', seq, 0, redis.call('ZRANK', K.waiting, id) + 1, own)
