-- inspect: a read-only snapshot of the queue for operators.
-- KEYS: the common layout (K, see common.lua).
-- ARGV: 1 unused, 2-7 common, 8 how many head tickets, 9 how many flows.
-- Returns {waiting, {head tickets}, {holder, ms left, ...},
--   {node, ms left, ...}, {{flow, waiting, held, usage}, ...} (busiest
--   first; usage: its counter minus the virtual time), grants,
--   {holder, upstream, ...}, {upstream, ms cooling left, ...}, tokens
--   held, {holder, tokens, ...}, {upstream, tokens held, ...}, {share
--   key, learned share, ...} ('' : the queue's, else an upstream's)}.
--   The head lists the ready flows' first tickets, least usage first,
--   then the FIFO tickets in order.
-- Idempotent: it writes nothing.
clock()
local want = tonumber(ARGV[8])
local head = {}
if want > 0 then
  for _, r in ipairs(redis.call('ZRANGE', K.fready, 0, want - 1)) do
    local m = head_of(string.match(r, '^[^|]*|(.*)$'))
    if m then
      local _, _, _, id = parse(m)
      head[#head + 1] = id
    end
  end
  for _, id in ipairs(redis.call('ZRANGE', K.waiting, 0, want - 1 - #head)) do
    if #head < want then head[#head + 1] = id end
  end
end
local holders = {}
local h = redis.call('ZRANGE', K.holders, 0, -1, 'WITHSCORES')
for i = 1, #h, 2 do
  holders[#holders + 1] = h[i]
  holders[#holders + 1] = tonumber(h[i + 1]) - now
end
local nodes = {}
local n = redis.call('ZRANGE', K.nodes, 0, -1, 'WITHSCORES')
for i = 1, #n, 2 do
  nodes[#nodes + 1] = n[i]
  nodes[#nodes + 1] = tonumber(n[i + 1]) - now
end
local flows = {}
local f = redis.call('HGETALL', K.twait)
for i = 1, #f, 2 do flows[#flows + 1] = {f[i], tonumber(f[i + 1])} end
table.sort(flows, function(a, b) return a[2] > b[2] end)
local top = {}
local v = vtime()
for i = 1, math.min(#flows, tonumber(ARGV[9])) do
  local flow = flows[i][1]
  top[#top + 1] = {flow, flows[i][2], tonumber(redis.call('HGET', K.finf, flow) or '0'), num((counter(flow) or v) - v)}
end
local cooling = {}
local c = redis.call('ZRANGEBYSCORE', K.ucool, '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #c, 2 do
  cooling[#cooling + 1] = c[i]
  cooling[#cooling + 1] = tonumber(c[i + 1]) - now
end
return {waiting(), head, holders, nodes, top, grants(), redis.call('HGETALL', K.uheld), cooling,
  held_tokens(), redis.call('HGETALL', K.thold), redis.call('HGETALL', K.tup),
  learned_shares()}
