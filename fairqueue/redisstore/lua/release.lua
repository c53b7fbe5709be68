-- release: give a ticket's permit back and hand it to the head of the
-- queue (the handoff: this script plus one Pub/Sub message).
-- KEYS: the common layout (2-4, 6, 8-10 used).
-- ARGV: 1 ticket, 2-5 common.
-- Returns the grants dispatch made to the releasing node's own waiters
-- ({ticket, grant no, ...}; see dispatch in common.lua).
-- Idempotent: releasing a ticket that holds nothing only dispatches.
redis.call('ZREM', KEYS[3], ARGV[1])
reap()
return dispatch(owner_of(ARGV[1]))
