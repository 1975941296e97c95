-- prelude_events.lua: the history events of the slot scripts that write them (lead, rescue,
-- record); the loader puts prelude.lua before it.

-- one event into the history stream (KEYS[3]), capped near ``history_max``
local function add_event(name, slot, event, detail, node, epoch, history_max)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', history_max, '*', 'event', event,
             'entry', name, 'slot', slot, 'node', node, 'epoch', epoch, 'detail', detail)
end

-- History events ARGV[first ..], groups of four (entry, slot, event, detail). Unfenced:
-- they say what already happened. 'sent' marks the stored slot sent (and drops an
-- overtaken record of it); 'unsent' marks a claimed one unsent: a leader's any, a
-- standby's (epoch '0') only its own. Returns how many were marked sent.
local function write_events(first, n, epoch, node, history_max)
  local marked = 0
  local any_overtaken = redis.call('EXISTS', KEYS[4]) == 1
  for i = first, first + 4 * n - 1, 4 do
    local name, slot, event, detail = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
    if event == 'sent' or event == 'unsent' then
      local stored = redis.call('HGET', KEYS[2], name)
      if stored and string.match(stored, '^(%d+)|') == slot then
        local rest, state, who = string.match(stored, '^(%d+|%d+|)(%a)(.*)$')
        if event == 'sent' then
          redis.call('HSET', KEYS[2], name, rest .. STATUS.SENT .. who)
          marked = marked + 1
        elseif state == STATUS.CLAIMED then
          local s_who = string.match(who, '^|([^|]*)') or ''
          if epoch ~= '0' or s_who == node then
            redis.call('HSET', KEYS[2], name, rest .. STATUS.UNSENT .. who)
          end
        end
      end
      if event == 'sent' and any_overtaken then
        redis.call('HDEL', KEYS[4], name .. '|' .. slot)
      end
    end
    add_event(name, slot, event, detail, node, epoch, history_max)
  end
  return marked
end
