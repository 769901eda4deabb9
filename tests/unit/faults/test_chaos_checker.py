"""The chaos run's schedule and checker (tests/faults/chaos) on hand-made data: a schedule is
the same for the same seed, and the checker passes a correct buffer history and names each
kind of violation in a broken one (so a chaos run that passes has been checked by something
that can fail)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from tests.faults.chaos import aof, checker
from tests.faults.chaos.schedule import DISK_FULL, KILL, Plan, concurrency, draw, kills_of

N = "buf"
RULES = checker.Rules(max_staleness=1)


# -- the schedule ---------------------------------------------------------------------------------


def test_a_seed_draws_the_same_schedule_and_seeds_differ():
    plan = Plan(duration_s=120.0, disk_p=0.5)
    assert draw(7, plan) == draw(7, plan)
    assert draw(7, plan) != draw(8, plan)
    assert draw(7, plan) != draw(7, Plan(duration_s=120.0, disk_p=0.5, mean_gap_s=3.0))


@pytest.mark.parametrize("seed", range(40))
def test_a_schedule_keeps_its_limits(seed):
    plan = Plan(duration_s=90.0, hosts=("actors",), disk_p=0.5)
    faults = draw(seed, plan)
    assert faults == sorted(faults, key=lambda f: (f.t_s, f.target))
    assert all(0 <= f.t_s < plan.duration_s for f in faults)
    by_target: dict[str, list] = {}
    for f in faults:
        by_target.setdefault(f.target, []).append(f)
    for target, fs in by_target.items():
        for a, b in zip(fs, fs[1:], strict=False):
            assert b.t_s >= a.end_s, f"two faults at once on {target}: {a}, {b}"
        kill_times = [f.t_s for f in fs if f.kind == KILL]
        gap = plan.kill_gap_s.get(target, plan.default_kill_gap_s)
        assert all(b - a >= gap for a, b in zip(kill_times, kill_times[1:], strict=False))
    for target, n in kills_of(faults).items():
        assert n <= plan.max_kills.get(target, plan.default_max_kills)
    disk = [f for f in faults if f.kind == DISK_FULL]
    assert len(disk) <= 1 and all(f.t_s >= plan.duration_s * 2 / 3 for f in disk)
    assert all(f.kind == "partition" for f in faults if f.target == "actors")


def test_schedules_overlap_faults():
    plan = Plan(duration_s=60.0)
    assert all(concurrency(draw(seed, plan)) >= 2 for seed in range(20))
    assert max(concurrency(draw(seed, plan)) for seed in range(20)) >= 3


# -- a hand-made buffer history -------------------------------------------------------------------


def _resp(*args) -> bytes:
    parts = [str(a).encode() if not isinstance(a, bytes) else a for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def _payload(actor: int, rows: list[list[int]]) -> bytes:
    batch = pa.RecordBatch.from_arrays(
        [pa.array(rows, type=pa.list_(pa.int32()))],
        schema=pa.schema([pa.field("token_versions", pa.list_(pa.int32()))]).with_metadata(
            {"asyncrl.actor_id": str(actor)}
        ),
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


class Buffer:
    """Writes the AOF commands a job's scripts would (asyncrl/buffer/scripts.py's effects)."""

    def __init__(self) -> None:
        self.data = b""
        self.ms = 1_000_000
        self.seq = 0

    def tx(self, *cmds) -> None:
        self.data += _resp("MULTI") + b"".join(_resp(*c) for c in cmds) + _resp("EXEC")

    def learner(self, token: str, version: int, pid: int = 1) -> None:
        claim = json.dumps({"token": token, "pid": pid})
        self.data += _resp("SET", f"{N}:learner", claim, "PXAT", "1")
        self.data += _resp("HSET", f"{N}:meta", "control_addr", "tcp://x", "learner_run_dir", "/r")
        self.version(version)

    def version(self, v: int, sent: bool = False) -> None:
        if sent:
            self.data += _resp("HSET", f"{N}:meta", "weights_sent_max", v)
        self.data += _resp("HSET", f"{N}:meta", "learner_version", v)

    def claim(self, actor: int, index: int) -> None:
        self.tx(("SADD", f"{N}:inflight:{actor}", index), ("SET", f"{N}:cursor:{actor}", index + 1))

    def commit(self, actor: int, index: int, rows: list[list[int]]) -> str:
        self.ms += 10
        self.seq += 1
        eid = f"{self.ms}-0"
        self.tx(("HINCRBY", f"{N}:stats", "committed", 1),
                ("XADD", N, eid, "group_id", f"0:{index}", "seq", self.seq, "payload",
                 _payload(actor, rows)),
                ("HSET", f"{N}:commits", eid, self.seq), ("SADD", f"{N}:group_ids", f"0:{index}"),
                ("SREM", f"{N}:inflight:{actor}", index))  # fmt: skip
        return eid

    def deliver(self, eid: str, count: int = 1) -> None:
        self.data += _resp("XCLAIM", N, "learner", "learner", 0, eid, "TIME", self.ms,
                           "RETRYCOUNT", count, "FORCE", "JUSTID", "LASTID", eid)  # fmt: skip

    def ack(self, eid: str, state: str = "trained") -> None:
        self.tx(("XACK", N, "learner", eid), ("XDEL", N, eid), ("HDEL", f"{N}:commits", eid),
                ("HINCRBY", f"{N}:stats", state, 1))  # fmt: skip

    def history(self) -> aof.History:
        cmds, torn = aof.parse(self.data)
        assert torn == 0
        return aof.replay(aof.transactions(cmds), N)


def _good() -> tuple[Buffer, list[str]]:
    """Two steps at versions 0 and 1 with two groups each, checkpointed and acked; a group of
    version 1 still buffered."""
    b = Buffer()
    b.learner("a", 0)
    ids = []
    for index, versions in ((0, [[0, 0]]), (1, [[0]]), (2, [[0, 0]]), (3, [[0]])):
        b.claim(0, index)
        ids.append(b.commit(0, index, versions))
    for eid in ids[:2]:
        b.deliver(eid)
    for eid in ids[:2]:
        b.deliver(eid, 0)  # the step at version 0 completed
    b.version(1, sent=True)
    for eid in ids[2:]:
        b.deliver(eid)
        b.deliver(eid, 0)
    b.version(2, sent=True)
    for eid in ids:
        b.ack(eid)
    b.claim(0, 4)
    ids.append(b.commit(0, 4, [[1, 2], [2]]))
    return b, ids


def _props(violations) -> set[str]:
    return {v.prop for v in violations}


def test_a_correct_history_passes():
    b, ids = _good()
    h = b.history()
    assert checker.check_history(h, RULES) == []
    assert h.live() == [ids[4]] and h.stats == {"committed": 5, "trained": 4}
    final = {"stream_ids": [ids[4]], "stats": {"committed": "5", "trained": "4"},
             "group_ids": 5, "commits": 1, "dead": 0}  # fmt: skip
    assert checker.check_final(h, final) == []


def test_a_group_that_ends_twice_or_uncounted_is_named():
    b, ids = _good()
    b.ack(ids[4], "dropped_uniform")
    b.ack(ids[4], "dropped_uniform")
    b.tx(("XACK", N, "learner", ids[0]), ("XDEL", N, ids[0]))  # deleted, counted nowhere
    v = checker.check_history(b.history(), RULES)
    assert "one-end" in _props(v) and "history" in _props(v), v
    assert any("ended 2 times" in x.text for x in v), v
    assert any("without a counted state" in x.text for x in v), v


def test_a_group_acked_trained_without_a_step_is_named():
    b, ids = _good()
    b.deliver(ids[4])
    b.ack(ids[4])
    v = checker.check_history(b.history(), RULES)
    assert [x.prop for x in v] == ["one-end"] and "without a completed step" in v[0].text


def test_stale_and_future_tokens_are_named():
    b = Buffer()
    b.learner("a", 0)
    for v in range(1, 4):
        b.version(v, sent=True)
    b.claim(0, 0)
    old = b.commit(0, 0, [[1]])  # trained at 3: staleness 2 > 1
    b.claim(0, 1)
    ahead = b.commit(0, 1, [[5]])  # version 5 was never sent
    for eid in (old, ahead):
        b.deliver(eid)
        b.deliver(eid, 0)
    v = checker.check_history(b.history(), RULES)
    assert _props(v) == {"staleness", "future"}, v
    assert any("staleness 2 > max_staleness 1" in x.text for x in v), v
    assert any("negative staleness" in x.text for x in v), v


def test_a_stale_drop_of_a_fresh_group_is_named():
    b, ids = _good()
    b.deliver(ids[4])
    b.ack(ids[4], "dropped_stale")  # version 1..2 at learner version 2: fresh
    v = checker.check_history(b.history(), RULES)
    assert [x.prop for x in v] == ["staleness"] and "was within" in v[0].text


def test_training_twice_is_named_unless_a_restart_lost_the_step():
    b, ids = _good()
    b.deliver(ids[4])
    b.deliver(ids[4], 0)  # trained at version 2
    b.deliver(ids[4], 0)  # the same call again (its reply was lost): still one step
    assert len(b.history().entries[ids[4]].steps) == 1
    b.deliver(ids[4], 1)
    b.deliver(ids[4], 0)  # and again by the same learner
    v = checker.check_history(b.history(), RULES)
    assert [x.prop for x in v] == ["trained-once"] and "no restart" in v[0].text

    b, ids = _good()
    b.deliver(ids[4])
    b.deliver(ids[4], 0)  # trained at version 2, then the learner dies before a checkpoint
    b.learner("b", 2, pid=2)  # resumes at 2: the step is lost, training it again is right
    b.deliver(ids[4], 1)
    b.deliver(ids[4], 0)
    assert checker.check_history(b.history(), RULES) == []

    b, ids = _good()
    b.deliver(ids[4])
    b.deliver(ids[4], 0)
    b.version(3)
    b.learner("b", 3, pid=2)  # resumes at 3: its checkpoint holds the step at 2
    b.deliver(ids[4], 1)
    b.deliver(ids[4], 0)
    v = checker.check_history(b.history(), checker.Rules(max_staleness=2))
    assert [x.prop for x in v] == ["trained-once"] and "was in that checkpoint" in v[0].text


def test_a_dead_learners_last_command_after_its_successors_claim_is_the_dead_ones():
    """Redis stopped while the learner was killed: its last step's command lands after the
    new learner's claim (Redis serves both sockets when it resumes), before the new one's
    meta. It is the old learner's step, so training the group again is no violation."""
    b, ids = _good()
    b.deliver(ids[4])
    b.data += _resp("SET", f"{N}:learner", json.dumps({"token": "b", "pid": 2}), "PXAT", "1")
    b.deliver(ids[4], 0)  # the dead learner's step at version 2
    b.data += _resp("HSET", f"{N}:meta", "learner_run_dir", "/r")
    b.version(2)
    b.deliver(ids[4], 1)
    b.deliver(ids[4], 0)
    h = b.history()
    assert [s.incarnation for s in h.entries[ids[4]].steps] == [0, 1]
    assert checker.check_history(h, RULES) == []


def test_a_learner_version_that_jumps_or_a_resume_from_the_future_is_named():
    b, _ = _good()
    b.version(4)
    v = checker.check_history(b.history(), RULES)
    assert [x.prop for x in v] == ["versions"] and "version 4 right after 2" in v[0].text

    b, _ = _good()
    b.learner("b", 7, pid=2)
    v = checker.check_history(b.history(), RULES)
    assert [x.prop for x in v] == ["versions"] and "past every version" in v[0].text


def test_an_actor_on_older_weights_after_announcing_newer_is_named():
    b, _ = _good()  # actor 0 committed tokens of version 2 (group 4)
    b.claim(0, 5)
    b.commit(0, 5, [[1, 1]])  # claimed after that commit, generated on version 1
    v = checker.check_history(b.history(), RULES)
    assert [x.prop for x in v] == ["weights"] and "older weights" in v[0].text
    # a learner restart between (its checkpoint's weights) or the actor's restart excuses it
    b, _ = _good()
    b.learner("b", 1, pid=2)
    b.claim(0, 5)
    b.commit(0, 5, [[1, 1]])
    assert checker.check_history(b.history(), RULES) == []
    b, _ = _good()
    kill_s = (b.ms + 5) / 1000
    b.ms += 5000
    b.claim(0, 5)
    b.commit(0, 5, [[1, 1]])
    assert checker.check_history(b.history(), RULES, {"actor0": [kill_s]}) == []
    # ... also when the dead actor's last commit lands after the restart (Redis was stopped)
    b, _ = _good()
    kill_s = (b.ms - 3000) / 1000  # group 4 was committed by the dead actor 3 s later
    b.ms += 5000
    b.claim(0, 5)
    b.commit(0, 5, [[1, 1]])
    h = b.history()
    assert _props(checker.check_history(h, RULES, {"actor0": [kill_s]})) == {"weights"}
    outage = [(kill_s - 1, kill_s + 3.5)]
    assert checker.check_history(h, RULES, {"actor0": [kill_s]}, outage) == []
    # a sample that goes back in version
    b, _ = _good()
    b.claim(0, 5)
    b.commit(0, 5, [[2, 1]])
    v = checker.check_history(b.history(), RULES)
    assert _props(v) == {"weights"} and any("goes back" in x.text for x in v)


def test_the_final_state_must_match_the_history():
    b, ids = _good()
    h = b.history()
    final = {"stream_ids": [], "stats": {"committed": "5", "trained": "5"},
             "group_ids": 5, "commits": 0, "dead": 0}  # fmt: skip
    v = checker.check_final(h, final)
    assert _props(v) == {"final"} and any("missing" in x.text for x in v), v


def test_an_aof_torn_at_its_end_drops_the_unfinished_command_and_transaction():
    b, _ = _good()
    cmds, torn = aof.parse(b.data + _resp("MULTI") + _resp("SET", "k", "v") + b"*3\r\n$4\r\nXA")
    assert torn == len(b"*3\r\n$4\r\nXA")
    assert len(aof.transactions(cmds)) == len(aof.transactions(aof.parse(b.data)[0]))
    with pytest.raises(aof.AofError):
        aof.parse(b"garbage" + b.data)


def test_incr_files_missing_from_the_chain_are_named(tmp_path):
    b, _ = _good()
    (tmp_path / "appendonly.aof.1.incr.aof").write_bytes(b.data)
    (tmp_path / "appendonly.aof.3.incr.aof").write_bytes(b"")
    _, problems = aof.read_files(aof.incr_files(tmp_path))
    assert problems and "not 1..N" in problems[0]


# -- checkpoints, metrics.jsonl and what the harness saw ------------------------------------------


def _ckpt(root: Path, version: int, ids: list[str], marker: str | None = None) -> None:
    d = root / f"step_{version:06d}"
    d.mkdir(parents=True)
    (d / "COMPLETE").write_text(marker if marker is not None else str(version))
    (d / "state.json").write_text(json.dumps({"version": version, "trained_ids": ids}))
    (d / "w.bin").write_bytes(b"x" * 10)
    (d / "manifest.json").write_text(json.dumps({"files": {"w.bin": {"bytes": 10}}}))


def test_checkpoints_hold_each_trained_group_once(tmp_path):
    b, ids = _good()
    h = b.history()
    _ckpt(tmp_path, 2, ids[:4])
    assert checker.check_checkpoints(h, checker.read_checkpoints(tmp_path), RULES) == []
    _ckpt(tmp_path, 3, ids[3:5], marker="2")  # ids[3] again, ids[4] never trained
    (tmp_path / "step_000003" / "w.bin").write_bytes(b"x")
    v = checker.check_checkpoints(h, checker.read_checkpoints(tmp_path), RULES)
    text = "\n".join(map(str, v))
    assert "trained twice across a durable checkpoint" in text, text
    assert "which no step before that version trained" in text, text
    assert "is marked '2'" in text and "has 1 bytes" in text, text


def test_metrics_go_back_only_to_a_restarts_version():
    b, _ = _good()
    h = b.history()
    recs = [{"step": s, "version": s + 1, "staleness_max": 0} for s in (0, 1, 2, 1)]
    v = checker.check_metrics(h, recs, 0, RULES)
    assert [x.prop for x in v] == ["versions"] and "no learner resumed at 1" in v[0].text
    b.learner("b", 1, pid=2)
    assert checker.check_metrics(b.history(), recs, 0, RULES) == []
    recs[0]["staleness_max"] = 3
    assert _props(checker.check_metrics(b.history(), recs, 0, RULES)) == {"staleness"}


def test_silence_is_named_unless_the_learner_was_stopped():
    lines = [(100.0, "step 1"), (110.0, "step 2"), (170.0, "step 3")]
    v = checker.check_silence(lines, [], 100.0, 180.0, 45.0)
    assert [x.prop for x in v] == ["silence"] and "silent for 60s" in v[0].text
    assert checker.check_silence(lines, [(115.0, 140.0)], 100.0, 180.0, 45.0) == []


def test_every_kill_is_announced_and_no_other_death():
    console = [
        (1.0, "[asyncrl] actor0 killed by SIGKILL; restarting it in 0.5s (restart 1 of 2, ...)"),
        (2.0, "[asyncrl] learner exited with code 1; restarting it in 0.5s (restart 1 of 1, ...)"),
        (3.0, "[buffer] redis-server exited (-9); restarted from /r on the same port (restart 1)"),
    ]
    kills = [checker.Fault(0.5, "kill", "actor0"), checker.Fault(1.5, "kill", "learner"),
             checker.Fault(2.5, "kill", "redis")]  # fmt: skip
    assert checker.check_deaths(console, kills, 10.0) == []
    v = checker.check_deaths(console, kills[:2] + [checker.Fault(2.8, "kill", "actor1")], 10.0)
    assert {x.text.split(":")[0] for x in v} == {"actor1", "redis"}, v
