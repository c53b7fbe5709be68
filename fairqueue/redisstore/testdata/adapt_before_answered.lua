-- adapt: one node's reports for the learned capacity (fairqueue.Adaptive):
-- each is added to its share's window in K.adapt and, when an interval
-- has passed since that share last moved (Redis' clock), the share moves
-- by its window's reports (fairqueue.NextShare, the same lines) and a new
-- window starts. Every node's calls grant under the shares (common.lua).
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 node, 2-7 common, 8 limited (1: the node's requests waited),
--   9 floor, 10 decrease, 11 step, 12 breach share, 13 interval ms,
--   14 min samples (fairqueue.Ripe), 15 heads TTL ms (fairqueue.HeadsTTL),
--   then per share: its key ('' : the queue's, else an upstream's dial), the
--   TTFTs measured, those above the target, the requests refused, and the
--   share the node last heard of ('' : none; fairqueue.AdaptArgs.Known): a
--   share K.adapt lacks (Redis lost its data) starts from it, not from 1.
-- The queue's share is not lowered (its window keeps its reports until a
-- later call) on a node's report while heads a reply named under a
-- learned capacity to another node may still serve (K.members' field h,
-- "<ms> <node>", written by my_heads in dispatch.lua less than the heads
-- TTL ago): heads are named only to a node alone in the queue, which
-- hands on locally to them for that long and hears of a share from its
-- own reports only; another node's lowering (a newcomer that joined
-- since, or one not in the queue) must not meet them. Their node's own
-- report may lower it: its reply tells it the share, and it drops heads
-- chosen before (fairqueue/handoff.go, inForceAt). Where no heads were
-- named that recently, nothing is held back, however often nodes join.
-- Returns {key, share, ...}: every share in force (17 significant digits),
--   none below the floor.
-- K.adapt: HASH, per share key k: s:k share, m:k when it moved (ms),
--   n:k samples, o:k over, r:k refused, l:k limited (its window).
clock()
-- A report of a node that left (sent before its leave, come late: left
-- in common.lua) counts nothing: after the last leave, it writes no key.
if left(ARGV[1]) then return {} end
local floor, decrease, step, breach, interval, min_samples, heads_ttl =
  tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14]),
  tonumber(ARGV[15])
-- held_back: the queue's share may not come down now (see above). A
-- record ahead of the clock (Redis' clock stepped back since it was
-- written) counts from now: the heads serve HeadsTTL at most, by their
-- node's own clock, so the hold ends HeadsTTL after the step is seen,
-- not once the clock has caught up with the record.
local function held_back()
  local at, to = string.match(redis.call('HGET', K.members, 'h') or '', '^(%d+) (.*)$')
  if at == nil or to == ARGV[1] then return false end
  if tonumber(at) > now then
    at = now
    redis.call('HSET', K.members, 'h', now .. ' ' .. to)
  end
  return now - tonumber(at) < heads_ttl
end
for i = 16, #ARGV - 4, 5 do
  local k = ARGV[i]
  if ARGV[i + 4] ~= '' then redis.call('HSETNX', K.adapt, 's:' .. k, ARGV[i + 4]) end
  local n = redis.call('HINCRBY', K.adapt, 'n:' .. k, ARGV[i + 1])
  local o = redis.call('HINCRBY', K.adapt, 'o:' .. k, ARGV[i + 2])
  local r = redis.call('HINCRBY', K.adapt, 'r:' .. k, ARGV[i + 3])
  if ARGV[8] == '1' then redis.call('HSET', K.adapt, 'l:' .. k, 1) end
  local v = redis.call('HMGET', K.adapt, 's:' .. k, 'm:' .. k, 'l:' .. k)
  local share, moved, limited = tonumber(v[1]) or 1, tonumber(v[2]) or 0, v[3] == '1'
  local down = r > 0 or (n > 0 and o > breach * n)
  if now - moved >= interval and (r > 0 or n >= min_samples) and not (down and k == '' and held_back()) then
    if down then
      share = share * decrease
    elseif limited and n > 0 then
      share = share + step
    end
    share = math.min(math.max(share, floor), 1)
    redis.call('HSET', K.adapt, 's:' .. k, num(share), 'm:' .. k, now, 'n:' .. k, 0, 'o:' .. k, 0, 'r:' .. k, 0, 'l:' .. k, 0)
  end
end
-- A share below the floor in force (a reload raised it) rises to it now,
-- not at its next move: a window may take min_samples answers to ripen.
local l = learned_shares()
for i = 1, #l, 2 do
  if tonumber(l[i + 1]) < floor then
    redis.call('HSET', K.adapt, 's:' .. l[i], num(floor))
    l[i + 1] = num(floor)
  end
end
return l
