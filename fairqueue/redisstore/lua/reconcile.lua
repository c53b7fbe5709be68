-- reconcile: a node's periodic safety net. Frees expired leases,
-- recounts the permits each tenant holds from the holders (fair.lua),
-- dispatches (permits freed by expiry have no releaser), forgets dead
-- nodes, expired tombstones and idle flows' counters the virtual time
-- has passed, and lists the node's holders so it can find grants whose
-- message was lost.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-6 common, 7 ms: holders granted or renewed more recently
--   are left out (their grant message may still be in flight).
-- Returns {epoch, grants, waiting, {holder tickets of node}, own grants}
-- (own grants: {ticket, grant no, ...} made to the node by this call).
-- Idempotent: a second run finds nothing more to free or dispatch.
reap()
recount()
local own = (dispatch(ARGV[1]))
forget_dead()
redis.call('ZREMRANGEBYSCORE', K.gone, '-inf', now)
redis.call('ZREMRANGEBYSCORE', K.fidle, '-inf', num(vtime()))
return {redis.call('GET', K.epoch) or '', grants(), waiting(), mine(ARGV[1], tonumber(ARGV[7])), own}
