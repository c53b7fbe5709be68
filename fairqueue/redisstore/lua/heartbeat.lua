-- heartbeat: renew a node's liveness and the leases of its permits, and
-- tell it which of its waiters Redis no longer has.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-7 common, 8 epoch the node knows ('' if none),
--   9 epoch candidate, 10 this heartbeat's number (per node, increasing),
--   11 count n of held tickets, 12 count m of pending tickets, then the n
--   held tickets, the m pending tickets ("<ticket>[ w=<tokens>]": the
--   weight it was queued with), and the adopted tickets
--   (admitted while Redis was unreachable) to the end. A held or adopted
--   ticket is "<ticket>[ u=<upstream>][ w=<tokens>]": re-added or
--   adopted, it counts on its pool upstream (pool.lua) and weighs its
--   tokens (tokens.lua) too.
-- Returns {epoch, rejoined, waiting, holders, nodes, expired, re-added,
-- missing, tokens held, Redis ms, rank, held by each live node, held on
-- each upstream of the pool} (holdings below): waiting to expired, and tokens held, are the
-- cluster's view (queue length, permits held, live nodes, leases that
-- ended unrenewed since the queue began, the holders' weights); rejoined = 1 when Redis had forgotten the node (it lost its
-- data, the node was silent longer than its lease, or an acquire brought
-- the node back since its last heartbeat): its waiters may be gone, so it
-- should name them in a heartbeat; re-added lists the held tickets whose
-- holder entry was missing; missing lists the pending tickets that are
-- neither waiting nor holding here: the node queues them again (and
-- those waiting whose weight Redis lost, recorded again: see below).
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
-- A heartbeat of a node that left (see below) sets no epoch: after the
-- last leave, it writes no key.
local gone = left(node)
if gone then
  cur = cur or ''
elseif not cur then
  cur = ARGV[9]
  redis.call('SET', K.epoch, cur)
end
-- holdings: what each live node holds (live: their IDs, in order; a
-- ticket's ID names its node: "<node>:..."): {rank, permits, tokens,
-- ...} for each live node that holds any, in rank order, and, by each
-- upstream of the calling node's pool, {dial, held on it, rank, held on
-- it by that node, ...}: a holder without an upstream counted on every
-- one, as dispatch counts it (pool_view). What each node's fallback
-- queue takes while Redis is down, and what is free to deal
-- (ClusterView.HeldBy). O(holders + nodes), and the nodes that hold any
-- once per upstream.
local function holdings(live)
  local rank_of = {}
  for i, id in ipairs(live) do rank_of[id] = i - 1 end
  local ids = redis.call('ZRANGE', K.holders, 0, -1)
  local w = {}
  if redis.call('EXISTS', K.thold) == 1 then
    local h = redis.call('HGETALL', K.thold)
    for i = 1, #h, 2 do w[h[i]] = tonumber(h[i + 1]) or 0 end
  end
  local held, tok, rank_by_id = {}, {}, {}
  for _, id in ipairs(ids) do
    local r = rank_of[string.match(id, '^[^:]*')]
    if r then
      held[r] = (held[r] or 0) + 1
      tok[r] = (tok[r] or 0) + (w[id] or 0)
      rank_by_id[id] = r
    end
  end
  local by, ranks = {}, {}
  for r = 0, #live - 1 do
    if held[r] then
      ranks[#ranks + 1] = r
      by[#by + 1] = r
      by[#by + 1] = held[r]
      by[#by + 1] = tok[r]
    end
  end
  local ups = {}
  if #pool > 0 then
    local on, on_rank, placed_by, nplaced = {}, {}, {}, 0
    local placed = redis.call('HGETALL', K.uheld)
    for i = 1, #placed, 2 do
      local id, u = placed[i], placed[i + 1]
      on[u] = (on[u] or 0) + 1
      nplaced = nplaced + 1
      local r = rank_by_id[id]
      if r then
        on_rank[u] = on_rank[u] or {}
        on_rank[u][r] = (on_rank[u][r] or 0) + 1
        placed_by[r] = (placed_by[r] or 0) + 1
      end
    end
    local anywhere = math.max(#ids - nplaced, 0)
    for _, u in ipairs(pool) do
      local e, mine = {u.dial, (on[u.dial] or 0) + anywhere}, on_rank[u.dial] or {}
      for _, r in ipairs(ranks) do
        local n = (mine[r] or 0) + held[r] - (placed_by[r] or 0)
        if n > 0 then
          e[#e + 1] = r
          e[#e + 1] = n
        end
      end
      ups[#ups + 1] = e
    end
  end
  return by, ups
end
-- reply: the answer, with the cluster's view, this node's rank among
-- the live nodes in the order of their IDs and what each holds (the
-- capacity each node's fallback queue takes while Redis is down:
-- ClusterView.Rank, HeldBy).
local function reply(rejoined, readded, missing)
  local live = redis.call('ZRANGE', K.nodes, now, '+inf', 'BYSCORE')
  local rank = 0
  for _, other in ipairs(live) do
    if other < node then rank = rank + 1 end
  end
  table.sort(live)
  local by, ups = holdings(live)
  return {cur, rejoined, waiting(), redis.call('ZCARD', K.holders),
    #live, tonumber(redis.call('GET', K.expired) or '0'), readded, missing,
    held_tokens(), now, rank, by, ups}
end
-- A heartbeat of a node that left, sent before its leave and come late,
-- does not bring the node back to life, and renews, re-adds and adopts
-- nothing (left in common.lua). The node reads no reply: it left.
if gone then return reply(1, {}, {}) end
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
local reindexed = false
for i = 13 + n, 12 + n + m do
  local id, w = string.match(ARGV[i], '^%S+'), tonumber(string.match(ARGV[i], ' w=(%d+)'))
  -- A fair ticket waits where its order entry is (K.fwait): one Redis
  -- lost (an eviction of that key) with its index entry left waits
  -- nowhere, and that entry goes, so the node can queue it again; its
  -- weight goes with it (queued again, it is recorded again).
  local fm = redis.call('HGET', K.fticket, id)
  if not fm and not reindexed and flow_of(id) then
    -- Its index entry lost (an eviction of K.fticket), it may still
    -- wait in its flow's order: the index is rebuilt from there, once
    -- (reindex in fair.lua); queued again, it would wait twice. Only
    -- where the index holds fewer waiters than the order (two counts,
    -- read once a call): else the ticket is gone or granted (cancelled,
    -- dropped with its forgotten node), and the index is not written
    -- again (O(waiters)).
    reindexed = true
    if redis.call('HLEN', K.fticket) < redis.call('ZCARD', K.fwait) then
      reindex()
      fm = redis.call('HGET', K.fticket, id)
    end
  end
  if fm and not redis.call('ZSCORE', K.fwait, fm) then
    unqueue(id)
    take_weight(id)
    fm = false
  end
  local queued = fm or redis.call('ZSCORE', K.waiting, id)
  if not queued and not redis.call('ZSCORE', K.holders, id) then
    missing[#missing + 1] = id
  elseif queued and w and w > 0 and redis.call('HEXISTS', K.tok, id) == 0 then
    -- Its weight lost (an eviction of K.tok): granted, it would weigh
    -- nothing, above kv_tokens until its node's next heartbeat counted
    -- it, however long after the eviction. Recorded again (what it asks
    -- beyond, if more, is not known here), and reported missing: its
    -- node's acquire finds it queued, and the node's next heartbeat
    -- names every waiter of its own.
    set_weight(id, w, true)
    missing[#missing + 1] = id
  end
end
for i = 13 + n + m, #ARGV do add(ARGV[i]) end
return reply(rejoined, readded, missing)
