-- fair.lua: fair queueing by usage (Config.Fair), prepended to every
-- script after common.lua.
--
-- Each flow (a tenant in one priority band, "<tenant>.<band>") has a
-- usage counter (K.fcount). A grant charges the ticket's cost (already
-- divided by its weight and band factor) to it; a release corrects it
-- by what the request really used (TicketArgs.Correction). Dispatch
-- serves the ready flow with the least counter, ties by the arrival of
-- its head, FIFO inside each flow (Sheng et al., "Fairness in Serving
-- Large Language Models", OSDI 2024: the virtual token counter). A flow
-- that becomes active (its first waiter, nothing held) starts at the
-- least counter among the ready flows (the virtual time K.vtime when
-- none is), or where it stopped if that is higher: idle time earns no
-- credit, and leaving does not erase usage. A flow with a request in
-- service is still active: its next request keeps its counter.
-- A tenant that holds max_in_flight_per_tenant permits (ARGV[6]) has
-- its flows left out of the ready set; its release puts them back.
-- Counters are written with 17 significant digits (exact doubles) and
-- rebased when the virtual time passes 1e9.

local function num(x)
  return string.format('%.17g', x)
end

-- A tenant's flows are its priority bands 0..MAXBAND (fairqueue.MaxPriority).
local MAXBAND = 3

local function tenant_of(flow)
  return string.match(flow, '^(.*)%.[^.]*$') or flow
end

-- vtime is the virtual time, read once a script: only set_vtime writes it,
-- from a queue's first counter on. Missing beside counters (K.fcount,
-- K.fidle), Redis lost it alone (evicted): it reads as their least (not
-- 0, below tenants that used much: they would wait for as long as the
-- queue had run), within a request's cost. vt_kept: K.vtime exists.
local vt, vt_kept
local function vtime()
  if vt then return vt end
  local v = redis.call('GET', K.vtime)
  vt, vt_kept = tonumber(v or '0'), v ~= false
  if not vt_kept then
    local least = redis.call('ZRANGE', K.fidle, 0, 0, 'WITHSCORES')[2]
    least = least and tonumber(least)
    for _, c in ipairs(redis.call('HVALS', K.fcount)) do least = math.min(least or tonumber(c), tonumber(c)) end
    vt = math.max(least or 0, 0)
  end
  return vt
end

local function set_vtime(v, s)
  redis.call('SET', K.vtime, s)
  vt, vt_kept = v, true
end

-- A waiting fair ticket is the K.fwait member
-- "<flow>|<seq, 16 hex digits>|<cost>|<ticket>": one flow's tickets are
-- one lexical range, in arrival order.
local function fmember(flow, seq, cost, id)
  return flow .. '|' .. string.format('%016x', seq) .. '|' .. num(cost) .. '|' .. id
end

-- parse reads a K.fwait member: flow, seq (hex), cost, ticket.
local function parse(m)
  local flow, seq, cost, id = string.match(m, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return flow, seq, tonumber(cost), id
end

-- head_of is the K.fwait member of flow's first waiter, or nil.
local function head_of(flow)
  return redis.call('ZRANGEBYLEX', K.fwait, '[' .. flow .. '|', '[' .. flow .. '|~', 'LIMIT', 0, 1)[1]
end

-- ready_key is flow's K.fready member while m is its head.
local function ready_key(flow, m)
  local _, seq = parse(m)
  return seq .. '|' .. flow
end

local function counter(flow)
  return tonumber(redis.call('HGET', K.fcount, flow) or '') -- nil: idle
end

-- inflight reads the permits flow and its tenant hold (K.finf) in one
-- HMGET: n, tn.
local function inflight(flow)
  local had = redis.call('HMGET', K.finf, flow, tenant_of(flow))
  return tonumber(had[1]) or 0, tonumber(had[2]) or 0
end

-- capped: tenant holds its cap (max_in_flight_per_tenant). tn: the
-- permits it holds, when the caller has read them (nil: read).
local function capped(tenant, tn)
  return tenant_cap > 0 and (tn or tonumber(redis.call('HGET', K.finf, tenant) or '0')) >= tenant_cap
end

-- add_held adds d (1 or -1) to the permits flow and its tenant hold, n
-- and tn as inflight read them (nil: read here), and writes both in one
-- HSET, a count that falls to 0 deleted instead (one HDEL). Returns the
-- counts after.
local function add_held(flow, d, n, tn)
  if not n then n, tn = inflight(flow) end
  local tenant = tenant_of(flow)
  n, tn = n + d, tn + d
  if tenant == flow then -- one field, counted twice
    tn = math.max(n, 0) + d
    n = tn
  end
  local set, del = {}, {}
  for _, e in ipairs(tenant == flow and {{tenant, tn}} or {{flow, n}, {tenant, tn}}) do
    if e[2] > 0 then
      set[#set + 1] = e[1]
      set[#set + 1] = e[2]
    else
      del[#del + 1] = e[1]
    end
  end
  if #set > 0 then redis.call('HSET', K.finf, unpack(set)) end
  if #del > 0 then redis.call('HDEL', K.finf, unpack(del)) end
  return n, tn
end

-- floor is where a flow becoming active starts: the least counter of
-- the ready flows, else the virtual time. Flows of tenants at the cap
-- found on the way leave the ready set (a reload may have lowered the
-- cap), as in best_fair.
local function floor()
  while true do
    local r = redis.call('ZRANGE', K.fready, 0, 0, 'WITHSCORES')
    if #r == 0 then return vtime() end
    if not capped(tenant_of(string.match(r[1], '^[^|]*|(.*)$'))) then return tonumber(r[2]) end
    redis.call('ZREM', K.fready, r[1])
  end
end

-- start is the counter an idle flow becomes active with: max(its counter
-- when it went idle, if kept, and the virtual time (at_vtime: the
-- caller knows no flow is ready) or else floor()). Its K.fidle entry
-- goes; the caller writes the counter.
local function start(flow, at_vtime)
  local c = at_vtime and vtime() or floor()
  local idle = redis.call('ZSCORE', K.fidle, flow)
  if idle then
    c = math.max(c, tonumber(idle))
    redis.call('ZREM', K.fidle, flow)
  end
  return c
end

-- activate gives an idle flow its counter (see start).
local function activate(flow, at_vtime)
  if counter(flow) then return end
  redis.call('HSET', K.fcount, flow, num(start(flow, at_vtime)))
  if vt_kept == false then set_vtime(vt, num(vt)) end -- K.fcount exists: so does K.vtime
end

-- unready takes flow out of the ready set: before its head changes.
local function unready(flow)
  local m = head_of(flow)
  if m then redis.call('ZREM', K.fready, ready_key(flow, m)) end
end

-- ready puts flow, whose head is m and counter c (nil: none, the
-- virtual time stands in), in the ready set.
local function ready(flow, m, c)
  redis.call('ZADD', K.fready, num(c or vtime()), ready_key(flow, m))
end

-- IDLE_FLOWS is fairqueue.IdleFlows: at most that many idle counters
-- are kept; beyond it those nearest the virtual time go (down to 7/8 of
-- it, as the local store does), ties by name.
local IDLE_FLOWS = 4096

-- rest: flow has no waiters and holds no permit, so it goes idle: its
-- counter c (nil: it has none) is kept (K.fidle) only while above the
-- virtual time.
local function rest(flow, c)
  if c then
    redis.call('HDEL', K.fcount, flow)
    if c > vtime() then
      redis.call('ZADD', K.fidle, num(c), flow)
      local n = redis.call('ZCARD', K.fidle)
      if n > IDLE_FLOWS then redis.call('ZPOPMIN', K.fidle, n - (IDLE_FLOWS - math.floor(IDLE_FLOWS / 8))) end
    end
  end
end

-- refresh brings flow's ready entry up to date after a change: ready
-- with its head and counter when it has waiters and its tenant is under
-- the cap; else idle (rest) when it holds no permit. What the caller
-- knows is not read again: c, the counter it has just written (nil:
-- read it); held, true when the flow holds a permit; nowait, true when
-- no fair ticket waits (K.fwait missing); tn, the permits its tenant
-- holds (nil: read where the cap needs it). Returns true when it made
-- the flow ready.
local function refresh(flow, c, held, nowait, tn)
  local m = not nowait and head_of(flow)
  if m then
    if capped(tenant_of(flow), tn) then return false end
    ready(flow, m, c or counter(flow))
    return true
  end
  if not held and not redis.call('HGET', K.finf, flow) then rest(flow, c or counter(flow)) end
  return false
end

-- rebase subtracts v from every counter and the virtual time, keeping
-- their order, so that they never grow into the doubles' precision.
local function rebase(v)
  local c = redis.call('HGETALL', K.fcount)
  for i = 1, #c, 2 do redis.call('HSET', K.fcount, c[i], num(tonumber(c[i + 1]) - v)) end
  for _, key in ipairs({K.fready, K.fidle}) do
    local r = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    for i = 1, #r, 2 do redis.call('ZADD', key, num(tonumber(r[i + 1]) - v), r[i]) end
  end
  set_vtime(0, '0')
end

-- cap_out takes every flow of flow's tenant out of the ready set when
-- the tenant holds its cap (tn: the permits it holds now): a capped
-- tenant's flows are not ready, and an entry left behind would count
-- as ready in floor, fposition and inspect until best_fair meets it.
local function cap_out(flow, tn)
  local tenant = tenant_of(flow)
  if not capped(tenant, tn) then return end
  for b = 0, MAXBAND do unready(tenant .. '.' .. b) end
end

-- advance is counter c charged cost: c + cost, or, when a positive cost
-- is too small to change c at its magnitude (a long uptime's large
-- virtual time), c moved up by one unit of its last place, so that every
-- grant still moves its flow behind the others of equal counter (the
-- local store's advance computes the same).
local function advance(c, cost)
  local n = c + cost
  if cost > 0 and n <= c then
    local _, e = math.frexp(c)
    n = c + math.ldexp(1, e - 53)
  end
  return n
end

-- charge does a fair grant's bookkeeping: the flow's counter before the
-- charge (c, when the caller has it: see start; else read) advances the
-- virtual time, the cost is added, and the flow and its tenant hold one
-- more permit (n, tn: their permits, when the caller has read them with
-- inflight; else read). Returns the counter and the tenant's permits
-- written.
local function charge(flow, cost, c, n, tn)
  local v = vtime()
  c = c or counter(flow) or v
  if c > v or not vt_kept then
    v = math.max(c, v)
    set_vtime(v, num(v))
  end
  c = advance(c, cost)
  redis.call('HSET', K.fcount, flow, num(c))
  n, tn = add_held(flow, 1, n, tn)
  cap_out(flow, tn)
  if v > 1e9 then
    rebase(v)
    c = c - v -- as rebase wrote it
  end
  return c, tn
end

-- held counts a holder entry added outside a grant (a heartbeat re-adding
-- or adopting a permit): nothing is charged.
local function held(id)
  local flow = flow_of(id)
  if not flow then return end
  activate(flow, true)
  local _, tn = add_held(flow, 1)
  cap_out(flow, tn)
end

-- unheld does the bookkeeping of a holder entry removed (release,
-- cancel, lease end, leave): its weight is returned (tokens.lua), its
-- upstream entry goes (pool.lua), the
-- flow and its tenant hold one permit less, correction is added to the
-- flow's counter, the flow is refreshed, and a tenant that was at its
-- cap, or that holds nothing any more, has its flows ready again. The permit counts are read once
-- (inflight) and written once (add_held), the flow's counter at most
-- once. nowait: the caller
-- knows no fair ticket waits (K.fwait missing). Returns true when a flow
-- was made ready.
local function unheld(id, correction, nowait)
  give_tokens(id)
  unplace(id)
  local flow = flow_of(id)
  if not flow then return false end
  local tenant = tenant_of(flow)
  local n, tn = inflight(flow)
  local was = capped(tenant, tn)
  n, tn = add_held(flow, -1, n, tn) -- the permits after
  local c = counter(flow)
  if c then c = c + correction end
  local m = not nowait and head_of(flow)
  local readied = false
  if m or n > 0 then
    if c and correction ~= 0 then redis.call('HSET', K.fcount, flow, num(c)) end
    if m and not capped(tenant, tn) then
      ready(flow, m, c)
      readied = true
    elseif m and c and correction ~= 0 then
      -- Its tenant holds its cap: the flow is not made ready, but an
      -- entry it still has in the ready set (left there when a reload
      -- lowered the cap, or by another instance's call under a higher
      -- one in a rolling change) takes the corrected counter. Else it
      -- would be served by the counter before the correction once the
      -- cap allows it again: recount keeps the entries when no flow
      -- with waiters is missing from the set.
      redis.call('ZADD', K.fready, 'XX', num(c), ready_key(flow, m))
    end
  else
    rest(flow, c)
  end
  if was then
    for b = 0, MAXBAND do
      local f = tenant .. '.' .. b
      if f ~= flow and refresh(f, nil, false, nowait) then readied = true end
    end
  elseif tn <= 0 and not nowait then
    -- Its last permit ended, under a cap it did not hold (or none): its
    -- other bands may still be out of the ready set from when it held
    -- the cap in force before a reload raised or lifted it, and a tenant
    -- that holds nothing is out of recount's reach. Those with waiters
    -- are ready now (one HMGET; nothing more when none waits).
    local others = {}
    for b = 0, MAXBAND do
      local f = tenant .. '.' .. b
      if f ~= flow then others[#others + 1] = f end
    end
    for i, w in ipairs(redis.call('HMGET', K.twait, unpack(others))) do
      if w and refresh(others[i], nil, false, false, 0) then readied = true end
    end
  end
  return readied
end

-- take removes the fair waiter m from the queue.
local function take(m)
  local flow, _, _, id = parse(m)
  redis.call('ZREM', K.fwait, m)
  redis.call('HDEL', K.fticket, id)
  if redis.call('HINCRBY', K.twait, flow, -1) <= 0 then redis.call('HDEL', K.twait, flow) end
end

-- enqueue queues fair ticket id at the tail of its flow.
local function enqueue(flow, seq, cost, id)
  activate(flow)
  local m = fmember(flow, seq, cost, id)
  redis.call('ZADD', K.fwait, 0, m)
  redis.call('HSET', K.fticket, id, m)
  redis.call('HINCRBY', K.twait, flow, 1)
  refresh(flow)
  return m
end

-- reindex rebuilds the ticket index (K.fticket) from the flows' order
-- (K.fwait), where the waiters are, when Redis lost it alone (evicted):
-- a waiter would count in no queue length, and a heartbeat naming it
-- would report it missing, its node queue it again, twice in its flow's
-- order: granted again once its request ended, to nobody, and charged.
-- O(fair waiters); a heartbeat calls it where a ticket it names is
-- missing from the index, once a call.
local function reindex()
  local args = {}
  for _, m in ipairs(redis.call('ZRANGE', K.fwait, 0, -1)) do
    local _, _, _, id = parse(m)
    args[#args + 1] = id
    args[#args + 1] = m
    if #args >= 1000 then
      redis.call('HSET', K.fticket, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('HSET', K.fticket, unpack(args)) end
end

-- unqueue removes fair ticket id from the queue; false if it is not there.
-- With lost, one the index lacks, where it holds fewer waiters than the
-- order (see reindex), is looked for in its flow's order (O(its waiters)):
-- left there, a cancelled ticket would be granted to nobody, and charged.
local function unqueue(id, lost)
  local m = redis.call('HGET', K.fticket, id)
  local flow = lost and not m and flow_of(id)
  if flow and redis.call('HLEN', K.fticket) < redis.call('ZCARD', K.fwait) then
    for _, e in ipairs(redis.call('ZRANGEBYLEX', K.fwait, '[' .. flow .. '|', '[' .. flow .. '|~')) do
      local _, _, _, t = parse(e)
      if t == id then m = e end
    end
  end
  if not m then return false end
  flow = parse(m)
  unready(flow)
  take(m)
  refresh(flow)
  return true
end

-- best_fair is the ready flow to serve next, as its ready key, flow, head
-- seq and head member, and with a tenant cap the permits the flow and
-- its tenant hold (inflight: read for the cap, passed on to charge);
-- flows of tenants at the cap found on the way leave the ready set (the
-- cap may have been lowered by a reload).
local function best_fair()
  while true do
    local r = redis.call('ZRANGE', K.fready, 0, 0)[1]
    if not r then return nil end
    local seq, flow = string.match(r, '^([^|]*)|(.*)$')
    local n, tn
    if tenant_cap > 0 then n, tn = inflight(flow) end
    local m = not capped(tenant_of(flow), tn) and head_of(flow)
    if m then return r, flow, tonumber(seq, 16), m, n, tn end
    redis.call('ZREM', K.fready, r)
  end
end

-- waiting is the queue length: FIFO and fair tickets.
local function waiting()
  return redis.call('ZCARD', K.waiting) + redis.call('HLEN', K.fticket)
end

-- fposition estimates the place of the fair waiter m of flow: the flows
-- ready take turns, so each ticket ahead in its own flow is a round.
local function fposition(flow, m)
  local ahead = redis.call('ZLEXCOUNT', K.fwait, '[' .. flow .. '|', '(' .. m)
  local nready = redis.call('ZCARD', K.fready)
  local rank = redis.call('ZRANK', K.fready, ready_key(flow, head_of(flow)))
  local rounds = nready
  if not rank then
    -- Its tenant is at its cap: not in the ready set, it still takes its
    -- turn in each round once under the cap again, after the ready flows
    -- of less usage (ties: counted ahead of it).
    rounds = nready + 1
    local c = counter(flow)
    rank = c and redis.call('ZCOUNT', K.fready, '-inf', num(c)) or nready
  end
  return math.min(waiting(), ahead * math.max(rounds, 1) + rank + 1)
end

-- recount rebuilds the permits held per flow and tenant from the holders,
-- the truth, should the two ever disagree (bookkeeping lost with a
-- failover or an operator's edit): a tenant counted above its real use
-- would wait for releases that never come. Then, when some flow with
-- waiters is not ready, the flows of the tenants under the cap in force
-- are made ready: cap_out left them out while their tenant held its
-- cap, and a reload that raised or lifted it readies nothing else.
local function recount()
  local want, tenants = {}, {}
  for _, id in ipairs(redis.call('ZRANGE', K.holders, 0, -1)) do
    local flow = flow_of(id)
    if flow then
      local tenant = tenant_of(flow)
      want[flow] = (want[flow] or 0) + 1
      want[tenant] = (want[tenant] or 0) + 1
      tenants[tenant] = true
    end
  end
  local have = redis.call('HGETALL', K.finf)
  local wrong = {}
  for i = 1, #have, 2 do
    local k, n = have[i], tonumber(have[i + 1])
    if want[k] ~= n then wrong[#wrong + 1] = k end
    want[k] = want[k] or 0
  end
  for k, n in pairs(want) do
    if redis.call('HEXISTS', K.finf, k) == 0 and n > 0 then wrong[#wrong + 1] = k end
  end
  for _, k in ipairs(wrong) do
    if want[k] > 0 then
      redis.call('HSET', K.finf, k, want[k])
    else
      redis.call('HDEL', K.finf, k)
    end
  end
  for _, k in ipairs(wrong) do
    local tenant = tenant_of(k)
    for b = 0, MAXBAND do refresh(tenant .. '.' .. b) end
  end
  local nready, nwait = redis.call('ZCARD', K.fready), redis.call('HLEN', K.twait)
  if nwait <= nready then return end
  -- Every flow with waiters (K.twait) of a tenant under its cap is ready
  -- (the capped tenants' flows counted, O(holders)); where fewer are, all
  -- are made ready, also those of tenants that hold nothing, whose entries
  -- Redis lost (K.fready evicted): O(flows waiting), then only.
  for tenant in pairs(tenants) do
    local flows = {}
    for b = 0, MAXBAND do flows[#flows + 1] = tenant .. '.' .. b end
    for _, w in ipairs(capped(tenant, want[tenant]) and redis.call('HMGET', K.twait, unpack(flows)) or {}) do
      if w then nwait = nwait - 1 end
    end
  end
  if nwait <= nready then return end
  for _, flow in ipairs(redis.call('HKEYS', K.twait)) do
    local tn = want[tenant_of(flow)] or 0
    if not capped(tenant_of(flow), tn) then refresh(flow, nil, true, false, tn) end
  end
end
