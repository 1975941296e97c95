-- guard_lock.lua: the overlap lock's hand-over, shared by every guard script (the loader
-- puts it first). A waiting slot leaves the sorted set only when it starts, so a message
-- lost between a script and the broker is handed over again once the hand-over lapses.

-- hand the lock to the entry's first waiting slot for two leases; its message to publish,
-- or nil when none waits
local function promote(lock, waiting, messages, held, lease_ms)
  while true do
    local head = redis.call('ZRANGE', waiting, 0, 0)[1]
    if not head then return nil end
    local message = redis.call('HGET', messages, head)
    if message then
      redis.call('SET', lock, head, 'PX', 2 * tonumber(lease_ms))
      redis.call('DEL', held)
      return message
    end
    redis.call('ZREM', waiting, head)  -- its message expired with the key: nothing to send
  end
end
