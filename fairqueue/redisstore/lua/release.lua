-- release: give a ticket's permit back and hand it to the head of the
-- queue (the handoff: this script plus one Pub/Sub message).
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-7 common, 8 correction: what the request really
--   used minus its charged cost, added to its flow's counter (fair.lua),
--   9 an upstream to cool ('' : none), 10 for how many ms (pool.lua).
-- Returns the grants dispatch made to the releasing node's own waiters
-- ({ticket, grant no, upstream, ...}; see dispatch in dispatch.lua).
-- Expired leases are reaped by dispatch when they keep a waiter out.
-- Idempotent: releasing a ticket that holds nothing only dispatches (a
-- cooldown sent again ends no later than the first one's).
if redis.call('ZREM', K.holders, ARGV[1]) == 1 then unheld(ARGV[1], tonumber(ARGV[8])) end
cool(ARGV[9], ARGV[10])
return (dispatch(owner_of(ARGV[1])))
