-- define.lua: the leader marks the stored definitions as its own (KEYS and replies:
-- prelude.lua): KEYS[6] "|epoch" -> its epoch, fenced by its lease. Until the newest
-- leader has marked them no standby rescues (a fingerprint may be an earlier leader's).
-- ARGV: token, ttl (ms), epoch, ahead (ms, for the backfill floor after a reset), the
-- highest generation seen ('' none, or 'reset'), with 'reset' the generation to lift above.
local token, ttl, epoch, ahead, seen, lift_above = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
                                                    ARGV[6]

local wrong = bad_keys()
if wrong then return refuse('define', wrong) end
local answer, generation = fenced(token, ttl, seen, lift_above, ahead)
if answer then return answer end
define('', '', epoch)
return {1, now_ms(), 0, generation}
