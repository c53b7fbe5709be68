-- release: give a ticket's permit back and hand it to the head of the
-- queue (the handoff: this script plus one Pub/Sub message).
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 ticket, 2-7 common, 8 correction: what the request really
--   used minus its charged cost, added to its flow's counter (fair.lua),
--   9 an upstream to cool ('' : none), 10 for how many ms (pool.lua),
--   11 '1' when a heartbeat of the node that names the ticket may be on
--   its way: the ticket is marked freed (K.freed) for a lease.
-- Returns {own grants, heads}: the grants dispatch made to the releasing
-- node's own waiters ({ticket, grant no, upstream, Redis ms, ...}; see
-- dispatch in dispatch.lua), and the node's tickets now heading the
-- queue, in order (my_heads; {} if none): its next releases may hand
-- them their permits at once (transfer.lua).
-- Expired leases are reaped by dispatch when they keep a waiter out.
-- Idempotent: releasing a ticket that holds nothing only dispatches and
-- cools its upstream if that one is not cooling (a cooldown sent again
-- while it runs is not applied again).
-- Cost: one EXISTS, read after the cooldown is written (the only write
-- to K.ucool), tells unheld whether any holder weighs tokens (where
-- this call's limits count none) and whether any fair ticket waits (none: no
-- flow's head is looked for) and dispatch whether anybody waits, any
-- upstream may be cooling and any waiter's weight is recorded; a flow
-- unheld makes ready is added to what it tells. Nobody waiting: ZREM, EXISTS, and the holder's bookkeeping;
-- with waiters, a ZCARD and a ZRANGE more read the new heads (my_heads).
-- A marked release (ARGV 11) adds a TIME, a ZADD and a PEXPIRE; a
-- cooldown for a ticket that holds nothing, a ZSCORE.
local id = ARGV[1]
mark_freed(id, ARGV[11])
-- The upstream failed the request: the release that frees the permit
-- cools it, and so does one that finds no holder (Redis may have lost
-- the permit: a restart without persistence, FLUSHALL; the next request
-- would be granted at once on the upstream that failed), unless the
-- upstream cools already: a release sent again, while the cooldown its
-- first send set runs, does not extend it.
local was = redis.call('ZREM', K.holders, id) == 1
cool(ARGV[9], ARGV[10], not was)
local ex = present('waiting', 'fready', 'fwait', #pool > 0 and 'ucool' or nil, 'uheld',
  tokens == 0 and 'thold' or nil, tokens == 0 and 'tok' or nil, tokens == 0 and 'tpass' or nil)
weighted, uheld_kept = ex.thold, ex.uheld
if was and unheld(id, tonumber(ARGV[8]), not ex.fwait) then
  ex.fready = true
end
local node = owner_of(id)
local own = dispatch(node, ex)
return {own, ex.waiting and my_heads(node, ex) or {}}
