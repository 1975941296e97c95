-- prelude.lua: what every slot script shares (lead, rescue, record, backfill, define, check),
-- after the code tables (CODE, REASON, STATUS, from store/types.py); prelude_*.lua follow it
-- for the scripts that use them (store/scripts.py says which). KEYS, the same in each:
--  [1] leader key  [2] slots hash: entry -> "<slot_ms>|<epoch>|<state>[|<node>|<claimed ms>]"
--  [3] history stream  [4] overtaken hash: "<entry>|<slot_ms>" -> a value a newer claim
--  replaced while it was unconfirmed  [5] paused hash  [6] definitions hash: entry ->
--  fingerprint, and "|epoch": the epoch that last marked them  [7] progress: the store's
--  clock at the leader's latest claim  [8] generation counter: raised by every write, so a
--  node that saw a higher one knows Redis lost writes  [9] backfilled hash: "<entry>|<slot>"
--  -> request id; "|floor", "|lost_at" (a leader's reset), "|loss" (a reported loss)
--  [10] epoch counter (read only)
-- Replies: {1, now_ms, marked, generation, result per item...}; {0, holder, marked} a
-- fenced call whose token no longer leads; {2, generation[, 1]} Redis lost writes the
-- caller saw (or a node reported it): nothing written. An error names what a write would
-- fail on; it is checked before the first write, so nothing is written then.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- the stored value's parts: slot (number), epoch, state, node ('' for a leader), claimed at
local function parts(stored)
  local s_slot, s_epoch, s_state, s_rest = string.match(stored, '^(%d+)|(%d+)|(%a)|?(.*)$')
  local s_node, s_at = string.match(s_rest, '^(.*)|(%d+)$')
  if not s_node then
    s_node, s_at = s_rest, nil
  end
  return tonumber(s_slot), s_epoch, s_state, s_node, tonumber(s_at)
end

local function wrong_type(key, want)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= want then
    return key .. ' holds a ' .. kind .. ', not a ' .. want
  end
end

-- the keys' types and the values every script reads: nil when a write cannot fail on them
local KIND = {'string', 'hash', 'stream', 'hash', 'hash', 'hash', 'string', 'string', 'hash',
              'string'}
local function bad_keys()
  for k = 1, 10 do
    local wrong = wrong_type(KEYS[k], KIND[k])
    if wrong then return wrong end
  end
  local counter = redis.call('GET', KEYS[8])
  if counter and not string.match(counter, '^%d+$') then
    return KEYS[8] .. ' holds ' .. counter .. ', not a generation number'
  end
  local floor = redis.call('HGET', KEYS[9], '|floor')
  if floor and not tonumber(floor) then
    return KEYS[9] .. ' field |floor holds ' .. floor .. ', not a number'
  end
end

-- the stored slots of ``names``: nil when each is a slot state or absent
local function bad_values(names)
  if #names == 0 then return nil end
  local values = redis.call('HMGET', KEYS[2], unpack(names))
  for k = 1, #names do
    if values[k] and not string.find(values[k], '^%d+|%d+|%a') then
      return KEYS[2] .. ' field ' .. names[k] .. ' holds ' .. values[k] .. ', not a slot state'
    end
  end
end

local function refuse(script, wrong)
  return redis.error_reply(script .. '.lua: ' .. wrong .. ' (nothing was written)')
end

-- The generation: ``seen`` is the highest the caller saw ('' none); lower here means Redis
-- lost writes: the loss is marked for everyone and the call answers {2, generation}. A
-- reported loss answers {2, generation, 1} (unless ``loss_ok``) until a leader's reset:
-- ``reset`` lifts the counter above ``lift_above`` and the reported loss. Returns the reply
-- to answer at once, or nil and the generation.
local function check_generation(seen, reset, lift_above, loss_ok)
  local generation = tonumber(redis.call('GET', KEYS[8]) or '0')
  local loss = tonumber(redis.call('HGET', KEYS[9], '|loss') or '')
  if reset then
    generation = math.max(generation, tonumber(lift_above), loss or 0) + 1
    redis.call('SET', KEYS[8], generation)
    if loss then redis.call('HDEL', KEYS[9], '|loss') end
    return nil, generation
  elseif seen == 'reset' then
    -- a leader fenced meanwhile: events are written, the counter left for the next leader
    if generation < tonumber(lift_above) then return nil, generation end
  elseif seen ~= '' and generation < tonumber(seen) then
    -- a node that remembers nothing must not rescue, nor a new leader send, from here
    if tonumber(seen) > (loss or -1) then redis.call('HSET', KEYS[9], '|loss', seen) end
    return {2, generation}
  end
  if loss and not loss_ok then
    return {2, generation, 1}  -- reported by another node: a leader re-anchors first
  end
  return nil, redis.call('INCR', KEYS[8])
end

-- A leader's call: the holder's token when ``token`` no longer leads, else nil (the lease
-- is renewed for ``ttl`` ms). After a reset what was sent before it cannot be told: the
-- backfill floor moves to now plus ``ahead`` ms.
local function fence(token, ttl, reset, ahead)
  local current = redis.call('GET', KEYS[1])
  if current ~= token then return current or false end
  redis.call('PEXPIRE', KEYS[1], ttl)
  if reset then
    local now = now_ms()
    local old = tonumber(redis.call('HGET', KEYS[9], '|floor') or '0')
    redis.call('HSET', KEYS[9], '|floor', math.max(old, now + tonumber(ahead)), '|lost_at', now)
  end
  return nil
end

-- the leader writes what it plans: an entry's fingerprint (none for ''), and its epoch
local function define(name, fingerprint, epoch)
  if name ~= '' then redis.call('HSET', KEYS[6], name, fingerprint) end
  redis.call('HSET', KEYS[6], '|epoch', epoch)
end
