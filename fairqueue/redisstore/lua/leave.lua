-- leave: a node stops. Its permits are released and handed on, its
-- liveness entry removed (its waiters, if any remain, are dropped when
-- they reach the head). When the queue is then empty everywhere, its
-- counters, epoch, tombstones and fairness state are deleted too: nothing is left.
-- KEYS: the common layout (all twelve).
-- ARGV: 1 node, 2-5 common.
-- Returns the number of permits released.
-- Idempotent: a second run finds nothing of the node.
local held = mine(ARGV[1])
if #held > 0 then redis.call('ZREM', KEYS[3], unpack(held)) end
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[12], ARGV[1])
reap()
dispatch('')
forget_dead()
if redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12])
end
return #held
