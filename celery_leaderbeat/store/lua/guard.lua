-- guard.lua: a worker starts, keeps alive or finishes one run of one slot (the worker guard).
-- A run is one delivery that does the work: the slot's first run, or its k-th retry (a run
-- key of its own per retry, so a duplicated retry message is caught like any other).
-- KEYS[1] the run's record         ({p}:run:<run id>)    "<state>|<token>|<worker>", PX record ttl
-- KEYS[2] the run's liveness       ({p}:alive:<run id>)  "<token>|<worker>", PX lease, renewed
-- KEYS[3] the entry's overlap lock ({p}:overlap:<entry>) task id of the run going on, or of
--         the waiting slot published to run next; PX lease (every policy but allow_all)
-- KEYS[4] history stream
-- KEYS[5] fencing counter          ({p}:guard:fence)     the last run token handed out
-- KEYS[6] the entry's waiting slots ({p}:waiting:<entry>) sorted set: task id by slot ms
-- KEYS[7] their messages           ({p}:waiting-msg:<entry>) hash: task id -> message (JSON)
-- KEYS[8] entries with waiting slots ({p}:overlap-waiting) set
-- KEYS[9] the lock holder's slot   ({p}:overlap-held:<entry>) '<slot ms>|<worker>', PX lease
-- KEYS[10] decision counters       ({p}:overlap-decisions) hash: entry|policy|decision -> n
-- (KEYS[6..10] may be absent: then only 'allow_all' and 'skip' are kept)
-- ARGV[1] mode: 'start', 'renew', 'finish' or 'release'; 'sweep' (its own layout, below)
-- ARGV[2] task id    ARGV[3] worker (host:pid)    ARGV[4] record ttl (ms)    ARGV[5] lease (ms)
-- ARGV[6] overlap: skip, buffer_one, buffer_all, cancel_other, allow_all ('allow': allow_all)
-- ARGV[7] history max length    ARGV[8] entry    ARGV[9] slot (ms)    ARGV[10] epoch
-- ARGV[11] finish: the outcome recorded; start: 'wait' while the caller will ask again
--          (a "running" answer is then not recorded yet)
-- ARGV[12] renew, finish: the run's token (from its start)    ARGV[13] start: the retry number
-- ARGV[14] start: the message that starts this slot if it has to wait
-- ARGV[15] start: '1' for a waiting slot's message, published when its turn came
-- ARGV[16] the slot as people read it (ISO 8601), for the history's details
-- Overlap (start, first runs only; a retry continues its slot's run): a slot finds the
--   entry busy when the lock is held by another task or other slots wait. skip: recorded
--   skipped. buffer_all: it waits (recorded 'buffered'), in slot order. buffer_one: it waits
--   unless a slot already waits; then it is skipped (the first waiting one is kept).
--   cancel_other: as buffer_one, and the run holding the lock is to be cancelled: recorded
--   'cancelled' for that run's slot, answered {'cancel', its task id}: the caller revokes it.
--   Only the lock's holder may start; a waiting slot is started by whoever ends the run
--   (finish, release) or finds the lock lapsed (sweep): the lock is handed to the first
--   waiting slot for two leases and its message returned to be published. A waiting slot
--   leaves the sorted set only when it starts, so a message lost between this script and
--   the broker is published again by a sweep once the hand-over lapses (a second copy is a
--   duplicate the guard refuses).
-- release: the caller's worker terminated the run (Celery's revoke, terminate=True): its
--   record says finished, its liveness and the lock go, and the next waiting slot is handed
--   the lock. Its worker is the only one that knows the run stopped, so no token is asked.
-- sweep: KEYS[1] the set of entries with waiting slots; ARGV[2..5] the prefixes of the lock,
--   waiting, messages and held keys (an entry's name follows), ARGV[6] lease (ms): every
--   entry whose lock lapsed (its run's worker died, or a hand-over was never delivered)
--   hands it to its first waiting slot. Returns the messages to publish.
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
--                 | {'wait', holder} | {'cancel', holder}
--         renew:  {'ok'} | {'superseded', worker of the run that holds the slot}
--         finish: {'ok', message to publish or ''} | {'superseded', worker}
--         release: {'ok', message to publish or ''}    sweep: {message, ...}
local mode, task, worker = ARGV[1], ARGV[2], ARGV[3]
local record_ttl, lease, token = ARGV[4], ARGV[5], ARGV[12]

-- hand the lock to the entry's first waiting slot; its message, or nil when none waits
local function promote(lock, waiting, messages, held, lease_ms)
  while true do
    local head = redis.call('ZRANGE', waiting, 0, 0)[1]
    if not head then return nil end
    local message = redis.call('HGET', messages, head)
    if message then
      redis.call('SET', lock, head, 'PX', 2 * tonumber(lease_ms))
      redis.call('DEL', held)
      return message
    end
    redis.call('ZREM', waiting, head)  -- its message expired with the key: nothing to send
  end
end

if mode == 'sweep' then
  local out = {}
  for _, entry in ipairs(redis.call('SRANDMEMBER', KEYS[1], 100)) do
    local lock, waiting = ARGV[2] .. entry, ARGV[3] .. entry
    if redis.call('ZCARD', waiting) == 0 then
      redis.call('SREM', KEYS[1], entry)
    elseif redis.call('EXISTS', lock) == 0 then
      local message = promote(lock, waiting, ARGV[4] .. entry, ARGV[5] .. entry, ARGV[6])
      if message then table.insert(out, message) end
    end
  end
  return out
end
local function history(event, detail, slot)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'event', event, 'entry', ARGV[8],
             'slot', slot or ARGV[9], 'node', worker, 'epoch', ARGV[10], 'detail', detail)
end
local policy = ARGV[6]
if policy == 'allow' then policy = 'allow_all' end
local queues = KEYS[6] ~= nil  -- the caller passes the keys of waiting slots
local function count(decision)
  if KEYS[10] then
    redis.call('HINCRBY', KEYS[10], ARGV[8] .. '|' .. policy .. '|' .. decision, 1)
  end
end
-- the outcome of a run that ends, said 'cancelled' when a newer slot replaced it
local function cancelled_said(outcome)
  if not queues or redis.call('GET', KEYS[3]) ~= task then return outcome end
  local held = redis.call('GET', KEYS[9]) or ''
  if string.sub(held, -10) ~= '|cancelled' or string.sub(outcome, 1, 10) == 'cancelled:' then
    return outcome
  end
  return 'cancelled: replaced (' .. outcome .. ')'
end
-- the run holding the lock ended: free it and hand it on; the message to publish, or ''
local function hand_on()
  if redis.call('GET', KEYS[3]) ~= task then return '' end
  redis.call('DEL', KEYS[3])
  if not queues then return '' end
  redis.call('DEL', KEYS[9])
  return promote(KEYS[3], KEYS[6], KEYS[7], KEYS[9], lease) or ''
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
      if queues then redis.call('PEXPIRE', KEYS[9], lease) end
    end
    return {'ok'}
  end
  redis.call('SET', KEYS[1], 'f|' .. token .. '|' .. worker, 'PX', record_ttl)
  redis.call('DEL', KEYS[2])
  history('finished', cancelled_said(ARGV[11]))
  return {'ok', hand_on()}
end

if mode == 'release' then
  local state, held, by = holder()
  if redis.call('GET', KEYS[3]) ~= task or state ~= 's' then return {'ok', ''} end
  redis.call('SET', KEYS[1], 'f|' .. held .. '|' .. by, 'PX', record_ttl)
  redis.call('DEL', KEYS[2])
  history('finished', ARGV[11])
  return {'ok', hand_on()}
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
-- this slot waits for the entry's run (recorded once, however often it is delivered)
local function wait_here(lock)
  local added = redis.call('ZADD', KEYS[6], 'NX', ARGV[9], task)
  redis.call('HSET', KEYS[7], task, ARGV[14])
  redis.call('PEXPIRE', KEYS[6], record_ttl)
  redis.call('PEXPIRE', KEYS[7], record_ttl)
  redis.call('SADD', KEYS[8], ARGV[8])
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
  if ARGV[15] == '1' then return skipped('no longer waits', lock) end
  local first = redis.call('ZRANGE', KEYS[6], 0, 0)[1]
  if not lock and not first then return nil end
  if policy == 'skip' then
    return skipped((lock or first) .. ' still runs', lock or first)
  elseif policy == 'buffer_all' then
    return wait_here(lock)
  elseif first then  -- buffer_one, cancel_other: one slot waits already and is kept
    return skipped(first .. ' waits already', lock or first)
  end
  local held = redis.call('GET', KEYS[9]) or ''
  local slot = string.match(held, '^(%d+)|') or '0'
  if policy == 'cancel_other' and lock and tonumber(slot) > tonumber(ARGV[9]) then
    return skipped('older than the running slot (' .. lock .. ')', lock)  -- delivered late
  end
  local reply = wait_here(lock)
  if policy == 'cancel_other' and lock then  -- no slot waits: the lock's holder runs
    history('cancelled', 'replaced by slot ' .. ARGV[16], slot)
    count('cancelled')
    redis.call('SET', KEYS[9], held .. '|cancelled', 'KEEPTTL')
    reply[1] = 'cancel'
  end
  return reply
end

local waited = false
if policy ~= 'allow_all' and ARGV[13] == '0' then
  local refused = overlap_check()
  if refused then return refused end
  redis.call('SET', KEYS[3], task, 'PX', lease)
  if queues then
    redis.call('SET', KEYS[9], ARGV[9] .. '|' .. worker, 'PX', lease)
    waited = redis.call('ZREM', KEYS[6], task) == 1
    redis.call('HDEL', KEYS[7], task)
    if redis.call('ZCARD', KEYS[6]) == 0 then redis.call('SREM', KEYS[8], ARGV[8]) end
    count(waited and 'started_after_wait' or 'started')
  end
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
elseif waited then
  detail = 'after wait'
end
if state then
  if detail ~= '' then detail = detail .. '; ' end
  history('started', detail .. 'rerun: the first run was lost with its worker')
  return {'run', 'rerun', new}
end
history('started', detail)
return {'run', '', new}
