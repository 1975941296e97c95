-- guard_prelude.lua: what the scripts of one run share (start, renew, finish, release); the
-- loader puts guard_lock.lua before it. KEYS, the same in each:
--  [1] the run's record ({p}:run:<run id>) "<state>|<token>|<worker>", PX record ttl
--  [2] its liveness ({p}:alive:<run id>) "<token>|<worker>", PX lease  [3] the entry's
--  overlap lock ({p}:overlap:<entry>): task id of the run going on, or of the waiting slot
--  handed the turn  [4] history stream  [5] run tokens ({p}:guard:fence): the last handed out
--  [6] waiting slots ({p}:waiting:<entry>) sorted set: task id by slot ms  [7] their messages
--  ({p}:waiting-msg:<entry>)  [8] entries with waiting slots  [9] the lock holder's slot
--  ({p}:overlap-held:<entry>) '<slot ms>|<worker>'  [10] decision counters: entry|policy|
--  decision -> n. KEYS[6..10] may be absent: then only 'allow_all' and 'skip' are kept.
-- ARGV, named below: a run is one delivery that does the work, the slot's first run or its
-- k-th retry (a run id of its own). The token fences the runs of one slot: renew and finish
-- act only for the run whose token the record holds.
local task, worker, record_ttl, lease, policy, history_max = ARGV[1], ARGV[2], ARGV[3],
  ARGV[4], ARGV[5], ARGV[6]                      -- policy: an overlap policy, 'allow' allow_all
local entry, slot, epoch = ARGV[7], ARGV[8], ARGV[9]
local detail = ARGV[10]  -- finish, release: the outcome; start: 'wait' or ''
local token, retry, message = ARGV[11], tonumber(ARGV[12] or '0') or 0, ARGV[13]
local handed_over, slot_text = ARGV[14] == '1', ARGV[15]  -- slot_text: ISO 8601, for people
if policy == 'allow' then policy = 'allow_all' end
local queues = KEYS[6] ~= nil  -- the caller passes the keys of waiting slots

local function history(event, what, event_slot)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', history_max, '*', 'event', event, 'entry', entry,
             'slot', event_slot or slot, 'node', worker, 'epoch', epoch, 'detail', what)
end

local function count(decision)
  if KEYS[10] then
    redis.call('HINCRBY', KEYS[10], entry .. '|' .. policy .. '|' .. decision, 1)
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
