-- guard_sweep.lua: every entry with waiting slots whose overlap lock lapsed (its run's
-- worker died, or a hand-over was never delivered) hands it to its first waiting slot.
-- The loader puts guard_lock.lua before it. KEYS[1] the set of entries with waiting slots.
-- Returns the messages to publish: {message, ...}
local lock_prefix, waiting_prefix, messages_prefix, held_prefix = ARGV[1], ARGV[2], ARGV[3],
  ARGV[4]                                        -- an entry's name follows each prefix
local lease = ARGV[5]                            -- ms

local out = {}
for _, entry in ipairs(redis.call('SRANDMEMBER', KEYS[1], 100)) do
  local lock, waiting = lock_prefix .. entry, waiting_prefix .. entry
  if redis.call('ZCARD', waiting) == 0 then
    redis.call('SREM', KEYS[1], entry)
  elseif redis.call('EXISTS', lock) == 0 then
    local message = promote(lock, waiting, messages_prefix .. entry, held_prefix .. entry, lease)
    if message then table.insert(out, message) end
  end
end
return out
