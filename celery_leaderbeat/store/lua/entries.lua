-- entries.lua: the entries defined at run time (the entry API, the CLI), versioned.
-- KEYS[1] entries hash: name -> "<version>|<anchor_ms>|<fingerprint>|<timing>|<enabled>|<ran_ms>|<kept>\n<json>"
--         (kept: '1' when the anchor was given, an imported entry's last run elsewhere)
-- KEYS[2] meta hash: 'version' (bumped by every change), 'floor' (changes before it forgotten)
-- KEYS[3] changed zset: live name -> version of its last change
-- KEYS[4] removed zset: removed name -> version of its removal (capped, see ARGV)
-- KEYS[5] slots hash (the slot scripts'): an enabled entry saved with no slot state gets its
--         first one here, "<anchor>|0|a", in the same step as the save: a standby can
--         rescue its first slot even when the leader died before reading the save
-- ARGV[1] mode: 'save', 'delete', 'finish' or 'changes'
-- save:    ARGV[2] name  ARGV[3] how: 'upsert', 'create' (refused if it exists) or 'update'
--          (refused if it does not)  ARGV[4] fingerprint of the whole definition
--          ARGV[5] timing fingerprint (what decides the slots)  ARGV[6] enabled '1'/'0'
--          ARGV[7] anchor (ms) to keep instead of now, or ''  ARGV[8] definition JSON
--          ARGV[9] removed-zset cap  ARGV[10] a one-off's slot less 1 ms, or '': its first
--          slot state is the earlier of that and the anchor
-- delete:  ARGV[2] name  ARGV[3] cap
-- finish:  ARGV[2] name  ARGV[3] fingerprint  ARGV[4] slot (ms): a one-off entry ran
-- changes: ARGV[2] the version the caller has seen
-- The anchor (the moment an entry's slots are counted from) is Redis TIME when the
-- entry is created, its timing changes, or it is enabled again, rounded up to the whole
-- second; otherwise kept. On whole seconds, entries saved one by one share their slots'
-- instants as beat_schedule entries do (anchored together at a leader's start): a
-- leader sends them in one batch a second, not one small batch per millisecond.
-- A save whose fingerprint and enabled flag equal the stored ones changes nothing
-- (not even the anchor: an import run twice keeps the first run's phase).
-- Returns save:    {1, version, anchor_ms} saved, {0, version, anchor_ms} unchanged,
--                  {2} exists (create), {3} unknown (update)
--         delete:  {1, version} removed, {3} unknown
--         finish:  {1, version} disabled, {0} not this definition, or not enabled
--         changes: {version, full, n, name1, value1, ..., removed1, ...}; full = 1 when
--                  the caller is older than the floor: every entry is listed, n of them
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

if mode == 'save' then
  local name, how, fp, timing, enabled, keep = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
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
                                                 '|') .. '\n' .. ARGV[8])
  redis.call('ZADD', KEYS[3], version, name)
  redis.call('ZREM', KEYS[4], name)
  if enabled == '1' and KEYS[5] then
    local first = anchor
    if (ARGV[10] or '') ~= '' then first = math.min(anchor, tonumber(ARGV[10])) end
    redis.call('HSETNX', KEYS[5], name, string.format('%d|0|a', first))
  end
  return {1, version, anchor}
elseif mode == 'delete' then
  local name = ARGV[2]
  if redis.call('HDEL', KEYS[1], name) == 0 then return {3} end
  local version = bump()
  redis.call('ZREM', KEYS[3], name)
  redis.call('ZADD', KEYS[4], version, name)
  cap_removed(tonumber(ARGV[3]))
  return {1, version}
elseif mode == 'finish' then
  local name = ARGV[2]
  local cur = redis.call('HGET', KEYS[1], name)
  if not cur then return {0} end
  local f, body = head(cur)
  if f[3] ~= ARGV[3] or f[5] ~= '1' then return {0} end
  local version = bump()
  redis.call('HSET', KEYS[1], name, table.concat({version, f[2], f[3], f[4], '0', ARGV[4],
                                                  f[7] or ''}, '|') .. '\n' .. body)
  redis.call('ZADD', KEYS[3], version, name)
  return {1, version}
elseif mode == 'changes' then
  local seen = tonumber(ARGV[2])
  local version = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
  if version == seen then return {version, 0, 0} end
  local floor = tonumber(redis.call('HGET', KEYS[2], 'floor') or '0')
  local out = {version, 0, 0}
  local names
  if seen < floor or seen > version then
    out[2] = 1
    names = redis.call('HKEYS', KEYS[1])
  else
    names = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. seen, '+inf')
  end
  out[3] = #names
  for _, name in ipairs(names) do
    out[#out + 1] = name
    out[#out + 1] = redis.call('HGET', KEYS[1], name)
  end
  if out[2] == 0 then
    for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. seen, '+inf')) do
      out[#out + 1] = name
    end
  end
  return out
end
return redis.error_reply('entries.lua: unknown mode ' .. tostring(mode))
