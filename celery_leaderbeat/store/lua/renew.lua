-- renew.lua: extend the lease, only for the holder of this exact token.
-- KEYS[1] leader key
-- ARGV[1] token (node_id|epoch)   ARGV[2] lease ttl (ms)
-- Returns {1, seconds, microseconds}   renewed; Redis TIME, for clock-skew checks
--         {0, holder_token or false}   the lease is not ours any more
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local now = redis.call('TIME')
  return {1, now[1], now[2]}
end
return {0, current}
