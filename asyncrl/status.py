"""``asyncrl status``: one screen about a job, read from its buffer."""

from __future__ import annotations

from asyncrl.config import Config


def print_status(cfg: Config) -> int:
    from buffer.connection import connect, mask_url
    from buffer.redis_buffer import ReplayBuffer

    if not cfg.buffer.url:
        raise ValueError("asyncrl status needs buffer.url=redis://:PASSWORD@HOST:PORT/0 of the job")
    b = cfg.buffer
    buf = ReplayBuffer(connect(b.url), b.name, b.capacity, b.lease_ttl_s)
    stats = buf.stats()
    print(f"buffer {b.name!r} at {mask_url(b.url)}")
    print(f"  learner version {buf.learner_version()}   meta {buf.meta()}")
    for key in (
        "committed",
        "trained",
        "dropped_stale",
        "dropped_invalid",
        "unread",
        "pending",
        "leased",
        "capacity",
    ):
        print(f"  {key:16s} {stats[key]}")
    return 0
