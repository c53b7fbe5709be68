-- leave: a node stops. Its permits are released and handed on, its
-- liveness entry removed (its waiters, if any remain, are dropped when
-- they reach the head). When the queue is then empty everywhere, its
-- counters, epoch, tombstones and fairness state are deleted too: nothing is left.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-6 common.
-- Returns the number of permits released.
-- Idempotent: a second run finds nothing of the node.
clock()
local held = mine(ARGV[1])
for _, id in ipairs(held) do
  redis.call('ZREM', K.holders, id)
  unheld(id, 0)
end
redis.call('ZREM', K.nodes, ARGV[1])
redis.call('HDEL', K.members, ARGV[1])
reap()
dispatch('')
forget_dead()
redis.call('ZREMRANGEBYSCORE', K.fidle, '-inf', num(vtime()))
if waiting() + redis.call('ZCARD', K.holders) + redis.call('ZCARD', K.nodes) == 0 then
  redis.call('DEL', unpack(KEYS))
end
return #held
