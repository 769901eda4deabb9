"""Replay buffer: Redis Streams + Arrow IPC codec + staleness control + private redis-server.

Public API::

    encode_group, decode_group, PayloadError            buffer.codec
    ReplayBuffer, LeaseExpired                          buffer.redis_buffer
    BufferDamaged                                       buffer.store
    Entry                                               buffer.stream_reads
    PromptCursor, SyncQuota                             buffer.cursors
    RedisServer, RedisServerError                       buffer.server
    connect, BufferUnavailable, mask_url                buffer.connection
    within_staleness, split_by_staleness, staleness     buffer.staleness
"""

from buffer.codec import PayloadError, decode_group, encode_group
from buffer.connection import BufferUnavailable, connect, mask_url
from buffer.cursors import PromptCursor, SyncQuota
from buffer.redis_buffer import LeaseExpired, ReplayBuffer
from buffer.server import RedisServer, RedisServerError
from buffer.staleness import split_by_staleness, staleness, within_staleness
from buffer.store import BufferDamaged
from buffer.stream_reads import Entry

__all__ = [
    "BufferDamaged",
    "BufferUnavailable",
    "Entry",
    "LeaseExpired",
    "PayloadError",
    "PromptCursor",
    "RedisServer",
    "RedisServerError",
    "ReplayBuffer",
    "SyncQuota",
    "connect",
    "decode_group",
    "encode_group",
    "mask_url",
    "split_by_staleness",
    "staleness",
    "within_staleness",
]
