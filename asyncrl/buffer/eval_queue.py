"""The validation board in the buffer's Redis: the learner posts "validate version V", actors
claim chunks of the validation set and post one JSON record per prompt (no pickle).

Keys (``<name>`` = ``buffer.name``)::

    <name>:eval:request       JSON {"version": V, "size": N, "chunk": C, "samples": S}: the
                              one validation under way (absent: none); posting a new one
                              replaces it. The records of prompts 0..S-1 carry their text
                              (``sample``: eval.log_samples); a request without "samples"
                              (an older learner) asks for none
    <name>:eval:<V>:todo      list of chunk starts s; LPOP hands out prompt indices [s, s + C)
    <name>:eval:<V>:results   list of JSON records, one per prompt (actors/validation.py)

Invariants: a chunk start is popped by one actor (LPOP is atomic) until the learner puts it
back (``requeue``: the chunk of an actor that died, or is slow, goes to another actor; the
learner keeps the first record of each prompt index); the learner reads results from an
offset, so each record is read once; ``finish`` deletes a version's keys, and a restarted
learner clears every key here before its first request.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.buffer.faces import BufferHandle


class EvalQueue:
    """The board of one buffer; ``buffer`` is a ``ReplayBuffer`` (its client and retries)."""

    def __init__(self, buffer: BufferHandle) -> None:
        self._buffer = buffer
        self.client = buffer.client
        self._prefix = f"{buffer.name}:eval"

    def _key(self, version: int, what: str) -> str:
        return f"{self._prefix}:{version}:{what}"

    def _call(self, fn):
        call = getattr(self._buffer, "call", None)  # a real ReplayBuffer: reconnect + retry
        return call(fn) if call is not None else fn()

    def post(self, version: int, size: int, chunk: int, samples: int = 0) -> None:
        """Ask the actors to validate ``size`` prompts with the weights of ``version``, the
        first ``samples`` of them with their text in the record."""
        fields = {"version": version, "size": size, "chunk": chunk, "samples": samples}
        request = json.dumps({k: int(v) for k, v in fields.items()})
        keys = [self._key(version, "todo"), self._key(version, "results")]
        self._call(lambda: self.client.delete(*keys))
        self.requeue(version, range(0, size, chunk))
        self._call(lambda: self.client.set(f"{self._prefix}:request", request))

    def requeue(self, version: int, starts) -> None:
        """Hand the chunks starting at ``starts`` out again."""
        starts = [int(s) for s in starts]
        if starts:
            self._call(lambda: self.client.rpush(self._key(version, "todo"), *starts))

    def request(self) -> dict | None:
        """The validation under way (``version``, ``size``, ``chunk``, ``samples``), or None."""
        raw = self._call(lambda: self.client.get(f"{self._prefix}:request"))
        if raw is None:
            return None
        try:
            request = json.loads(raw)
            out = {k: int(request[k]) for k in ("version", "size", "chunk")}
            return out | {"samples": int(request.get("samples", 0))}
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"the validation request in {self._prefix}:request is not valid JSON with "
                f"version, size and chunk: {raw[:200]!r}; was the key written by another tool?"
            ) from None

    def claim(self, request: dict) -> range | None:
        """The next chunk of prompt indices of ``request`` for this actor; None when all are
        handed out."""
        c, n = request["chunk"], request["size"]
        key = self._key(request["version"], "todo")
        raw = self._call(lambda: self.client.lpop(key))
        if raw is None:
            return None
        start = int(raw)
        return range(start, min(start + c, n))

    def put(self, version: int, record: dict) -> None:
        """Post one prompt's record (JSON-serialisable) for the learner."""
        data = json.dumps(record)
        self._call(lambda: self.client.rpush(self._key(version, "results"), data))

    def results(self, version: int, start: int = 0) -> list[dict]:
        """Records of ``version`` from the ``start``-th on. A record that is not JSON is
        returned as ``{"malformed": <text>}`` (counted by the learner, not trained on)."""
        raw = self._call(lambda: self.client.lrange(self._key(version, "results"), start, -1))
        out = []
        for item in raw:
            try:
                record = json.loads(item)
            except ValueError:
                record = None
            out.append(record if isinstance(record, dict) else {"malformed": repr(item[:200])})
        return out

    def finish(self, version: int) -> None:
        """Withdraw the request (if it is still ``version``'s) and delete its keys."""
        current = self.request()
        if current is not None and current["version"] == version:
            self._call(lambda: self.client.delete(f"{self._prefix}:request"))
        keys = [self._key(version, "todo"), self._key(version, "results")]
        self._call(lambda: self.client.delete(*keys))

    def clear(self) -> None:
        """Delete every key of the board (a learner starting: no validation is under way)."""
        keys = list(self._call(lambda: list(self.client.scan_iter(f"{self._prefix}:*"))))
        if keys:
            self._call(lambda: self.client.delete(*keys))
