-- release: give a ticket's permit back and hand it to the head of the
-- queue (the handoff: this script plus one Pub/Sub message).
-- KEYS: the common layout (2-4, 6, 8-10 used).
-- ARGV: 1 ticket, 2-5 common.
-- Returns 1 if the ticket held a permit, else 0.
-- Idempotent: releasing a ticket that holds nothing only dispatches.
local n = redis.call('ZREM', KEYS[3], ARGV[1])
reap()
dispatch()
return n
