-- release.lua: give the lease up (graceful stop or step-down) and wake standbys.
-- KEYS[1] leader key      KEYS[2] history stream
-- ARGV: token, history max length, events channel, reason ('released' or 'step-down')
-- Returns 1 released; 0 the lease was not ours (nothing changed)
local token, history_max, channel, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('GET', KEYS[1]) ~= token then
  return 0
end
redis.call('DEL', KEYS[1])
local node, epoch = string.match(token, '^(.*)|(%d+)$')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', history_max, '*',
           'event', 'released', 'node', node, 'epoch', epoch, 'reason', reason)
redis.call('PUBLISH', channel, 'released')
return 1
