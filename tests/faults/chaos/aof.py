"""The buffer's history, read from redis-server's append-only file: every write Redis made,
in the order it made them. The chaos checker (checker.py) judges this history; nothing here
imports asyncrl.

redis-server runs with ``appendonly yes`` and ``appendfsync always``: each command it executed
is in the AOF before its reply went out, Lua scripts as their effects wrapped in
``MULTI``/``EXEC`` (one transaction), so the AOF is the complete, ordered list of what every
role durably did to the buffer, kills and restarts of Redis included. Redis 7 keeps it in
``appendonlydir/``: a base file and ``appendonly.aof.<n>.incr.aof`` files; a rewrite (after a
restart that dropped a torn tail) starts the next ``n`` and deletes the older files, so the
chaos harness hard-links every file as it appears (``observe.AofTap``) and the history is the
incr files ``1..N`` in order.

What the history gives per committed entry of the stream ``N`` (the buffer's name), using
only the key layout of asyncrl/buffer/scripts.py and the delivery-count protocol of
docs/reliability.md ("Poison"):

- its commit: ``XADD N <id> group_id G seq S payload P`` (``P``: Arrow IPC, read here with
  pyarrow: the token versions, the actor), and the lease it used (``ZREM N:leases L`` in the
  same transaction; the lease was granted by the first ``ZADD N:leases <expiry> L``);
- every delivery to the learner (``XCLAIM ... RETRYCOUNT c``: a read counts 1, a re-read
  handed to a step ``c+1``) and every completed step with it (``RETRYCOUNT 0``, set right
  after the step ran, before the learner publishes its next version): the version the step
  read at is the meta's ``learner_version`` at that moment;
- its end: ``XDEL N <id>`` with the ``HINCRBY N:stats <state> 1`` of the same transaction.

and per learner incarnation (a new token in ``SET N:learner``): its start version (the next
``HSET N:meta learner_version``) and every version it published.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TERMINAL = ("trained", "dropped_stale", "dropped_invalid", "dropped_poison", "dropped_uniform")
"""The counted end states of a committed group (a counter each in ``N:stats``)."""
_INCR = re.compile(r"appendonly\.aof\.(\d+)\.incr\.aof")


class AofError(ValueError):
    """The AOF is not a sequence of RESP commands (other than a torn last command)."""


def parse(data: bytes) -> tuple[list[list[bytes]], int]:
    """The commands of an AOF (RESP arrays of bulk strings) and the number of bytes of a torn
    last command (a kill mid-write; 0 if none)."""
    cmds: list[list[bytes]] = []
    i, n = 0, len(data)
    while i < n:
        start = i
        try:
            if data[i : i + 1] != b"*":
                raise AofError(f"byte {i}: expected '*', got {data[i : i + 12]!r}")
            j = data.index(b"\r\n", i)
            count = int(data[i + 1 : j])
            i = j + 2
            args = []
            for _ in range(count):
                if data[i : i + 1] != b"$":
                    if i >= n:
                        raise IndexError
                    raise AofError(f"byte {i}: expected '$', got {data[i : i + 12]!r}")
                j = data.index(b"\r\n", i)
                size = int(data[i + 1 : j])
                i = j + 2
                if i + size + 2 > n:
                    raise IndexError
                args.append(data[i : i + size])
                i += size + 2
        except (ValueError, IndexError) as e:
            if isinstance(e, AofError):
                raise
            return cmds, n - start  # torn: the rest is one unfinished command
        cmds.append(args)
    return cmds, 0


def transactions(cmds: Iterable[list[bytes]]) -> list[list[list[bytes]]]:
    """Commands grouped as Redis ran them: a ``MULTI`` ... ``EXEC`` block is one transaction,
    any other command one of its own; an unfinished block at the end is dropped (Redis drops
    it too when it loads the file)."""
    out: list[list[list[bytes]]] = []
    block: list[list[bytes]] | None = None
    for c in cmds:
        name = c[0].upper()
        if name == b"MULTI":
            block = []
        elif name == b"EXEC":
            if block is not None:
                out.append(block)
            block = None
        elif block is not None:
            block.append(c)
        else:
            out.append([c])
    return out


def incr_files(folder: Path) -> list[Path]:
    """The incr files in ``folder``, by their number."""
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _INCR.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def read_files(files: Sequence[Path]) -> tuple[list[list[list[bytes]]], list[str]]:
    """The transactions of ``files`` in order, and problems: a gap in their numbers, a torn
    command anywhere but at the end of the last file (Redis cuts a torn tail off when it loads
    the file, before it writes more). An unfinished ``MULTI`` block at the end of a file is
    dropped, as Redis drops it."""
    problems: list[str] = []
    nums = [int(m.group(1)) for p in files if (m := _INCR.fullmatch(Path(p).name))]
    if nums != list(range(1, len(nums) + 1)):
        problems.append(f"the AOF incr files are not 1..N: {nums} (a file was missed)")
    txs: list[list[list[bytes]]] = []
    for k, path in enumerate(files):
        part, torn = parse(Path(path).read_bytes())
        if torn and k != len(files) - 1:
            problems.append(f"{Path(path).name} ends in a torn command of {torn} bytes")
        txs.extend(transactions(part))
    return txs, problems


# -- payloads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    actor_id: int
    version_min: int
    version_max: int
    monotone: bool
    """Each sample's token versions never decrease along the completion."""


def read_payload(payload: bytes) -> Payload:
    """The token versions and the actor of a group payload (Arrow IPC, one record batch with a
    ``token_versions`` list column; the actor in the schema metadata), read with pyarrow."""
    import pyarrow as pa

    reader = pa.ipc.open_stream(pa.py_buffer(payload))
    batch = reader.read_next_batch()
    meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    rows = batch.column(batch.schema.get_field_index("token_versions")).to_pylist()
    flat = [v for row in rows for v in row]
    monotone = all(a <= b for row in rows for a, b in zip(row, row[1:], strict=False))
    return Payload(int(meta.get("asyncrl.actor_id", -1)), min(flat), max(flat), monotone)


# -- the history ------------------------------------------------------------------------------


@dataclass
class Step:
    """A completed step with an entry: the transaction, the version it read at, the learner
    incarnation that ran it."""

    tx: int
    version: int
    incarnation: int


@dataclass
class Entry:
    entry_id: str
    group_id: str
    commit_tx: int
    commit_ms: int
    payload: Payload | None
    actor: int = -1
    """The actor whose prompt cursor the commit took the prompt index off (``N:inflight:<a>``)."""
    claim_tx: int = -1
    """When that actor claimed the prompt index (before it generated anything for it)."""
    sent_max: int = -1
    """The newest version the learner had sent (``weights_sent_max``) when it was committed."""
    deliveries: list[tuple[int, int]] = field(default_factory=list)
    """(transaction, delivery count) of every delivery (``RETRYCOUNT`` >= 1)."""
    steps: list[Step] = field(default_factory=list)
    ends: list[tuple[str, int, int]] = field(default_factory=list)
    """(state, transaction, the learner's version then) of each counted end (one is right)."""


@dataclass
class Incarnation:
    """One learner process, from its claim on the buffer."""

    tx: int
    token: str
    pid: int
    ms: int
    """A lower bound of when it started (the newest server time seen before its claim)."""
    sent_before: int = -1
    """The newest version any learner of the run had sent before it opened."""
    opened: bool = False
    """It published its meta (``learner_run_dir``: hub.start). Until then what the history
    shows of a learner is the previous one's: a killed learner's last commands can reach
    Redis after its successor's claim when Redis was stopped meanwhile, never after the
    successor's next round trips."""
    versions: list[tuple[int, int]] = field(default_factory=list)
    """(transaction, version) of every ``learner_version`` it published; the first is where
    it resumed."""

    @property
    def start_version(self) -> int | None:
        return self.versions[0][1] if self.versions else None


@dataclass
class History:
    name: str
    entries: dict[str, Entry] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    incarnations: list[Incarnation] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    """``N:stats`` as the HINCRBYs left it."""
    group_ids: set[str] = field(default_factory=set)
    dead: int = 0
    """Entries added to ``N:dead``."""
    problems: list[str] = field(default_factory=list)
    """What does not fit the key layout: a deletion without a counted state, a count without
    a deletion, a commit without its counter, an unknown entry."""
    clock: list[int] = field(default_factory=list)
    """Per transaction, the newest server time (ms) seen so far: a lower bound of its time
    (commits carry the server's time in their entry ids)."""
    stamped: set[int] = field(default_factory=set)
    """The transactions that carry a time of their own (commits)."""

    def live(self) -> list[str]:
        """Entries committed and not ended: what the stream holds at the end."""
        return [e for e in self.order if not self.entries[e].ends]

    def tx_span(self, t_ms: float, slack_ms: float) -> tuple[int, int]:
        """(lo, hi): transactions before ``lo`` ran before ``t_ms`` and those after ``hi``
        after it, give or take ``slack_ms`` (from the commits' times)."""
        lower, upper, nxt = self.clock, [0.0] * len(self.clock), float("inf")
        for k in range(len(lower) - 1, -1, -1):  # the next commit's time bounds it above
            if k in self.stamped:
                nxt = lower[k]
            upper[k] = nxt
        lo = next((k for k, u in enumerate(upper) if u >= t_ms - slack_ms), len(upper))
        hi = max((k for k, v in enumerate(lower) if v <= t_ms + slack_ms), default=-1)
        return lo, hi


def replay(txs: list[list[list[bytes]]], name: str, decode: bool = True) -> History:
    """The ``History`` of buffer ``name`` from its AOF transactions (module docstring)."""
    h = History(name)
    stream, stats, meta = name.encode(), f"{name}:stats".encode(), f"{name}:meta".encode()
    dead, group_ids = f"{name}:dead".encode(), f"{name}:group_ids".encode()
    claim_key, inflight = f"{name}:learner".encode(), f"{name}:inflight:".encode()
    version, sent_max, clock = -1, -1, 0
    claims: dict[tuple[int, str], int] = {}
    for k, tx in enumerate(txs):
        deleted: list[str] = []
        commit: dict = {}
        for c in tx:
            op, key = c[0].upper(), c[1] if len(c) > 1 else b""
            if op == b"XADD" and key == stream:
                eid = c[2].decode()
                commit.update(id=eid, fields=dict(zip(c[3::2], c[4::2], strict=False)))
                clock = max(clock, int(eid.split("-")[0]))
                h.stamped.add(k)
            elif op == b"XADD" and key == dead:
                h.dead += 1
            elif op == b"XDEL" and key == stream:
                deleted += [i.decode() for i in c[2:]]
            elif op == b"HINCRBY" and key == stats:
                fld, by = c[2].decode(), int(c[3])
                h.stats[fld] = h.stats.get(fld, 0) + by
                if fld in TERMINAL:
                    for _ in range(by):
                        if not deleted:
                            h.problems.append(f"tx {k}: {fld} counted without an entry deleted")
                            break
                        _end(h, deleted.pop(0), fld, k, version)
                elif fld == "committed" and not any(
                    x[0].upper() == b"XADD" and x[1] == stream for x in tx
                ):
                    h.problems.append(f"tx {k}: committed counted without a commit")
            elif op == b"XCLAIM" and key == stream:
                eid, count = c[5].decode(), _option(c, b"RETRYCOUNT")
                e = h.entries.get(eid)
                if e is None:
                    h.problems.append(f"tx {k}: {eid} delivered but never committed")
                elif count == 0:
                    # a second 0 with no delivery since is the same step's command again (a
                    # call retried after Redis ran it and the reply was lost): one step
                    last = e.deliveries[-1][0] if e.deliveries else -1
                    if not e.steps or e.steps[-1].tx < last:
                        e.steps.append(Step(k, version, _current(h)))
                elif count is not None:
                    e.deliveries.append((k, count))
            elif op == b"HSET" and key == meta:
                pairs = dict(zip(c[2::2], c[3::2], strict=False))
                if b"learner_run_dir" in pairs and h.incarnations:
                    inc = h.incarnations[-1]
                    inc.opened = True
                    inc.sent_before = max([sent_max] + [v for i in h.incarnations
                                                        for _, v in i.versions])  # fmt: skip
                if b"learner_version" in pairs:
                    version = int(pairs[b"learner_version"])
                    if _current(h) >= 0:
                        h.incarnations[_current(h)].versions.append((k, version))
                if b"weights_sent_max" in pairs:
                    sent_max = max(sent_max, int(pairs[b"weights_sent_max"]))
            elif op == b"SET" and key == claim_key:
                claim = json.loads(c[2])
                token, pid = str(claim.get("token")), int(claim.get("pid", -1))
                if not h.incarnations or h.incarnations[-1].token != token:
                    h.incarnations.append(Incarnation(k, token, pid, clock))
            elif op == b"SADD" and key.startswith(inflight):
                actor = int(key[len(inflight) :])
                for m in c[2:]:
                    claims.setdefault((actor, m.decode()), k)
            elif op == b"SREM" and key.startswith(inflight) and len(c) > 2:
                commit.update(actor=int(key[len(inflight) :]), index=c[2].decode())
            elif op == b"SADD" and key == group_ids:
                h.group_ids.update(m.decode() for m in c[2:])
        if "id" in commit:
            _commit(h, commit, k, claims, sent_max, decode)
        for eid in deleted:
            h.problems.append(f"tx {k}: {eid} deleted from the stream without a counted state")
        h.clock.append(clock)
    return h


def _current(h: History) -> int:
    """The learner incarnation the commands come from now: the newest that opened (-1: none)."""
    for n in range(len(h.incarnations) - 1, -1, -1):
        if h.incarnations[n].opened:
            return n
    return -1


def _option(c: list[bytes], name: bytes) -> int | None:
    upper = [a.upper() for a in c]
    if name in upper:
        return int(c[upper.index(name) + 1])
    return None


def _end(h: History, eid: str, state: str, k: int, version: int) -> None:
    e = h.entries.get(eid)
    if e is None:
        h.problems.append(f"tx {k}: {eid} counted {state} but never committed")
        return
    e.ends.append((state, k, version))


def _commit(h: History, commit: dict, k: int, claims, sent_max: int, decode: bool) -> None:
    eid, fields = commit["id"], commit["fields"]
    if b"seq" not in fields:
        h.problems.append(f"tx {k}: {eid} added to the stream without a seq (not by COMMIT)")
    payload = None
    if decode and b"payload" in fields:
        try:
            payload = read_payload(fields[b"payload"])
        except Exception as e:  # a payload pyarrow cannot read: the learner dead-letters it
            h.problems.append(f"tx {k}: {eid}'s payload does not decode ({e})")
    e = Entry(eid, fields.get(b"group_id", b"").decode(), k, int(eid.split("-")[0]), payload)
    e.sent_max = sent_max
    if "actor" in commit:
        e.actor = commit["actor"]
        e.claim_tx = claims.get((e.actor, commit["index"]), -1)
    if eid in h.entries:
        h.problems.append(f"tx {k}: entry id {eid} added twice")
    h.entries[eid] = e
    h.order.append(eid)
