-- tokens.lua: capacity in tokens (Limits.Tokens, Upstream.KVTokens),
-- prepended to every script after common.lua. The rules are memstore's
-- (fairqueue/memstore/tokens.go):
--   - a holder weighs its ticket's tokens (what it asks, unclamped,
--     where the grant's limits count tokens: asked), bounded by the
--     capacity in force at its grant (a heavier ticket runs alone); a grant needs
--     room for its weight besides a free permit: on the queue, and on
--     the upstream it names;
--   - a release (cancel, lease end, leave) returns the weight;
--   - FIFO is strict: a head that does not fit waits, nothing passes it;
--     in fair order a later ready flow whose head fits may pass the first
--     flow's head that does not, at most TOKEN_PASSES grants in a row
--     (K.tpass), then dispatch waits for room for that head; a head of a
--     node without the pool that cannot be placed is passed the same
--     way, with or without tokens (pass_bare, dispatch.lua).
-- Keys:
--   K.tok    HASH waiting ticket -> its weight (TicketArgs.Tokens, > 0),
--            and '+' .. ticket -> what it asks (TicketArgs.Asks) where
--            that is more (written by this version on; a node of an
--            earlier version reads the weight alone and leaves the ask
--            when it grants the ticket: reconcile drops it once nobody
--            waits)
--   K.thold  HASH holder -> the weight it holds
--   K.tsum   the weights of all holders (one number: O(1) per grant)
--   K.tup    HASH upstream -> the weights of its holders
--   K.tpass  grants made in a row past the first flow of the fair order
-- ARGV[2] is "<permits> <tokens>" when tokens are counted (tokens -1:
-- counted, no room at all), "<permits>" otherwise.

-- TOKEN_PASSES is fairqueue.TokenPasses; TOKEN_SCAN bounds the ready
-- flows looked at for a head that fits.
local TOKEN_PASSES, TOKEN_SCAN = 8, 16

local function held_tokens()
  return tonumber(redis.call('GET', K.tsum) or '0')
end

-- bounded is w bounded by a capacity (<= 0: unbounded).
local function bounded(w, cap)
  if cap and cap > 0 then return math.min(w, cap) end
  return w
end

-- weigh is the weight a ticket of w tokens is counted with: w bounded by
-- the token bound (the configured capacity: a ticket waits for reserved
-- tokens to end rather than count lighter); without one, by the queue's
-- capacity and, when every upstream of the pool sets its own, by the
-- largest of those (so it fits somewhere, alone). ARGV[7] is read here,
-- as pool.lua reads it.
local weigh_cap
local function weigh(w)
  if token_bound > 0 then return math.min(math.max(w or 0, 0), token_bound) end
  if weigh_cap == nil then
    weigh_cap = 0
    for t in string.gmatch(ARGV[7] or '', '%S+ %d+/?(%-?%d*)') do
      local c = tonumber(t) or 0
      if c <= 0 then
        weigh_cap = 0
        break
      end
      weigh_cap = math.max(weigh_cap, c)
    end
  end
  return bounded(bounded(math.max(w or 0, 0), tokens), weigh_cap)
end

-- fits_queue: w more tokens fit the queue's capacity.
local function fits_queue(w)
  if tokens == 0 then return true end
  if tokens < 0 then return false end
  return held_tokens() + weigh(w) <= tokens
end

-- asked is what a ticket of weight w asking a (TicketArgs.Asks; nil or
-- 0: none) weighs before weigh bounds it: a call whose limits count
-- tokens weighs what it asks, so that a waiter queued clamped to a
-- capacity a reload raised since is granted at its full weight at once
-- (its node would queue it again weighing that: nothing passes it
-- meanwhile); one that counts none keeps the weight its node's config
-- gave it (memstore's asked).
local function asked(w, a)
  if tokens ~= 0 and a and a > w then return a end
  return w
end

-- set_weight records waiting ticket id's weight w and what it asks a
-- (where tokens count, or with keep wherever it is known: a requeued
-- ticket's weight, put back under settings that count none, counts when
-- a later call that counts them grants it, as the local store's does).
local function set_weight(id, w, keep, a)
  if (tokens ~= 0 or keep) and w and w > 0 then
    if a and a > w then
      redis.call('HSET', K.tok, id, w, '+' .. id, a)
    else
      redis.call('HSET', K.tok, id, w)
    end
  end
end

-- weight_of is what waiting ticket id weighs in a grant by this call
-- (asked; 0: nothing), read with one command.
local function weight_of(id)
  local r = redis.call('HMGET', K.tok, id, '+' .. id)
  return asked(tonumber(r[1] or '0') or 0, tonumber(r[2] or ''))
end

-- take_weight removes waiting ticket id's weight (and what it asks) and
-- returns the weight (0: none).
local function take_weight(id)
  local w = tonumber(redis.call('HGET', K.tok, id) or '0')
  if w > 0 then redis.call('HDEL', K.tok, id, '+' .. id) end
  return w
end

-- drop_weight takes waiting ticket id's weight out where this call counts
-- no tokens, and returns it (0: none): a config that counts them
-- (another node's in a rolling change, this one's before a reload turned
-- kv_tokens off) may have recorded it. tok_kept: whether K.tok exists,
-- read with the caller's EXISTS (present in common.lua; nil: not read,
-- drop_weight reads it).
local tok_kept
local function drop_weight(id)
  if tok_kept == nil then tok_kept = redis.call('EXISTS', K.tok) == 1 end
  if not tok_kept then return 0 end
  return take_weight(id)
end

-- take_tokens counts holder id's weight w (weigh) on upstream up (nil:
-- none); v, a pool view (pool.lua), learns it too. A holder counted
-- already is left as it is. With recorded, w is the weight a config that
-- counts tokens recorded for the ticket (drop_weight), counted whatever
-- this call's limits: the ticket's node counts it against its capacity,
-- and its request holds those tokens wherever it was granted.
local function take_tokens(id, w, up, v, recorded)
  if (tokens == 0 and not recorded) or not w or w <= 0 then return end
  w = weigh(w)
  if redis.call('HSETNX', K.thold, id, w) == 0 then return end
  redis.call('INCRBY', K.tsum, w)
  if up and up ~= '' then
    redis.call('HINCRBY', K.tup, up, w)
    if v and v.tok then v.tok[up] = (v.tok[up] or 0) + w end
  elseif v and v.tok then
    v.tany = v.tany + w
  end
end

-- give_tokens returns holder id's weight, if it holds one: called before
-- its upstream entry goes (unheld). Without tokens in this call's limits
-- it looks only where some holder weighs tokens (K.thold exists; a
-- script that has read that sets weighted).
local weighted
local function give_tokens(id)
  if tokens == 0 then
    if weighted == nil then weighted = redis.call('EXISTS', K.thold) == 1 end
    if not weighted then return end
  end
  local w = tonumber(redis.call('HGET', K.thold, id) or '')
  if not w then return end
  redis.call('HDEL', K.thold, id)
  if redis.call('DECRBY', K.tsum, w) <= 0 then redis.call('DEL', K.tsum) end
  local up = redis.call('HGET', K.uheld, id)
  if up and redis.call('HINCRBY', K.tup, up, -w) <= 0 then redis.call('HDEL', K.tup, up) end
end

-- token_recount rebuilds K.tsum and K.tup from K.thold, the truth, and
-- drops the weights of tickets that hold nothing (reconcile; about the
-- permits).
local function token_recount()
  if redis.call('EXISTS', K.thold) == 0 then
    redis.call('DEL', K.tsum, K.tup)
    return
  end
  local sum, per = 0, {}
  local h = redis.call('HGETALL', K.thold)
  for i = 1, #h, 2 do
    local id, w = h[i], tonumber(h[i + 1])
    if redis.call('ZSCORE', K.holders, id) then
      sum = sum + w
      local up = redis.call('HGET', K.uheld, id)
      if up then per[up] = (per[up] or 0) + w end
    else
      redis.call('HDEL', K.thold, id)
    end
  end
  redis.call('DEL', K.tsum, K.tup)
  if sum > 0 then redis.call('SET', K.tsum, sum) end
  for up, w in pairs(per) do redis.call('HSET', K.tup, up, w) end
end
