-- claim.lua: the one gate every slot passes before it is sent, and its record.
-- KEYS[1] leader key      KEYS[2] slots hash      KEYS[3] history stream
-- KEYS[4] overtaken hash: "<entry>|<slot_ms>" -> the value a newer claim replaced while it
--         was still claimed and unconfirmed ('c' or 'u') by another claimant
-- KEYS[5] paused hash: entry -> note (``celery leaderbeat pause``)
-- KEYS[6] definitions hash: entry -> fingerprint of the definition the leader plans; and
--         the field "|epoch": the epoch of the leader that last wrote its whole definition
--         (at its election, 'define')
-- KEYS[7] progress: Redis TIME (ms) of the leader's latest call with a 'claim' in it
-- KEYS[8] generation: a counter every call that writes raises; a node remembers the highest
--         it has seen, so Redis going back to older state (a restore from an older
--         snapshot, a lagging replica promoted) is seen before anything is granted
-- KEYS[9] backfilled hash: "<entry>|<slot_ms>" -> the backfill request that sent it; and
--         the field "|floor": Redis TIME (ms) plus the ahead allowance when a leader last
--         re-anchored after a loss of writes ('reset'): what was sent before it cannot be
--         told; and "|lost_at": that Redis TIME (a request queued before it may be a replay);
--         and "|loss": a loss of writes a node reported (lost.lua), the highest generation
--         it had seen: lead and rescue calls answer {2, generation, 1} until a 'reset',
--         which lifts the counter above it too and deletes it
-- KEYS[10] epoch counter (read only: the newest leader's epoch, see acquire.lua)
-- ARGV[1] mode: 'lead', 'rescue' or 'record'
-- ARGV[2] lead: this leader's token (node_id|epoch); rescue/record: ''
-- ARGV[3] lead: lease ttl (ms); rescue: rescue_after (ms); record: ''
-- ARGV[4] epoch written with claims (lead: the leader's; rescue: 0, no lease)
-- ARGV[5] history max length      ARGV[6] node id
-- ARGV[7] lead: how far (ms) a claimed slot's fire time may lie ahead of Redis TIME;
--         rescue: how recent (ms) the leader's progress must be for a rescue to wait
--         (a live leader still claiming chunks of a burst gets to its slots first);
--         record: ''
-- ARGV[8] lead: how old (ms, by Redis TIME) a standby's claim must be before 'recover'
--         may take it over (younger, its claimant may still be publishing it); else ''
-- ARGV[9] n, the number of events
-- ARGV[10] the highest generation the caller has seen ('' none); a lower counter here
--          answers {2, counter} and writes only the mark of the loss (KEYS[9] "|loss",
--          see below): Redis lost writes the caller saw.
--          'reset' (a leader re-anchoring every entry after such a loss): the counter is
--          lifted above ARGV[11] and the call goes on; from a caller no longer the lease
--          holder the counter is left as it is (the call then answers {0, ...})
-- ARGV[11] with 'reset': the generation to lift the counter above; else ''
-- ARGV[12 .. 11+4n] events, groups of four: entry, slot (ms), event, detail
--   'sent'    the broker accepted the slot: state -> 's' while the stored slot is this one
--             (and an overtaken record of that slot is dropped: it was sent after all)
--   'unsent'  claimed, not sent: state 'c' -> 'u', so the next leader reports it once
--   others ('missed', 'skipped', 'error', ...) go to the history only
-- ARGV[10+4n ..]    claims, groups of six: entry, slot (ms), op, fire time (ms),
--                   previous slot (ms, or ''), definition fingerprint (or ''; a
--                   backfill: its request id)
--   op 'claim'    claim the slot to send it        (state 'c', claimed)
--   op 'skip'     advance past a slot not sent     (state 'k', skipped by policy)
--   op 'anchor'   the entry's first slot, only if it has no state yet (state 'a')
--   op 'reanchor' the entry's definition changed: start again from this slot (state 'a'),
--                 only while the stored fingerprint differs; never moves a slot backwards
--   op 'restore'  this node sent the slot and Redis lost that (restart, older snapshot):
--                 state 's', only when newer than the stored slot
--   op 'recover'  re-send an unconfirmed slot an earlier claimant left: granted only while
--                 the stored slot is this one and still 'c' or 'u' (or it is in KEYS[4]);
--                 the claim becomes this leader's ('c')
--   op 'backfill' (lead only) send a slot the schedule passed without sending it (the CLI's
--                 backfill): granted only when, at this moment, the slot is older than the
--                 stored slot (the schedule settled it), no 'sent' event of it is in the
--                 history, which reaches back to it, it is not claimed and unconfirmed
--                 (KEYS[4]: the next leader reports and may recover it), not backfilled
--                 before (KEYS[9]) and not older than the floor (KEYS[9] "|floor"). A grant
--                 writes KEYS[9]; the stored slot is left as it is. The same request asking
--                 again (its reply was lost, it was queued again) is granted again. A
--                 refusal answers its reason: 'later', 'sent', 'backfilled', 'unconfirmed',
--                 'lost' or 'horizon'
--   op 'define'   (lead only) KEYS[6] entry -> fingerprint (nothing for an empty entry
--                 name), and "|epoch" -> this leader's epoch: the leader wrote what it plans
-- Claim and enqueue in one step (optional: only when KEYS has more than ten keys):
-- KEYS[11 ..]       the broker's keys (queue lists) the commands below write; the queues
--                   of a message sent through an exchange are looked up by the caller
--                   just before the call (roles/routing.py), as kombu does at publish
-- ARGV[#ARGV]       L, the length of the enqueue section, which ends just before it and
--                   follows the claims; for each claim in order: its broker commands as
--                   one word ('' for none): 'l' (LPUSH) or 'e' (PEXPIRE), each followed by
--                   an index into KEYS (11 or more), e.g. 'l11' or 'l11e12'; then one
--                   argument per command, in order (the message payload, or ms)
--   A granted 'claim' that has commands runs them here, in this atomic step, and is
--   stored sent ('s'), never claimed: a slot is granted and enqueued, or neither; its
--   'sent' event is written to the history here too (the caller sends none).
-- A leader asking again for a slot it holds itself (its reply was lost; the retry may
-- carry commands the first attempt did not, or the reverse) is answered by what the
-- slot is: stored sent by this leader ('s': enqueued by an earlier attempt, or recorded
-- sent): 4, nothing runs or is written twice; still claimed ('c'): granted again (1), and
-- commands the retry carries run now, as for a first grant.
-- Checked before anything is written (Redis does not roll a script back, so an error
-- after the first write would leave a slot stored sent with no message): the type of
-- every key (WRONGTYPE), the generation counter, the stored values of the entries the
-- call touches, and the enqueue section. A problem answers an error naming it, and
-- nothing is written. A queue an LPUSH would write that is not a list fails only the
-- claims whose commands write it: each is granted without them ('c') and answers 5, so
-- the caller publishes it after the claim (kombu's own publish then fails that message
-- alone, as stock beat's would).
-- A 'claim' of a paused entry's slot advances past it instead (state 'k') and
-- answers 2: the slot is skipped, and resuming does not replay it.
-- Events are written first and unfenced: they say what already happened (the
-- previous chunk's sends ride on the next chunk's claim). Claims are then
-- granted only when the slot is newer than the stored one, so no slot can be
-- granted twice; in 'lead' mode only while the leader key holds the token, and only
-- for slots whose fire time is not ahead of Redis TIME by more than ARGV[7] (a node
-- whose wall clock stepped forward must not send the future). A leader's claim writes
-- the fingerprint of its definition to KEYS[6].
-- In 'rescue' mode (a standby, no lease) only 'claim' and 'skip' (slots its catch-up
-- policy passes over), only for an entry that has
-- state (its phase is known), only once the newest leader wrote what it plans (KEYS[6]
-- "|epoch" is the epoch counter; answers 0 until then; no mark at all: not checked),
-- only when the stored slot is the rescuer's previous slot
-- (a rescuer whose view is stale plans slots of another phase), only when the rescuer's
-- fingerprint is the leader's (answers 3 otherwise), and only once Redis TIME >= fire
-- time + rescue_after, so a standby with a fast clock cannot pre-empt a healthy leader,
-- and not while the lease holder claimed something within ARGV[7] ms (answers 0).
-- A value is "<slot_ms>|<epoch>|<state>", plus "|<node>|<claimed at ms>" for a standby's
-- claim.
-- Asking again for the exact claim this caller already holds answers 1 again (a leader's
-- 'claim': see above): a client that lost the reply and retried must not take its grant
-- for a refusal (the caller remembers what it published and never publishes a slot twice).
-- Returns an error (nothing written) when a key has the wrong type or a value cannot be read
--         {0, holder_token or false, marked}   lead mode, not the leader: no claim granted
--         {2, generation}   Redis went back to older state (see ARGV[10]): nothing written
--         {2, generation, 1}  a node reported a loss of writes (KEYS[9] "|loss", lost.lua):
--           nothing written; lead and rescue calls answer this until a leader's 'reset'
--         {1, redis_now_ms, marked, generation, r1, r2, ...}  per claim: 1 granted,
--           4 this leader's own claim asked again and stored sent (enqueued before),
--           5 granted without its commands (a queue they write is not a list),
--           2 paused (skipped), 3 definition differs (rescue), 0 not late enough (rescue)
--           or too far ahead (lead), false no state (rescue), a backfill's reason (see
--           'backfill'), else the stored value
local mode = ARGV[1]
local token = ARGV[2]
local ttl_or_rescue_after = ARGV[3]
local epoch = ARGV[4]
local history_max = ARGV[5]
local node = ARGV[6]
local window = ARGV[7]         -- lead: ahead allowance; rescue: the busy leader's window
local recover_age = ARGV[8]
local n = tonumber(ARGV[9])
local seen = ARGV[10]          -- the highest generation the caller has seen, or 'reset'
local lift_above = ARGV[11]    -- with 'reset': the generation to lift the counter above
local claims_at = 12 + 4 * n
local claims_end = #ARGV
local enq = nil  -- where the current claim's enqueue commands start, if any
if #KEYS > 10 then
  local enqueue_length = tonumber(ARGV[#ARGV])
  claims_end = #ARGV - 1 - enqueue_length
  enq = claims_end + 1
end

-- the type each of KEYS[1..10] must have (or none)
local KIND = {'string', 'hash', 'stream', 'hash', 'hash', 'hash', 'string', 'string', 'hash',
              'string'}
local function wrong_type(key, want)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= want then
    return key .. ' holds a ' .. kind .. ', not a ' .. want
  end
end
-- KEYS indices of queues (LPUSH) that are not lists: claims writing them run no commands
local not_list = {}
-- what a write below could fail on, checked before the first write; nil when nothing
local function problem()
  for k = 1, 10 do
    local wrong = wrong_type(KEYS[k], KIND[k])
    if wrong then return wrong end
  end
  local counter = redis.call('GET', KEYS[8])
  if counter and not string.match(counter, '^%d+$') then
    return KEYS[8] .. ' holds ' .. counter .. ', not a generation number'
  end
  local floor = redis.call('HGET', KEYS[9], '|floor')
  if floor and not tonumber(floor) then
    return KEYS[9] .. ' field |floor holds ' .. floor .. ', not a number'
  end
  if enq then
    local j = enq
    while j < #ARGV do  -- each claim's word: 'l' or 'e' and a key index, then its arguments
      local word = ARGV[j]
      local rest, c = string.gsub(word, '[le]%d+', '')
      if rest ~= '' then
        return 'broker commands ' .. word .. ' not supported'
      end
      for key in string.gmatch(word, 'l(%d+)') do
        if not_list[key] == nil then
          not_list[key] = wrong_type(KEYS[tonumber(key)], 'list') ~= nil
        end
      end
      j = j + 1 + c
    end
  end
  local names = {}  -- every entry an event or a claim names
  for i = 12, claims_at - 1, 4 do names[#names + 1] = ARGV[i] end
  for i = claims_at, claims_end, 6 do names[#names + 1] = ARGV[i] end
  if #names > 0 then
    local values = redis.call('HMGET', KEYS[2], unpack(names))
    for k = 1, #names do
      if values[k] and not string.find(values[k], '^%d+|%d+|%a') then
        return KEYS[2] .. ' field ' .. names[k] .. ' holds ' .. values[k] .. ', not a slot state'
      end
    end
  end
  for i = claims_at, claims_end, 6 do
    local name, slot_text, op = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local field = name .. '|' .. slot_text
    local over = op == 'recover' and redis.call('HGET', KEYS[4], field)
    if over and not string.find(over, '^%d+|%d+|%a') then
      return KEYS[4] .. ' field ' .. field .. ' holds ' .. over .. ', not a slot state'
    end
  end
end
local wrong = problem()
if wrong then
  return redis.error_reply('claim.lua: ' .. wrong .. ' (nothing was written)')
end

local generation = tonumber(redis.call('GET', KEYS[8]) or '0')
-- a loss a node reported (lost.lua): the highest generation it had seen
local loss = tonumber(redis.call('HGET', KEYS[9], '|loss') or '')
-- only the lease holder lifts the counter: a leader fenced meanwhile leaves the loss for
-- the next leader to see (it re-anchors, and sets the backfill floor)
local reset = seen == 'reset' and mode == 'lead' and redis.call('GET', KEYS[1]) == token
if reset then
  generation = math.max(generation, tonumber(lift_above), loss or 0) + 1
  redis.call('SET', KEYS[8], generation)
  if loss then
    redis.call('HDEL', KEYS[9], '|loss')
  end
elseif seen == 'reset' and generation < tonumber(lift_above) then
  -- not the leader (answered below): events are written, the counter is left as it is
elseif seen ~= '' and seen ~= 'reset' and generation < tonumber(seen) then
  -- the loss is marked for everyone (as lost.lua does): a node that remembers nothing
  -- must not rescue, nor a new leader send, from this older state until a leader's reset
  if tonumber(seen) > (loss or -1) then
    redis.call('HSET', KEYS[9], '|loss', seen)
  end
  return {2, generation}
elseif loss and mode ~= 'record' then
  return {2, generation, 1}  -- reported by another node: a leader re-anchors first
else
  generation = redis.call('INCR', KEYS[8])
end
local marked = 0
local any_overtaken = redis.call('EXISTS', KEYS[4]) == 1
for i = 12, claims_at - 1, 4 do
  local name, slot, event, detail = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if event == 'sent' or event == 'unsent' then
    local stored = redis.call('HGET', KEYS[2], name)
    if stored and string.match(stored, '^(%d+)|') == slot then
      local rest, state, who = string.match(stored, '^(%d+|%d+|)(%a)(.*)$')
      if event == 'sent' then
        redis.call('HSET', KEYS[2], name, rest .. 's' .. who)
        marked = marked + 1
      elseif state == 'c' then
        -- a standby (epoch 0) marks only its own claim: another node's live claim of the
        -- same slot stays claimed until its own record lands; a leader reports any
        local s_who = string.match(who, '^|([^|]*)') or ''
        if epoch ~= '0' or s_who == node then
          redis.call('HSET', KEYS[2], name, rest .. 'u' .. who)
        end
      end
    end
    if event == 'sent' and any_overtaken then
      redis.call('HDEL', KEYS[4], name .. '|' .. slot)
    end
  end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', history_max, '*', 'event', event,
             'entry', name, 'slot', slot, 'node', node, 'epoch', epoch, 'detail', detail)
end
if mode == 'lead' then
  local current = redis.call('GET', KEYS[1])
  if current ~= token then
    return {0, current, marked}
  end
  redis.call('PEXPIRE', KEYS[1], ttl_or_rescue_after)
  if reset then  -- what was sent before the loss cannot be told: no backfill reaches it
    local t = redis.call('TIME')
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local floor = now_ms + tonumber(window)
    local old = tonumber(redis.call('HGET', KEYS[9], '|floor') or '0')
    redis.call('HSET', KEYS[9], '|floor', math.max(old, floor), '|lost_at', now_ms)
  end
elseif mode ~= 'rescue' then
  if claims_end >= claims_at then
    return redis.error_reply('claim.lua: mode ' .. mode .. ' takes no claims')
  end
end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local states = {claim = 'c', skip = 'k', anchor = 'a', reanchor = 'a', restore = 's',
                recover = 'c'}
local suffix = ''
local leader_busy = false
local definitions_behind = false  -- the newest leader has not written what it plans yet
if mode == 'rescue' then
  local mark = redis.call('HGET', KEYS[6], '|epoch')
  definitions_behind = mark and mark ~= (redis.call('GET', KEYS[10]) or mark)
  suffix = '|' .. node .. '|' .. now_ms
  local progress = tonumber(redis.call('GET', KEYS[7]) or '')
  leader_busy = progress ~= nil and window ~= '' and now_ms - progress < tonumber(window)
                and redis.call('EXISTS', KEYS[1]) == 1
end
local progressed = false

-- the stored value's parts: slot (number), epoch, state, node ('' for a leader), claimed at
local function parts(stored)
  local s_slot, s_epoch, s_state, s_rest = string.match(stored, '^(%d+)|(%d+)|(%a)|?(.*)$')
  local s_node, s_at = string.match(s_rest, '^(.*)|(%d+)$')
  if not s_node then
    s_node, s_at = s_rest, nil
  end
  return tonumber(s_slot), s_epoch, s_state, s_node, tonumber(s_at)
end

-- backfill: the 'sent' events of the history from the oldest slot asked for, less the
-- ahead allowance (a leader may send a slot that much before Redis TIME reaches it), read
-- once per call; and how far back the history is whole: after the newest event trimmed
-- from it (Redis 7 says which), else from its oldest event on
local sent_in_history, whole_after = nil, nil
local function history_whole_after()
  if redis.call('EXISTS', KEYS[3]) == 0 then
    return nil
  end
  local info = redis.call('XINFO', 'STREAM', KEYS[3])
  for k = 1, #info, 2 do
    if info[k] == 'max-deleted-entry-id' then
      return tonumber(string.match(info[k + 1], '^(%d+)'))
    end
  end
  local first = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1]
  return first and tonumber(string.match(first[1], '^(%d+)')) - 1
end
local function backfill_refusal(name, slot_text, slot, s_slot, request)
  if not s_slot or slot >= s_slot then
    return 'later'
  end
  local by = redis.call('HGET', KEYS[9], name .. '|' .. slot_text)
  if by == request then
    return nil  -- this request's own grant, asked again (the first reply was lost)
  elseif by then
    return 'backfilled'
  end
  if redis.call('HEXISTS', KEYS[4], name .. '|' .. slot_text) == 1 then
    return 'unconfirmed'
  end
  if slot < tonumber(redis.call('HGET', KEYS[9], '|floor') or '0') then
    return 'lost'
  end
  local ahead = tonumber(window)
  if not sent_in_history then
    local oldest = slot
    for j = claims_at, claims_end, 6 do
      if ARGV[j + 2] == 'backfill' and tonumber(ARGV[j + 1]) < oldest then
        oldest = tonumber(ARGV[j + 1])
      end
    end
    whole_after = history_whole_after()
    sent_in_history = {}
    for _, row in ipairs(redis.call('XRANGE', KEYS[3], math.max(0, oldest - ahead), '+')) do
      local f, event, entry, at = row[2], nil, nil, nil
      for k = 1, #f, 2 do
        if f[k] == 'event' then
          event = f[k + 1]
        elseif f[k] == 'entry' then
          entry = f[k + 1]
        elseif f[k] == 'slot' then
          at = f[k + 1]
        end
      end
      if event == 'sent' and entry and at then
        sent_in_history[entry .. '|' .. at] = true
      end
    end
  end
  if sent_in_history[name .. '|' .. slot_text] then
    return 'sent'
  end
  if not whole_after or whole_after >= slot - ahead then
    return 'horizon'  -- a 'sent' event of the slot may have been trimmed
  end
  return nil
end

local out = {1, now_ms, marked, generation}
for i = claims_at, claims_end, 6 do
  local name, slot, op, fire = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
  local prev, fp = ARGV[i + 4], ARGV[i + 5]
  local spec, cmds, ncmds = '', 0, 0
  if enq then
    spec = ARGV[enq]
    cmds = enq + 1
    ncmds = select(2, string.gsub(spec, '[le]', ''))
    enq = cmds + ncmds
  end
  local unqueued = false  -- a queue its commands write is not a list: granted without them
  for key in string.gmatch(spec, 'l(%d+)') do
    unqueued = unqueued or not_list[key]
  end
  if unqueued then
    spec, ncmds = '', 0
  end
  local state = states[op]
  if op == 'claim' and ncmds > 0 then
    state = 's'  -- enqueued in this step: sent
  end
  local stored = redis.call('HGET', KEYS[2], name)
  local s_slot, s_epoch, s_state, s_node, s_at
  if stored then
    s_slot, s_epoch, s_state, s_node, s_at = parts(stored)
  end
  local slot_text = ARGV[i + 1]
  local result
  if mode == 'lead' and op == 'claim' and not progressed then
    redis.call('SET', KEYS[7], now_ms, 'PX', ttl_or_rescue_after)
    progressed = true
  end
  if mode == 'rescue' then
    local def = fp ~= '' and redis.call('HGET', KEYS[6], name)
    if (op ~= 'claim' and op ~= 'skip') or not stored then
      result = false
    elseif definitions_behind then
      result = 0
    elseif def and def ~= fp then
      result = 3
    elseif s_slot == slot and s_epoch == '0' and s_state == state and s_node == node then
      result = 1  -- a retry of this rescuer's own claim
    elseif slot <= s_slot or (prev ~= '' and tonumber(prev) ~= s_slot) then
      result = stored
    elseif now_ms < fire + tonumber(ttl_or_rescue_after) or leader_busy then
      result = 0
    end
  elseif op == 'define' then
    if name ~= '' then
      redis.call('HSET', KEYS[6], name, fp)
    end
    redis.call('HSET', KEYS[6], '|epoch', epoch)
    result = 1
  elseif op == 'backfill' then
    result = backfill_refusal(name, slot_text, slot, s_slot, fp)
    if result == nil then
      redis.call('HSET', KEYS[9], name .. '|' .. slot_text, fp)  -- fp: the request id
      result = 1
    end
  elseif op == 'claim' and fire > now_ms + tonumber(window) then
    result = 0
  elseif op == 'anchor' then
    if stored then result = stored end
  elseif op == 'reanchor' then
    if redis.call('HGET', KEYS[6], name) == fp then
      result = stored or false
    elseif stored and s_slot > slot then
      slot, slot_text = s_slot, tostring(s_slot)
    end
  elseif op == 'recover' then
    local field = name .. '|' .. slot_text
    local over = redis.call('HGET', KEYS[4], field)
    local left = over or (stored and s_slot == slot and (s_state == 'c' or s_state == 'u')
                          and stored)
    if not left then
      result = stored or false
    else
      local _, o_epoch, _, o_node, o_at = parts(left)
      if o_epoch == epoch and o_node == '' then
        result = 1  -- this leader's own claim (a retry)
      elseif o_at and now_ms < o_at + tonumber(recover_age) then
        result = 0  -- a standby's claim, young enough that it may still publish it
      else
        if over then
          redis.call('HDEL', KEYS[4], field)
          result = 1  -- the newer stored slot stays as it is
        end
      end
    end
  elseif stored then
    local own = s_slot == slot and s_epoch == epoch and s_node == ''
    if own and op == 'claim' and s_state == 's' then
      result = 4  -- asked again: enqueued by an earlier attempt (or recorded sent)
    elseif own and op == 'claim' and s_state == 'c' then
      -- asked again, not sent yet: granted again below (commands it carries run now)
    elseif own and s_state == state then
      result = 1  -- a retry of this leader's own claim
    elseif slot <= s_slot then
      result = stored
    end
  end
  if result == nil and op ~= 'backfill' and op ~= 'define' then
    -- granted
    if op == 'claim' and redis.call('HEXISTS', KEYS[5], name) == 1 then
      redis.call('HSET', KEYS[2], name, slot_text .. '|' .. epoch .. '|k' .. suffix)
      result = 2
    else
      local own = (mode == 'lead' and s_epoch == epoch and s_node == '')
                  or (mode == 'rescue' and s_epoch == '0' and s_node == node)
      if stored and op ~= 'recover' and (s_state == 'c' or s_state == 'u') and s_slot ~= slot
          and not own then
        redis.call('HSET', KEYS[4], name .. '|' .. s_slot, stored)
      end
      redis.call('HSET', KEYS[2], name, slot_text .. '|' .. epoch .. '|' .. state .. suffix)
      local j = cmds
      for cmd, key in string.gmatch(spec, '([le])(%d+)') do
        if cmd == 'l' then
          redis.call('LPUSH', KEYS[tonumber(key)], ARGV[j])
        else
          redis.call('PEXPIRE', KEYS[tonumber(key)], ARGV[j])
        end
        j = j + 1
      end
      if ncmds > 0 then  -- enqueued: its 'sent' event is written here, not by the caller
        redis.call('XADD', KEYS[3], 'MAXLEN', '~', history_max, '*', 'event', 'sent', 'entry', name,
                   'slot', slot_text, 'node', node, 'epoch', epoch,
                   'detail', mode == 'rescue' and 'rescued' or '')
      end
      result = unqueued and 5 or 1
    end
    if mode == 'lead' and fp ~= '' then
      redis.call('HSET', KEYS[6], name, fp)
    end
  end
  out[#out + 1] = result
end
return out
