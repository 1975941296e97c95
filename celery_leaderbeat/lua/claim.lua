-- claim.lua: the one gate every slot passes before it is sent, and its record.
-- KEYS[1] leader key      KEYS[2] slots hash      KEYS[3] history stream
-- KEYS[4] overtaken hash: "<entry>|<slot_ms>" -> the value a newer claim replaced while it
--         was still claimed and unconfirmed ('c' or 'u') by another claimant
-- KEYS[5] paused hash: entry -> note (``celery leaderbeat pause``)
-- KEYS[6] sending string: Redis TIME (ms) of the leader's last 'lead-more' call, PX lease
--         ttl; a rescue waits until rescue_after has passed since then too, so standbys
--         do not rescue slots of a healthy leader still working through a long batch
-- ARGV[1] mode: 'lead', 'rescue' or 'record'; 'lead-more' is 'lead' with more chunks of
--         this batch still to claim (it sets KEYS[6])
-- ARGV[2] lead: this leader's token (node_id|epoch); rescue/record: ''
-- ARGV[3] lead: lease ttl (ms); rescue: rescue_after (ms); record: ''
-- ARGV[4] epoch written with claims (lead: the leader's; rescue: 0, no lease)
-- ARGV[5] history max length      ARGV[6] node id      ARGV[7] n, the number of events
-- ARGV[8 .. 7+4n]   events, groups of four: entry, slot (ms), event, detail
--   'sent'    the broker accepted the slot: state -> 's' while the stored slot is this one
--   'unsent'  claimed, not sent: state 'c' -> 'u', so the next leader reports it once
--   others ('missed', 'skipped', 'error', ...) go to the history only
-- ARGV[8+4n ..]     claims, groups of four: entry, slot (ms), op, fire time (ms)
--   op 'claim'   claim the slot to send it        (state 'c', claimed)
--   op 'skip'    advance past a slot not sent     (state 'k', skipped by policy)
--   op 'anchor'  the entry's first slot, only if it has no state yet (state 'a')
-- Claim and enqueue in one step (optional: only when KEYS has more than six keys):
-- KEYS[7 ..]        the broker's keys (queue lists) the commands below write
-- ARGV[#ARGV]       L, the length of the enqueue section, which ends just before it and
--                   follows the claims; for each claim in order: c, its number of broker
--                   commands, then c groups of three: 'lpush' or 'pexpire', an index into
--                   KEYS (7 or more), the argument (the message payload, or ms)
--   A granted 'claim' that has commands runs them here, in this atomic step, and is
--   stored sent ('s'), never claimed: a slot is granted and enqueued, or neither. A
--   retry that finds exactly that sent value answers 1 again and runs nothing twice.
-- A 'claim' of a paused entry's slot advances past it instead (state 'k') and
-- answers 2: the slot is skipped, and resuming does not replay it.
-- Events are written first and unfenced: they say what already happened (the
-- previous chunk's sends ride on the next chunk's claim). Claims are then
-- granted only when the slot is newer than the stored one, so no slot can be
-- granted twice; in 'lead' mode only while the leader key holds the token; in
-- 'rescue' mode (a standby, no lease) only 'claim', only for an entry that has
-- state (its phase is known), and only once Redis TIME >= fire time + rescue_after,
-- so a standby with a fast clock cannot pre-empt a healthy leader.
-- A value is "<slot_ms>|<epoch>|<state>", plus "|<node>" for a standby's claim.
-- A grant that replaces another claimant's claimed, unconfirmed slot keeps that slot in
-- KEYS[4], so the next leader still reports it (and re-sends it with recover_unsent):
-- without this, a standby rescuing an entry's next slot made the older one vanish.
-- Asking again for the exact value this caller already wrote answers 1 again:
-- a client that lost the reply and retried must not take its grant for a refusal.
-- Returns {0, holder_token or false, marked}   lead mode, not the leader: no claim granted
--         {1, redis_now_ms, marked, r1, r2, ...}  one result per claim: 1 granted,
--           2 paused (skipped), 0 not late enough (rescue), 3 not late enough after the
--           leader's last claim mid-batch (rescue), false no state (rescue),
--           else the stored value
local mode, node, epoch = ARGV[1], ARGV[6], ARGV[4]
local more = mode == 'lead-more'
if more then
  mode = 'lead'
end
local n = tonumber(ARGV[7])
local claims_at = 8 + 4 * n
local claims_end = #ARGV
local enq = nil  -- where the current claim's enqueue commands start, if any
if #KEYS > 6 then
  claims_end = #ARGV - 1 - tonumber(ARGV[#ARGV])
  enq = claims_end + 1
  local j = enq
  while j < #ARGV do  -- checked before anything is written: a script is not rolled back
    for k = j + 1, j + 3 * tonumber(ARGV[j]), 3 do
      if ARGV[k] ~= 'lpush' and ARGV[k] ~= 'pexpire' then
        return redis.error_reply('claim.lua: broker command ' .. ARGV[k] .. ' is not supported')
      end
    end
    j = j + 1 + 3 * tonumber(ARGV[j])
  end
end
local marked = 0
for i = 8, claims_at - 1, 4 do
  local name, slot, event, detail = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if event == 'sent' or event == 'unsent' then
    local stored = redis.call('HGET', KEYS[2], name)
    if stored and string.match(stored, '^(%d+)|') == slot then
      local rest, state, who = string.match(stored, '^(%d+|%d+|)(%a)(.*)$')
      if event == 'sent' then
        redis.call('HSET', KEYS[2], name, rest .. 's' .. who)
        marked = marked + 1
      elseif state == 'c' then
        redis.call('HSET', KEYS[2], name, rest .. 'u' .. who)
      end
    end
  end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'event', event,
             'entry', name, 'slot', slot, 'node', node, 'epoch', epoch, 'detail', detail)
end
if mode == 'lead' then
  local current = redis.call('GET', KEYS[1])
  if current ~= ARGV[2] then
    return {0, current, marked}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
elseif mode ~= 'rescue' then
  if claims_end >= claims_at then
    return redis.error_reply('claim.lua: mode ' .. mode .. ' takes no claims')
  end
end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local sending = 0
if more then
  redis.call('SET', KEYS[6], now_ms, 'PX', ARGV[3])
elseif mode == 'rescue' then
  sending = tonumber(redis.call('GET', KEYS[6]) or '0')
end
local states = {claim = 'c', skip = 'k', anchor = 'a'}
local suffix = ''
if mode == 'rescue' then
  suffix = '|' .. node
end
local out = {1, now_ms, marked}
for i = claims_at, claims_end, 4 do
  local name, slot, op, fire = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
  local stored = redis.call('HGET', KEYS[2], name)
  local cmds, ncmds = 0, 0
  if enq then
    ncmds = tonumber(ARGV[enq])
    cmds = enq + 1
    enq = cmds + 3 * ncmds
  end
  local state = states[op]
  if op == 'claim' and ncmds > 0 then
    state = 's'
  end
  local value = ARGV[i + 1] .. '|' .. epoch .. '|' .. state .. suffix
  local granted
  if mode == 'rescue' and (op ~= 'claim' or not stored) then
    granted = nil
  elseif op == 'anchor' then
    granted = not stored
  else
    granted = (not stored) or slot > tonumber(string.match(stored, '^(%d+)'))
  end
  if granted and mode == 'rescue' and now_ms < fire + tonumber(ARGV[3]) then
    out[#out + 1] = 0
  elseif granted and mode == 'rescue' and now_ms < sending + tonumber(ARGV[3]) then
    out[#out + 1] = 3
  elseif granted and op == 'claim' and redis.call('HEXISTS', KEYS[5], name) == 1 then
    redis.call('HSET', KEYS[2], name, ARGV[i + 1] .. '|' .. epoch .. '|k' .. suffix)
    out[#out + 1] = 2
  elseif granted then
    if stored then
      local s_slot, s_epoch, s_state, s_node = string.match(stored, '^(%d+)|(%d+)|(%a)|?(.*)$')
      if (s_state == 'c' or s_state == 'u')
          and not (s_epoch == epoch and s_node == string.sub(suffix, 2)) then
        redis.call('HSET', KEYS[4], name .. '|' .. s_slot, stored)
      end
    end
    redis.call('HSET', KEYS[2], name, value)
    for j = cmds, cmds + 3 * ncmds - 1, 3 do
      local cmd, key = ARGV[j], KEYS[tonumber(ARGV[j + 1])]
      if cmd == 'lpush' then
        redis.call('LPUSH', key, ARGV[j + 2])
      else
        redis.call('PEXPIRE', key, ARGV[j + 2])
      end
    end
    out[#out + 1] = 1
  elseif stored == value then
    out[#out + 1] = 1
  else
    out[#out + 1] = stored or false
  end
end
return out
