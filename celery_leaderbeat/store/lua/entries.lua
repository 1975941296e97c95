-- entries.lua: the entries defined at run time (the entry API, the CLI), versioned. KEYS:
--  [1] entries hash: name -> "<version>|<anchor_ms>|<fingerprint>|<timing>|<enabled>|<ran_ms>|
--  <kept>\n<json>" (kept: '1' when the anchor was given, an imported entry's last run elsewhere)
--  [2] meta hash: 'version' (bumped by every change), 'floor' (changes before it forgotten)
--  [3] changed zset: live name -> version of its last change  [4] removed zset: removed name
--  -> version of its removal (capped)  [5] slots hash (the slot scripts'): an enabled entry
--  saved with no slot state gets its first, "<anchor>|0|a", in the save's own step, so a
--  standby can rescue its first slot even when the leader died before reading the save
-- ARGV[1] the mode: 'save', 'delete', 'finish' or 'changes'; the rest, by mode, named below.
-- The anchor (the moment an entry's slots are counted from) is Redis TIME when the entry is
-- created, its timing changes, or it is enabled again, rounded up to the whole second
-- (entries saved one by one then share their slots' instants, as beat_schedule entries
-- anchored together at a leader's start do: one batch a second, not one per millisecond);
-- otherwise kept. A save whose fingerprint and enabled flag equal the stored ones changes
-- nothing (not even the anchor: an import run twice keeps the first run's phase).
local mode = ARGV[1]

local function head(value)
  local h, body = string.match(value, '^([^\n]*)\n(.*)$')
  local f = {}
  for part in string.gmatch(h .. '|', '([^|]*)|') do f[#f + 1] = part end
  return f, body
end

local function bump()
  return redis.call('HINCRBY', KEYS[2], 'version', 1)
end

local function cap_removed(cap)
  local extra = redis.call('ZCARD', KEYS[4]) - cap
  if extra > 0 then
    local gone = redis.call('ZRANGE', KEYS[4], extra - 1, extra - 1, 'WITHSCORES')
    redis.call('HSET', KEYS[2], 'floor', gone[2])
    redis.call('ZREMRANGEBYRANK', KEYS[4], 0, extra - 1)
  end
end

-- save: name, how ('upsert', 'create': refused if it exists, 'update': if it does not), the
-- whole definition's fingerprint, the timing's (what decides the slots), enabled '1'/'0',
-- the anchor (ms) to keep instead of now or '', the JSON, a one-off's slot less 1 ms or ''
-- (its first slot state: the earlier of that and the anchor). {1, version, anchor_ms}
-- saved, {0, version, anchor_ms} unchanged, {2} exists (create), {3} unknown (update).
if mode == 'save' then
  local name, how, fp, timing, enabled, keep = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
  local json, one_off = ARGV[8], ARGV[9] or ''
  local cur = redis.call('HGET', KEYS[1], name)
  local t = redis.call('TIME')
  local anchor = (tonumber(t[1]) + (tonumber(t[2]) > 0 and 1 or 0)) * 1000
  if cur then
    if how == 'create' then return {2} end
    local f = head(cur)
    if f[3] == fp and f[5] == enabled then
      return {0, tonumber(f[1]), tonumber(f[2])}
    end
    if f[4] == timing and (f[5] == '1' or enabled == '0') then anchor = tonumber(f[2]) end
  elseif how == 'update' then
    return {3}
  end
  if keep ~= '' then anchor = tonumber(keep) end
  local version = bump()
  local kept = ''
  if keep ~= '' then kept = '1' elseif cur then kept = head(cur)[7] or '' end
  redis.call('HSET', KEYS[1], name, table.concat({version, anchor, fp, timing, enabled, '', kept},
                                                 '|') .. '\n' .. json)
  redis.call('ZADD', KEYS[3], version, name)
  redis.call('ZREM', KEYS[4], name)
  if enabled == '1' and KEYS[5] then
    local first = anchor
    if one_off ~= '' then first = math.min(anchor, tonumber(one_off)) end
    redis.call('HSETNX', KEYS[5], name, string.format('%d|0|a', first))
  end
  return {1, version, anchor}
-- delete: name, the removed-zset cap. {1, version} removed, {3} unknown.
elseif mode == 'delete' then
  local name, cap = ARGV[2], tonumber(ARGV[3])
  if redis.call('HDEL', KEYS[1], name) == 0 then return {3} end
  local version = bump()
  redis.call('ZREM', KEYS[3], name)
  redis.call('ZADD', KEYS[4], version, name)
  cap_removed(cap)
  return {1, version}
-- finish (a one-off entry ran): name, fingerprint, slot (ms). {1, version} disabled, {0}
-- not this definition, or not enabled.
elseif mode == 'finish' then
  local name, fp, ran = ARGV[2], ARGV[3], ARGV[4]
  local cur = redis.call('HGET', KEYS[1], name)
  if not cur then return {0} end
  local f, body = head(cur)
  if f[3] ~= fp or f[5] ~= '1' then return {0} end
  local version = bump()
  redis.call('HSET', KEYS[1], name, table.concat({version, f[2], f[3], f[4], '0', ran,
                                                  f[7] or ''}, '|') .. '\n' .. body)
  redis.call('ZADD', KEYS[3], version, name)
  return {1, version}
-- changes: the version the caller has seen. {version, full, n, name1, value1, ...,
-- removed1, ...}; full = 1 when the caller is older than the floor: every entry is listed.
elseif mode == 'changes' then
  local seen = tonumber(ARGV[2])
  local version = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
  if version == seen then return {version, 0, 0} end
  local floor = tonumber(redis.call('HGET', KEYS[2], 'floor') or '0')
  local full = seen < floor or seen > version
  local names = full and redis.call('HKEYS', KEYS[1])
                or redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. seen, '+inf')
  local out = {version, full and 1 or 0, #names}
  for _, name in ipairs(names) do
    out[#out + 1] = name
    out[#out + 1] = redis.call('HGET', KEYS[1], name)
  end
  if not full then
    for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. seen, '+inf')) do
      out[#out + 1] = name
    end
  end
  return out
end
return redis.error_reply('entries.lua: unknown mode ' .. tostring(mode))
