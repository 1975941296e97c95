-- lost.lua: a node saw Redis lose writes it knew of (the generation counter went back, or a
-- slot state older than one it knew settled). It says so, so that the leader starts again
-- as after any rollback, even a leader that is a new process and knows of no loss; and it
-- reports the newest slot of each entry it knew settled, for the leader's margin.
-- KEYS[1] lost hash: "<entry>|<node>" -> slot (ms), kept ARGV[2] ms
-- KEYS[2] backfilled hash: its field "|loss" holds the highest generation a node saw
--         before the loss; until a leader re-anchors ('reset' in prelude.lua, which lifts
--         the counter above it and deletes it) lead and rescue claims answer {2}
-- KEYS[3] generation counter (read only)
-- ARGV[1] node id    ARGV[2] how long (ms) the reports are kept
-- ARGV[3] the highest generation this node has seen
-- ARGV[4 ..] pairs: entry, slot (ms)
-- Returns 1
for i = 4, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[1], ARGV[i] .. '|' .. ARGV[1], ARGV[i + 1])
end
if #ARGV >= 5 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
-- only while the counter is still below what this node saw: a leader's 'reset' since has
-- dealt with the loss (it lifted the counter above every report it found)
local seen = tonumber(redis.call('HGET', KEYS[2], '|loss') or '-1')
local counter = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[3]) > seen and counter < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[2], '|loss', ARGV[3])
end
return 1
