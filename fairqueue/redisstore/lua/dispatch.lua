-- dispatch.lua: handing permits on, prepended to every script after
-- fair.lua.

-- reap frees the permits whose lease ended (a crashed or partitioned
-- node). At most the holders, so at most about the permits.
local function reap()
  local ids = redis.call('ZRANGEBYSCORE', K.holders, '-inf', now)
  for _, id in ipairs(ids) do
    redis.call('ZREM', K.holders, id)
    unheld(id, 0)
  end
  if #ids > 0 then redis.call('INCRBY', K.expired, #ids) end
  return #ids
end

-- next_waiter takes the next ticket to serve out of the queue: the
-- fair flow with the least usage or the FIFO head, whichever arrived
-- first (both kinds wait only while a reload turns Fair on or off).
-- Returns the ticket and, for a fair one, its flow, cost, and the
-- permits the flow and its tenant hold if best_fair read them, and what
-- put_back needs (a FIFO ticket's score, a fair one's member); nil when
-- nobody may be served. fair: whether flows may be ready (false: none
-- is, and none is looked for); fifo: whether FIFO tickets may wait
-- (false: K.waiting is missing, and not read).
local function next_waiter(fair, fifo)
  local r, flow, seq, m, n, tn
  if fair then r, flow, seq, m, n, tn = best_fair() end
  if not r then -- FIFO only: one call
    local h = fifo and redis.call('ZPOPMIN', K.waiting) or {}
    return h[1], nil, nil, nil, nil, h[2]
  end
  local h = fifo and redis.call('ZRANGE', K.waiting, 0, 0, 'WITHSCORES') or {}
  if #h == 0 or seq < tonumber(h[2]) then
    redis.call('ZREM', K.fready, r)
    take(m)
    local _, _, cost, id = parse(m)
    return id, flow, cost, n, tn, m
  end
  redis.call('ZREM', K.waiting, h[1])
  return h[1], nil, nil, nil, nil, h[2]
end

-- put_back returns ticket id, just taken by next_waiter and not granted,
-- to its place: back is its FIFO score, or its member of flow.
local function put_back(id, flow, back)
  if flow then
    redis.call('ZADD', K.fwait, 0, back)
    redis.call('HSET', K.fticket, id, back)
    redis.call('HINCRBY', K.twait, flow, 1)
    refresh(flow)
  else
    redis.call('ZADD', K.waiting, back, id)
  end
end

-- bare: node, alive or not, named no pool (K.upool: its last heartbeat,
-- or the call that made it alive), or Redis lost the record (an
-- eviction: it may have none, as pool_forget takes it, until its next
-- heartbeat). Its request runs on its route's static upstream, which
-- may be any of the pool. Read once a script per node.
local bare_of = {}
local function bare(node)
  if bare_of[node] == nil then bare_of[node] = (redis.call('HGET', K.upool, node) or '') == '' end
  return bare_of[node]
end

-- room is what one more grant needs, read now: the free permits, and
-- with a pool its view and the upstream to take. With w, the ticket's
-- weight (acquire's fast path), there is room only where w tokens fit
-- too (tokens.lua); dispatch checks each waiter's weight itself. With flow, none is
-- free while its tenant holds its cap (max_in_flight_per_tenant); the
-- permits the flow and its tenant hold, read for that (inflight), are
-- returned for charge. It is
-- the one place outside reconcile where expired leases (a crashed
-- node's permits) are reaped: only where they would keep a grant out,
-- that is when room finds none; then it reaps and looks again. Reconcile
-- (every poll interval on a node with waiters) reaps the rest.
-- cooling: false when the caller found K.ucool missing (see pool_view).
-- Returns free (0: no room), view, upstream, and those permits (nil:
-- not read).
local function room(flow, cooling, w)
  clock()
  local reaped = false
  while true do
    local held = redis.call('ZCARD', K.holders)
    local free = permits - held
    local v, up, n, tn
    if free > 0 and w and not fits_queue(w) then free = 0 end
    if free > 0 then
      v = pool_view(cooling, held)
      up = v and pick(v, w)
      if v and not up then
        free = 0
      elseif flow and tenant_cap > 0 then
        n, tn = inflight(flow)
        if capped(tenant_of(flow), tn) then free = 0 end
      end
    end
    if free > 0 or reaped or reap() == 0 then return math.max(free, 0), v, up, n, tn end
    reaped = true
  end
end

-- fit is where waiter id of weight w may be granted now by node self:
-- ok, and with a pool the upstream (pick). A waiter of another node
-- without a pool (bare) counts on every upstream once granted: it needs
-- room on every one (everywhere).
local function fit(v, w, id, self)
  if not fits_queue(w) then return nil, false end
  if not v then return nil, true end
  local up = pick(v, w)
  if up and owner_of(id) ~= self and bare(owner_of(id)) then return up, everywhere(v, w) end
  return up, up ~= nil
end

-- next_fitting is next_waiter where tokens count (tokens.lua): the next
-- ticket to serve, taken out of the queue with its weight, only if it
-- fits (a waiter of a dead node is taken out whatever it weighs:
-- dispatch drops it). A FIFO head that does not fit stops dispatch; a
-- first flow's head that does not fit may be passed by the head of a
-- later ready flow that fits, at most TOKEN_PASSES grants in a row.
-- Returns the ticket, flow, cost, the permits the flow and its tenant
-- hold (as next_waiter), its upstream and weight; nil when none may be
-- served now, with 'empty' when nobody waits. self: the calling node
-- (fit).
local function next_fitting(v, fair, fifo, self)
  local r, flow, seq, m, n, tn
  if fair then r, flow, seq, m, n, tn = best_fair() end
  local h = fifo and redis.call('ZRANGE', K.waiting, 0, 0, 'WITHSCORES') or {}
  if not r and #h == 0 then return nil, 'empty' end
  if not r or (#h > 0 and tonumber(h[2]) < seq) then
    local id = h[1]
    local w = weight_of(id)
    local up, ok = fit(v, w, id, self)
    if not ok and alive(owner_of(id)) then return nil end
    redis.call('ZREM', K.waiting, id)
    take_weight(id)
    redis.call('DEL', K.tpass)
    return id, nil, nil, nil, nil, up, w
  end
  local _, _, cost, id = parse(m)
  local w = weight_of(id)
  local up, ok = fit(v, w, id, self)
  if ok or not alive(owner_of(id)) then
    redis.call('ZREM', K.fready, r)
    take(m)
    take_weight(id)
    redis.call('DEL', K.tpass)
    return id, flow, cost, n, tn, up, w
  end
  if tonumber(redis.call('GET', K.tpass) or '0') >= TOKEN_PASSES then return nil end
  for _, r2 in ipairs(redis.call('ZRANGE', K.fready, 1, TOKEN_SCAN)) do
    local flow2 = string.match(r2, '^[^|]*|(.*)$')
    local n2, tn2
    if tenant_cap > 0 then n2, tn2 = inflight(flow2) end
    local m2 = not capped(tenant_of(flow2), tn2) and head_of(flow2)
    if m2 then
      local _, _, cost2, id2 = parse(m2)
      local w2 = weight_of(id2)
      local up2, ok2 = fit(v, w2, id2, self)
      if ok2 and alive(owner_of(id2)) then
        redis.call('ZREM', K.fready, r2)
        take(m2)
        take_weight(id2)
        redis.call('INCR', K.tpass)
        return id2, flow2, cost2, n2, tn2, up2, w2
      end
    end
  end
  return nil
end

-- pass_bare is the waiter to serve, where tokens do not count, past the
-- first flow's head, a waiter of another node without a pool (bare) that
-- cannot be placed now (no room on every upstream; put back at its
-- place): the head of a later ready flow that is not one too, as
-- next_fitting passes a head that does not fit, and under the same bound
-- (K.tpass: at most TOKEN_PASSES grants in a row, then dispatch waits
-- until every upstream has room for it). Taken out of the queue, as
-- next_waiter returns it; nil when none may pass. self: the calling node.
local function pass_bare(self)
  if tonumber(redis.call('GET', K.tpass) or '0') >= TOKEN_PASSES then return nil end
  for _, r2 in ipairs(redis.call('ZRANGE', K.fready, 1, TOKEN_SCAN)) do
    local flow2 = string.match(r2, '^[^|]*|(.*)$')
    local n2, tn2
    if tenant_cap > 0 then n2, tn2 = inflight(flow2) end
    local m2 = not capped(tenant_of(flow2), tn2) and head_of(flow2)
    if m2 then
      local _, _, cost2, id2 = parse(m2)
      local owner = owner_of(id2)
      if alive(owner) and (owner == self or not bare(owner)) then
        redis.call('ZREM', K.fready, r2)
        take(m2)
        redis.call('INCR', K.tpass)
        return id2, flow2, cost2, n2, tn2
      end
    end
  end
  return nil
end

-- dispatch hands free permits to the head of the queue, in order, and
-- tells each grantee's node on its own channel ("<ticket> <grant no>
-- <Redis time ms>/<permits> [<upstream>]", the permits the calling
-- node's limits carry), except the calling node (self): its
-- grants are returned instead ({ticket, grant no, upstream or '', Redis
-- time ms, ...}), so the caller wakes its own waiters without a Pub/Sub
-- round trip (and, as from a message, knows when each grant was made:
-- its handoff's latency).
-- With a pool, a permit is free only while an upstream has one too
-- (pool.lua picks it). Waiters of dead nodes are dropped on the way (at
-- most 1000 a call, to bound the script).
-- Also returns idle: true when nobody waiting may be served now (no FIFO
-- waiter, no ready flow left), so that the caller's fast path may grant
-- if room (above) says so.
-- Without a waiter it reads nothing more than one EXISTS (empty sets do
-- not exist), or nothing when the caller read that EXISTS already (ex:
-- present's answer for waiting, fready and, with a pool, ucool, still
-- true; where tokens do not count, tpass too, or nil: not read); with
-- one, O(1) per grant whatever the number waiting.
local function dispatch(self, ex)
  local own = {}
  local passes_reset = false
  ex = ex or present('waiting', 'fready', #pool > 0 and 'ucool' or nil, tokens == 0 and 'tok' or nil,
    tokens == 0 and 'tpass' or nil)
  if ex.tok ~= nil then tok_kept = ex.tok end
  if not (ex.waiting or ex.fready) then return own, true end
  local free, v = room(nil, ex.ucool)
  local skipped = 0
  while free > 0 do
    local id, flow, cost, n, tn, up, w, live, passed
    if tokens ~= 0 then
      id, flow, cost, n, tn, up, w = next_fitting(v, ex.fready, ex.waiting, self)
      if not id then return own, flow == 'empty' end
    else
      up = v and pick(v)
      if v and not up then return own, false end
      local back
      id, flow, cost, n, tn, back = next_waiter(ex.fready, ex.waiting)
      if not id then return own, true end
      if up and not everywhere(v) then
        -- A waiter of another node without a pool (bare) counts on
        -- every upstream once granted: with one of them full it waits,
        -- at its place; in FIFO order so do those behind it, in fair
        -- order a later flow's head may pass it (pass_bare; next_fitting
        -- checks it with the weight, fit).
        local owner = owner_of(id)
        live = alive(owner)
        if owner ~= self and live and bare(owner) then
          put_back(id, flow, back)
          if flow then id, flow, cost, n, tn = pass_bare(self) end
          if not flow then return own, false end
          passed, passes_reset, ex.tpass = true, false, true
        end
      end
      -- A weight recorded by a config that counts tokens (another
      -- node's in a rolling change) is counted with the grant.
      w = drop_weight(id)
      if not passed and ex.tpass ~= false and not passes_reset then
        -- A grant that passes nobody, made where tokens do not count,
        -- with a pool or without (the node without the pool granting its
        -- own waiter that was passed): the passes of a head that does not
        -- fit (next_fitting) or cannot be placed (pass_bare) start again,
        -- as at any such grant (a reload may count them again). Only
        -- where K.tpass exists (ex.tpass: present's answer, or nil when
        -- the caller did not ask): else no command is spent.
        redis.call('DEL', K.tpass)
        passes_reset = true
      end
    end
    local owner = owner_of(id)
    local c -- the flow's counter, once charged
    if live == nil then live = alive(owner) end
    if live then
      if flow then c, tn = charge(flow, cost, nil, n, tn) end
      local no = redis.call('INCR', K.grants)
      if up and owner ~= self and bare(owner) then
        -- Another node without a pool (a rolling change that adds one),
        -- or whose pool Redis lost: its request runs on its route's
        -- static upstream, which may be any of the pool, not on up.
        -- Granted on none, it counts on every upstream, as a grant that
        -- node made itself (pool_view); it was granted only with room on
        -- every one (everywhere). The calling node has a pool (up): its
        -- heartbeat may not have named it yet (a reload added it).
        v.anywhere = v.anywhere + 1
        up = nil
      end
      if up then place(v, id, up, no) end
      take_tokens(id, w, up, v, tokens == 0)
      if owner == self then
        redis.call('ZADD', K.holders, now + lease, id)
        own[#own + 1] = id
        own[#own + 1] = no
        own[#own + 1] = up or ''
        own[#own + 1] = now
      else
        redis.call('ZADD', K.holders, now + lease_of(owner), id)
        -- The Redis time carries the call's permits setting after a '/'
        -- (a node of an earlier version reads no time then, and no
        -- permits): the grant was made under it (Grant.Permits).
        local msg = id .. ' ' .. no .. ' ' .. now .. '/' .. string.match(ARGV[2], '^%-?%d+')
        if up then msg = msg .. ' ' .. up end
        redis.call(ARGV[5], ARGV[4] .. owner, msg)
      end
      free = free - 1
    else
      skipped = skipped + 1
    end
    if flow then refresh(flow, c, c ~= nil, false, tn) end -- charged: it holds a permit
    if skipped >= 1000 then break end
  end
  return own, false
end

-- my_heads lists the node's tickets at the head of the FIFO queue, in
-- order: the first waiters, up to the first of another node, at most
-- HEADS and at most twice the permits. They are the next to be served when
-- tokens are not counted (a weight may not fit), no fair ticket waits
-- and no pool is in use by any node (ex: present's answer for fwait,
-- fready and uheld, read in this script; a pool's requeue puts a ticket
-- back at its arrival, perhaps ahead), and the permits held are not
-- above the permits (a lowered permits setting, a count above it after
-- a failover: those hand on through Redis until the count is down); {}
-- otherwise. The node may hand the first a permit of its own without
-- asking (transfer.lua), and the second the next permit that ends, and
-- so on: a ticket at the head stays there until it is granted or
-- cancelled, since every later arrival queues behind it, and the one
-- after it is the head once it has gone (a waiter Redis loses and the
-- node queues again is at the tail: the node no longer hands on to it,
-- see fairqueue/handoff.go). More than twice the permits would not
-- serve: the first may be waiters the node has started already, whose
-- transfers are queued behind the one this reply answers (as many as
-- run, at most the permits), and each of the rest is for a permit of
-- the node's that ends before the next reply.
-- More than one only while the node is the only one in the queue: the
-- others' releases grant from the head too, and the further down the
-- list a waiter is, the likelier one of them has granted it before the
-- node starts it on a permit of its own; the permit Redis gave it would
-- then stay idle until the node's transfer lands.
-- None while another node is in a queue with a learned capacity (learned,
-- common.lua): its report may lower the share at any time, and the node
-- learns a share from its own reports only, so it would hand on under
-- the capacity it last heard of where dispatch now grants nobody. Heads
-- named under a learned capacity serve for fairqueue.HeadsTTL: when and
-- to whom the last were named is K.members' field h, and while they may
-- serve adapt.lua holds back a lowering of the queue's share on another
-- node's report (one HSET, only where heads are named under a learned
-- capacity).
local HEADS = 16
local function my_heads(self, ex)
  if ex.fwait or ex.fready or ex.uheld or #pool > 0 or tokens ~= 0 then return {} end
  local n = math.min(2 * permits, HEADS)
  if n < 1 or redis.call('ZCARD', K.holders) > permits then return {} end
  local out = {}
  for _, h in ipairs(redis.call('ZRANGE', K.waiting, 0, n - 1)) do
    if owner_of(h) ~= self then break end
    out[#out + 1] = h
  end
  if #out > 0 and redis.call('ZCARD', K.nodes) > 1 then
    if learned then return {} end
    if n > 1 then return {out[1]} end
  end
  if learned and #out > 0 then redis.call('HSET', K.members, 'h', clock() .. ' ' .. self) end
  return out
end

-- drop_waiters_of takes the waiters of the nodes forget_dead has just
-- forgotten (dead) out of the queue: nothing cancels a crashed node's
-- waiters, and they would count against max_queue and in every position
-- until dispatch reached them. A node only partitioned names them in
-- the heartbeat that reports it rejoined, and queues them again.
-- O(waiting), once per node forgotten.
local function drop_waiters_of(dead)
  if #dead == 0 then return end
  local set = {}
  for _, n in ipairs(dead) do set[n] = true end
  for _, id in ipairs(redis.call('ZRANGE', K.waiting, 0, -1)) do
    if set[owner_of(id)] then
      redis.call('ZREM', K.waiting, id)
      take_weight(id)
    end
  end
  for _, id in ipairs(redis.call('HKEYS', K.fticket)) do
    if set[owner_of(id)] then
      unqueue(id)
      take_weight(id)
    end
  end
end
