-- check.lua: a leader asks whether Redis lost writes it saw, and whether it still leads
-- (KEYS and replies: prelude.lua), before it acts on state a restore may have brought back
-- (queued requests). Writes nothing else; with 'reset', lifts the counter as lead.lua does.
-- ARGV: token, ttl (ms), ahead (ms, for the backfill floor after a reset), the highest
-- generation seen ('' none, or 'reset'), with 'reset' the generation to lift above.
local token, ttl, ahead, seen, lift_above = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local wrong = bad_keys()
if wrong then return refuse('check', wrong) end
local answer, generation = fenced(token, ttl, seen, lift_above, ahead)
if answer then return answer end
return {1, now_ms(), 0, generation}
