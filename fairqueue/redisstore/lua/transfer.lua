-- transfer: the local handoff. A node releasing a permit (ticket ARGV[1])
-- while its own ticket ARGV[8] heads the queue (my_heads told it so; or
-- follows only tickets that will not be granted after it: those the
-- node started already, whose transfers reach Redis before this one,
-- since the node sends them in the order it started the waiters, and
-- those cancelled; after a failed transfer the node hands on to none
-- behind its waiter) has already started that waiter on the permit; this records
-- it: the holder gives its entry to the waiter, in one step, so the
-- permits counted never drop below the permits in use while the call
-- is on its way.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 the holder, 2-7 common, 8 the waiter (a FIFO ticket of the
--   same node), 9 '1' to mark the holder freed (as release.lua's 11).
-- The waiter is counted as a holder whatever Redis holds: it runs. Where
-- it was no longer waiting but held already (another node's release
-- granted it meanwhile, its message still on its way), the holder's
-- permit is free and dispatch hands it on; where Redis had lost it (and
-- the holder with it: a restart), it is counted again, as a heartbeat
-- counts a held permit it finds missing; its weight, unknown here, is
-- counted by the node's next heartbeat, which names it (heartbeat.lua).
-- Returns {own grants, heads, added, grant no}: as release.lua; added 1
-- when the waiter's holder entry was written here (the node releases it
-- again if its request ended meanwhile: its release may have reached
-- Redis first), and the number of its grant (0: none made here).
-- Where the waiter was granted meanwhile by a call with a pool, its
-- upstream entry goes: it runs where the node sent it, on no upstream
-- the store chose.
-- Idempotent: sent again, it finds the holder gone and the waiter held,
-- and changes nothing.
-- A transfer of a node that left (sent before its leave, come late: left
-- in common.lua) changes nothing: the leave released the holder, and the
-- waiter would hold a permit for nobody.
clock()
local id, to = ARGV[1], ARGV[8]
local node = owner_of(id)
-- The holder goes first: a node that left holds none (its leave released
-- them), so only a transfer that finds none asks whether its node left.
local freed = redis.call('ZREM', K.holders, id) == 1
if not freed and left(node) then return {{}, {}, 0, 0} end
mark_freed(id, ARGV[9])
local ex = present('waiting', 'fready', 'fwait', 'uheld', tokens == 0 and 'thold' or nil,
  tokens == 0 and 'tok' or nil)
weighted, tok_kept, uheld_kept = ex.thold, ex.tok, ex.uheld
if freed then unheld(id, 0, true) end
local no, added = 0, 0
local waited = ex.waiting and redis.call('ZREM', K.waiting, to) == 1
if waited or not redis.call('ZSCORE', K.holders, to) then
  redis.call('ZADD', K.holders, now + lease, to)
  if waited then
    no = redis.call('INCR', K.grants)
    -- A weight recorded under limits that counted tokens (this node's
    -- before a reload turned kv_tokens off; my_heads: these count none)
    -- is counted with the grant, as dispatch counts it: the request
    -- holds those tokens, and a node that counts them must see them.
    take_tokens(to, drop_weight(to), nil, nil, true)
  end
  added = 1
  freed = false -- the permit went to the waiter
elseif ex.uheld then
  -- Granted meanwhile by a call with a pool (a reload gave the queue
  -- one): the waiter runs where the node's plain grant sent it, so it
  -- counts on every upstream, as a holder granted without the pool does
  -- (pool_view), not on the one that call placed it on.
  local dial = redis.call('HGET', K.uheld, to)
  if dial then
    redis.call('HDEL', K.uheld, to)
    local w = tonumber(redis.call('HGET', K.thold, to) or '0')
    if w > 0 and redis.call('HINCRBY', K.tup, dial, -w) <= 0 then redis.call('HDEL', K.tup, dial) end
  end
end
local own = {}
if freed then own = dispatch(node) end
return {own, ex.waiting and my_heads(node, ex) or {}, added, no}
