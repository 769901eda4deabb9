"""Replay buffer: Redis Streams + Arrow IPC codec + staleness control + private redis-server.

Public API::

    encode_group, decode_group, PayloadError            asyncrl.buffer.codec
    ReplayBuffer, LeaseExpired                          asyncrl.buffer.redis_buffer
    ActorBuffer, LearnerBuffer, BufferHandle            asyncrl.buffer.faces (its two faces)
    BufferDamaged                                       asyncrl.buffer.store
    Entry                                               asyncrl.buffer.stream_reads
    PromptCursor, SyncQuota                             asyncrl.buffer.cursors
    RedisServer, RedisServerError                       asyncrl.buffer.service.server
    connect, BufferUnavailable, mask_url                asyncrl.buffer.connection
    within_staleness, split_by_staleness, staleness     asyncrl.buffer.staleness
"""

from asyncrl.buffer.codec import PayloadError, decode_group, encode_group
from asyncrl.buffer.connection import BufferUnavailable, connect, mask_url
from asyncrl.buffer.cursors import PromptCursor, SyncQuota
from asyncrl.buffer.faces import ActorBuffer, BufferHandle, LearnerBuffer
from asyncrl.buffer.redis_buffer import LeaseExpired, ReplayBuffer
from asyncrl.buffer.service.server import RedisServer, RedisServerError
from asyncrl.buffer.staleness import split_by_staleness, staleness, within_staleness
from asyncrl.buffer.store import BufferDamaged
from asyncrl.buffer.stream_reads import Entry

__all__ = [
    "ActorBuffer",
    "BufferDamaged",
    "BufferHandle",
    "BufferUnavailable",
    "Entry",
    "LeaseExpired",
    "LearnerBuffer",
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
