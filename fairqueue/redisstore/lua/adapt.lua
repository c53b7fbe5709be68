-- adapt: one node's report for the learned capacity (fairqueue.Adaptive):
-- it is added to the queue's window (K.adapt) and, when an interval has
-- passed since the share last moved (Redis' clock), the share moves by
-- the window's reports (fairqueue.NextShare, the same lines) and a new
-- window starts. Every node's calls grant under that share (common.lua).
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-7 common, 8 TTFTs measured, 9 of them above the target,
--   10 requests the upstream refused, 11 limited (1: requests waited),
--   12 floor, 13 decrease, 14 step, 15 breach share, 16 interval ms.
-- Returns the share in force (a string, 17 significant digits).
-- K.adapt: HASH share, moved (ms), samples, over, refused, limited.
clock()
local samples = redis.call('HINCRBY', K.adapt, 'samples', ARGV[8])
local over = redis.call('HINCRBY', K.adapt, 'over', ARGV[9])
local refused = redis.call('HINCRBY', K.adapt, 'refused', ARGV[10])
if ARGV[11] == '1' then redis.call('HSET', K.adapt, 'limited', 1) end
local v = redis.call('HMGET', K.adapt, 'share', 'moved', 'limited')
local share, moved, limited = tonumber(v[1]) or 1, tonumber(v[2]) or 0, v[3] == '1'
if now - moved >= tonumber(ARGV[16]) then
  if refused > 0 or (samples > 0 and over > tonumber(ARGV[15]) * samples) then
    share = share * tonumber(ARGV[13])
  elseif limited and samples > 0 then
    share = share + tonumber(ARGV[14])
  end
  share = math.min(math.max(share, tonumber(ARGV[12])), 1)
  redis.call('HSET', K.adapt, 'share', num(share), 'moved', now, 'samples', 0, 'over', 0, 'refused', 0, 'limited', 0)
end
return num(share)
