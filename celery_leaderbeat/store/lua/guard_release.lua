-- guard_release.lua: the caller's worker terminated the run (Celery's revoke,
-- terminate=True); ``detail`` is its outcome. Its record says finished, its liveness and
-- the lock go, and the next waiting slot is handed the lock. That worker is the only one
-- that knows the run stopped, so no token is asked.
-- Returns {'ok', message to publish or ''}
local state, held, by = holder()
if redis.call('GET', KEYS[3]) ~= task or state ~= 's' then return {'ok', ''} end
redis.call('SET', KEYS[1], 'f|' .. held .. '|' .. by, 'PX', record_ttl)
redis.call('DEL', KEYS[2])
history('finished', detail)
return {'ok', hand_on()}
