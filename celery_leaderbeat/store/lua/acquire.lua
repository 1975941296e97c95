-- acquire.lua: take the leader lease if nobody else holds it. KEYS: [1] leader key
-- [2] epoch counter  [3] history stream  [4] generation counter (read only: see prelude.lua)
-- ARGV, named below. Returns {1, epoch, generation, seconds, microseconds} acquired (the new
-- epoch); {0, holder_token, pttl, generation, seconds, microseconds} another node holds it;
-- {0, '', -3, generation, seconds, microseconds} Redis lost writes and this node did not lead
-- last: it holds back while the node that led takes the lease again (seconds, microseconds:
-- Redis TIME, so every attempt also measures clock skew). A key still holding this node's
-- own id (from a lease it gave up locally) is taken again with a new epoch: the older self
-- is fenced by the new epoch. A key whose epoch is below one this node has seen was brought
-- back by Redis going to older state (epochs only rise otherwise): nobody leads under it,
-- and it is taken as free. The epoch is INCR'd, and lifted above the highest seen: after
-- Redis lost its data the counter restarts empty, and epochs must never go backwards.
local node, ttl, history_max = ARGV[1], ARGV[2], ARGV[3]
local seen_epoch = tonumber(ARGV[4])  -- the highest epoch this node has seen (0 if none)
local seen_generation = tonumber(ARGV[5] or '0')  -- the highest generation seen (0 if none)
-- '1' when this node may lead even though Redis lost writes (it led last, as far as it
-- knows, or it has held back for the grace already), else '0'
local may_lead_after_loss = ARGV[6] ~= '0'
local now = redis.call('TIME')
local generation = tonumber(redis.call('GET', KEYS[4]) or '0')
local current = redis.call('GET', KEYS[1])
if current then
  local holder, held = string.match(current, '^(.*)|(%d+)$')
  if holder ~= node and not (held and tonumber(held) < seen_epoch) then
    return {0, current, redis.call('PTTL', KEYS[1]), generation, now[1], now[2]}
  end
end
if generation < seen_generation and not may_lead_after_loss then
  return {0, '', -3, generation, now[1], now[2]}
end
local epoch = redis.call('INCR', KEYS[2])
if epoch <= seen_epoch then
  epoch = seen_epoch + 1
  redis.call('SET', KEYS[2], epoch)
end
redis.call('SET', KEYS[1], node .. '|' .. epoch, 'PX', ttl)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', history_max, '*',
           'event', 'elected', 'node', node, 'epoch', epoch)
return {1, epoch, generation, now[1], now[2]}
