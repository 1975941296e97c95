-- states.lua: the slot states of the named entries, read in one call (an HMGET).
-- What it saves is the client's, not Redis's: a standby looks at a whole due batch
-- (a thousand entries and more) at each look, and redis-py packs every name of an
-- HMGET and parses every value of its reply in Python; one JSON text each way is
-- packed and parsed in C.
-- KEYS[1] slots hash
-- ARGV[1] the entry names, a JSON array of strings (at least one)
-- Returns a JSON array: each name's state in order, false where it has none
local names = cjson.decode(ARGV[1])
local states = {}
-- unpack takes a bounded number of values: the names go to HMGET a thousand at a time
for first = 1, #names, 1000 do
  local part = redis.call('HMGET', KEYS[1], unpack(names, first, math.min(first + 999, #names)))
  for i = 1, #part do
    states[#states + 1] = part[i]
  end
end
return cjson.encode(states)
