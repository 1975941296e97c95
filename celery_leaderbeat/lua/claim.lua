-- claim.lua: the fenced gate every slot passes before it is sent.
-- KEYS[1] leader key      KEYS[2] slots hash
-- ARGV[1] token (node_id|epoch)   ARGV[2] lease ttl (ms)   ARGV[3] epoch
-- ARGV[4..] groups of three: entry name, slot (ms since the epoch), op
--   op 'c'  claim the slot to send it         (state becomes 'c', claimed)
--   op 'k'  advance past a slot not sent      (state 'k', skipped by policy)
--   op 'a'  record the entry's anchor if it has no state yet (state 'a')
-- Slot state is stored as "<slot_ms>|<epoch>|<state>". A claim or skip is
-- granted only when the slot is newer than the stored one: claims are
-- monotonic per entry, so no slot can be granted twice. Asking again for the
-- exact state this epoch already wrote answers 1 again (idempotent): a client
-- that lost the reply and retried must not mistake its own grant for a refusal.
-- Returns {0, holder_token or false}   not the leader: nothing granted
--         {1, r1, r2, ...}             one result per group: 1 granted,
--                                      else the stored state that refused it
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {0, current}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local out = {1}
for i = 4, #ARGV, 3 do
  local name, slot, op = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local stored = redis.call('HGET', KEYS[2], name)
  local granted
  if op == 'a' then
    granted = not stored
  else
    granted = (not stored) or slot > tonumber(string.match(stored, '^(%d+)'))
  end
  local value = ARGV[i + 1] .. '|' .. ARGV[3] .. '|' .. op
  if granted then
    redis.call('HSET', KEYS[2], name, value)
    out[#out + 1] = 1
  elseif stored == value then
    out[#out + 1] = 1
  else
    out[#out + 1] = stored
  end
end
return out
