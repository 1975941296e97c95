-- lost.lua: a node saw Redis lose writes it knew of (the generation counter went back, or a
-- slot state older than one it knew settled). It says so, so that the leader starts again
-- as after any rollback, even a leader that is a new process and knows of no loss; and it
-- reports the newest slot of each entry it knew settled, for the leader's margin.
-- KEYS[1] lost hash: "<entry>|<node>" -> slot (ms), kept for keep_ms
-- KEYS[2] backfilled hash: its field "|loss" holds the highest generation a node saw
--         before the loss; until a leader re-anchors ('reset' in prelude.lua, which lifts
--         the counter above it and deletes it) lead and rescue claims answer {2}
-- KEYS[3] generation counter (read only)
-- ARGV: node id, keep_ms (how long the reports are kept), the highest generation this node
-- has seen, then pairs: entry, slot (ms)
-- Returns 1
local node, keep_ms, seen_generation = ARGV[1], ARGV[2], ARGV[3]
for i = 4, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[1], ARGV[i] .. '|' .. node, ARGV[i + 1])
end
if #ARGV >= 5 then
  redis.call('PEXPIRE', KEYS[1], keep_ms)
end
-- only while the counter is still below what this node saw: a leader's 'reset' since has
-- dealt with the loss (it lifted the counter above every report it found)
local reported = tonumber(redis.call('HGET', KEYS[2], '|loss') or '-1')
local counter = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(seen_generation) > reported and counter < tonumber(seen_generation) then
  redis.call('HSET', KEYS[2], '|loss', seen_generation)
end
return 1
