-- record.lua: mark claimed slots as sent and write history events, in one call.
-- KEYS[1] slots hash      KEYS[2] history stream
-- ARGV[1] history max length      ARGV[2] node id      ARGV[3] epoch
-- ARGV[4..] groups of four: entry name, slot (ms), event, detail
--   event 'sent'   the broker accepted the slot's message: state 'c'/'u' -> 's'
--                  (only while the stored slot is still this one)
--   event 'unsent' the slot was claimed but not sent: state 'c' -> 'u', so the
--                  next leader knows it was reported already
--   any other event ('unsent', 'missed', 'skipped', ...) is written to history only
-- Returns the number of slots marked sent.
local marked = 0
for i = 4, #ARGV, 4 do
  local name, slot, event, detail = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if event == 'sent' or event == 'unsent' then
    local stored = redis.call('HGET', KEYS[1], name)
    if stored and string.match(stored, '^(%d+)|') == slot then
      local epoch, state = string.match(stored, '^%d+|(%d+)|(%a)$')
      if event == 'sent' then
        redis.call('HSET', KEYS[1], name, slot .. '|' .. epoch .. '|s')
        marked = marked + 1
      elseif state == 'c' then
        redis.call('HSET', KEYS[1], name, slot .. '|' .. epoch .. '|u')
      end
    end
  end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'event', event,
             'entry', name, 'slot', slot, 'node', ARGV[2], 'epoch', ARGV[3],
             'detail', detail)
end
return marked
