-- release: give a ticket's permit back and hand it to the head of the
-- queue (the handoff: this script plus one Pub/Sub message).
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-6 common, 7 correction: what the request really
--   used minus its charged cost, added to its flow's counter (fair.lua).
-- Returns the grants dispatch made to the releasing node's own waiters
-- ({ticket, grant no, ...}; see dispatch in dispatch.lua).
-- Idempotent: releasing a ticket that holds nothing only dispatches.
if redis.call('ZREM', K.holders, ARGV[1]) == 1 then unheld(ARGV[1], tonumber(ARGV[7])) end
reap()
return (dispatch(owner_of(ARGV[1])))
