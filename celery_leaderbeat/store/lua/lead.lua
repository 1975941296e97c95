-- lead.lua: the leader's claim of slots (KEYS and replies: prelude.lua). Fenced: nothing is
-- granted unless KEYS[1] holds ``token``; a slot only when newer than the stored one.
-- ARGV, named below: token, ttl (ms), epoch, history max length, node id, ahead (ms a slot's
-- fire time may lie ahead of the store's clock), recover age (ms a standby's claim must be
-- old before 'recover' takes it), the highest generation seen ('' none; 'reset': lift the
-- counter above the next ARGV and go on), that generation or '', n events, events (4 each,
-- prelude_events.lua), items (5 each: entry, slot, op, fire time, fingerprint), then the
-- optional enqueue section (prelude_enqueue.lua). A granted 'claim' with commands runs them
-- in this same step and is stored sent; a queue that is not a list leaves its claims
-- granted without them (UNQUEUED). A paused entry's 'claim' is skipped (PAUSED). A
-- leader's own slot asked again: stored sent answers ENQUEUED, still claimed is granted
-- again. Per item: a CODE, or the stored value that refused it.
local token, ttl, epoch, history_max = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local node, ahead, recover_age = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local seen, lift_above, n = ARGV[8], ARGV[9], tonumber(ARGV[10])
local items_at, items_end = 11 + 4 * n, enqueue_section()
local STATE = {claim = STATUS.CLAIMED, skip = STATUS.SKIPPED, rolled_back = STATUS.SKIPPED,
               anchor = STATUS.ANCHOR, reanchor = STATUS.ANCHOR, restore = STATUS.SENT,
               recover = STATUS.CLAIMED}

local function problem()
  local wrong = bad_keys() or bad_commands()
  if wrong then return wrong end
  local names = {}
  for i = 11, items_at - 1, 4 do names[#names + 1] = ARGV[i] end
  for i = items_at, items_end, 5 do
    names[#names + 1] = ARGV[i]
    local field = ARGV[i] .. '|' .. ARGV[i + 1]
    local over = ARGV[i + 2] == 'recover' and redis.call('HGET', KEYS[4], field)
    if over and not string.find(over, '^%d+|%d+|%a') then
      return KEYS[4] .. ' field ' .. field .. ' holds ' .. over .. ', not a slot state'
    end
  end
  return bad_values(names)
end
local wrong = problem()
if wrong then return refuse('lead', wrong) end

local reset = seen == 'reset' and redis.call('GET', KEYS[1]) == token
local answer, generation = check_generation(seen, reset, lift_above, false)
if answer then return answer end
local marked = write_events(11, n, epoch, node, history_max)
local holder = fence(token, ttl, reset, ahead)
if holder ~= nil then return {0, holder, marked} end
local now = now_ms()

-- why an item is not granted as asked, or nil; and the slot to store when granted
local function judge(op, name, slot, slot_text, fire, fp, stored)
  local s_slot, s_epoch, s_state, s_node
  if stored then s_slot, s_epoch, s_state, s_node = parts(stored) end
  if op == 'claim' and fire > now + ahead then
    return CODE.EARLY
  elseif op == 'anchor' then
    return stored or nil
  elseif op == 'reanchor' then
    if redis.call('HGET', KEYS[6], name) == fp then return stored or CODE.UNKNOWN end
    if stored and s_slot > slot then return nil, tostring(s_slot) end
    return nil
  elseif op == 'recover' then
    return recover(name, slot_text, stored, epoch, now, recover_age)
  elseif not stored then
    return nil
  end
  local own = s_slot == slot and s_epoch == epoch and s_node == ''
  if own and op == 'claim' and s_state == STATUS.SENT then
    return CODE.ENQUEUED  -- enqueued by an earlier attempt (or recorded sent)
  elseif own and op == 'claim' and s_state == STATUS.CLAIMED then
    return nil  -- asked again, not sent yet: granted again (commands it carries run now)
  elseif own and s_state == STATE[op] then
    return CODE.GRANTED  -- a retry of this leader's own claim
  elseif slot <= s_slot then
    return stored
  end
  return nil
end

local out = {1, now, marked, generation}
local progressed = false
for i = items_at, items_end, 5 do
  local name, slot_text, op, fire, fp = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]),
                                        ARGV[i + 4]
  local slot = tonumber(slot_text)
  local spec, cmds, ncmds, unqueued = take_commands()
  if op == 'claim' and not progressed then
    redis.call('SET', KEYS[7], now, 'PX', ttl)
    progressed = true
  end
  local stored = redis.call('HGET', KEYS[2], name)
  local result, moved = nil, nil
  if op == 'define' then
    define(name, fp, epoch)
    result = CODE.GRANTED
  else
    result, moved = judge(op, name, slot, slot_text, fire, fp, stored)
  end
  if result == nil then
    if op == 'claim' and skip_paused(name, slot_text, epoch, '') then
      result = CODE.PAUSED
    else
      local _, s_epoch, s_node
      if stored then _, s_epoch, _, s_node = parts(stored) end
      local state = (op == 'claim' and ncmds > 0) and STATUS.SENT or STATE[op]
      store_slot(name, moved or slot_text, epoch, state, '', stored,
                 op == 'recover' or (s_epoch == epoch and s_node == ''))
      run_commands(spec, cmds)
      if ncmds > 0 then  -- enqueued: its 'sent' event is written here, not by the caller
        add_event(name, slot_text, 'sent', '', node, epoch, history_max)
      end
      result = unqueued and CODE.UNQUEUED or CODE.GRANTED
    end
    if fp ~= '' then redis.call('HSET', KEYS[6], name, fp) end
  end
  out[#out + 1] = result
end
return out
