-- acquire: grant a ticket at once (fast path) or put it in the queue.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-7 common, 8 node, 9 epoch candidate, 10 the ticket's
--   cost (fair queueing, see fair.lua; a ticket without a flow is
--   ordered by arrival), 11 max waiting (0: no cap), 12 max waiting per
--   flow (0: no cap).
-- A node that is not alive here (new, idle past its lease, or forgotten)
-- is made alive, with its lease, and marked (mark 0) so that its next
-- heartbeat reports it rejoined: Redis may have dropped its waiters, and
-- only the heartbeat can tell the node to check them. An alive node's
-- liveness is left to its heartbeats.
-- Returns {status, seq, grant_no, position, grants, epoch, own grants,
--   upstream}, status one of 'granted', 'queued', 'gone', 'full' (a cap
--   refused it); own grants: {ticket, grant no, upstream, ...} made to
--   the node's earlier waiters by this call's dispatch (see dispatch in
--   dispatch.lua); upstream: the granted ticket's pool upstream, or ''.
-- The fast path grants only when nobody may be served before the ticket:
--   no FIFO waiter, no ready flow, its tenant under its cap, and (with a
--   pool) an upstream with a free permit.
-- Idempotent by ticket: a ticket that already holds a permit answers
-- 'granted' (grant_no 0), one already waiting answers 'queued' with its
-- place, a cancelled one (tombstone) answers 'gone'; none is changed.
local id, node = ARGV[1], ARGV[8]
local epoch = redis.call('SET', K.epoch, ARGV[9], 'NX', 'GET') or ARGV[9]
-- answer builds the reply (decoded by decodeAcquire in replies.go).
local function answer(status, seq, no, position, own, up)
  return {status, seq, no, position, grants(), epoch, own or {}, up or ''}
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
  return answer('granted', 0, 0, 0, nil, #pool > 0 and upstream_of(id))
end
local rank = redis.call('ZRANK', K.waiting, id)
if rank then
  return answer('queued', 0, 0, rank + 1)
end
local flow = flow_of(id) -- a tenant in one band
local m = flow and redis.call('HGET', K.fticket, id)
if m then
  return answer('queued', 0, 0, fposition(flow, m))
end
reap()
local own, idle, view, up = dispatch(node)
local free = idle and not (flow and capped(tenant_of(flow)))
if not free then
  local cap, fcap = tonumber(ARGV[11]), tonumber(ARGV[12])
  if cap > 0 or (flow and fcap > 0) then
    local n = waiting()
    if (cap > 0 and n >= cap) or
       (flow and fcap > 0 and tonumber(redis.call('HGET', K.twait, flow) or '0') >= fcap) then
      return answer('full', 0, 0, n + 1, own)
    end
  end
end
local seq = redis.call('INCR', K.seq)
local cost = tonumber(ARGV[10])
if free then
  redis.call('ZADD', K.holders, now + lease, id)
  if flow then
    activate(flow, floor())
    charge(flow, cost)
  end
  local no = redis.call('INCR', K.grants)
  if up then place(view, id, up, no) end
  return answer('granted', seq, no, 0, own, up)
end
if flow then
  m = enqueue(flow, seq, cost, id)
  return answer('queued', seq, 0, fposition(flow, m), own)
end
redis.call('ZADD', K.waiting, seq, id)
return answer('queued', seq, 0, redis.call('ZRANK', K.waiting, id) + 1, own)
