-- acquire.lua: take the leader lease if nobody else holds it.
-- KEYS[1] leader key      KEYS[2] epoch counter      KEYS[3] history stream
-- ARGV[1] node id         ARGV[2] lease ttl (ms)     ARGV[3] history max length
-- Returns {1, epoch}                 acquired; the new fencing epoch (INCR)
--         {0, holder_token, pttl}    another node holds the lease
-- A key still holding this node's own id (from a lease it gave up locally) is
-- taken again with a new epoch: the older self is fenced by the new epoch.
local current = redis.call('GET', KEYS[1])
if current then
  local holder = string.match(current, '^(.*)|%d+$')
  if holder ~= ARGV[1] then
    return {0, current, redis.call('PTTL', KEYS[1])}
  end
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. epoch, 'PX', ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*',
           'event', 'elected', 'node', ARGV[1], 'epoch', epoch)
return {1, epoch}
