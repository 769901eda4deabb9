"""Replay buffer: Redis Streams + Arrow IPC codec + staleness control + private redis-server.

Public API::

    encode_group, decode_group, PayloadError            buffer.codec
    ReplayBuffer, Entry, LeaseExpired, BufferDamaged    buffer.redis_buffer
    RedisServer, RedisServerError                       buffer.server
    connect, BufferUnavailable, mask_url                buffer.connection
    split_by_staleness, AdmissionGate, may_generate     buffer.staleness
"""

from buffer.codec import PayloadError, decode_group, encode_group
from buffer.connection import BufferUnavailable, connect, mask_url
from buffer.redis_buffer import BufferDamaged, Entry, LeaseExpired, ReplayBuffer
from buffer.server import RedisServer, RedisServerError
from buffer.staleness import AdmissionGate, may_generate, split_by_staleness

__all__ = [
    "AdmissionGate",
    "BufferDamaged",
    "BufferUnavailable",
    "Entry",
    "LeaseExpired",
    "PayloadError",
    "RedisServer",
    "RedisServerError",
    "ReplayBuffer",
    "connect",
    "decode_group",
    "encode_group",
    "mask_url",
    "may_generate",
    "split_by_staleness",
]
