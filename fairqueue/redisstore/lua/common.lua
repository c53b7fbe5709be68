-- common.lua: prepended to every script of this package.
--
-- KEYS, the same layout for every script, named in the table K (made by
-- the Go side from its one list of key names and prepended to this file;
-- every key shares the queue's hash tag, so a queue lives in one Redis
-- Cluster slot):
--   K.seq      INCR counter: arrival order
--   K.waiting  ZSET FIFO ticket -> arrival order (fair tickets: K.fwait)
--   K.holders  ZSET ticket -> lease expiry (ms, Redis server time)
--   K.nodes    ZSET node -> liveness expiry (ms, Redis server time)
--   K.epoch    random ID of this data set; missing = Redis lost its data
--   K.grants   INCR counter: grants made
--   K.gone     ZSET ticket -> tombstone expiry: cancelled tickets whose
--              acquire may still reach Redis late, and tickets given back
--              by a requeue whose copy may (requeue.lua); node -> expiry:
--              nodes that left, whose calls may still reach Redis late
--              (left)
--   K.vtime    fair queueing's virtual time: the largest usage counter a
--              flow had when it was granted (the floor of a new flow)
--   K.twait    HASH flow -> its tickets waiting
--   K.expired  INCR counter: permits freed by an ended lease
--   K.members  HASH node -> "<lease ms> <mark>": the node's own lease
--              (every grant to its waiters expires after it, whoever
--              makes the grant) and its join mark: the number of the
--              heartbeat that last found the node forgotten, or 0 when an
--              acquire brought it back and its next heartbeat must say so
--              (field h, no node: "<ms> <node>", when and to whom a reply
--              last named heads under a learned capacity; my_heads in
--              dispatch.lua, adapt.lua)
--   K.fwait    ZSET (all scores 0, ordered by member) of the fair
--              tickets waiting, "<flow>|<seq, 16 hex digits>|<cost>|<ticket>":
--              a flow's tickets are one range, in arrival order
--   K.fticket  HASH fair ticket -> its K.fwait member
--   K.fready   ZSET "<head seq hex>|<flow>" -> the flow's usage counter:
--              the flows with waiters that may be served now (a flow whose
--              tenant holds its max_in_flight_per_tenant is left out);
--              the least counter is served first, ties by arrival
--   K.fcount   HASH flow -> usage counter, for every active flow (waiting
--              or holding a permit)
--   K.fidle    ZSET flow -> usage counter of a flow gone idle above the
--              virtual time (it used more than its share: kept until the
--              virtual time passes it, so coming back is no fresh start)
--   K.finf     HASH flow or tenant -> permits it holds (fair tickets)
--   K.uheld    HASH holder ticket -> its pool upstream (pool.lua)
--   K.ucool    ZSET upstream -> end of its cooldown (ms, Redis time)
--   K.ulast    HASH upstream -> grant number of its last grant
--   K.tlast    written by earlier versions only; deleted with the rest
--   K.tok, K.thold, K.tsum, K.tup, K.tpass: capacity in tokens (tokens.lua)
--   K.adapt    HASH the learned capacity's share and window (adapt.lua)
--   K.freed    ZSET ticket -> mark expiry: permits given back (released,
--              or handed on by a transfer) while a heartbeat of their node
--              that names them may be on its way: that heartbeat must not
--              count them again (heartbeat.lua)
--   K.upool    HASH node -> its pool's upstreams, as its last heartbeat
--              named them (ARGV[7]; or the acquire or requeue that made
--              it alive, before its first heartbeat): dispatch grants a
--              waiter of another node without a pool on no upstream,
--              and what is kept per upstream goes
--              when no node has it (pool_forget, pool.lua)
-- (a flow is one tenant's requests in one priority band)
-- ARGV, the same first seven for every script:
--   1 ticket ID (or node ID)   2 permits [and tokens, tokens.lua]   3 lease ms
--   4 channel prefix (+ node ID = that node's grant channel)
--   5 publish command: 'spublish' (sharded Pub/Sub) or 'publish'
--   6 max permits one tenant holds (max_in_flight_per_tenant; 0: no cap)
--   7 the pool's upstreams, "<dial> <permits>[/<tokens>] ..." ('' : no pool)
--
-- Ticket IDs are "<node>:<counter>" (FIFO) or "<node>:<counter>:<flow>"
-- (fair queueing), so a ticket names its owner node and its flow.
-- Time is Redis' own clock (TIME), never a node's.

-- now is Redis' clock in ms, read once by clock(). Every script calls
-- clock() first, except release: its fast path (nobody waiting) needs no
-- time, and what it calls that does (mark_freed, cool, dispatch) calls
-- clock().
local now
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
-- ARGV[2]: "<permits>", or "<permits> <tokens> <token bound>"
-- (tokens.lua), followed by " a" where the learned shares (K.adapt, see
-- adapt.lua) apply: the queue's (field 's:') to permits and tokens, each
-- upstream's ('s:<dial>') to its own (pool.lua), at least 1 each; the
-- token bound follows the largest share (fairqueue.Limits.Scale).
local permits, tokens, token_bound, learned
do
  local p, t, b, a = string.match(ARGV[2], '^(%-?%d+) ?(%-?%d*) ?(%-?%d*) ?(a?)$')
  permits, tokens, token_bound, learned = tonumber(p), tonumber(t) or 0, tonumber(b) or 0, a == 'a'
end
-- learned_shares lists K.adapt's shares: {key, share, ...} (the share
-- of key k is its field 's:k'); one that is no number (an operator's
-- typo) is none, the ceiling.
local function learned_shares()
  local out = {}
  local h = redis.call('HGETALL', K.adapt)
  for i = 1, #h, 2 do
    local k = string.match(h[i], '^s:(.*)$')
    if k and tonumber(h[i + 1]) then
      out[#out + 1] = k
      out[#out + 1] = h[i + 1]
    end
  end
  return out
end
local shares = {}
if learned then
  local l = learned_shares()
  for i = 1, #l, 2 do
    shares[l[i]] = tonumber(l[i + 1])
  end
  -- The token bound follows the largest share in force: the queue's
  -- without a pool, each upstream's (ARGV[7]) with one; a key without a
  -- share is at 1.
  local most, any = 0, false
  for dial in string.gmatch(ARGV[7] or '', '(%S+) %d+/?%-?%d*') do
    any = true
    most = math.max(most, shares[dial] or 1)
  end
  if not any then most = shares[''] or 1 end
  local bound = token_bound
  if most < 1 and token_bound > 0 then token_bound = math.max(math.floor(token_bound * most), 1) end
  -- With a pool whose every upstream sets its own kv_tokens, the bound
  -- is at most the largest of theirs in force, each under its own share
  -- (unequal caches: it may be another upstream's than the largest
  -- share's), so that a heavy ticket fits somewhere.
  local in_force = 0
  if bound > 0 and next(shares) ~= nil then -- none learned: as configured (fairqueue.Limits.Scale)
    for dial, kv in string.gmatch(ARGV[7] or '', '(%S+) %d+/?(%-?%d*)') do
      local c = tonumber(kv) or 0
      if c == 0 then
        in_force = 0
        break
      end
      if c > 0 then
        c = math.min(c, bound)
        local share = shares[dial]
        if share and share < 1 then c = math.max(math.floor(c * share), 1) end
        in_force = math.max(in_force, c)
      end
    end
  end
  if in_force > 0 then token_bound = math.min(token_bound, in_force) end
end
-- scale is capacity n under the share of key ('' : the queue's).
local function scale(n, key)
  local share = shares[key or '']
  if not share or share >= 1 or n <= 0 then return n end
  return math.max(math.floor(n * share), 1)
end
-- The queue's share applies without a pool only (ARGV[7] empty): with
-- one, each upstream's does (pool.lua).
if not string.find(ARGV[7] or '', '%S') then permits, tokens = scale(permits), scale(tokens) end
local lease = tonumber(ARGV[3])
local tenant_cap = tonumber(ARGV[6])

-- ticket reads a ticket ID, "<node>:<counter>" or "<node>:<counter>:<flow>"
-- (fairqueue.TicketID): its owner node, and its flow (nil in FIFO).
local function ticket(id)
  local node, flow = string.match(id, '^([^:]*):[^:]*:?(.*)$')
  if flow == '' then flow = nil end
  return node or id, flow
end

local function owner_of(id)
  return (ticket(id))
end

-- mark_freed marks ticket id given back for a lease when mark is '1' (see
-- K.freed): a heartbeat of its node sent before the release must not
-- count it again.
local function mark_freed(id, mark)
  if mark == '1' then
    redis.call('ZADD', K.freed, clock() + lease, id)
    -- A release that ran late, after the last node left, leaves nothing;
    -- the key lasts as long as its longest mark: an instance with a
    -- shorter lease must not cut another's marks short.
    if redis.call('PTTL', K.freed) < lease then redis.call('PEXPIRE', K.freed, lease) end
  end
end

local function flow_of(id)
  local _, flow = ticket(id)
  return flow
end

local function alive(node)
  local exp = redis.call('ZSCORE', K.nodes, node)
  return exp ~= false and tonumber(exp) >= now
end

-- left tells whether node, not alive here, left (Queue.Close: leave.lua
-- tombstones it in K.gone) no more than a tombstone's life ago: a call
-- of it that reaches Redis now was sent before the leave and came late
-- (its client gave up on it: a slow network, a frozen Redis that thawed).
-- The leave gave back everything of the node; such a call changes
-- nothing (it would count permits, queue waiters and bring the node back
-- to life for nobody, and keep the last leave from deleting the keys).
local function left(node)
  if alive(node) then return false end
  local t = redis.call('ZSCORE', K.gone, node)
  return t ~= false and tonumber(t) > now
end

-- tombstone adds member (a ticket, a node or the mark '!late': see
-- leave.lua) to K.gone for ttl ms. The key has no expiry while live
-- nodes use the queue; where it has one (kept by the last leave), or is
-- new with no live node (a cancel that ran late, after the last leave),
-- it lasts as long as its longest tombstone, and so goes by itself.
local function tombstone(member, ttl)
  local p = redis.call('PTTL', K.gone)
  redis.call('ZADD', K.gone, now + ttl, member)
  if (p >= 0 and p < ttl) or (p == -2 and redis.call('ZCOUNT', K.nodes, now, '+inf') == 0) then
    redis.call('PEXPIRE', K.gone, ttl)
  end
end

-- lease_of is node's own lease (ms): a grant to its waiter lasts as long
-- as the owner renews it, not as long as the granting node would.
local function lease_of(node)
  local v = redis.call('HGET', K.members, node)
  return (v and tonumber(string.match(v, '^(%d+)'))) or lease
end

-- present tells which of the keys K[name] for the given names exist, in
-- one EXISTS: EXISTS counts a key once per mention, so the i-th name is
-- mentioned 2^(i-1) times and each bit of the count answers for one.
-- A name may be nil (not asked: its answer is nil). Returns {name = bool}.
local function present(...)
  local names, args = {...}, {}
  for i = 1, select('#', ...) do
    if names[i] then
      for _ = 1, 2 ^ (i - 1) do args[#args + 1] = K[names[i]] end
    end
  end
  local n = redis.call('EXISTS', unpack(args))
  local out = {}
  for i = 1, select('#', ...) do
    if names[i] then out[names[i]] = math.floor(n / 2 ^ (i - 1)) % 2 == 1 end
  end
  return out
end

local function grants()
  return tonumber(redis.call('GET', K.grants) or '0')
end

-- mine lists the holders owned by node, the calling node (scans the
-- holders: about the permits, never the waiters). With fresh, it leaves
-- out those granted or renewed in the last `fresh` ms under the node's
-- lease: their grant message may still be in flight. A holder whose
-- expiry lies beyond the node's lease was granted under an earlier,
-- longer one and is listed.
local function mine(node, fresh)
  local out = {}
  local h = redis.call('ZRANGE', K.holders, 0, -1, 'WITHSCORES')
  for i = 1, #h, 2 do
    local id, exp = h[i], tonumber(h[i + 1])
    if owner_of(id) == node and
       not (fresh and exp > now + lease - fresh and exp <= now + lease) then
      out[#out + 1] = id
    end
  end
  return out
end

-- forget_dead removes nodes whose liveness ended, with their member
-- entries (at most 100 a call), and returns them (drop_waiters_of in
-- dispatch.lua takes their waiters out).
local function forget_dead()
  local dead = redis.call('ZRANGEBYSCORE', K.nodes, '-inf', '(' .. now, 'LIMIT', 0, 100)
  if #dead > 0 then
    redis.call('ZREM', K.nodes, unpack(dead))
    redis.call('HDEL', K.members, unpack(dead))
    redis.call('HDEL', K.upool, unpack(dead))
  end
  return dead
end
