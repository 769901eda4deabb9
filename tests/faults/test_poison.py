"""Guarantee 7: a group that crashes the learner step every time is dead-lettered as poison
after ``buffer.max_deliveries`` deliveries; every other group is trained exactly once.

The learner is a real process (this file run as a script): the learner's own ``GroupSource``
over a ``ReplayBuffer`` on the session's real redis-server, "training" each batch and acking
it every ``CKPT_EVERY`` steps (a checkpoint). The poison group arms the failpoint
``learner.step/<group_id>`` (asyncrl/core/runtime/faults.py), which crashes the process right before the
step: alternately a Python exception and a real SIGKILL. The test restarts it until it exits 0
and, like actors that keep producing, commits a few new groups before every restart.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl.buffer.codec import decode_group
from asyncrl.buffer.connection import connect
from asyncrl.buffer.redis_buffer import BufferOptions, ReplayBuffer
from asyncrl.buffer.testing import random_group

pytestmark = [pytest.mark.faults, pytest.mark.redis]

VOCAB = 100
MAX_DELIVERIES = 3
BATCH = 2
CKPT_EVERY = 2
CAPACITY = 64
_TERMINAL = ("trained", "dropped_stale", "dropped_invalid", "dropped_poison", "dropped_uniform")
_REPO = Path(__file__).resolve().parents[2]


def conserved(s: dict) -> bool:
    """committed == every terminal state + still buffered (unread + pending)."""
    return s["committed"] == sum(s[k] for k in _TERMINAL) + s["unread"] + s["pending"]


def _learner_main(url: str, name: str, acked_log: str) -> int:
    """One learner life: resume, train batches, ack every CKPT_EVERY steps; 0 when drained."""
    from asyncrl.learner.hub.data import GroupSource

    buf = ReplayBuffer(connect(url), name, CAPACITY, BufferOptions(max_deliveries=MAX_DELIVERIES))
    # random_group's tokens come from versions 0-5: a learner of this run reached 5 before
    source = GroupSource(buf, "learner", VOCAB, max_staleness=1000, timeout_s=5.0, ceiling=5)
    source.resume()
    done: list = []
    step = 0
    while available := buf.stats()["unread"] + len(source._pending):
        done += source.next_batch(version=0, count=min(BATCH, available))  # crash point
        step += 1
        if step % CKPT_EVERY == 0:
            _ack(buf, done, acked_log)
            done = []
    _ack(buf, done, acked_log)
    return 0


def _ack(buf: ReplayBuffer, entries: list, acked_log: str) -> None:
    """The checkpoint: ack ``entries`` as trained, then log their group ids (one per line)."""
    if entries:
        buf.ack([e.entry_id for e in entries], "trained")
        with open(acked_log, "a") as f:
            f.write("".join(f"{e.group.group_id}\n" for e in entries))


def _run_learner(url: str, name: str, acked_log: Path, poison: list[str], life: int):
    """Start one learner life in a real process; return (returncode, stderr tail)."""
    action = "kill" if life % 2 else "raise"
    env = dict(os.environ, PYTHONPATH=str(_REPO))
    env["ASYNCRL_FAILPOINTS"] = ",".join(f"learner.step/{g}={action}@0" for g in poison)
    cmd = [sys.executable, __file__, url, name, str(acked_log)]
    proc = subprocess.run(cmd, env=env, cwd=_REPO, capture_output=True, text=True, timeout=90)
    return proc.returncode, proc.stderr[-2000:]


@pytest.mark.timeout(600)
def test_poison_group_is_dead_lettered_after_max_deliveries(
    redis_server, buffer_name, counts, tmp_path
):
    rounds, n_valid = counts(1, 3), 6
    rng = random.Random(20261122)
    buf = ReplayBuffer(
        connect(redis_server.url), buffer_name, CAPACITY, BufferOptions(max_deliveries=3)
    )
    poison, valid, crashes = [], [], []
    acked_log, t0 = tmp_path / "acked.txt", time.monotonic()
    for r in range(rounds):  # one poison group per round, amid valid ones
        poison.append(f"poison-{r}")
        ids = [f"ok-{r}-{i}" for i in range(n_valid)]
        valid += ids
        ids.append(poison[-1])
        rng.shuffle(ids)  # poison anywhere in the stream, including mid-batch
        _commit(buf, rng, ids)
        # the learner process connects as the least-privilege ACL user "learner"
        url = redis_server.url_for("learner")
        crashes += _crash_until_dead_lettered(buf, url, rng, acked_log, poison, valid)
    elapsed = time.monotonic() - t0

    s = buf.stats()
    assert conserved(s), s
    assert (s["dropped_poison"], s["trained"]) == (rounds, len(valid)), s
    assert (s["unread"], s["pending"], s["dropped_invalid"]) == (0, 0, 0), s
    trained = acked_log.read_text().split()
    assert sorted(trained) == sorted(valid), "every valid group trained (acked) exactly once"
    dead = buf.client.xrange(f"{buffer_name}:dead")
    assert sorted(decode_group(f[b"payload"]).group_id for _, f in dead) == sorted(poison)
    for _, f in dead:
        reason = f[b"reason"].decode()
        assert reason.startswith(f"poison: delivered {MAX_DELIVERIES} times"), reason
    kinds = {"raise": sum(rc == 1 for rc in crashes), "SIGKILL": sum(rc == -9 for rc in crashes)}
    print(f"\npoison: {rounds} poison + {len(valid)} valid groups, {len(crashes)} learner "
          f"crashes {kinds}, {elapsed:.1f}s")  # fmt: skip


def _crash_until_dead_lettered(buf, url, rng, acked_log, poison, valid) -> list[int]:
    """Restart the learner until it exits 0; return the crashed lives' return codes.

    Checks that the round's poison group was in exactly MAX_DELIVERIES crashed steps (its
    Redis delivery count went up once per crash) and that conservation held after each crash.
    """
    gid, r, crashes, last, tries = poison[-1], len(poison) - 1, [], 0, 0
    for life in range(MAX_DELIVERIES + 2):  # bounded: one more life than needed, + 1
        more = [f"ok-{r}-life{life}-{i}" for i in range(2 * BATCH)]  # actors keep producing
        _commit(buf, rng, more)
        valid += more
        rc, err = _run_learner(url, buf.name, acked_log, poison, life)
        if rc == 0:
            break
        crashes.append(rc)
        injected = rc == -9 or (rc == 1 and f"FailpointError: failpoint learner.step/{gid}" in err)
        assert injected, f"round {r} life {life} failed for another reason (rc {rc}):\n{err}"
        assert conserved(buf.stats()), buf.stats()
        now = _pending_counts(buf, [gid]).get(gid, 0)
        tries, last = tries + (now > last), now  # the count went up: one more crashed step
    else:
        pytest.fail(f"round {r}: learner never finished after {len(crashes)} crashes:\n{err}")
    assert (len(crashes), tries) == (MAX_DELIVERIES, MAX_DELIVERIES), (r, crashes, tries)
    return crashes


def _pending_counts(buf: ReplayBuffer, group_ids: list[str]) -> dict[str, int]:
    """{group id: Redis delivery count} of the pending entries among ``group_ids``."""
    rows = buf.client.xpending_range(buf.name, "learner", "-", "+", 10_000)
    counts = {r["message_id"]: r["times_delivered"] for r in rows}
    out = {}
    for eid, fields in buf.client.xrange(buf.name):
        gid = fields[b"group_id"].decode()
        if eid in counts and gid in group_ids:
            out[gid] = counts[eid]
    return out


def _commit(buf: ReplayBuffer, rng: random.Random, group_ids: list[str]) -> None:
    for gid in group_ids:
        lease = buf.lease(0, timeout_s=5.0)
        assert lease is not None, f"no free slot for {gid}: {buf.stats()}"
        assert buf.commit(lease, random_group(rng, gid, vocab_size=VOCAB))


@pytest.fixture
def buffer_name() -> str:
    """A fresh key prefix on the shared session redis-server."""
    return f"poison-{os.getpid()}-{time.monotonic_ns()}"


if __name__ == "__main__":
    sys.exit(_learner_main(*sys.argv[1:4]))
