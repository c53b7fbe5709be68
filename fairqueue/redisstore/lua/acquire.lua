-- acquire: grant a ticket at once (fast path) or put it in the queue.
-- KEYS: the common layout (all twelve).
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
local epoch = redis.call('SET', KEYS[5], ARGV[7], 'NX', 'GET') or ARGV[7]
local tomb = redis.call('ZSCORE', KEYS[7], id)
if tomb and tonumber(tomb) > now then
  return {'gone', 0, 0, 0, 0, epoch, {}}
end
if not alive(node) then
  redis.call('ZADD', KEYS[4], now + lease, node)
  redis.call('HSET', KEYS[12], node, lease .. ' 0')
end
if redis.call('ZSCORE', KEYS[3], id) then
  return {'granted', 0, 0, 0, grants(), epoch, {}}
end
local rank = redis.call('ZRANK', KEYS[2], id)
if rank then
  return {'queued', 0, 0, rank + 1, grants(), epoch, {}}
end
reap()
local own = dispatch(node)
local tenant = tenant_of(id)
local waiting = redis.call('ZCARD', KEYS[2])
local free = waiting == 0 and redis.call('ZCARD', KEYS[3]) < permits
if not free then
  local cap, tcap = tonumber(ARGV[9]), tonumber(ARGV[10])
  if (cap > 0 and waiting >= cap) or
     (tenant and tcap > 0 and tonumber(redis.call('HGET', KEYS[10], tenant) or '0') >= tcap) then
    return {'full', 0, 0, waiting + 1, grants(), epoch, own}
  end
end
local seq = redis.call('INCR', KEYS[1])
local score = seq
if tenant then
  local v = tonumber(redis.call('GET', KEYS[8]) or '0')
  local last = tonumber(redis.call('HGET', KEYS[9], tenant) or '0')
  score = math.max(v, last) + tonumber(ARGV[8])
end
if free then
  redis.call('ZADD', KEYS[3], now + lease, id)
  if tenant then advance(score) end
  local no = redis.call('INCR', KEYS[6])
  return {'granted', seq, no, 0, no, epoch, own}
end
redis.call('ZADD', KEYS[2], score, id)
if tenant then
  redis.call('HSET', KEYS[9], tenant, tostring(score))
  redis.call('HINCRBY', KEYS[10], tenant, 1)
end
return {'queued', seq, 0, redis.call('ZRANK', KEYS[2], id) + 1, grants(), epoch, own}
