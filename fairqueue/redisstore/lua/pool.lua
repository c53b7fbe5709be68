-- pool.lua: upstream pools (Limits.Upstreams), prepended to every script
-- after common.lua.
--
-- ARGV[7] lists the calling node's upstreams, "<dial> <permits> ..."
-- ('' : no pool), "<permits>/<tokens>" for one with its own capacity in
-- tokens (tokens.lua). Every grant then names one upstream: K.uheld maps the
-- holder to it, so an upstream's permits in flight are its entries there
-- (about the permits: a scan of K.uheld reads as much as one of the
-- holders). An entry is written in the script that adds the holder and
-- deleted with it, by any node, with the pool list or without (one of a
-- rolling change that adds the pool): an entry left behind would count
-- on its upstream a holder that runs anywhere (pool_view), so that
-- another upstream would be granted beside it.
-- K.ucool holds the upstreams left out of dispatch until a time (they
-- failed a request), K.ulast the grant number of each one's last grant.

local pool = {}
for dial, n, t in string.gmatch(ARGV[7] or '', '(%S+) (%d+)/?(%-?%d*)') do
  pool[#pool + 1] = {dial = dial, permits = scale(tonumber(n), dial), tokens = scale(tonumber(t) or 0, dial)}
end

-- token_view adds to a pool view what fits_on needs, once: the weights
-- held on each upstream (v.tok) and by holders without one (v.tany:
-- they count on every upstream).
local function token_view(v)
  if v.tok then return end
  v.tok = {}
  local sum = 0
  local t = redis.call('HGETALL', K.tup)
  for i = 1, #t, 2 do
    v.tok[t[i]] = tonumber(t[i + 1])
    sum = sum + tonumber(t[i + 1])
  end
  v.tany = math.max(held_tokens() - sum, 0)
end

-- fits_on: w more tokens fit upstream u.
local function fits_on(v, u, w)
  if tokens == 0 or u.tokens == 0 then return true end
  if u.tokens < 0 then return false end
  token_view(v)
  return (v.tok[u.dial] or 0) + v.tany + weigh(w) <= u.tokens
end

-- pool_view reads what choosing an upstream needs: permits in flight
-- and who is cooling (not read when the caller found K.ucool missing:
-- cooling false, see present in common.lua); when each was granted last
-- is read by last_of, only if a tie needs it. nil without a pool.
-- held is the number of holders: those without an entry in K.uheld
-- (granted while the queue had no pool, before a reload added one) may
-- run on any upstream, so they count on every one (v.anywhere).
local function pool_view(cooling, held)
  if #pool == 0 then return nil end
  local v = {inf = {}, cool = {}}
  local placed = redis.call('HVALS', K.uheld)
  for _, u in ipairs(placed) do v.inf[u] = (v.inf[u] or 0) + 1 end
  v.anywhere = math.max(held - #placed, 0)
  if cooling ~= false then
    for _, u in ipairs(redis.call('ZRANGEBYSCORE', K.ucool, '(' .. clock(), '+inf')) do v.cool[u] = true end
  end
  return v
end

-- last_of is the grant number of dial's last grant (-1: none), read for
-- every upstream of the view at its first use.
local function last_of(v, dial)
  if not v.last then
    local dials = {}
    for i, u in ipairs(pool) do dials[i] = u.dial end
    local last = redis.call('HMGET', K.ulast, unpack(dials))
    v.last = {}
    for i, u in ipairs(pool) do v.last[u.dial] = tonumber(last[i]) or -1 end
  end
  return v.last[dial]
end

-- pick is the upstream to grant on: not cooling, under its permits
-- (its holders and those that may run anywhere) and with room for w
-- tokens (nil: not asked), the most free relative to its size (of its
-- tokens when every upstream counts them, else of its permits; compared
-- exactly), ties to the one granted longest ago, then list order. nil
-- when none may be.
local function pick(v, w)
  local best, bfree, bsize
  local bytok = tokens ~= 0
  if bytok then
    for _, u in ipairs(pool) do
      if u.tokens <= 0 then bytok = false end
    end
    if bytok then token_view(v) end
  end
  for _, u in ipairs(pool) do
    local free, size = u.permits - (v.inf[u.dial] or 0) - v.anywhere, u.permits
    if free > 0 and not v.cool[u.dial] and (w == nil or fits_on(v, u, w)) then
      if bytok then free, size = u.tokens - (v.tok[u.dial] or 0) - v.tany, u.tokens end
      local a, b = free * (bsize or 1), (bfree or 0) * size
      if not best or a > b or (a == b and last_of(v, u.dial) < last_of(v, best)) then
        best, bfree, bsize = u.dial, free, size
      end
    end
  end
  return best
end

-- everywhere: every upstream of the pool has a free permit (its holders
-- and those that may run anywhere), and room for w tokens (nil: not
-- asked), cooling or not: what a grant that counts on every upstream
-- needs (a waiter of a node without the pool runs on its route's static
-- upstream, whichever that is).
local function everywhere(v, w)
  for _, u in ipairs(pool) do
    if u.permits - (v.inf[u.dial] or 0) - v.anywhere <= 0 or (w and not fits_on(v, u, w)) then return false end
  end
  return true
end

-- place records a grant of ticket id on upstream dial (grant number no).
local function place(v, id, dial, no)
  redis.call('HSET', K.uheld, id, dial)
  redis.call('HSET', K.ulast, dial, no)
  v.inf[dial] = (v.inf[dial] or 0) + 1
  if v.last then v.last[dial] = no end -- else last_of reads it written
end

-- uheld_kept: whether K.uheld exists, where the caller read it with its
-- present call (nil: not read).
local uheld_kept

-- unplace forgets the upstream of a holder removed, whatever the calling
-- node's pool: a grant by a node with the pool may be released by one
-- without it (a rolling change). No command where the caller read that
-- no holder has an upstream.
local function unplace(id)
  if #pool > 0 or uheld_kept ~= false then redis.call('HDEL', K.uheld, id) end
end

-- cool leaves upstream dial out of dispatch for ms (the later end wins);
-- idle: only if it is not cooling now (a ZSCORE more), so that a
-- cooldown sent again while the first one runs does not extend it.
-- The only writer of K.ucool: a script that calls it reads the key's
-- presence after it.
local function cool(dial, ms, idle)
  ms = tonumber(ms) or 0
  if dial == '' or ms <= 0 then return end
  if idle then
    local ends = redis.call('ZSCORE', K.ucool, dial)
    if ends and tonumber(ends) > clock() then return end
  end
  redis.call('ZADD', K.ucool, 'GT', clock() + ms, dial)
end

-- upstream_of is the upstream holder id runs on, or ''.
local function upstream_of(id)
  return redis.call('HGET', K.uheld, id) or ''
end

-- pool_forget deletes what is kept per upstream (its learned share and
-- window in K.adapt, its last grant in K.ulast) for the upstreams no
-- node of the queue has in its pool (K.upool, every node's as its last
-- heartbeat named it), at most 1000 fields of each key a call
-- (heartbeat): a reload that drops an upstream leaves nothing of it once
-- every node has it, and a node still on the old pool (a rolling
-- change) keeps its upstreams' shares. Nothing goes while a node of the
-- queue has named no pool (one of an earlier version, or one whose entry
-- Redis lost): it may use any. About the nodes and the upstreams kept.
local function pool_forget()
  local has = present('adapt', 'ulast')
  if not has.adapt and not has.ulast then return end
  local keep = {}
  local nodes = redis.call('ZRANGE', K.nodes, 0, -1)
  if #nodes > 0 then
    for _, p in ipairs(redis.call('HMGET', K.upool, unpack(nodes))) do
      if not p then return end
      for dial in string.gmatch(p, '(%S+) %d+/?%-?%d*') do keep[dial] = true end
    end
  end
  for _, name in ipairs({'adapt', 'ulast'}) do
    if has[name] then
      local gone = {}
      for _, f in ipairs(redis.call('HKEYS', K[name])) do
        -- K.adapt's fields are "<letter>:<key>", the queue's key '' kept.
        local dial = f
        if name == 'adapt' then dial = string.match(f, '^%a:(.+)$') end
        if dial and not keep[dial] and #gone < 1000 then gone[#gone + 1] = f end
      end
      if #gone > 0 then redis.call('HDEL', K[name], unpack(gone)) end
    end
  end
end

-- pool_tidy deletes upstream entries of tickets that hold nothing and
-- ended cooldowns (reconcile). About the permits.
local function pool_tidy()
  local h = redis.call('HKEYS', K.uheld)
  for _, id in ipairs(h) do
    if not redis.call('ZSCORE', K.holders, id) then redis.call('HDEL', K.uheld, id) end
  end
  redis.call('ZREMRANGEBYSCORE', K.ucool, '-inf', now)
end
