-- prune.lua: drop state that no longer belongs to anything, so nothing grows without bound.
-- KEYS[1] slots hash     KEYS[2] definitions hash     KEYS[3] backfilled hash
-- KEYS[4] nodes hash     KEYS[5] overtaken hash
-- ARGV[1] cutoff (ms, Redis TIME): slot states and backfill records older than this go
-- ARGV[2] node cutoff (s, epoch seconds): node records last seen before this go
-- ARGV[3] n, the number of entry names     ARGV[4 .. 3+n] entries the caller does not
--         schedule (candidates; their state goes only when its slot is older than the cutoff,
--         so an entry another node still sends, during a rolling deploy, is kept)
-- ARGV[4+n ..] backfilled fields "<entry>|<slot_ms>" (candidates, same cutoff on the slot)
-- Returns {slots dropped, backfill records dropped, nodes dropped}
local cutoff, node_cutoff, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local slots, backfills, nodes = 0, 0, 0
for i = 4, 3 + n do
  local name = ARGV[i]
  local stored = redis.call('HGET', KEYS[1], name)
  local slot = stored and tonumber(string.match(stored, '^(%d+)|'))
  if stored and slot and slot < cutoff
      and not string.match(stored, '^%d+|%d+|[cu]') then  -- unconfirmed claims are reported
    redis.call('HDEL', KEYS[1], name)
    redis.call('HDEL', KEYS[2], name)
    slots = slots + 1
  end
end
for i = 4 + n, #ARGV do
  local slot = tonumber(string.match(ARGV[i], '|(%d+)$'))
  if slot and slot < cutoff then
    backfills = backfills + redis.call('HDEL', KEYS[3], ARGV[i])
  end
end
local all = redis.call('HGETALL', KEYS[4])
for i = 1, #all, 2 do
  local seen = tonumber(string.match(all[i + 1], '"last_seen": *([%d%.]+)'))
  if seen and seen < node_cutoff then
    redis.call('HDEL', KEYS[4], all[i])
    nodes = nodes + 1
  end
end
return {slots, backfills, nodes}
