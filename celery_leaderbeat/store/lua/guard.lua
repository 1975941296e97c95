-- guard.lua: a worker starts, keeps alive or finishes one slot's run (the worker guard).
-- KEYS[1] run record of the slot   ({p}:run:<task id>)    "<state>|<worker>", PX record ttl
-- KEYS[2] the run's liveness        ({p}:alive:<task id>)  worker, PX lease, renewed while it runs
-- KEYS[3] the entry's overlap lock  ({p}:overlap:<entry>)  task id, PX lease (overlap 'skip' only)
-- KEYS[4] history stream
-- ARGV[1] mode: 'start', 'renew' or 'finish'
-- ARGV[2] task id    ARGV[3] worker (host:pid)    ARGV[4] record ttl (ms)    ARGV[5] lease (ms)
-- ARGV[6] overlap: 'allow' or 'skip'    ARGV[7] history max length
-- ARGV[8] entry    ARGV[9] slot (ms)    ARGV[10] epoch
-- ARGV[11] finish: the outcome recorded; start: 'wait' while the caller will ask again
--          (a "running" answer is then not recorded yet)
-- renew: the liveness is set again (not only extended: after a Redis outage longer than the
--   lease, or a restart, it may be gone while the run goes on), and so is the run record
--   unless it says finished.
-- start: a slot whose run finished, or still runs (its liveness key lives, even once its
--   run record has expired), is a duplicate;
--   with overlap 'skip', a slot whose entry has another run alive is skipped; else the
--   run is recorded started ('s'), alive, and (skip) holds the entry's overlap lock.
--   A run recorded started whose liveness lapsed died with its worker: it may run again.
-- Returns start:  {'run', ''} | {'run', 'rerun'} | {'duplicate', why} | {'overlap', holder}
--         renew:  {'ok'}       finish: {'ok'}
local mode, task, worker = ARGV[1], ARGV[2], ARGV[3]
local record_ttl, lease = ARGV[4], ARGV[5]
local function history(event, detail)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'event', event, 'entry', ARGV[8],
             'slot', ARGV[9], 'node', worker, 'epoch', ARGV[10], 'detail', detail)
end
if mode == 'renew' then
  redis.call('SET', KEYS[2], worker, 'PX', lease)
  local run = redis.call('GET', KEYS[1])
  if not run or string.sub(run, 1, 1) ~= 'f' then
    redis.call('SET', KEYS[1], 's|' .. worker, 'PX', record_ttl)
  end
  if redis.call('GET', KEYS[3]) == task then
    redis.call('PEXPIRE', KEYS[3], lease)
  end
  return {'ok'}
end
if mode == 'finish' then
  redis.call('SET', KEYS[1], 'f|' .. worker, 'PX', record_ttl)
  redis.call('DEL', KEYS[2])
  if redis.call('GET', KEYS[3]) == task then
    redis.call('DEL', KEYS[3])
  end
  history('finished', ARGV[11])
  return {'ok'}
end
local run = redis.call('GET', KEYS[1])
if not run then
  local alive = redis.call('GET', KEYS[2])
  if alive then  -- the record expired (guard_expires) while the run still goes on
    run = 's|' .. alive
  end
end
if run then
  local state, by = string.match(run, '^(%a)|(.*)$')
  if state == 'f' then
    history('skipped', 'duplicate: already ran on ' .. by)
    return {'duplicate', 'finished on ' .. by}
  end
  if redis.call('EXISTS', KEYS[2]) == 1 then
    if ARGV[11] ~= 'wait' then
      history('skipped', 'duplicate: running on ' .. by)
    end
    return {'duplicate', 'running on ' .. by}
  end
end
if ARGV[6] == 'skip' then
  local holder = redis.call('GET', KEYS[3])
  if holder and holder ~= task then
    history('skipped', 'overlap: ' .. holder .. ' still runs')
    return {'overlap', holder}
  end
  redis.call('SET', KEYS[3], task, 'PX', lease)
end
redis.call('SET', KEYS[1], 's|' .. worker, 'PX', record_ttl)
redis.call('SET', KEYS[2], worker, 'PX', lease)
if run then
  history('started', 'rerun: the first run was lost with its worker')
  return {'run', 'rerun'}
end
history('started', '')
return {'run', ''}
