-- acquire.lua: take the leader lease if nobody else holds it.
-- KEYS[1] leader key      KEYS[2] epoch counter      KEYS[3] history stream
-- KEYS[4] generation counter (read only: see prelude.lua)
-- ARGV[1] node id         ARGV[2] lease ttl (ms)     ARGV[3] history max length
-- ARGV[4] the highest epoch this node has seen (0 if none)
-- ARGV[5] the highest generation this node has seen (0 if none)
-- ARGV[6] '1' when this node may lead even though Redis lost writes: it led last, as far as
--         it knows, or it has held back for the grace already; else '0'
-- Returns {1, epoch, generation, seconds, microseconds}        acquired; the new epoch
--         {0, holder_token, pttl, generation, seconds, microseconds}  another node holds it
--         {0, '', -3, generation, seconds, microseconds}   Redis lost writes and this node
--             did not lead last: it holds back while the node that led takes the lease again
-- (seconds, microseconds: Redis TIME, so every attempt also measures clock skew)
-- A key still holding this node's own id (from a lease it gave up locally) is
-- taken again with a new epoch: the older self is fenced by the new epoch.
-- A key whose epoch is below one this node has seen was brought back by Redis going to
-- older state (epochs only rise otherwise): nobody leads under it, and it is taken as free.
-- The epoch is INCR'd, and lifted above ARGV[4]: after Redis lost its data the
-- counter restarts empty, and epochs must never go backwards.
local now = redis.call('TIME')
local generation = tonumber(redis.call('GET', KEYS[4]) or '0')
local seen_epoch = tonumber(ARGV[4])
local current = redis.call('GET', KEYS[1])
if current then
  local holder, held = string.match(current, '^(.*)|(%d+)$')
  if holder ~= ARGV[1] and not (held and tonumber(held) < seen_epoch) then
    return {0, current, redis.call('PTTL', KEYS[1]), generation, now[1], now[2]}
  end
end
if generation < tonumber(ARGV[5] or '0') and ARGV[6] == '0' then
  return {0, '', -3, generation, now[1], now[2]}
end
local epoch = redis.call('INCR', KEYS[2])
if epoch <= seen_epoch then
  epoch = seen_epoch + 1
  redis.call('SET', KEYS[2], epoch)
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. epoch, 'PX', ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*',
           'event', 'elected', 'node', ARGV[1], 'epoch', epoch)
return {1, epoch, generation, now[1], now[2]}
