-- requeue: a held ticket gives its permit back and a new ticket of the
-- same node and flow takes its place in the queue, in one step: an
-- upstream refused the request before anything reached the client
-- (fairqueue.Permit.Requeue).
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 new ticket, 2-7 common, 8 node, 9 epoch candidate, 10 the new
--   ticket's cost [and " <tokens>" [" <asks>"], as acquire's], 11 the old ticket, 12 its arrival order (the new
--   ticket's place: before every ticket that arrived later), 13 the old
--   ticket's correction (usually minus its cost: its grant is undone),
--   14 an upstream to cool ('' : none), 15 for how many ms, 16 '1' to
--   mark the old ticket freed (as release.lua's 11), 17 the old
--   ticket's tombstone TTL ms (0 or absent: none).
-- Returns acquire's reply (see acquire.lua): 'queued' with the new
--   ticket's position (a grant dispatch made it at once is among the own
--   grants), or for a call sent again 'granted' or 'queued' as the new
--   ticket stands, or 'gone' (cancelled meanwhile). No queue cap applies.
-- Idempotent by both tickets: the first run tombstones the old ticket
-- (K.gone), so that a copy sent again that reaches Redis after the new
-- ticket was granted and released (go-redis sends a command again after
-- a read timeout, on another connection; the first send may run last)
-- finds that it ran, and answers 'gone' (its reply is read by nobody)
-- rather than queue the new ticket again for a request no node waits
-- for: that waiter would count in the queue, and, granted with its
-- grant in that unread reply, hold a permit for nobody for a lease.
clock()
local id, node, old, seq = ARGV[1], ARGV[8], ARGV[11], tonumber(ARGV[12])
local epoch = ''
local function answer(status, no, position, own, up)
  return {status, seq, no, position, grants(), epoch, own or {}, up or ''}
end
-- A requeue of a node that left (sent before its leave, come late: left
-- in common.lua) answers 'gone' and changes nothing: the leave released
-- the old ticket; the new one would wait, or hold, for nobody. Checked
-- before the epoch is set: after the last leave, it writes no key.
if left(node) then return answer('gone', 0, 0) end
epoch = redis.call('SET', K.epoch, ARGV[9], 'NX', 'GET') or ARGV[9]
if not alive(node) then
  redis.call('ZADD', K.nodes, now + lease, node)
  redis.call('HSET', K.members, node, lease .. ' 0')
  redis.call('HSET', K.upool, node, ARGV[7] or '') -- its pool, as acquire.lua records it
end
local flow = flow_of(id)
local tomb = redis.call('ZSCORE', K.gone, id)
local gone = tomb and tonumber(tomb) > now
local known = gone or redis.call('ZSCORE', K.holders, id) or redis.call('ZSCORE', K.waiting, id) or
  (flow and redis.call('HEXISTS', K.fticket, id) == 1)
-- ran: a copy of a requeue that ran already (the old ticket's tombstone),
-- whose new ticket has ended since (neither held nor waiting).
local ttl = tonumber(ARGV[17]) or 0
local ran = false
if not known and ttl > 0 then
  local t = redis.call('ZSCORE', K.gone, old)
  ran = t ~= false and tonumber(t) > now
end
known = known or ran
if ttl > 0 and not ran then tombstone(old, ttl) end
-- The new ticket first: its flow, still holding the old permit, stays
-- active and keeps its counter.
if not known then
  -- The arrival counter below the ticket's number was lost alone (an
  -- eviction under maxmemory: see arrival in acquire.lua): it moves on,
  -- so that later arrivals queue behind the ticket, not ahead of it.
  if seq > 0 and tonumber(redis.call('GET', K.seq) or '0') < seq then
    redis.call('SET', K.seq, string.format('%.0f', seq))
  end
  local cost, weight, asks = string.match(ARGV[10], '^(%S+) ?(%d*) ?(%d*)$')
  set_weight(id, tonumber(weight), true, tonumber(asks))
  if flow then
    unready(flow) -- its head may change
    enqueue(flow, seq, tonumber(cost), id)
  else
    redis.call('ZADD', K.waiting, seq, id)
  end
end
mark_freed(old, ARGV[16])
-- The upstream refused the request: the first send cools it, whether or
-- not the old permit is still held here (Redis may have lost it: a
-- restart without persistence, FLUSHALL; then the new ticket, unknown,
-- would be granted at once on the upstream that refused it). Sent again
-- (the new ticket known, the old one held no more), it does not extend
-- the cooldown.
local held = redis.call('ZREM', K.holders, old) == 1
if held then unheld(old, tonumber(ARGV[13])) end
if held or not known then cool(ARGV[14], ARGV[15]) end
local own = (dispatch(node))
if gone or ran then return answer('gone', 0, 0, own) end
if redis.call('ZSCORE', K.holders, id) then
  return answer(known and 'granted' or 'queued', 0, 0, own, upstream_of(id))
end
local rank = redis.call('ZRANK', K.waiting, id)
if rank then return answer('queued', 0, rank + 1, own) end
local m = flow and redis.call('HGET', K.fticket, id)
return answer('queued', 0, m and fposition(flow, m) or 1, own)
