-- guard.lua: a worker starts, keeps alive or finishes one run of one slot (the worker guard).
-- A run is one delivery that does the work: the slot's first run, or its k-th retry (a run
-- key of its own per retry, so a duplicated retry message is caught like any other).
-- KEYS[1] the run's record         ({p}:run:<run id>)    "<state>|<token>|<worker>", PX record ttl
-- KEYS[2] the run's liveness       ({p}:alive:<run id>)  "<token>|<worker>", PX lease, renewed
-- KEYS[3] the entry's overlap lock ({p}:overlap:<entry>) task id, PX lease (overlap 'skip' only)
-- KEYS[4] history stream
-- KEYS[5] fencing counter          ({p}:guard:fence)     the last run token handed out
-- ARGV[1] mode: 'start', 'renew' or 'finish'
-- ARGV[2] task id    ARGV[3] worker (host:pid)    ARGV[4] record ttl (ms)    ARGV[5] lease (ms)
-- ARGV[6] overlap: 'allow' or 'skip'    ARGV[7] history max length
-- ARGV[8] entry    ARGV[9] slot (ms)    ARGV[10] epoch
-- ARGV[11] finish: the outcome recorded; start: 'wait' while the caller will ask again
--          (a "running" answer is then not recorded yet)
-- ARGV[12] renew, finish: the run's token (from its start)    ARGV[13] start: the retry number
-- The token fences runs of one slot: a start hands out a number above every token handed out
-- before (the counter, lifted to Redis TIME in microseconds so it keeps rising after Redis
-- lost its data). renew and finish act only for the run whose token the record holds: a run
-- taken for dead (its worker could not reach Redis for a lease) whose slot started again
-- is told 'superseded' and changes nothing.
-- renew: the liveness is set again (not only extended: after a Redis outage longer than the
--   lease, or a restart, it may be gone while the run goes on), and so is the run record
--   unless it says finished.
-- start: a run that finished, or still runs (its liveness key lives, even once its record
--   has expired), is a duplicate; with overlap 'skip', a slot whose entry has another run
--   alive is skipped; else the run is recorded started ('s') under a new token, alive, and
--   (skip) holds the entry's overlap lock. A run recorded started whose liveness lapsed was
--   taken for dead with its worker: it may run again.
-- Returns start:  {'run', '' | 'rerun', token} | {'duplicate', why} | {'overlap', holder}
--         renew, finish: {'ok'} | {'superseded', worker of the run that holds the slot}
local mode, task, worker = ARGV[1], ARGV[2], ARGV[3]
local record_ttl, lease, token = ARGV[4], ARGV[5], ARGV[12]
local function history(event, detail)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'event', event, 'entry', ARGV[8],
             'slot', ARGV[9], 'node', worker, 'epoch', ARGV[10], 'detail', detail)
end
-- the run that holds the slot: state, token, worker (token '0': a record without one)
local function holder()
  local run = redis.call('GET', KEYS[1])
  if run then
    local state, held, by = string.match(run, '^(%a)|(%d+)|(.*)$')
    if state then return state, held, by end
    state, by = string.match(run, '^(%a)|(.*)$')
    return state, '0', by
  end
  local alive = redis.call('GET', KEYS[2])  -- the record expired while the run goes on
  if alive then
    local held, by = string.match(alive, '^(%d+)|(.*)$')
    if held then return 's', held, by end
    return 's', '0', alive
  end
  return nil
end

if mode == 'renew' or mode == 'finish' then
  local state, held, by = holder()
  if state and held ~= token then
    if mode == 'finish' then
      history('finished', ARGV[11] .. '; superseded: the slot ran again on ' .. by)
    end
    return {'superseded', by}
  end
  if mode == 'renew' then
    redis.call('SET', KEYS[2], token .. '|' .. worker, 'PX', lease)
    if state ~= 'f' then
      redis.call('SET', KEYS[1], 's|' .. token .. '|' .. worker, 'PX', record_ttl)
    end
    if redis.call('GET', KEYS[3]) == task then
      redis.call('PEXPIRE', KEYS[3], lease)
    end
    return {'ok'}
  end
  redis.call('SET', KEYS[1], 'f|' .. token .. '|' .. worker, 'PX', record_ttl)
  redis.call('DEL', KEYS[2])
  if redis.call('GET', KEYS[3]) == task then
    redis.call('DEL', KEYS[3])
  end
  history('finished', ARGV[11])
  return {'ok'}
end

local state, _, by = holder()
if state == 'f' then
  history('skipped', 'duplicate: already ran on ' .. by)
  return {'duplicate', 'finished on ' .. by}
end
if state and redis.call('EXISTS', KEYS[2]) == 1 then
  if ARGV[11] ~= 'wait' then
    history('skipped', 'duplicate: running on ' .. by)
  end
  return {'duplicate', 'running on ' .. by}
end
if ARGV[6] == 'skip' then
  local lock = redis.call('GET', KEYS[3])
  if lock and lock ~= task then
    history('skipped', 'overlap: ' .. lock .. ' still runs')
    return {'overlap', lock}
  end
  redis.call('SET', KEYS[3], task, 'PX', lease)
end
local now = redis.call('TIME')
local fence = redis.call('INCR', KEYS[5])
local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
if fence < floor then
  fence = floor
end
local new = string.format('%d', fence)
redis.call('SET', KEYS[5], new)
redis.call('SET', KEYS[1], 's|' .. new .. '|' .. worker, 'PX', record_ttl)
redis.call('SET', KEYS[2], new .. '|' .. worker, 'PX', lease)
local retry = tonumber(ARGV[13] or '0') or 0
local detail = ''
if retry > 0 then
  detail = 'retry ' .. retry
end
if state then
  if detail ~= '' then detail = detail .. '; ' end
  history('started', detail .. 'rerun: the first run was lost with its worker')
  return {'run', 'rerun', new}
end
history('started', detail)
return {'run', '', new}
