"""Lua scripts for every multi-key state change of ``ReplayBuffer`` (each runs atomically).

Keys of a buffer named ``N`` (passed in KEYS, never built inside a script)::

    N            stream: one entry per committed group, fields group_id, seq, payload
                 (seq = the committed count it made; marks entries that came through COMMIT)
    N:dead       stream: dead letters, fields entry_id, reason, payload
    N:leases     zset: lease_id -> expiry (server time, ms); expired members are reclaimed
                 lazily by the scripts below (the server clock is the only clock used)
    N:stats      hash: committed and one counter per terminal state: trained, dropped_stale,
                 dropped_invalid, dropped_poison, dropped_uniform (monotone; a field missing
                 in data written by an older version reads as 0)
    N:meta       hash: capacity, consumer_group, learner_version, user keys (set_meta)
    N:group_ids  set: every group_id ever committed (idempotent commit)

``unread`` = stream length - entries pending in the learner's consumer group: acked and
dead-lettered entries are XDELed in the same script that XACKs them, so every entry still in
the stream is either unread or pending.
"""

_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function pending_count(stream, meta)
  local g = redis.call('HGET', meta, 'consumer_group')
  if not g or redis.call('EXISTS', stream) == 0 then return 0 end
  local res = redis.pcall('XPENDING', stream, g)
  if type(res) ~= 'table' or res.err then return 0 end  -- group not created yet
  return tonumber(res[1])
end
local function unread_count(stream, meta)
  -- clamp: an entry XDELed by a foreign client while pending must not make this negative
  return math.max(0, redis.call('XLEN', stream) - pending_count(stream, meta))
end
local function capacity(meta)
  local cap = tonumber(redis.call('HGET', meta, 'capacity'))
  if not cap then error('buffer capacity is not set (N:meta capacity missing)') end
  return cap
end
"""

# KEYS: leases, stream, meta   ARGV: lease_id, ttl_ms
# Grants a slot iff live leases + unread < capacity. Returns 1 (granted) or 0 (full).
LEASE = (
    _PRELUDE
    + """
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) + unread_count(KEYS[2], KEYS[3]) >= capacity(KEYS[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

# KEYS: leases, stream, meta, stats, group_ids   ARGV: lease_id, group_id, payload
# Returns 1 stored, 0 duplicate group_id (nothing stored), -1 lease gone and buffer full.
# A live lease's slot turns into the new unread entry (leased-1, unread+1); without a live
# lease the group is stored only if a slot is free, so leased + unread <= capacity holds.
COMMIT = (
    _PRELUDE
    + """
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('SISMEMBER', KEYS[5], ARGV[2]) == 1 then return 0 end
if held == 0 then
  local used = redis.call('ZCARD', KEYS[1]) + unread_count(KEYS[2], KEYS[3])
  if used >= capacity(KEYS[3]) then return -1 end
end
local seq = redis.call('HINCRBY', KEYS[4], 'committed', 1)
redis.call('XADD', KEYS[2], '*', 'group_id', ARGV[2], 'seq', seq, 'payload', ARGV[3])
redis.call('SADD', KEYS[5], ARGV[2])
return 1
"""
)

# KEYS: leases   ARGV: lease_id, ttl_ms   Returns 1 if the live lease was extended, else 0.
RENEW = (
    _PRELUDE
    + """
local now = now_ms()
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

# KEYS: stream, stats   ARGV: consumer_group, state, entry_id...
# XACK + XDEL + count, per entry only if it was still pending: acking twice counts once.
# Counted entry by entry, so even a script aborted halfway leaves the counters consistent.
ACK = """
local n = 0
for i = 3, #ARGV do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then
    redis.call('XDEL', KEYS[1], ARGV[i])
    redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
    n = n + 1
  end
end
return n
"""

# KEYS: stream, dead, stats   ARGV: consumer_group, entry_id, reason, payload, foreign, counter
# Moves one pending entry to the dead-letter stream and counts it as ``counter``
# ("dropped_invalid" for a malformed payload, "dropped_poison" for one delivered too often).
# An entry that did not come through COMMIT (foreign == '1') is counted as committed here, so
# the conservation law also covers it once it has been read.
DEAD_LETTER = """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 then return 0 end  -- already handled (a retried call)
-- The one write that can fail (OOM) goes first: Lua does not roll back earlier writes.
redis.call('XADD', KEYS[2], '*', 'entry_id', ARGV[2], 'reason', ARGV[3], 'payload', ARGV[4])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if ARGV[5] == '1' then redis.call('HINCRBY', KEYS[3], 'committed', 1) end
redis.call('HINCRBY', KEYS[3], ARGV[6], 1)
return 1
"""

# KEYS: stream, leases, stats, meta   Returns one consistent snapshot (see STATS_FIELDS).
STATS = (
    _PRELUDE
    + """
local now = now_ms()
local c = redis.call('HMGET', KEYS[3], 'committed', 'trained', 'dropped_stale', 'dropped_invalid',
                     'dropped_poison', 'dropped_uniform')
local pending = pending_count(KEYS[1], KEYS[4])
local unread = math.max(0, redis.call('XLEN', KEYS[1]) - pending)
local leased = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local cap = tonumber(redis.call('HGET', KEYS[4], 'capacity')) or 0
local out = {}
for i = 1, 6 do out[i] = tonumber(c[i]) or 0 end  -- missing field (older data) = 0
for _, v in ipairs({unread, pending, leased, cap}) do out[#out + 1] = v end
return out
"""
)
STATS_FIELDS = (
    "committed",
    "trained",
    "dropped_stale",
    "dropped_invalid",
    "dropped_poison",
    "dropped_uniform",
    "unread",
    "pending",
    "leased",
    "capacity",
)
