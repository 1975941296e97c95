-- renew.lua: extend the lease, only for the holder of this exact token.
-- KEYS[1] leader key
-- ARGV: token (node_id|epoch), lease ttl (ms)
-- Returns {1, seconds, microseconds}   renewed; Redis TIME, for clock-skew checks
--         {0, holder_token or false}   the lease is not ours any more
local token, ttl = ARGV[1], ARGV[2]
local current = redis.call('GET', KEYS[1])
if current == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  local now = redis.call('TIME')
  return {1, now[1], now[2]}
end
return {0, current}
