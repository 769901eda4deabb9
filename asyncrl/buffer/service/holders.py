"""Who still holds a buffer: the learner's claim (buffer/learner_claim.py) and the actors' ids
(buffer/actor_ids.py). ``asyncrl launch buffer``, asked to stop while its job stops too (a
scheduler signals every role at once), serves on until nothing holds it, so the learner can
write its last checkpoint and ``summary.json`` and the actors release their ids."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from asyncrl.buffer.learner_claim import claim_key

if TYPE_CHECKING:
    import redis

SCAN_COUNT = 1000


def holders(client: redis.Redis, name: str) -> list[str]:
    """What holds buffer ``name`` now, in words: ``the learner (host H, pid P)`` while its
    claim is live, ``actor ids [..]`` while any actor id is held (a released id is set to ''
    for a millisecond); ``[]`` when nothing does."""
    found = []
    raw = client.get(claim_key(name))
    if raw:
        try:
            who = json.loads(raw)
            found.append(f"the learner (host {who.get('host', '?')}, pid {who.get('pid', '?')})")
        except (ValueError, AttributeError):
            found.append("the learner")
    prefix = f"{name}:actor_id:"
    keys = sorted(client.scan_iter(match=prefix + "*", count=SCAN_COUNT))
    values = client.mget(keys) if keys else []
    ids = sorted(
        int(_text(k)[len(prefix) :])
        for k, v in zip(keys, values, strict=True)
        if v and _text(k)[len(prefix) :].isdigit()
    )
    if ids:
        found.append(f"actor ids {ids}")
    return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
