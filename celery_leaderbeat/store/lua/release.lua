-- release.lua: give the lease up (graceful stop or step-down) and wake standbys.
-- KEYS[1] leader key      KEYS[2] history stream
-- ARGV[1] token           ARGV[2] history max length   ARGV[3] events channel
-- ARGV[4] reason ('released' or 'step-down')
-- Returns 1 released; 0 the lease was not ours (nothing changed)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local node, epoch = string.match(ARGV[1], '^(.*)|(%d+)$')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*',
           'event', 'released', 'node', node, 'epoch', epoch, 'reason', ARGV[4])
redis.call('PUBLISH', ARGV[3], 'released')
return 1
