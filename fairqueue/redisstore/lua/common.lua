-- common.lua: prepended to every script of this package.
--
-- KEYS, the same layout for every script, named in the table K (made by
-- the Go side from its one list of key names and prepended to this file;
-- every key shares the queue's hash tag, so a queue lives in one Redis
-- Cluster slot):
--   K.seq      INCR counter: arrival order
--   K.waiting  ZSET ticket -> arrival order (FIFO) or virtual finish tag
--   K.holders  ZSET ticket -> lease expiry (ms, Redis server time)
--   K.nodes    ZSET node -> liveness expiry (ms, Redis server time)
--   K.epoch    random ID of this data set; missing = Redis lost its data
--   K.grants   INCR counter: grants made
--   K.gone     ZSET ticket -> tombstone expiry: cancelled tickets whose
--              acquire may still reach Redis late
--   K.vtime    the fair queue's virtual time: the tag of the last grant
--   K.tlast    HASH flow -> tag of its last queued ticket
--   K.twait    HASH flow -> its tickets waiting; a flow's fields are
--              deleted when its backlog empties, so nothing outlives it
--   K.expired  INCR counter: permits freed by an ended lease
--   K.members  HASH node -> "<lease ms> <mark>": the node's own lease
--              (every grant to its waiters expires after it, whoever
--              makes the grant) and its join mark: the number of the
--              heartbeat that last found the node forgotten, or 0 when an
--              acquire brought it back and its next heartbeat must say so
-- (a flow is one tenant's requests in one priority band)
-- ARGV, the same first five for every script:
--   1 ticket ID (or node ID)   2 permits   3 lease ms
--   4 channel prefix (+ node ID = that node's grant channel)
--   5 publish command: 'spublish' (sharded Pub/Sub) or 'publish'
--
-- Ticket IDs are "<node>:<counter>" (FIFO) or "<node>:<counter>:<flow>"
-- (fair queueing), so a ticket names its owner node and its flow.
-- Time is Redis' own clock (TIME), never a node's.

local now
do
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local permits = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])

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

local function flow_of(id)
  local _, flow = ticket(id)
  return flow
end

-- left_queue does a waiter's tenant bookkeeping when it leaves the queue
-- (granted, cancelled or dropped): an emptied backlog forgets the tenant,
-- which also caps its tag at the virtual time when it comes back (a
-- tenant whose requests timed out is not punished later).
local function left_queue(id)
  local t = flow_of(id)
  if t and redis.call('HINCRBY', K.twait, t, -1) <= 0 then
    redis.call('HDEL', K.twait, t)
    redis.call('HDEL', K.tlast, t)
  end
end

-- advance moves the virtual time to a granted tag.
local function advance(tag)
  local v = tonumber(redis.call('GET', K.vtime) or '0')
  if tag > v then redis.call('SET', K.vtime, tostring(tag)) end
end

local function alive(node)
  local exp = redis.call('ZSCORE', K.nodes, node)
  return exp ~= false and tonumber(exp) >= now
end

-- lease_of is node's own lease (ms): a grant to its waiter lasts as long
-- as the owner renews it, not as long as the granting node would.
local function lease_of(node)
  local v = redis.call('HGET', K.members, node)
  return (v and tonumber(string.match(v, '^(%d+)'))) or lease
end

local function grants()
  return tonumber(redis.call('GET', K.grants) or '0')
end

-- reap frees the permits whose lease ended (a crashed or partitioned
-- node). At most the holders, so at most about the permits.
local function reap()
  local n = redis.call('ZREMRANGEBYSCORE', K.holders, '-inf', now)
  if n > 0 then redis.call('INCRBY', K.expired, n) end
  return n
end

-- dispatch hands free permits to the head of the queue, in order, and
-- tells each grantee's node on its own channel ("<ticket> <grant no>
-- <Redis time ms>"), except the calling node (self): its grants are
-- returned instead ({ticket, grant no, ...}), so the caller wakes its own
-- waiters without a Pub/Sub round trip. Waiters of dead nodes are dropped
-- on the way (at most 1000 a call, to bound the script).
local function dispatch(self)
  local free = permits - redis.call('ZCARD', K.holders)
  local skipped = 0
  local own = {}
  while free > 0 do
    local head = redis.call('ZPOPMIN', K.waiting)
    if #head == 0 then break end
    local id = head[1]
    local owner = owner_of(id)
    left_queue(id)
    if alive(owner) then
      if flow_of(id) then advance(tonumber(head[2])) end
      local no = redis.call('INCR', K.grants)
      if owner == self then
        redis.call('ZADD', K.holders, now + lease, id)
        own[#own + 1] = id
        own[#own + 1] = no
      else
        redis.call('ZADD', K.holders, now + lease_of(owner), id)
        redis.call(ARGV[5], ARGV[4] .. owner, id .. ' ' .. no .. ' ' .. now)
      end
      free = free - 1
    else
      skipped = skipped + 1
      if skipped >= 1000 then break end
    end
  end
  return own
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
-- entries (at most 100 a call).
local function forget_dead()
  local dead = redis.call('ZRANGEBYSCORE', K.nodes, '-inf', '(' .. now, 'LIMIT', 0, 100)
  if #dead > 0 then
    redis.call('ZREM', K.nodes, unpack(dead))
    redis.call('HDEL', K.members, unpack(dead))
  end
end
