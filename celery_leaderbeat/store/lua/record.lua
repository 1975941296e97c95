-- record.lua: write history events; 'sent' and 'unsent' also mark their stored slot (see
-- write_events in prelude_events.lua; KEYS and replies: prelude.lua). Unfenced: events
-- say what already happened. A reported loss does not stop a record.
-- ARGV: epoch ('0' a standby), history max length, node id, the highest generation seen
-- ('' none), n events, events (4 each).
local epoch, history_max, node, seen, n = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])

local names = {}
for i = 6, 5 + 4 * n, 4 do names[#names + 1] = ARGV[i] end
local wrong = bad_keys() or bad_values(names)
if wrong then return refuse('record', wrong) end

local answer, generation = check_generation(seen, false, '', true)
if answer then return answer end
local marked = write_events(6, n, epoch, node, history_max)
return {1, now_ms(), marked, generation}
