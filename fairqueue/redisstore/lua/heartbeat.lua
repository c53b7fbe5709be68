-- heartbeat: renew a node's liveness and the leases of its permits, and
-- tell it which of its waiters Redis no longer has.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-7 common, 8 epoch the node knows ('' if none),
--   9 epoch candidate, 10 this heartbeat's number (per node, increasing),
--   11 count n of held tickets, 12 count m of pending tickets, then the n
--   held tickets, the m pending tickets, and the adopted tickets
--   (admitted while Redis was unreachable) to the end. A held or adopted
--   ticket is "<ticket>[ u=<upstream>][ w=<tokens>]": re-added or
--   adopted, it counts on its pool upstream (pool.lua) and weighs its
--   tokens (tokens.lua) too.
-- Returns {epoch, rejoined, waiting, holders, nodes, expired, re-added,
-- missing, tokens held, Redis ms, rank, mine, mine's tokens, the pool's
-- upstreams held} (mine below): waiting to expired, and tokens held, are the
-- cluster's view (queue length, permits held, live nodes, leases that
-- ended unrenewed since the queue began, the holders' weights); rejoined = 1 when Redis had forgotten the node (it lost its
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
-- the truth; one still queued (a lost transfer) leaves the queue. A
-- forgotten node re-adds nothing in this heartbeat: it may
-- have left (a heartbeat delayed past its leave, while other nodes keep
-- the queue); its next heartbeat counts its running requests again. A
-- ticket released while this heartbeat was on its way is not counted
-- again: the node marks such a release, transfer or requeue (K.freed,
-- mark_freed in common.lua). Where the
-- mark is missing (a heartbeat that ran later than the node knew, after
-- its call failed), the node releases again every ticket it released
-- meanwhile.
-- A heartbeat of a node that left (Queue.Close; a call sent before the
-- leave that reached Redis after it) changes nothing: the leave gave
-- back every permit of the node, and a late call counts none again
-- (left in common.lua), adopted tickets included; a node only forgotten
-- (silent past its lease) adopts them at once, as the permits it runs.
-- The node's pool (ARGV[7]) is recorded in K.upool: what is kept of an
-- upstream no node has any more goes (pool_forget, pool.lua).
-- Idempotent: expiries are set to now + lease, and a re-sent heartbeat
-- (same number) reports rejoined as its first run did (the mark).
clock()
local node, beat = ARGV[1], ARGV[10]
local cur = redis.call('GET', K.epoch)
local lost = (not cur) or (ARGV[8] ~= '' and cur ~= ARGV[8])
if not cur then
  cur = ARGV[9]
  redis.call('SET', K.epoch, cur)
end
-- mine: the permits this node's tickets hold (a ticket's ID names its
-- node: "<node>:..."), their weights, and, by each upstream of the
-- node's pool, {dial, held, mine, ...}: the permits held on it and this
-- node's, a holder without an upstream counted on every one, as
-- dispatch counts it (pool_view). What the node's fallback queue takes
-- while Redis is down: ClusterView.Mine. O(holders).
local function mine()
  local ids = redis.call('ZRANGE', K.holders, 0, -1)
  local own, prefix = {}, node .. ':'
  for _, id in ipairs(ids) do
    if string.sub(id, 1, #prefix) == prefix then own[#own + 1] = id end
  end
  local tokens = 0
  if #own > 0 and redis.call('EXISTS', K.thold) == 1 then
    for _, w in ipairs(redis.call('HMGET', K.thold, unpack(own))) do tokens = tokens + (tonumber(w) or 0) end
  end
  local ups = {}
  if #pool > 0 then
    local on, of = {}, {}
    local placed = redis.call('HGETALL', K.uheld)
    for i = 1, #placed, 2 do
      on[placed[i + 1]] = (on[placed[i + 1]] or 0) + 1
      of[placed[i]] = placed[i + 1]
    end
    local anywhere = math.max(#ids - #placed / 2, 0)
    local mine_on, mine_any = {}, 0
    for _, id in ipairs(own) do
      local u = of[id]
      if u then mine_on[u] = (mine_on[u] or 0) + 1 else mine_any = mine_any + 1 end
    end
    for _, u in ipairs(pool) do
      ups[#ups + 1] = u.dial
      ups[#ups + 1] = (on[u.dial] or 0) + anywhere
      ups[#ups + 1] = (mine_on[u.dial] or 0) + mine_any
    end
  end
  return #own, tokens, ups
end
-- reply: the answer, with the cluster's view, this node's rank among
-- the live nodes in the order of their IDs and what it holds (its part
-- of the capacity while Redis is down: ClusterView.Rank, Mine).
local function reply(rejoined, readded, missing)
  local live = redis.call('ZRANGE', K.nodes, now, '+inf', 'BYSCORE')
  local rank = 0
  for _, other in ipairs(live) do
    if other < node then rank = rank + 1 end
  end
  local own, own_tokens, ups = mine()
  return {cur, rejoined, waiting(), redis.call('ZCARD', K.holders),
    #live, tonumber(redis.call('GET', K.expired) or '0'), readded, missing,
    held_tokens(), now, rank, own, own_tokens, ups}
end
-- A heartbeat of a node that left, sent before its leave and come late,
-- does not bring the node back to life, and renews, re-adds and adopts
-- nothing (left in common.lua). The node reads no reply: it left.
if left(node) then return reply(1, {}, {}) end
local info = redis.call('HGET', K.members, node)
local mark = info and string.match(info, ' (%S+)$')
if lost or not mark or mark == '0' or not alive(node) then mark = beat end
local rejoined = 0
if mark == beat then rejoined = 1 end
redis.call('HSET', K.members, node, lease .. ' ' .. mark)
redis.call('ZADD', K.nodes, now + lease, node)
redis.call('HSET', K.upool, node, ARGV[7] or '')
pool_forget()
local readd = lost or rejoined == 0
-- marked: some permit was given back while a heartbeat was on its way
-- (K.freed); the expired marks go.
local marked = redis.call('EXISTS', K.freed) == 1
if marked then redis.call('ZREMRANGEBYSCORE', K.freed, '-inf', now) end
local n, m = tonumber(ARGV[11]), tonumber(ARGV[12])
-- add counts a holder entry added again (re-added or adopted) on its
-- upstream and with its weight, if it names them: the weight its ticket
-- was queued with, counted whatever this call's limits (a reload turned
-- kv_tokens off on the node while the request ran), as dispatch and
-- transfer count a recorded weight: the request holds those tokens, and
-- a node that counts them must see them. A holder counted already that
-- weighs nothing here although the node names its weight gets it: a
-- call that found it lost counted it without one (a local handoff after
-- Redis lost its data, transfer.lua, knows no weight).
local function add(arg)
  local id = string.match(arg, '^%S+')
  local up, w = string.match(arg, ' u=(%S+)'), tonumber(string.match(arg, ' w=(%d+)'))
  if marked and redis.call('ZSCORE', K.freed, id) then return nil end
  if redis.call('ZADD', K.holders, now + lease, id) == 0 then
    if w and w > 0 and redis.call('HEXISTS', K.thold, id) == 0 then
      take_tokens(id, w, redis.call('HGET', K.uheld, id) or nil, nil, true)
    end
    return nil
  end
  -- Still queued here (a failover lost the transfer of the local
  -- handoff that started it): it leaves the queue, where it would count
  -- in every position and be granted again when it ends.
  if redis.call('ZREM', K.waiting, id) == 1 or unqueue(id) then take_weight(id) end
  held(id)
  if up then redis.call('HSET', K.uheld, id, up) end
  take_tokens(id, w, up, nil, true)
  return id
end
local readded = {}
for i = 13, 12 + n do
  if not readd then
    redis.call('ZADD', K.holders, 'XX', now + lease, (string.match(ARGV[i], '^%S+')))
  else
    local id = add(ARGV[i])
    if id then readded[#readded + 1] = id end
  end
end
local missing = {}
for i = 13 + n, 12 + n + m do
  local id = ARGV[i]
  -- A fair ticket waits where its order entry is (K.fwait): one Redis
  -- lost (an eviction of that key) with its index entry left waits
  -- nowhere, and that entry goes, so the node can queue it again.
  local fm = redis.call('HGET', K.fticket, id)
  if fm and not redis.call('ZSCORE', K.fwait, fm) then
    unqueue(id)
    fm = false
  end
  if not redis.call('ZSCORE', K.waiting, id) and not fm and not redis.call('ZSCORE', K.holders, id) then
    missing[#missing + 1] = id
  end
end
for i = 13 + n + m, #ARGV do add(ARGV[i]) end
return reply(rejoined, readded, missing)
