-- prelude_enqueue.lua: lead.lua's optional enqueue section (the loader puts prelude.lua
-- before it). It follows the items when KEYS has more than the ten slot keys: per item its
-- broker commands as one word ('l' LPUSH or 'e' PEXPIRE, each with a KEYS index from 11:
-- 'l11e12'; '' none), then one argument per command; the last ARGV is its length.
local enq = nil  -- where the next item's broker commands start (nil: no section)
local not_list = {}  -- KEYS indices of queues (LPUSH) that are not lists

-- the index of the items' last ARGV; notes where the section starts
local function enqueue_section()
  if #KEYS <= 10 then return #ARGV end
  enq = #ARGV - tonumber(ARGV[#ARGV])
  return enq - 1
end

-- a command word this script does not run, or nil; notes which queues are not lists
local function bad_commands()
  local j = enq
  while j and j < #ARGV do
    local rest, c = string.gsub(ARGV[j], '[le]%d+', '')
    if rest ~= '' then return 'broker commands ' .. ARGV[j] .. ' not supported' end
    for key in string.gmatch(ARGV[j], 'l(%d+)') do
      if not_list[key] == nil then
        not_list[key] = wrong_type(KEYS[tonumber(key)], 'list') ~= nil
      end
    end
    j = j + 1 + c
  end
end

-- the next item's broker commands: their word, where their arguments start, how many,
-- and whether a queue they write is not a list (then none runs: UNQUEUED)
local function take_commands()
  if not enq then return '', 0, 0, false end
  local spec, cmds = ARGV[enq], enq + 1
  local ncmds = select(2, string.gsub(spec, '[le]', ''))
  enq = cmds + ncmds
  for key in string.gmatch(spec, 'l(%d+)') do
    if not_list[key] then return '', 0, 0, true end
  end
  return spec, cmds, ncmds, false
end

local function run_commands(spec, j)
  for cmd, key in string.gmatch(spec, '([le])(%d+)') do
    redis.call(cmd == 'l' and 'LPUSH' or 'PEXPIRE', KEYS[tonumber(key)], ARGV[j])
    j = j + 1
  end
end
