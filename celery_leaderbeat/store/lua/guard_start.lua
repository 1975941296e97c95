-- guard_start.lua: a worker asks to start one run. A run that finished, or still runs (its
-- liveness lives, even once its record expired), is a duplicate; one recorded started whose
-- liveness lapsed was taken for dead with its worker and may run again. ``detail`` 'wait':
-- the caller will ask again, so a "running" answer is not recorded yet. Overlap (first
-- runs only; a retry continues its slot's run): the entry is busy when its lock is held by
-- another task or other slots wait; docs/architecture.md tells each policy. Only the lock's
-- holder starts; a waiting slot starts when the lock is handed to it. A start gets a token
-- above every one handed out before (the counter, lifted to Redis TIME in microseconds so
-- it keeps rising after Redis lost its data) and, with a policy, holds the entry's lock.
-- Returns {'run', '' | 'rerun', token} | {'duplicate', why} | {'overlap', holder}
--         | {'wait', holder} | {'cancel', holder}: the caller revokes that holder

local state, _, by = holder()
if state == 'f' then
  history('skipped', 'duplicate: already ran on ' .. by)
  return {'duplicate', 'finished on ' .. by}
end
if state and redis.call('EXISTS', KEYS[2]) == 1 then
  local will_ask_again = detail == 'wait'
  if not will_ask_again then history('skipped', 'duplicate: running on ' .. by) end
  return {'duplicate', 'running on ' .. by}
end

-- this slot waits for the entry's run (recorded once, however often it is delivered)
local function wait_here(lock)
  local added = redis.call('ZADD', KEYS[6], 'NX', slot, task)
  redis.call('HSET', KEYS[7], task, message)
  redis.call('PEXPIRE', KEYS[6], record_ttl)
  redis.call('PEXPIRE', KEYS[7], record_ttl)
  redis.call('SADD', KEYS[8], entry)
  if added == 1 then
    history('buffered', 'waits for ' .. (lock or 'the slots before it'))
    count('buffered')
  end
  return {'wait', lock or ''}
end

local function skipped(why, holder_task)
  history('skipped', 'overlap: ' .. why)
  count('skipped')
  return {'overlap', holder_task or ''}
end

-- cancel_other with no slot waiting: this slot waits and the lock's holder is cancelled,
-- unless this slot is older than the holder's (it was delivered late)
local function replace(lock)
  local held = redis.call('GET', KEYS[9]) or ''
  local held_slot = string.match(held, '^(%d+)|') or '0'
  if tonumber(held_slot) > tonumber(slot) then
    return skipped('older than the running slot (' .. lock .. ')', lock)
  end
  local reply = wait_here(lock)
  history('cancelled', 'replaced by slot ' .. slot_text, held_slot)
  count('cancelled')
  redis.call('SET', KEYS[9], held .. '|cancelled', 'KEEPTTL')
  reply[1] = 'cancel'
  return reply
end

-- nil: this slot may start; else the reply that says why not
local function overlap_check()
  local lock = redis.call('GET', KEYS[3])
  if lock == task then return nil end  -- handed the lock: its turn came
  if not queues then
    if policy == 'skip' and lock then return skipped(lock .. ' still runs', lock) end
    return nil
  end
  if redis.call('ZSCORE', KEYS[6], task) then  -- waits already: a message delivered again
    if not lock and redis.call('ZRANGE', KEYS[6], 0, 0)[1] == task then return nil end
    return {'wait', lock or ''}
  end
  if handed_over then return skipped('no longer waits', lock) end
  local first = redis.call('ZRANGE', KEYS[6], 0, 0)[1]
  if not lock and not first then return nil end
  if policy == 'skip' then
    return skipped((lock or first) .. ' still runs', lock or first)
  elseif policy == 'buffer_all' then
    return wait_here(lock)
  elseif first then  -- buffer_one, cancel_other: one slot waits already and is kept
    return skipped(first .. ' waits already', lock or first)
  elseif policy == 'cancel_other' and lock then
    return replace(lock)
  end
  return wait_here(lock)
end

local waited = false
if policy ~= 'allow_all' and retry == 0 then
  local refused = overlap_check()
  if refused then return refused end
  redis.call('SET', KEYS[3], task, 'PX', lease)
  if queues then
    redis.call('SET', KEYS[9], slot .. '|' .. worker, 'PX', lease)
    waited = redis.call('ZREM', KEYS[6], task) == 1
    redis.call('HDEL', KEYS[7], task)
    if redis.call('ZCARD', KEYS[6]) == 0 then redis.call('SREM', KEYS[8], entry) end
    count(waited and 'started_after_wait' or 'started')
  end
end

local now = redis.call('TIME')
local new = math.max(redis.call('INCR', KEYS[5]), tonumber(now[1]) * 1000000 + tonumber(now[2]))
new = string.format('%d', new)
redis.call('SET', KEYS[5], new)
redis.call('SET', KEYS[1], 's|' .. new .. '|' .. worker, 'PX', record_ttl)
redis.call('SET', KEYS[2], new .. '|' .. worker, 'PX', lease)
local said = retry > 0 and ('retry ' .. retry) or (waited and 'after wait' or '')
if state then
  if said ~= '' then said = said .. '; ' end
  history('started', said .. 'rerun: the first run was lost with its worker')
  return {'run', 'rerun', new}
end
history('started', said)
return {'run', '', new}
