"""Damage to the buffer's own state is detected, named, and never silently
miscounted. Each case damages a real redis-server from outside, as a user's admin client
would, and checks what every role that touches the damaged state does:

- XGROUP DESTROY of the learner's group: rebuilt where it was, with a warning naming the key;
  the groups delivered before stay pending and count as trained when acked (not stale);
- an entry with a forged seq: dead-lettered as invalid with the reason, counted, the ledger
  balances;
- FLUSHDB, or a field that is not a number: ``BufferDamaged`` naming the key and the fix, for
  the actor's and the learner's calls alike (no Lua or ValueError traceback);
- the learner's per-step ledger check: an edited counter is reported once, with the counters
  and the difference, and summary.json's ``ledger`` block says the ledger did not balance.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from asyncrl.buffer.codec import encode_group
from asyncrl.buffer.connection import connect
from asyncrl.buffer.ledger import LedgerWatch
from asyncrl.buffer.redis_buffer import TERMINAL_STATES, BufferDamaged, ReplayBuffer
from asyncrl.buffer.service.server import RedisServer
from asyncrl.buffer.testing import random_group

pytestmark = [pytest.mark.faults, pytest.mark.redis]

VOCAB = 100
FIX = r"fresh buffer \(a new buffer\.name\)"  # every BufferDamaged says how to go on


def _group(gid: str, seed: int = 0):
    return random_group(random.Random(seed), gid, vocab_size=VOCAB, versions=(0, 0))


def _commit(buf: ReplayBuffer, gids) -> None:
    for i, gid in enumerate(gids):
        assert buf.commit(buf.lease(0, 1.0), _group(gid, seed=i))


def _conserved(s: dict) -> bool:
    return s["committed"] == sum(s[k] for k in TERMINAL_STATES) + s["unread"] + s["pending"]


# -- XGROUP DESTROY --------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("first_call", ["read", "ack", "audit", "restart"])
def test_xgroup_destroy_rebuilds_the_group_and_trained_groups_count_as_trained(
    redis_server, redis_client, buffer_name, first_call
):
    """8 groups trained but not yet acked (ack-on-checkpoint) when the group is destroyed:
    whichever call meets the loss first rebuilds the group where it was, so the next read
    hands out only new groups and the checkpoint's ack counts the 8 as trained."""
    buf = ReplayBuffer(redis_client, buffer_name, capacity=16)
    _commit(buf, [f"0:{i}" for i in range(12)])
    trained = buf.read("learner", 8, 0, VOCAB)
    assert len(trained) == 8
    redis_client.xgroup_destroy(buffer_name, "learner")  # the damage, from outside

    if first_call == "restart":  # destroyed while no learner ran: the resumed one rebuilds it
        buf = ReplayBuffer(connect(redis_server.url, 5.0), buffer_name, capacity=16)
    if first_call in ("read", "restart"):
        new = buf.read("learner", 8, 0, VOCAB)
        assert [e.group.group_id for e in new] == [f"0:{i}" for i in range(8, 12)]
    elif first_call == "audit":
        assert buf.audit()["imbalance"] == 0
    assert buf.ack([e.entry_id for e in trained], "trained") == 8
    s = buf.stats()
    assert (s["trained"], s["dropped_stale"], s["dropped_invalid"]) == (8, 0, 0), s
    assert s["pending"] + s["unread"] == 4 and _conserved(s), s
    [repair] = buf.repairs
    assert f"consumer group 'learner' of stream '{buffer_name}' was missing" in repair
    assert "XGROUP DESTROY" in repair and "8 group(s)" in repair


# -- forged seq ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_forged_seq_entries_are_dead_lettered_and_the_ledger_balances(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=16)
    _commit(buf, ["0:0", "0:1", "0:2"])
    [(real_id, real)] = redis_client.xrange(buffer_name, count=1)
    forged = {  # valid payloads: only the seq (or the whole entry) is forged
        "reused": {b"group_id": b"f:1", b"seq": b"2", b"payload": encode_group(_group("f:1"))},
        "future": {b"group_id": b"f:2", b"seq": b"999", b"payload": encode_group(_group("f:2"))},
        "copy": dict(real),  # an exact copy of a committed entry's fields
    }
    ids = {k: redis_client.xadd(buffer_name, f).decode() for k, f in forged.items()}
    a = buf.audit()  # unread forged entries are not groups yet: counted when read
    assert (a["foreign"], a["imbalance"], a["still_buffered"]) == (3, 0, 3), a

    got = buf.read("learner", 10, 0, VOCAB)
    assert [e.group.group_id for e in got] == ["0:0", "0:1", "0:2"]
    dead = dict(buf.dead_letters())
    assert set(dead) == set(ids.values())
    for reason in dead.values():
        assert reason.startswith("forged seq:") and f"{buffer_name}:commits" in reason, reason
    assert "seq='999'" in dead[ids["future"]] and "it added no such entry" in dead[ids["copy"]]
    buf.ack([e.entry_id for e in got], "trained")
    s = buf.stats()
    assert (s["committed"], s["trained"], s["dropped_invalid"]) == (6, 3, 3), s
    assert _conserved(s) and buf.audit()["imbalance"] == 0


# -- FLUSHDB ---------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_flushdb_mid_run_fails_every_role_naming_the_key(tmp_path):
    name = "flushed"
    with RedisServer(tmp_path / "redis", key_prefix=name) as server:
        actor = ReplayBuffer(connect(server.url_for("actor")), name, capacity=8)
        learner = ReplayBuffer(connect(server.url_for("learner")), name, capacity=8)
        _commit(actor, ["0:0", "0:1", "0:2"])
        held = learner.read("learner", 2, 0, VOCAB)
        lease = actor.lease(0, 1.0)
        admin = connect(server.url)
        admin.flushdb()  # the damage, from outside

        meta = f"{name}:meta field capacity is missing"
        for call in (
            lambda: actor.lease(0, 0.0),
            lambda: actor.commit(lease, _group("0:3")),
            lambda: actor.stats(),
            lambda: learner.read("learner", 1, 0, VOCAB),
            lambda: learner.ack([e.entry_id for e in held], "trained"),
            lambda: learner.audit(),
        ):
            with pytest.raises(BufferDamaged, match=f"{re.escape(meta)}.*{FIX}"):
                call()
        assert actor.learner_version() == -1  # nothing to misread: no version published

        # a role restarted after the flush writes the capacity again; the learner still
        # sees that the meta no longer names its consumer group, and stops
        ReplayBuffer(connect(server.url_for("actor")), name, capacity=8)
        consumer = f"{name}:meta field consumer_group is missing"
        for call in (lambda: learner.audit(), lambda: learner.read("learner", 1, 0, VOCAB)):
            with pytest.raises(BufferDamaged, match=f"{re.escape(consumer)}.*{FIX}"):
                call()
        admin.close()


# -- a field that is not a number ------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "key, field",
    [("meta", "learner_version"), ("meta", "capacity"), ("stats", "committed")],
)
def test_a_field_that_is_not_a_number_fails_its_readers_naming_the_key(
    redis_client, buffer_name, key, field
):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    _commit(buf, ["0:0"])
    buf.read("learner", 1, 0, VOCAB)
    buf.set_learner_version(3)
    redis_client.hset(f"{buffer_name}:{key}", field, "abc")  # the damage, from outside

    what = re.escape(f"{buffer_name}:{key} field {field} is ") + r"""["']abc["'], not an integer"""
    lease, commit = (lambda: buf.lease(0, 0.0)), (lambda: buf.commit("x", _group("0:1")))
    readers = {  # the calls of the roles that read the field: actor's, then learner's
        "learner_version": [buf.learner_version, buf.audit],
        "capacity": [lease, commit, buf.stats, buf.audit],
        "committed": [commit, buf.stats, buf.audit],
    }
    for call in readers[field]:
        with pytest.raises(BufferDamaged, match=f"{what}.*{FIX}"):
            call()
    if field == "capacity":  # a new role reads the capacity when it opens the buffer
        with pytest.raises(BufferDamaged, match=what):
            ReplayBuffer(redis_client, buffer_name, capacity=8)


# -- the learner's per-step ledger check -------------------------------------------------------


@pytest.mark.timeout(30)
def test_ledger_check_reports_an_edited_counter_once_with_the_difference(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    watch = LedgerWatch(buffer_name)
    _commit(buf, ["0:0", "0:1"])
    buf.read("learner", 1, 0, VOCAB)
    assert watch.check(buf.audit(), 0) == []
    redis_client.hincrby(f"{buffer_name}:stats", "trained", 2)  # the damage, from outside

    [line] = watch.check(buf.audit(), 1)
    assert line.startswith("WARNING: buffer ledger does not balance at step 1: committed 2 != ")
    assert "trained 2 + dropped_stale 0" in line and "still buffered 2 (= 4)" in line
    assert "2 group(s) more are accounted for than were committed" in line
    assert f"{buffer_name}:stats" in line and "fresh buffer.name" in line
    assert watch.check(buf.audit(), 2) == []  # the same difference: reported once
    redis_client.hincrby(f"{buffer_name}:stats", "trained", -2)
    [line] = watch.check(buf.audit(), 3)
    assert line.startswith("buffer ledger balances again at step 3: committed 2 == ")
    ledger = watch.to_dict()
    assert ledger["balanced"] and ledger["imbalance"] == 0, ledger
    assert ledger["imbalanced_steps"] == 2 and ledger["first_imbalance_step"] == 1, ledger


@pytest.mark.timeout(240)
def test_real_run_reports_an_imbalance_and_summary_says_the_ledger_did_not_balance(tmp_path, roles):
    """``asyncrl run`` (learner + simulated actor): a counter edited mid-run is reported by
    the learner's per-step check and summary.json says the ledger did not balance."""
    from tests.e2e.conftest import needs_full_stack
    from tests.faults.test_supervision import Launcher

    needs_full_stack()
    run_dir, name = tmp_path / "run", "ledgerjob"
    launcher = Launcher(
        roles, "run", "experiment=tiny", "learner.steps=10", "learner.checkpoint_every=5",
        "learner.nproc=1", "actor.engine=sim", "metrics_port=0", f"buffer.name={name}",
        f"run_dir={run_dir}",
    )  # fmt: skip
    try:
        roles.wait_until(
            lambda: re.search(r"^step +1 \|", launcher.output, re.M),
            180, "the learner to train two steps", poll_s=0.2,
        )  # fmt: skip
        client = connect((run_dir / "redis" / "redis.url").read_text().strip(), timeout_s=5.0)
        client.hincrby(f"{name}:stats", "dropped_stale", 3)  # the damage, from outside
        client.close()
        code = launcher.wait(180)
    finally:
        launcher.stop()
    out = launcher.output
    assert code == 0, out[-4000:]
    warnings = re.findall(r"WARNING: buffer ledger does not balance at step \d+: .*", out)
    assert len(warnings) == 1, out[-4000:]
    assert "dropped_stale 3" in warnings[0] and "3 group(s) more are accounted" in warnings[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    ledger = summary["ledger"]
    assert (ledger["balanced"], ledger["imbalance"]) == (False, -3), ledger
    assert ledger["imbalanced_steps"] >= 1 and ledger["first_imbalance_step"] >= 1, ledger
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["ledger_imbalance"] == 0 and records[-1]["ledger_imbalance"] == -3
