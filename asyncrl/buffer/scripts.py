"""Lua scripts for every multi-key state change of ``ReplayBuffer`` (each runs atomically).

Keys of a buffer named ``N`` (passed in KEYS, never built inside a script)::

    N            stream: one entry per committed group, fields group_id, seq, payload
                 (seq = the committed count it made; marks entries that came through COMMIT)
    N:commits    hash: entry id -> seq, one record per committed entry still in the stream;
                 an entry without its record (or with another seq) was added from outside
                 the job (a forged or foreign entry) and is dead-lettered when read
    N:dead       stream: dead letters, fields entry_id, reason, payload
    N:leases     zset: lease_id -> expiry (server time, ms); expired members are reclaimed
                 lazily by the scripts below (the server clock is the only clock used)
    N:stats      hash: committed and one counter per terminal state: trained, dropped_stale,
                 dropped_invalid, dropped_poison, dropped_uniform (monotone; a field missing
                 in data written by an older version reads as 0)
    N:meta       hash: capacity, consumer_group, learner_version, learner_wants and
                 learner_wants_from (groups the learner still needs for the step it reads,
                 as of that delivered id: buffer.admission=window), learner_last_version
                 (the version its last step reads at: no window reaches past it),
                 delivered_upto (the newest entry id ever delivered to the learner) and
                 delivered_to (its consumer), user keys (set_meta)
    N:group_ids  set: every group_id ever committed (idempotent commit)
    N:wake       list: a token per slot freed by a read or a release (trimmed to capacity);
                 an actor whose LEASE found the buffer full BLPOPs it (no busy polling)

``unread`` = stream length - entries pending in the learner's consumer group: acked and
dead-lettered entries are XDELed in the same script that XACKs them, so every entry still in
the stream is either unread or pending, and every entry up to ``delivered_upto`` is pending.
That is what lets REGROUP rebuild a consumer group destroyed from outside exactly.

State that is missing or not a number where a script needs it raises an error reply
``BUFFERSTATE <key> field <f> ...`` naming the key; ``ReplayBuffer`` turns it into
``BufferDamaged`` with the fix. A missing consumer group raises ``NOGROUP ...`` (XACK alone
would answer 0 and lose the acks silently).
"""

_PRELUDE = """
local function damaged(msg) error({err = 'BUFFERSTATE ' .. msg}) end
local function int(key, field, value)  -- nil if missing; the key's damage if not an integer
  if not value then return nil end
  if not string.match(value, '^%-?%d+$') then
    damaged(key .. ' field ' .. field .. ' is ' .. string.format('%q', value) ..
            ', not an integer')
  end
  return tonumber(value)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function has_group(stream, g)
  if redis.call('EXISTS', stream) == 0 then return false end
  local res = redis.pcall('XPENDING', stream, g)
  return type(res) == 'table' and not res.err
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
  local cap = int(meta, 'capacity', redis.call('HGET', meta, 'capacity'))
  if not cap then damaged(meta .. ' field capacity is missing') end
  return cap
end
local function require_group(stream, g)
  if not has_group(stream, g) then
    error({err = 'NOGROUP consumer group ' .. g .. ' of stream ' .. stream .. ' is missing'})
  end
end
"""

# KEYS: leases, stream, meta
# ARGV: ttl_ms, weights_version, max_staleness, batch_groups, lease_id...
# Grants the first g of the given lease ids, g = min(their number, capacity - live leases -
# unread); returns g (0 = full). One call reserves several slots (an actor refilling its
# engine after a batch of groups finished makes one round trip, not one per group).
# max_staleness >= 0 (buffer.admission=window) also caps leased + unread at the admission
# window, from the meta's learner_version and learner_wants read in the same script:
# wants + min(max_staleness - lag, learner_last_version - learner_version) * batch_groups,
# lag = max(0, learner_version - weights_version), the min only once learner_last_version is set
# (buffer/staleness.py ``admission_window``, the spec; a test holds the two equal). ``wants``
# is learner_wants less the entries still pending that were delivered after it was set
# (ids above learner_wants_from): XREADGROUP moves an entry from unread to pending atomically,
# so no moment counts a group as free and as wanted at once; one dropped (acked) comes back
# into wants, as the learner then needs another.
# max_staleness = -1: no window (buffer.admission=capacity).
LEASE = (
    _PRELUDE
    + """
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local used = redis.call('ZCARD', KEYS[1]) + unread_count(KEYS[2], KEYS[3])
local limit = capacity(KEYS[3])
local bound = tonumber(ARGV[3])
if bound >= 0 then
  local lv = int(KEYS[3], 'learner_version', redis.call('HGET', KEYS[3], 'learner_version')) or -1
  local wants = int(KEYS[3], 'learner_wants', redis.call('HGET', KEYS[3], 'learner_wants')) or 0
  if wants > 0 then  -- less the entries delivered since the learner said so (its read so far)
    local from = redis.call('HGET', KEYS[3], 'learner_wants_from') or '0-0'
    local g = redis.call('HGET', KEYS[3], 'consumer_group')
    local got = g and redis.pcall('XPENDING', KEYS[2], g, '(' .. from, '+', wants)
    if type(got) == 'table' and not got.err then wants = math.max(0, wants - #got) end
  end
  local ahead = bound - math.max(0, lv - tonumber(ARGV[2]))
  local last = int(KEYS[3], 'learner_last_version',
                   redis.call('HGET', KEYS[3], 'learner_last_version'))
  if last then ahead = math.min(ahead, last - lv) end
  local window = math.max(0, wants + ahead * tonumber(ARGV[4]))
  limit = math.min(limit, window)
end
local granted = math.max(0, math.min(limit - used, #ARGV - 4))
local expiry = now + tonumber(ARGV[1])
for i = 5, granted + 4 do
  redis.call('ZADD', KEYS[1], expiry, ARGV[i])
end
return granted
"""
)

# KEYS: meta   ARGV: wants   (buffer.admission=window; the learner, before a read)
# learner_wants = wants, learner_wants_from = delivered_upto (the newest id delivered so far),
# so that LEASE counts only the entries delivered after this as read against wants.
WANTS = (
    _PRELUDE
    + """
local upto = redis.call('HGET', KEYS[1], 'delivered_upto') or '0-0'
redis.call('HSET', KEYS[1], 'learner_wants', ARGV[1], 'learner_wants_from', upto)
return 1
"""
)

# KEYS: leases, stream, meta, stats, group_ids, commits[, inflight]
# ARGV: lease_id, group_id, payload[, index]
# Returns 1 stored, 0 duplicate group_id (nothing stored), -1 lease gone and buffer full.
# With the optional 7th key, ``index`` leaves that set (the prompt cursor's in-flight set,
# buffer/cursors.py) when the result is 1 or 0: the group and its prompt's "done" land
# together, so no kill can fall between them.
# A live lease's slot turns into the new unread entry (leased-1, unread+1); without a live
# lease the group is stored only if a slot is free, so leased + unread <= capacity holds.
# The capacity is checked on every commit, so a wiped meta hash fails the actor at once.
COMMIT = (
    _PRELUDE
    + """
local now = now_ms()
local cap = capacity(KEYS[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('SISMEMBER', KEYS[5], ARGV[2]) == 1 then
  if KEYS[7] then redis.call('SREM', KEYS[7], ARGV[4]) end
  return 0
end
if held == 0 then
  local used = redis.call('ZCARD', KEYS[1]) + unread_count(KEYS[2], KEYS[3])
  if used >= cap then return -1 end
end
int(KEYS[4], 'committed', redis.call('HGET', KEYS[4], 'committed'))
local seq = redis.call('HINCRBY', KEYS[4], 'committed', 1)
local id = redis.call('XADD', KEYS[2], '*', 'group_id', ARGV[2], 'seq', seq, 'payload', ARGV[3])
redis.call('HSET', KEYS[6], id, seq)
redis.call('SADD', KEYS[5], ARGV[2])
if KEYS[7] then redis.call('SREM', KEYS[7], ARGV[4]) end
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

# KEYS: stream, stats, commits   ARGV: consumer_group, state, entry_id...
# XACK + XDEL + count, per entry only if it was still pending: acking twice counts once.
# Counted entry by entry, so even a script aborted halfway leaves the counters consistent.
# A missing group is an error (NOGROUP), not "0 acked": the acks would be lost.
ACK = (
    _PRELUDE
    + """
require_group(KEYS[1], ARGV[1])
int(KEYS[2], ARGV[2], redis.call('HGET', KEYS[2], ARGV[2]))
local n = 0
for i = 3, #ARGV do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then
    redis.call('XDEL', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[3], ARGV[i])
    redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
    n = n + 1
  end
end
return n
"""
)

# KEYS: stream, dead, stats, commits   ARGV: consumer_group, entry_id, reason, payload, counter
# Moves one pending entry to the dead-letter stream and counts it as ``counter``
# ("dropped_invalid" for a malformed or forged entry, "dropped_poison" for one delivered too
# often). An entry without its commit record did not come through COMMIT: it is counted as
# committed here, so the conservation law also covers it once it has been read.
DEAD_LETTER = (
    _PRELUDE
    + """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 then return 0 end  -- already handled (a retried call)
for _, f in ipairs({'committed', ARGV[5]}) do int(KEYS[3], f, redis.call('HGET', KEYS[3], f)) end
-- The one write that can fail (OOM) goes first: Lua does not roll back earlier writes.
redis.call('XADD', KEYS[2], '*', 'entry_id', ARGV[2], 'reason', ARGV[3], 'payload', ARGV[4])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('HDEL', KEYS[4], ARGV[2]) == 0 then redis.call('HINCRBY', KEYS[3], 'committed', 1) end
redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
return 1
"""
)

# KEYS: meta, commits   ARGV: consumer, entry_id...   (the ids just delivered to consumer)
# Records the newest delivered id (meta delivered_upto, delivered_to) for REGROUP and returns
# each entry's commit record (its seq, or false: not committed through COMMIT).
DELIVERED = (
    _PRELUDE
    + """
local function id_key(key, field, id)
  local ms, sq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then damaged(key .. ' field ' .. field .. ' is ' .. string.format('%q', id) ..
                         ', not a stream entry id') end
  return tonumber(ms), tonumber(sq)
end
local upto = redis.call('HGET', KEYS[1], 'delivered_upto')
local best = upto
for i = 2, #ARGV do
  local ms, sq = id_key('entry', 'id', ARGV[i])
  if best then
    local bms, bsq = id_key(KEYS[1], 'delivered_upto', best)
    if ms > bms or (ms == bms and sq > bsq) then best = ARGV[i] end
  else
    best = ARGV[i]
  end
end
if best and best ~= upto then
  redis.call('HSET', KEYS[1], 'delivered_upto', best, 'delivered_to', ARGV[1])
end
if #ARGV < 2 then return {} end
return redis.call('HMGET', KEYS[2], unpack(ARGV, 2))
"""
)

# KEYS: stream, meta   ARGV: consumer_group, consumer ('' = meta delivered_to), had ('1' if
# the caller held the group, so its loss is damage even if nothing was delivered yet).
# Returns {'exists'} | {'created'} | {'repaired', delivered_upto, re-delivered count}.
# Nothing delivered yet (no delivered_upto): the group is created at 0 (MKSTREAM), as on a
# first start. Otherwise the group was destroyed from outside (XGROUP DESTROY): it is
# recreated where it was. Entries up to delivered_upto still in the stream are exactly the
# pending ones (acked entries are deleted), so they are delivered again to the consumer
# (pending once more, delivery count 1) and the group's position is set back to
# delivered_upto: no trained group is read again as new, and their acks still count.
# A missing stream or meta field means the buffer was flushed or deleted: BUFFERSTATE.
REGROUP = (
    _PRELUDE
    + """
local stream, meta, g = KEYS[1], KEYS[2], ARGV[1]
if has_group(stream, g) then return {'exists'} end
local upto = redis.call('HGET', meta, 'delivered_upto')
if not upto and ARGV[3] ~= '1' then
  redis.call('XGROUP', 'CREATE', stream, g, '0', 'MKSTREAM')
  return {'created'}
end
capacity(meta)
local owner = redis.call('HGET', meta, 'consumer_group')
if owner ~= g then
  damaged(meta .. ' field consumer_group is ' ..
          (owner and string.format('%q', owner) or 'missing') .. ' (expected ' .. g .. ')')
end
if redis.call('EXISTS', stream) == 0 then
  damaged(stream .. ' (the stream of committed groups) is missing')
end
upto = upto or '0-0'
redis.call('XGROUP', 'CREATE', stream, g, '0')
local n = 0
if upto ~= '0-0' then
  n = #redis.call('XRANGE', stream, '-', upto)
  local consumer = ARGV[2]
  if consumer == '' then consumer = redis.call('HGET', meta, 'delivered_to') or 'learner' end
  if n > 0 then
    redis.call('XREADGROUP', 'GROUP', g, consumer, 'COUNT', n, 'STREAMS', stream, '>')
  end
  redis.call('XGROUP', 'SETID', stream, g, upto)
end
return {'repaired', upto, n}
"""
)

# KEYS: stream, leases, stats, meta, commits   ARGV: consumer_group to audit ('' = none)
# One consistent snapshot: STATS_FIELDS, then group_ok, stream length, commit records.
# Counters and the capacity must be integers (else BUFFERSTATE naming the field). With a
# consumer group to audit (the learner's per-step check), the meta must still name it and
# learner_version must be an integer: a wiped meta hash (FLUSHDB) or a hand edit is damage.
STATS = (
    _PRELUDE
    + """
local now = now_ms()
local names = {'committed', 'trained', 'dropped_stale', 'dropped_invalid', 'dropped_poison',
               'dropped_uniform'}
local c = redis.call('HMGET', KEYS[3], unpack(names))
local out = {}
for i = 1, 6 do out[i] = int(KEYS[3], names[i], c[i]) or 0 end  -- missing (older data) = 0
local cap = capacity(KEYS[4])
local g = ARGV[1] or ''
if g ~= '' then
  local owner = redis.call('HGET', KEYS[4], 'consumer_group')
  if owner ~= g then
    damaged(KEYS[4] .. ' field consumer_group is ' ..
            (owner and string.format('%q', owner) or 'missing') .. ' (expected ' .. g .. ')')
  end
  int(KEYS[4], 'learner_version', redis.call('HGET', KEYS[4], 'learner_version'))
end
local pending = pending_count(KEYS[1], KEYS[4])
local xlen = redis.call('XLEN', KEYS[1])
local unread = math.max(0, xlen - pending)
local leased = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
for _, v in ipairs({unread, pending, leased, cap}) do out[#out + 1] = v end
local group_ok = 1
if g ~= '' and not has_group(KEYS[1], g) then group_ok = 0 end
for _, v in ipairs({group_ok, xlen, redis.call('HLEN', KEYS[5])}) do out[#out + 1] = v end
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
AUDIT_FIELDS = ("group_ok", "stream_len", "commit_records")
"""What STATS returns after ``STATS_FIELDS`` (see ``ReplayBuffer.audit``)."""
