"""Per-episode API keys of the agent endpoint.

A key is minted when an episode opens (``"sk-asyncrl-" + secrets.token_urlsafe(32)``: 256
random bits), handed to the agent, and revoked when the episode ends. Only its sha256 is
kept, so a key never sits in the actor's memory after ``mint`` returns it. A revoked key's
hash stays in a bounded LRU of ended keys (``ENDED_KEYS``) with the episode's end, so a late
call is told that its episode ended (``EndedKey``) rather than that its key is wrong.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict

PREFIX = "sk-asyncrl-"
ENDED_KEYS = 4096
"""Ended keys remembered; an older one reads as unknown (the agent has long finished)."""


class UnknownKey(LookupError):
    """A key no episode was given (or one ended too long ago to remember)."""


class EndedKey(LookupError):
    """The key of an episode that ended; the message is its end (``max_tokens``, ...)."""


def key_hash(key: str) -> bytes:
    """[32] sha256 of ``key``: what the endpoint keeps and looks up."""
    return hashlib.sha256(key.encode()).digest()


class Keys:
    """Live keys (hash -> episode id) and the last ``ended`` ended ones (hash -> end).

    Invariant: a hash is live or ended, never both; ``len(self.ended) <= ended``."""

    def __init__(self, ended: int = ENDED_KEYS) -> None:
        if ended < 1:
            raise ValueError(f"Keys(ended={ended}): remember at least one ended key")
        self.cap = ended
        self.live: dict[bytes, str] = {}
        self.ended: OrderedDict[bytes, str] = OrderedDict()

    def mint(self, episode_id: str) -> tuple[str, bytes]:
        """A new key for ``episode_id`` and its hash (the key itself is not kept)."""
        key = PREFIX + secrets.token_urlsafe(32)
        h = key_hash(key)
        self.live[h] = episode_id
        return key, h

    def resolve(self, key: str) -> str:
        """The episode id of a live ``key``; ``EndedKey`` (its end) or ``UnknownKey``."""
        h = key_hash(key)
        if h in self.live:
            return self.live[h]
        if h in self.ended:
            self.ended.move_to_end(h)
            raise EndedKey(self.ended[h])
        raise UnknownKey("no episode has this key")

    def revoke(self, h: bytes, end: str) -> None:
        """End the key of hash ``h`` with the episode's ``end`` (idempotent: the first end
        stays)."""
        if self.live.pop(h, None) is None:
            return
        self.ended[h] = end
        while len(self.ended) > self.cap:
            self.ended.popitem(last=False)
