-- release: give a ticket's permit back and hand it to the head of the
-- queue (the handoff: this script plus one Pub/Sub message).
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-5 common.
-- Returns the grants dispatch made to the releasing node's own waiters
-- ({ticket, grant no, ...}; see dispatch in common.lua).
-- Idempotent: releasing a ticket that holds nothing only dispatches.
redis.call('ZREM', K.holders, ARGV[1])
reap()
return dispatch(owner_of(ARGV[1]))
