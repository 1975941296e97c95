-- prelude_claims.lua: how the claim scripts (lead, rescue) store what they grant; the
-- loader puts prelude.lua before it.

-- the entry's value after a grant; an unconfirmed claim it replaces, not its own, is kept
-- in KEYS[4] for the next leader to report
local function store_slot(name, slot_text, epoch, state, suffix, stored, own)
  if stored and not own then
    local s_slot, _, s_state = parts(stored)
    if (s_state == STATUS.CLAIMED or s_state == STATUS.UNSENT) and s_slot ~= tonumber(slot_text) then
      redis.call('HSET', KEYS[4], name .. '|' .. s_slot, stored)
    end
  end
  redis.call('HSET', KEYS[2], name, slot_text .. '|' .. epoch .. '|' .. state .. suffix)
end

-- a granted claim of a paused entry: its slot is stored skipped instead (true), else false
local function skip_paused(name, slot_text, epoch, suffix)
  if redis.call('HEXISTS', KEYS[5], name) == 0 then return false end
  redis.call('HSET', KEYS[2], name, slot_text .. '|' .. epoch .. '|' .. STATUS.SKIPPED .. suffix)
  return true
end

-- A leader's 'recover' at its store clock ``now``: granted while the slot is still
-- unconfirmed (stored, or overtaken in KEYS[4]), once a standby's claim is ``recover_age``
-- ms old. Returns why not, or nil to store it as a claim of ``epoch``.
local function recover(name, slot_text, stored, epoch, now, recover_age)
  local field = name .. '|' .. slot_text
  local over = redis.call('HGET', KEYS[4], field)
  local s_slot, _, s_state = nil, nil, nil
  if stored then s_slot, _, s_state = parts(stored) end
  local left = over or (s_slot == tonumber(slot_text)
                        and (s_state == STATUS.CLAIMED or s_state == STATUS.UNSENT) and stored)
  if not left then return stored or CODE.UNKNOWN end
  local _, o_epoch, _, o_node, o_at = parts(left)
  if o_epoch == epoch and o_node == '' then
    return CODE.GRANTED  -- this leader's own claim (a retry)
  elseif o_at and now < o_at + recover_age then
    return CODE.EARLY  -- a standby's claim, young enough that it may still publish it
  elseif over then
    redis.call('HDEL', KEYS[4], field)
    return CODE.GRANTED  -- the newer stored slot stays as it is
  end
  return nil
end
