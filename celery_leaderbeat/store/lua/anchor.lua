-- anchor.lua: the leader sets where entries stand before it plans them (KEYS and replies:
-- prelude.lua), fenced like lead.lua: 'anchor' an entry's first slot, only while it has no
-- state; 'reanchor' its definition changed: start again from this slot (never backwards),
-- only while the stored fingerprint differs (else the stored value, or UNKNOWN); 'restore'
-- this node sent the slot and Redis lost that: sent; 'rolled_back' Redis went back to older
-- state: start again past the slot, skipped; 'define' store the entry's fingerprint and
-- mark the definitions with this epoch. Per item: a CODE, or the stored value refusing it.
-- ARGV: token, ttl (ms), epoch, history max length, node id, ahead (ms, for the backfill
-- floor after a reset), the highest generation seen ('' none, or 'reset'), with 'reset'
-- the generation to lift above, n events, events (4 each, prelude.lua), items (4 each:
-- entry, slot, op, fingerprint).
local token, ttl, epoch, history_max = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local node, ahead, seen, lift_above, n = ARGV[5], ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
local items_at = 10 + 4 * n
local STATE = {anchor = STATUS.ANCHOR, reanchor = STATUS.ANCHOR, restore = STATUS.SENT,
               rolled_back = STATUS.SKIPPED, define = false}

local function problem()
  local names = {}
  for i = 10, items_at - 1, 4 do names[#names + 1] = ARGV[i] end
  for i = items_at, #ARGV, 4 do
    if STATE[ARGV[i + 2]] == nil then return 'op ' .. ARGV[i + 2] .. ' is not an anchor' end
    names[#names + 1] = ARGV[i]
  end
  return bad_keys() or bad_values(names)
end
local wrong = problem()
if wrong then return refuse('anchor', wrong) end

local reset = seen == 'reset' and redis.call('GET', KEYS[1]) == token
local answer, generation = check_generation(seen, reset, lift_above, false)
if answer then return answer end
local marked = write_events(10, n, epoch, node, history_max)
local holder = fence(token, ttl, reset, ahead)
if holder ~= nil then return {0, holder, marked} end

-- why an item is not granted as asked, or nil; and the slot to store when granted
local function judge(op, name, slot, fp, stored)
  if not stored then
    if op == 'reanchor' and redis.call('HGET', KEYS[6], name) == fp then return CODE.UNKNOWN end
    return nil
  end
  local s_slot, s_epoch, s_state, s_node = parts(stored)
  if op == 'anchor' then
    return stored
  elseif op == 'reanchor' then
    if redis.call('HGET', KEYS[6], name) == fp then return stored end
    if s_slot > slot then return nil, tostring(s_slot) end
    return nil
  elseif s_slot == slot and s_epoch == epoch and s_node == '' and s_state == STATE[op] then
    return CODE.GRANTED  -- a retry of this leader's own call
  elseif slot <= s_slot then
    return stored
  end
  return nil
end

local out = {1, now_ms(), marked, generation}
for i = items_at, #ARGV, 4 do
  local name, slot_text, op, fp = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local stored = redis.call('HGET', KEYS[2], name)
  local result, moved = nil, nil
  if op == 'define' then
    define(name, fp, epoch)
    result = CODE.GRANTED
  else
    result, moved = judge(op, name, tonumber(slot_text), fp, stored)
  end
  if result == nil then
    local _, s_epoch, s_node
    if stored then _, s_epoch, _, s_node = parts(stored) end
    store_slot(name, moved or slot_text, epoch, STATE[op], '', stored,
               s_epoch == epoch and s_node == '')
    if fp ~= '' then redis.call('HSET', KEYS[6], name, fp) end
    result = CODE.GRANTED
  end
  out[#out + 1] = result
end
return out
