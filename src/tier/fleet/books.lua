-- kvtier's fleet books: one bucket prefix's capacity ledger, kept in Valkey
-- (or Redis) and changed only by this script, so that every step is one
-- atomic operation on the server. docs/design.md, "The fleet's books in
-- Valkey", states the protocol; models/src/fleet_reference.rs is its
-- reference model, and models/tests/fleet_differential.rs runs this script
-- against it.
--
-- KEYS: 1 meta (hash), 2 blocks (hash key -> bytes), 3 recency (zset key ->
-- tick), 4 held (hash key -> "kind bytes token deadline"), 5 pins (hash key
-- -> "token deadline;..."), 6 deadlines (zset key -> deadline of its held
-- entry), 7 the rebuild lock (string).
-- ARGV: 1 the operation, 2 the caller's epoch, then the operation's own.
--
-- Held entries: kind "r" is a reservation (a store writing the block), "e"
-- an eviction (the block left the books' blocks, its object is being
-- deleted). Both keep their bytes until released: a holder that dies leaves
-- them until a sweeper claims the expired entry, deletes the object and
-- releases it, so the bucket never holds more than the books count.

local META, BLOCKS, RECENCY, HELD, PINS, DEADLINES, LOCK =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local op, epoch = ARGV[1], ARGV[2]

-- A whole number as the server's commands take it (Lua 5.1 would write
-- 1e14 and above in exponent form).
local function int(x)
  return string.format('%d', x)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function num(field)
  return tonumber(redis.call('HGET', META, field) or '0')
end

local function add(field, amount)
  redis.call('HINCRBY', META, field, int(amount))
end

local function held_entry(key)
  local raw = redis.call('HGET', HELD, key)
  if not raw then
    return nil
  end
  local kind, bytes, token, deadline = string.match(raw, '^(%a) (%d+) (%S+) (%d+)$')
  return { kind = kind, bytes = tonumber(bytes), token = token, deadline = tonumber(deadline) }
end

local function hold(key, kind, bytes, token, deadline)
  redis.call('HSET', HELD, key, kind .. ' ' .. int(bytes) .. ' ' .. token .. ' ' .. int(deadline))
  redis.call('ZADD', DEADLINES, deadline, key)
end

local function unhold(key, entry)
  redis.call('HDEL', HELD, key)
  redis.call('ZREM', DEADLINES, key)
  add('held', -entry.bytes)
end

-- The live pins of `key` (token -> deadline), expired ones dropped.
local function live_pins(key, now)
  local raw = redis.call('HGET', PINS, key)
  local pins, count = {}, 0
  if raw then
    for token, deadline in string.gmatch(raw, '(%S+) (%d+);') do
      if tonumber(deadline) > now then
        pins[token] = tonumber(deadline)
        count = count + 1
      end
    end
  end
  return pins, count
end

local function write_pins(key, pins)
  local parts = {}
  for token, deadline in pairs(pins) do
    parts[#parts + 1] = token .. ' ' .. int(deadline) .. ';'
  end
  table.sort(parts)
  if #parts == 0 then
    redis.call('HDEL', PINS, key)
  else
    redis.call('HSET', PINS, key, table.concat(parts))
  end
end

local function touch(key)
  local tick = redis.call('HINCRBY', META, 'tick', 1)
  redis.call('ZADD', RECENCY, tick, key)
end

-- Victims of at least `needed` bytes, least recent first, never pinned:
-- nil when the unpinned blocks cannot make the room. Changes nothing.
local function choose(needed, now)
  local chosen, freed, start = {}, 0, 0
  while freed < needed do
    -- guard: G1-victims-are-unpinned-least-recent-blocks
    local batch = redis.call('ZRANGE', RECENCY, start, start + 63)
    if #batch == 0 then
      return nil
    end
    for _, key in ipairs(batch) do
      local _, pinned = live_pins(key, now)
      if pinned == 0 then
        local bytes = tonumber(redis.call('HGET', BLOCKS, key))
        chosen[#chosen + 1] = { key = key, bytes = bytes }
        freed = freed + bytes
        if freed >= needed then
          break
        end
      end
    end
    start = start + 64
  end
  return chosen
end

-- Moves the victims from the blocks to held evictions of `token`; the
-- reply lists each key and its bytes.
local function evict(victims, token, deadline)
  local reply = { 'evict' }
  for _, victim in ipairs(victims) do
    redis.call('HDEL', BLOCKS, victim.key)
    redis.call('ZREM', RECENCY, victim.key)
    redis.call('HDEL', PINS, victim.key)
    add('committed', -victim.bytes)
    add('held', victim.bytes)
    add('evictions', 1)
    hold(victim.key, 'e', victim.bytes, token, deadline)
    reply[#reply + 1] = victim.key
    reply[#reply + 1] = victim.bytes
  end
  return reply
end

-- Operations that need no epoch: the state of the books, and rebuilds.
if op == 'status' then
  local status = redis.call('HGET', META, 'status')
  if not status then
    return { 'lost' }
  end
  return {
    status, redis.call('HGET', META, 'epoch'), num('capacity'), num('committed'), num('held'),
    redis.call('HLEN', BLOCKS), redis.call('HLEN', HELD),
  }
end

if op == 'begin_rebuild' then
  -- ARGV: 3 holder, 4 lease ms, 5 new epoch, 6 capacity.
  local status = redis.call('HGET', META, 'status')
  if status == 'ready' then
    return { 'ready', redis.call('HGET', META, 'epoch') }
  end
  if not redis.call('SET', LOCK, ARGV[3], 'NX', 'PX', tonumber(ARGV[4])) then
    return { 'rebuilding' }
  end
  redis.call('DEL', META, BLOCKS, RECENCY, HELD, PINS, DEADLINES)
  redis.call('HSET', META, 'status', 'rebuilding', 'epoch', ARGV[5], 'capacity', ARGV[6],
    'committed', 0, 'held', 0, 'tick', 0)
  return { 'rebuild', ARGV[5] }
end

local status = redis.call('HGET', META, 'status')
if not status then
  return { 'lost' }
end
local current = redis.call('HGET', META, 'epoch')
-- guard: G2-a-caller-of-another-epoch-is-refused
if current ~= epoch then
  return { 'epoch', current }
end

if op == 'rebuild_add' then
  -- ARGV: 3 holder, then key, bytes pairs, oldest first. Blocks that do
  -- not fit are returned to be deleted.
  -- guard: G3-only-the-lock-holder-rebuilds
  if status ~= 'rebuilding' or redis.call('GET', LOCK) ~= ARGV[3] then
    return { 'not_holder' }
  end
  local capacity, reply = num('capacity'), { 'added' }
  for i = 4, #ARGV, 2 do
    local key, bytes = ARGV[i], tonumber(ARGV[i + 1])
    if not redis.call('HGET', BLOCKS, key) then
      if num('committed') + bytes <= capacity then
        redis.call('HSET', BLOCKS, key, int(bytes))
        add('committed', bytes)
        touch(key)
      else
        reply[#reply + 1] = key
      end
    end
  end
  return reply
end

if op == 'rebuild_end' then
  -- ARGV: 3 holder.
  if status ~= 'rebuilding' or redis.call('GET', LOCK) ~= ARGV[3] then
    return { 'not_holder' }
  end
  redis.call('HSET', META, 'status', 'ready')
  redis.call('DEL', LOCK)
  return { 'ready', current }
end

-- guard: G10-no-step-while-the-books-are-rebuilt
if status ~= 'ready' then
  return { 'rebuilding' }
end
local now = now_ms()

if op == 'lookup' then
  -- ARGV: 3.. keys. One verdict per key: 1 committed, 0 not.
  local reply = {}
  for i = 3, #ARGV do
    reply[#reply + 1] = redis.call('HEXISTS', BLOCKS, ARGV[i])
  end
  add('lookups', #ARGV - 2)
  return reply
end

if op == 'unlisted' then
  -- ARGV: 3.. keys found in a listing. 1 for each the books neither commit
  -- nor hold: an orphan (a write whose books were lost, a writer that died
  -- between its put and a refused commit), for the sweep to delete once
  -- old enough.
  local reply = {}
  for i = 3, #ARGV do
    local known = redis.call('HEXISTS', BLOCKS, ARGV[i]) == 1 or redis.call('HEXISTS', HELD, ARGV[i]) == 1
    -- guard: G18-only-keys-the-books-do-not-know-are-orphans
    reply[#reply + 1] = known and 0 or 1
  end
  return reply
end

if op == 'touch' then
  -- ARGV: 3.. keys read since the last touch; those still committed move
  -- to the recent end.
  local touched = 0
  for i = 3, #ARGV do
    if redis.call('HEXISTS', BLOCKS, ARGV[i]) == 1 then
      touch(ARGV[i])
      touched = touched + 1
    end
  end
  return { 'touched', touched }
end

if op == 'reserve' then
  -- ARGV: 3 key, 4 bytes, 5 token, 6 lease ms.
  local key, bytes, token, lease = ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
  local capacity = num('capacity')
  if bytes > capacity then
    return { 'too_large' }
  end
  if redis.call('HEXISTS', BLOCKS, key) == 1 then
    touch(key)
    return { 'present' }
  end
  -- guard: G9-one-holder-per-block
  if redis.call('HEXISTS', HELD, key) == 1 then
    return { 'busy' }
  end
  local used = num('committed') + num('held')
  -- guard: G4-a-reservation-is-granted-only-what-fits
  if used + bytes <= capacity then
    hold(key, 'r', bytes, token, now + lease)
    add('held', bytes)
    add('reserves', 1)
    return { 'granted' }
  end
  local victims = choose(used + bytes - capacity, now)
  if not victims then
    return { 'no_room' }
  end
  return evict(victims, token, now + lease)
end

if op == 'commit' then
  -- ARGV: 3 key, 4 token. Refused once the reservation's lease ended (a
  -- sweeper may have claimed it): the caller deletes its object.
  local key, token = ARGV[3], ARGV[4]
  local entry = held_entry(key)
  -- guard: G5-a-commit-after-its-lease-is-refused
  if not entry or entry.kind ~= 'r' or entry.token ~= token or entry.deadline <= now then
    add('refused_commits', 1)
    return { 'refused' }
  end
  unhold(key, entry)
  redis.call('HSET', BLOCKS, key, int(entry.bytes))
  add('committed', entry.bytes)
  add('commits', 1)
  touch(key)
  return { 'committed' }
end

if op == 'release' then
  -- ARGV: 3 token, 4.. keys: held entries of this token (a reservation
  -- aborted, an eviction's object deleted, an expired entry settled).
  local token, released = ARGV[3], 0
  for i = 4, #ARGV do
    local entry = held_entry(ARGV[i])
    -- guard: G6-only-the-holder-releases
    if entry and entry.token == token then
      unhold(ARGV[i], entry)
      released = released + 1
    end
  end
  return { 'released', released }
end

if op == 'renew' then
  -- ARGV: 3 token, 4 lease ms, 5.. keys: the token's live held entries and
  -- pins of these keys get a new deadline; an expired one stays expired.
  local token, deadline, renewed = ARGV[3], now + tonumber(ARGV[4]), 0
  for i = 5, #ARGV do
    local key = ARGV[i]
    local entry = held_entry(key)
    -- guard: G7-an-expired-lease-is-not-renewed
    if entry and entry.token == token and entry.deadline > now then
      hold(key, entry.kind, entry.bytes, token, deadline)
      renewed = renewed + 1
    end
    local pins = live_pins(key, now)
    if pins[token] then
      pins[token] = deadline
      write_pins(key, pins)
      renewed = renewed + 1
    end
  end
  return { 'renewed', renewed }
end

if op == 'pin' then
  -- ARGV: 3 key, 4 token, 5 lease ms.
  local key, token = ARGV[3], ARGV[4]
  if redis.call('HEXISTS', BLOCKS, key) == 0 then
    return { 'miss' }
  end
  local pins = live_pins(key, now)
  pins[token] = now + tonumber(ARGV[5])
  write_pins(key, pins)
  touch(key)
  return { 'pinned' }
end

if op == 'unpin' then
  -- ARGV: 3 key, 4 token.
  local pins = live_pins(ARGV[3], now)
  local had = pins[ARGV[4]] ~= nil
  pins[ARGV[4]] = nil
  write_pins(ARGV[3], pins)
  return { 'unpinned', had and 1 or 0 }
end

if op == 'forget' then
  -- ARGV: 3 key: its object was found missing; the block leaves the books.
  local bytes = redis.call('HGET', BLOCKS, ARGV[3])
  if not bytes then
    return { 'unknown' }
  end
  redis.call('HDEL', BLOCKS, ARGV[3])
  redis.call('ZREM', RECENCY, ARGV[3])
  redis.call('HDEL', PINS, ARGV[3])
  add('committed', -tonumber(bytes))
  add('forgotten', 1)
  return { 'forgotten' }
end

if op == 'claim_expired' then
  -- ARGV: 3 token, 4 lease ms, 5 at most. Held entries whose lease ended
  -- become the caller's, with a new lease: it deletes each object and
  -- releases the entry. Reply: key, kind, bytes per entry.
  local token, deadline = ARGV[3], now + tonumber(ARGV[4])
  -- guard: G8-only-expired-entries-are-claimed
  local keys = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
  local reply = { 'claimed' }
  for _, key in ipairs(keys) do
    local entry = held_entry(key)
    hold(key, entry.kind, entry.bytes, token, deadline)
    add('claimed', 1)
    reply[#reply + 1] = key
    reply[#reply + 1] = entry.kind
    reply[#reply + 1] = entry.bytes
  end
  return reply
end

if op == 'set_capacity' then
  -- ARGV: 3 capacity, 4 token, 5 lease ms. Evicts what no longer fits (as
  -- many as are unpinned).
  local capacity = tonumber(ARGV[3])
  redis.call('HSET', META, 'capacity', int(capacity))
  local over = num('committed') + num('held') - capacity
  if over <= 0 then
    return { 'evict' }
  end
  local victims = choose(over, now)
  if not victims then
    -- As many as there are: every unpinned block.
    local all = redis.call('ZRANGE', RECENCY, 0, -1)
    victims = {}
    for _, key in ipairs(all) do
      local _, pinned = live_pins(key, now)
      if pinned == 0 then
        victims[#victims + 1] = { key = key, bytes = tonumber(redis.call('HGET', BLOCKS, key)) }
      end
    end
  end
  return evict(victims, ARGV[4], now + tonumber(ARGV[5]))
end

return redis.error_reply('kvtier fleet books: unknown operation ' .. tostring(op))
