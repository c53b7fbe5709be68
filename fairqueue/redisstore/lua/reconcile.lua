-- reconcile: a node's periodic safety net. Frees expired leases,
-- recounts the permits each tenant holds from the holders (fair.lua)
-- and the tokens held from the holders' weights (tokens.lua),
-- dispatches (permits freed by expiry have no releaser), forgets dead
-- nodes, expired tombstones and idle flows' counters the virtual time
-- has passed, and lists (and renews) the node's holders so it can find grants whose
-- message was lost.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-7 common, 8 ms: holders granted or renewed more recently
--   are left out (their grant message may still be in flight).
-- Returns {epoch, grants, waiting, {holder tickets of node}, own grants,
-- {their upstreams}} (own grants: {ticket, grant no, upstream, Redis ms,
-- ...} made to the node by this call; the upstreams, '' for none, in the order of
-- the holders).
-- Idempotent: a second run finds nothing more to free or dispatch.
clock()
reap()
recount()
token_recount()
pool_tidy()
local own = (dispatch(ARGV[1]))
drop_waiters_of(forget_dead())
-- What a ticket asks is left behind where a node of an earlier version
-- granted it (tokens.lua): once nobody waits, K.tok holds nothing else.
-- Nobody waits where no fair ticket is in a flow's order either: one
-- whose index entry (K.fticket) Redis evicted is still granted from
-- there (best_fair), weighing what K.tok keeps for it.
local queued = waiting()
if queued == 0 and redis.call('EXISTS', K.fwait) == 0 then redis.call('DEL', K.tok) end
redis.call('ZREMRANGEBYSCORE', K.gone, '-inf', now)
redis.call('ZREMRANGEBYSCORE', K.fidle, '-inf', num(vtime()))
local held = mine(ARGV[1], tonumber(ARGV[8]))
-- The holders listed are renewed, each to a lease from now at least:
-- the node starts a waiter it finds among them only while its answer is
-- less than a lease old (a grant whose message was lost may be nearly a
-- lease old itself, and another node may reap it before the answer is
-- read: the node stopped or starved past what was left of it).
for _, id in ipairs(held) do redis.call('ZADD', K.holders, 'XX', 'GT', now + lease, id) end
local ups = {}
if #held > 0 and redis.call('EXISTS', K.uheld) == 1 then
  for i, u in ipairs(redis.call('HMGET', K.uheld, unpack(held))) do ups[i] = u or '' end
end
return {redis.call('GET', K.epoch) or '', grants(), queued, held, own, ups}
