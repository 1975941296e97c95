-- guard_finish.lua: the run ended; ``detail`` is its outcome. The record says finished, the
-- liveness goes, and the overlap lock the run holds is handed to the first waiting slot.
-- A run taken for dead whose slot started again writes only its history event.
-- Returns {'ok', message to publish or ''} | {'superseded', worker of the run that holds it}
local state, held, by = holder()
if state and held ~= token then
  history('finished', detail .. '; superseded: the slot ran again on ' .. by)
  return {'superseded', by}
end
redis.call('SET', KEYS[1], 'f|' .. token .. '|' .. worker, 'PX', record_ttl)
redis.call('DEL', KEYS[2])
history('finished', cancelled_said(detail))
return {'ok', hand_on()}
