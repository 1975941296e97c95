-- backfill.lua: the leader asks to send slots of one entry the schedule passed unsent (the
-- CLI's backfill; KEYS and replies: prelude.lua). Fenced. A slot is granted only when, at
-- this moment, it is older than the stored slot (the schedule settled it), no 'sent' event
-- of it is in the history, which reaches back to it, it is not claimed and unconfirmed
-- (KEYS[4]), not backfilled before (KEYS[9]) and not older than the floor (KEYS[9]
-- "|floor"). A grant writes KEYS[9]; the stored slot stays. The same request asking again
-- (its reply was lost) is granted again. Per slot: CODE.GRANTED or a REASON.
-- ARGV: token, ttl (ms), epoch, ahead (ms a leader may send a slot before the store's clock
-- reaches it), the highest generation seen ('' none, or 'reset'), with 'reset' the
-- generation to lift above, the entry, the request id, the slots (ms).
local token, ttl, epoch, ahead, seen = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local lift_above, name, request = ARGV[6], ARGV[7], ARGV[8]
local slots_at = 9

local wrong = bad_keys() or bad_values({name})
if wrong then return refuse('backfill', wrong) end
local answer, generation = fenced(token, ttl, seen, lift_above, ahead)
if answer then return answer end

-- how far back the history is whole: after the newest event trimmed from it (Redis 7
-- says which), else from its oldest event on
local function history_whole_after()
  if redis.call('EXISTS', KEYS[3]) == 0 then return nil end
  local info = redis.call('XINFO', 'STREAM', KEYS[3])
  for k = 1, #info, 2 do
    if info[k] == 'max-deleted-entry-id' then
      return tonumber(string.match(info[k + 1], '^(%d+)'))
    end
  end
  local first = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1]
  return first and tonumber(string.match(first[1], '^(%d+)')) - 1
end

-- the entry's 'sent' slots in the history from the oldest slot asked for, less ``ahead``
local function sent_in_history()
  local oldest = math.huge
  for i = slots_at, #ARGV do oldest = math.min(oldest, tonumber(ARGV[i])) end
  local sent = {}
  for _, row in ipairs(redis.call('XRANGE', KEYS[3], math.max(0, oldest - ahead), '+')) do
    local f, event, entry, at = row[2], nil, nil, nil
    for k = 1, #f, 2 do
      if f[k] == 'event' then event = f[k + 1]
      elseif f[k] == 'entry' then entry = f[k + 1]
      elseif f[k] == 'slot' then at = f[k + 1] end
    end
    if event == 'sent' and entry == name and at then sent[at] = true end
  end
  return sent
end

local stored = redis.call('HGET', KEYS[2], name)
local s_slot = stored and parts(stored)
local floor = tonumber(redis.call('HGET', KEYS[9], '|floor') or '0')
local sent, whole_after = nil, nil
local function refusal(slot_text, slot)
  if not s_slot or slot >= s_slot then return REASON.LATER end
  local by = redis.call('HGET', KEYS[9], name .. '|' .. slot_text)
  if by == request then return nil end  -- this request's own grant, asked again
  if by then return REASON.BACKFILLED end
  if redis.call('HEXISTS', KEYS[4], name .. '|' .. slot_text) == 1 then
    return REASON.UNCONFIRMED
  end
  if slot < floor then return REASON.LOST end
  if not sent then sent, whole_after = sent_in_history(), history_whole_after() end
  if sent[slot_text] then return REASON.SENT end
  if not whole_after or whole_after >= slot - ahead then
    return REASON.HORIZON  -- a 'sent' event of the slot may have been trimmed
  end
  return nil
end

local out = {1, now_ms(), 0, generation}
for i = slots_at, #ARGV do
  local result = refusal(ARGV[i], tonumber(ARGV[i]))
  if result == nil then
    redis.call('HSET', KEYS[9], name .. '|' .. ARGV[i], request)
    result = CODE.GRANTED
  end
  out[#out + 1] = result
end
return out
