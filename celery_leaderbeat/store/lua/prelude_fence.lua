-- prelude_fence.lua: a leader's call that writes nothing before its fence (backfill,
-- define, check). lead.lua writes its events between the two, so it spells them out.

-- The generation checked (reset when this leader lifts it), then the lease renewed and
-- checked: the reply to give instead (an older generation, another holder), else nil and
-- the generation.
local function fenced(token, ttl, seen, lift_above, ahead)
  local reset = seen == 'reset' and redis.call('GET', KEYS[1]) == token
  local answer, generation = check_generation(seen, reset, lift_above, false)
  if answer then return answer end
  local holder = fence(token, ttl, reset, ahead)
  if holder ~= nil then return {0, holder, 0} end
  return nil, generation
end
