"""``asyncrl.learner.hub.hub.Hub`` on its parts' fakes (``ListFeed``, ``RecordingPublisher``,
``MemoryRecorder``) and a dict-backed buffer: the order of the loop's calls reaches the right
part, with the right state on the learner's clock. The real parts run in every e2e test."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from asyncrl.core.config.load import load_config
from asyncrl.learner.hub.hub import Hub, HubParts
from tests.fakes.learner import ListFeed, MemoryRecorder, RecordingPublisher
from tests.random_groups import random_groups

STATS = {"committed": 8, "trained": 0, "dropped_stale": 0, "dropped_invalid": 0,
         "dropped_poison": 0, "dropped_uniform": 0, "still_buffered": 8, "imbalance": 0}  # fmt: skip


class DictBuffer:
    """The ``ReplayBuffer`` calls the hub makes, on a dict."""

    def __init__(self, meta: dict | None = None) -> None:
        self._meta = dict(meta or {})
        self.version = 0
        self.repairs = 0

    def meta(self) -> dict:
        return dict(self._meta)

    def set_meta(self, **kv) -> None:
        self._meta.update({k: str(v) for k, v in kv.items()})

    def learner_version(self) -> int:
        return self.version

    def set_learner_version(self, v: int) -> None:
        self.version = v

    def set_learner_last_version(self, v: int) -> None:
        self.last_version = v

    def audit(self) -> dict:
        return dict(STATS)


def _hub(tmp_path, publisher=None, meta=None, overrides=()):
    cfg = load_config(["metrics_port=0", "learner.batch_groups=2", *overrides])
    entries = [SimpleNamespace(group=g, entry_id=f"e{i}") for i, g in enumerate(random_groups(4))]
    feed, pub, rec = ListFeed(entries), publisher or RecordingPublisher(), MemoryRecorder()
    return Hub(cfg, str(tmp_path), DictBuffer(meta), HubParts(feed, pub, rec)), feed, pub, rec


def _state(version: int):
    return SimpleNamespace(version=version, wall_s=1.0, nonfinite_steps=0, nonfinite_updates=0)


def test_a_step_reads_syncs_logs_checkpoints_and_acks(tmp_path):
    hub, feed, pub, rec = _hub(tmp_path, overrides=["learner.steps=9"])
    hub.start(0)
    assert pub.events == ["open"] and hub.buffer.meta()["control"] == "recording"
    assert hub.buffer.last_version == 8  # the admission window reaches no further
    groups = hub.next_groups(0)
    assert [g.group_id for g in groups] == ["g0", "g1"]
    hub.step_done()
    assert hub.send_weights(iter([]), 1) is False and pub.versions == [1]
    hub.after_step(_state(1), {"loss": 0.5})
    (record,) = rec.records
    assert record["step"] == 0 and record["version"] == 1 and record["loss"] == 0.5
    assert record["stale"] == [0, 0] and record["dropped_uniform"] == 0
    assert hub.trained_ids() == ["e0", "e1"] and feed.acked == []
    hub.ack_trained()
    assert feed.acked == ["e0", "e1"] and feed.trained_ids() == []
    assert rec.states == ["busy", "waiting_data", "busy", "weight_sync", "busy", "checkpoint",
                          "busy"]  # fmt: skip
    summary = hub.finish(_state(1))
    assert pub.events == ["open", "stop_actors", "close"] and rec.status == "FINISHED"
    assert summary["final_version"] == 1 and summary["dropped_by_reason"]["stale"] == 0


def test_a_failed_sync_try_is_counted_and_the_retry_counts_the_sync(tmp_path):
    hub, _, pub, rec = _hub(tmp_path, RecordingPublisher(fail_first=1, nbytes=64))
    hub.start(0)
    assert hub.send_weights(iter([]), 1, attempt=0) is True
    assert hub.send_weights(iter([]), 1, attempt=1) is False
    assert rec.syncs == [(1, 1, None), (0, 0, None), (0, 0, (64, 0.0))]


def test_without_weight_sync_no_channel_opens_but_actors_are_still_stopped(tmp_path):
    hub, _, pub, _ = _hub(tmp_path, overrides=["learner.weight_sync=false"])
    hub.start(0)
    hub.finish(_state(0))
    assert pub.events == ["stop_actors", "close"]


@pytest.mark.parametrize("same_run", [True, False])
def test_a_restart_of_the_same_run_keeps_the_versions_it_sent(tmp_path, same_run):
    run = str(tmp_path.resolve()) if same_run else "/elsewhere"
    hub, _, pub, _ = _hub(tmp_path, meta={"learner_run_dir": run, "weights_sent_max": "7"})
    hub.start(3)
    assert pub.sent_max == (7 if same_run else -1)


def test_the_step_record_has_episode_metrics_only_for_episodes(tmp_path):
    """metrics.jsonl: a single-turn step's record has no ``episode/*``; a step with one
    multi-turn episode among its 8 samples has them."""
    hub, feed, _, rec = _hub(tmp_path)
    s = feed.entries[2].group.samples[0]  # the second step's first sample: 2 turns, 1 call
    hub.start(0)
    hub.next_groups(0)
    hub.after_step(_state(1), {})
    assert not [k for k in rec.records[0] if k.startswith("episode/")]
    s.loss_mask = [1] * len(s.completion_ids) + [0, 1]
    s.completion_ids += [9, 9]
    s.behavior_logprobs += [0.0, -1.0]
    s.token_versions += [0, 0]
    s.turns, s.tool_calls, s.episode_end = 2, 1, "max_turns"
    hub.next_groups(1)
    hub.after_step(_state(2), {})
    record = rec.records[1]
    assert record["episode/turns_mean"] == 9 / 8 and record["episode/tool_call_rate"] == 1 / 8
    assert record["episode/end_max_turns"] == 1 / 8 and record["episode/end_done"] == 7 / 8
