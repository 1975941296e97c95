-- guard_renew.lua: the run's worker keeps it alive. The liveness is set again, not only
-- extended (after a Redis outage longer than the lease, or a restart, it may be gone while
-- the run goes on), and so is the record unless it says finished; the overlap lock the run
-- holds is extended. A run taken for dead whose slot started again changes nothing.
-- Returns {'ok'} | {'superseded', worker of the run that holds the slot}
local state, held, by = holder()
if state and held ~= token then return {'superseded', by} end
redis.call('SET', KEYS[2], token .. '|' .. worker, 'PX', lease)
if state ~= 'f' then
  redis.call('SET', KEYS[1], 's|' .. token .. '|' .. worker, 'PX', record_ttl)
end
if redis.call('GET', KEYS[3]) == task then
  redis.call('PEXPIRE', KEYS[3], lease)
  if queues then redis.call('PEXPIRE', KEYS[9], lease) end
end
return {'ok'}
