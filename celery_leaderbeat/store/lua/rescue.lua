-- rescue.lua: a standby claims slots nobody claimed in time (KEYS and replies: prelude.lua).
-- No lease: the claim is the only gate. Only 'claim' and 'skip' (slots its catch-up policy
-- passes over), only for an entry with state (else UNKNOWN: its phase is not known), once
-- the newest leader marked its definitions (else EARLY), for the leader's definition (else
-- DIFFERS), from the stored slot (the rescuer's previous slot; else the stored value), and
-- once the store's clock is past fire time + rescue_after and the lease holder has not
-- claimed within the busy window (else EARLY): a standby with a fast clock cannot pre-empt
-- a healthy leader. Written with epoch 0 and "|<node>|<claimed at ms>".
-- ARGV: rescue_after (ms), history max length, node id, busy window (ms), the highest
-- generation seen ('' none), n events, events (4 each, prelude_events.lua), items (6 each:
-- entry, slot, op, fire time, previous slot or '', fingerprint or '').
local rescue_after, history_max, node = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local busy_window, seen, n = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local items_at = 7 + 4 * n
local STATE = {claim = STATUS.CLAIMED, skip = STATUS.SKIPPED}

local function problem()
  local wrong = bad_keys()
  if wrong then return wrong end
  local names = {}
  for i = 7, items_at - 1, 4 do names[#names + 1] = ARGV[i] end
  for i = items_at, #ARGV, 6 do
    if not STATE[ARGV[i + 2]] then return 'op ' .. ARGV[i + 2] .. ' is not a rescue' end
    names[#names + 1] = ARGV[i]
  end
  return bad_values(names)
end
local wrong = problem()
if wrong then return refuse('rescue', wrong) end

local answer, generation = check_generation(seen, false, '', false)
if answer then return answer end
local marked = write_events(7, n, '0', node, history_max)
local now = now_ms()
local mark = redis.call('HGET', KEYS[6], '|epoch')
local definitions_behind = mark and mark ~= (redis.call('GET', KEYS[10]) or mark)
local progress = tonumber(redis.call('GET', KEYS[7]) or '')
local leader_busy = progress ~= nil and now - progress < busy_window
                    and redis.call('EXISTS', KEYS[1]) == 1
local suffix = '|' .. node .. '|' .. now

local function judge(name, slot, op, fire, prev, fp, stored)
  if not stored then return CODE.UNKNOWN end
  local s_slot, s_epoch, s_state, s_node = parts(stored)
  local def = fp ~= '' and redis.call('HGET', KEYS[6], name)
  if definitions_behind then
    return CODE.EARLY
  elseif def and def ~= fp then
    return CODE.DIFFERS
  elseif s_slot == slot and s_epoch == '0' and s_state == STATE[op] and s_node == node then
    return CODE.GRANTED  -- a retry of this rescuer's own claim
  elseif slot <= s_slot or (prev ~= '' and tonumber(prev) ~= s_slot) then
    return stored
  elseif now < fire + rescue_after or leader_busy then
    return CODE.EARLY
  end
  return nil
end

local out = {1, now, marked, generation}
for i = items_at, #ARGV, 6 do
  local name, slot_text, op = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local stored = redis.call('HGET', KEYS[2], name)
  local result = judge(name, tonumber(slot_text), op, tonumber(ARGV[i + 3]), ARGV[i + 4],
                       ARGV[i + 5], stored)
  if result ~= nil then
    -- refused, as judged
  elseif op == 'claim' and skip_paused(name, slot_text, '0', suffix) then
    result = CODE.PAUSED
  else
    local _, s_epoch, _, s_node = parts(stored)
    store_slot(name, slot_text, '0', STATE[op], suffix, stored, s_epoch == '0' and s_node == node)
    result = CODE.GRANTED
  end
  out[#out + 1] = result
end
return out
