-- acquire: grant a ticket at once (fast path) or put it in the queue.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-7 common, 8 node, 9 epoch candidate, 10 the ticket's
--   cost (fair queueing, see fair.lua; a ticket without a flow is
--   ordered by arrival), followed by " <tokens>" when it weighs tokens
--   (tokens.lua) and " <asks>" when it asks more (TicketArgs.Asks), 11 max waiting (0: no cap), 12 max waiting per flow
--   (0: no cap). A weight counts whatever this call's limits: only a
--   config that counts tokens gives a ticket one, and a waiter Redis lost
--   that its node queues again after a reload turned kv_tokens off keeps
--   it (its request holds those tokens once granted, as a weight dispatch
--   finds recorded counts).
-- A node that is not alive here (new, idle past its lease, or forgotten)
-- is made alive, with its lease, and marked (mark 0) so that its next
-- heartbeat reports it rejoined: Redis may have dropped its waiters, and
-- only the heartbeat can tell the node to check them; its pool is
-- recorded (K.upool), as a heartbeat records it: another node's dispatch
-- grants a waiter of a node without a pool on no upstream, before the
-- node's first heartbeat too. An alive node's liveness is left to its
-- heartbeats.
-- Returns {status, seq, grant_no, position, grants, epoch, own grants,
--   upstream}, status one of 'granted', 'queued', 'gone', 'full' (a cap
--   refused it); own grants: {ticket, grant no, upstream, Redis ms,
--   ...} made to the node's earlier waiters by this call's dispatch (see
--   dispatch in dispatch.lua); upstream: the granted ticket's pool upstream, or ''.
-- The fast path grants only when nobody may be served before the ticket:
--   no FIFO waiter, no ready flow, its tenant under its cap, and (with a
--   pool) an upstream with a free permit.
-- Idempotent by ticket: a ticket that already holds a permit answers
-- 'granted' (grant_no 0), one already waiting answers 'queued' with its
-- place, a cancelled one (tombstone) answers 'gone'; none is changed.
-- An acquire of a node that left (sent before its leave, come late: left
-- in common.lua) answers 'gone' too: it would queue or grant a ticket,
-- and bring the node back to life, for nobody.
-- Cost: the fast path reads whether anybody waits, whether any
-- tombstone lives and whether any upstream may be cooling in one EXISTS,
-- and looks the ticket up only where it could be known: a holder is
-- found by the grant's ZADD NX itself; a waiter, or a tombstone, only
-- where that EXISTS says one exists. A fair grant reads its flow's
-- counter once and writes it once (charge).
clock()
local id, node = ARGV[1], ARGV[8]
local flow = flow_of(id) -- a tenant in one band
local cost, weight, asks = string.match(ARGV[10], '^(%S+) ?(%d*) ?(%d*)$')
cost, weight, asks = tonumber(cost), tonumber(weight) or 0, tonumber(asks)
-- epoch: the data set's, read (or set where missing, when the node is
-- not alive here: see below). Always in the reply: a heartbeat that made
-- the node alive in a new data set may answer after this call does, and
-- the reply's grant counter (a waiter's place) is counted in this one.
local epoch = ''
-- answer builds the reply (decoded by decodeAcquire in replies.go); a
-- grant made here passes its number, which is the grant counter.
local function answer(status, seq, no, position, own, up, count)
  return {status, seq, no, position, count or grants(), epoch, own or {}, up or ''}
end
-- One EXISTS tells whether anybody waits (FIFO or fair, ready or not),
-- whether any tombstone lives and, with a pool, whether any upstream may
-- be cooling (see present in common.lua).
local ex = present('waiting', 'fwait', 'gone', #pool > 0 and 'ucool' or nil)
local quiet = not (ex.waiting or ex.fwait) -- nobody waits
if ex.gone then
  -- Tombstones (a failed call leaves one, a leave, and a requeue, for
  -- the ticket it gave back): the ended go, so that the key soon
  -- vanishes and the check with it; a live one is ours?
  redis.call('ZREMRANGEBYSCORE', K.gone, '-inf', now)
  if redis.call('ZSCORE', K.gone, id) or left(node) then
    return answer('gone', 0, 0, 0)
  end
end
if not alive(node) then
  -- Only here can the data set be new: the node's liveness entry is
  -- written after the epoch, so while it is alive the epoch is the one
  -- the node learnt when it became alive (this branch or a heartbeat),
  -- or the heartbeat finds the epoch key missing and sets a new one.
  epoch = redis.call('SET', K.epoch, ARGV[9], 'NX', 'GET') or ARGV[9]
  redis.call('ZADD', K.nodes, now + lease, node)
  redis.call('HSET', K.members, node, lease .. ' 0')
  redis.call('HSET', K.upool, node, ARGV[7] or '')
else
  epoch = redis.call('GET', K.epoch) or ''
end
-- arrival is the ticket's arrival number (K.seq). The counter starts
-- over (at 1) with the queue's keys; one that starts over beside waiters
-- was lost alone (an eviction under maxmemory): each later arrival would
-- queue ahead of them until the counter had passed their numbers (in a
-- busy queue, they would wait out their max_wait). It goes on above the
-- last of theirs: read only then (FIFO: one ZRANGE; fair: the flows'
-- orders, O(fair waiters)). A holder's number is not kept in Redis: a
-- requeue at it moves the counter on (requeue.lua).
local function arrival()
  local seq = redis.call('INCR', K.seq)
  if seq == 1 and (ex.waiting or ex.fwait) then
    local top = 0
    local h = redis.call('ZRANGE', K.waiting, -1, -1, 'WITHSCORES')
    if #h > 0 then top = tonumber(h[2]) end
    for _, m in ipairs(ex.fwait and redis.call('ZRANGE', K.fwait, 0, -1) or {}) do
      local _, s = parse(m)
      top = math.max(top, tonumber(s, 16))
    end
    if top >= seq then
      seq = top + 1
      redis.call('SET', K.seq, string.format('%.0f', seq))
    end
  end
  return seq
end
-- n, tn: the permits the flow and its tenant hold, if room read them
local own, free, view, up, n, tn = {}, 0, nil, nil, nil, nil
if quiet then
  free, view, up, n, tn = room(flow, ex.ucool, asked(weight, asks))
end
if free == 0 then
  -- Not the fast path: the ticket may be known (a re-sent acquire).
  if redis.call('ZSCORE', K.holders, id) then
    return answer('granted', 0, 0, 0, nil, upstream_of(id))
  end
  local rank = redis.call('ZRANK', K.waiting, id)
  if rank then
    return answer('queued', 0, 0, rank + 1)
  end
  local m = flow and redis.call('HGET', K.fticket, id)
  if m then
    return answer('queued', 0, 0, fposition(flow, m))
  end
  if not quiet then
    local idle
    own, idle = dispatch(node)
    if idle then free, view, up, n, tn = room(flow, ex.ucool, asked(weight, asks)) end
  end
end
if free == 0 then
  local cap, fcap = tonumber(ARGV[11]), tonumber(ARGV[12])
  if cap > 0 or (flow and fcap > 0) then
    local n = waiting()
    if (cap > 0 and n >= cap) or
       (flow and fcap > 0 and tonumber(redis.call('HGET', K.twait, flow) or '0') >= fcap) then
      return answer('full', 0, 0, n + 1, own)
    end
  end
end
if free > 0 then
  -- A re-sent acquire of a ticket granted already finds its entry here.
  if redis.call('ZADD', K.holders, 'NX', now + lease, id) == 0 then
    return answer('granted', 0, 0, 0, own, upstream_of(id))
  end
  local seq = arrival()
  if flow then
    -- Its counter read once and written once (quiet: no flow is ready).
    charge(flow, cost, counter(flow) or start(flow, quiet), n, tn)
  end
  local no = redis.call('INCR', K.grants)
  if up then place(view, id, up, no) end
  take_tokens(id, asked(weight, asks), up, view, true)
  return answer('granted', seq, no, 0, own, up, no)
end
local seq = arrival()
set_weight(id, weight, true, asks)
if flow then
  local m = enqueue(flow, seq, cost, id)
  return answer('queued', seq, 0, fposition(flow, m), own)
end
redis.call('ZADD', K.waiting, seq, id)
return answer('queued', seq, 0, redis.call('ZRANK', K.waiting, id) + 1, own)
