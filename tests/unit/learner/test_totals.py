"""learner/hub/totals.py: a learner restarted from a checkpoint's totals ends with the totals of
one that never stopped."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from asyncrl.core.types import EPISODE_ENDS, Sample
from asyncrl.learner.hub.totals import EpisodeTally, RunTotals, episode_metrics


@dataclass
class S:
    reward_error: str = ""
    token_versions: list = field(default_factory=lambda: [3, 4])
    completion_ids: list = field(default_factory=lambda: [1, 2])
    loss_mask: list | None = None
    episode_end: str = "done"
    tool_calls: int = 0
    tool_errors: int = 0


@dataclass
class G:
    group_id: str
    samples: list = field(default_factory=lambda: [S(), S("raised: boom")])
    num_tokens: int = 7

    @property
    def episodes(self) -> list:
        return self.samples


def _steps(t: RunTotals, steps) -> None:
    for i, stale in steps:
        t.count_read([G(f"0:{i}"), G(f"0:{i + 100}"), G(f"0:{i + 200}", num_tokens=21)])
        t.count_trained([G(f"0:{i}"), G(f"0:{i + 100}")], stale, version=4)
        t.count_sync(1000, 0.5)
        t.count_sync_faults(i % 2, 1)


def test_restored_totals_continue_as_if_never_stopped():
    steps = [(0, [0, 1]), (1, [1, 1]), (2, [0, 2]), (3, [1, 0])]
    whole = RunTotals()
    _steps(whole, steps)
    first = RunTotals()
    _steps(first, steps[:2])
    saved = first.to_dict({"busy": 3.0}, 10.0, {"balanced": True})
    again = RunTotals()
    again.restore(saved)
    _steps(again, steps[2:])
    got = again.to_dict({"busy": 2.0, "checkpoint": 1.0}, 5.0, {})
    want = whole.to_dict({"busy": 5.0, "checkpoint": 1.0}, 15.0, {})
    assert got == want
    assert got["trained_totals"] == {"groups": 8, "samples": 16, "tokens": 56}
    assert got["trained_staleness_histogram"] == {"0": 3, "1": 4, "2": 1}
    assert got["weight_sync"]["count"] == 4 and got["weight_sync"]["failures"] == 2
    assert got["weight_sync"]["regroups"] == 4
    assert got["reward_errors"]["count"] == 8
    assert got["episodes"] == {"by_end": {k: 16 * (k == "done") for k in EPISODE_ENDS},
                               "tool_calls": 0, "tool_errors": 0}  # fmt: skip


def test_admission_figures_closed_form():
    """Per step 3 groups of 2 samples read (7, 7 and 21 tokens), the two 7-token ones
    trained: 14/35 of the tokens; mean length 3.5 trained against 35/6 read."""
    t = RunTotals()
    assert t.admission() == {"trained_token_frac": None, "length_bias": None}
    _steps(t, [(0, [0, 0]), (1, [0, 1])])
    got = t.to_dict({}, 0.0, {})
    assert got["read_totals"] == {"groups": 6, "samples": 12, "tokens": 70}
    assert got["trained_token_frac"] == 28 / 70
    assert abs(got["length_bias"] - 3.5 / (70 / 12)) < 1e-12
    # 4 trained groups x 2 samples x versions [3, 4] at version 4: staleness 1 and 0
    assert got["trained_token_staleness_histogram"] == {"0": 8, "1": 8}


def test_completion_lengths_mean_and_p95_read_against_trained():
    """20 read completions, lengths 1..20; the trained ones are the 10 shortest."""
    read = [G(f"0:{n}", samples=[S(completion_ids=[0] * n)]) for n in range(1, 21)]
    t = RunTotals()
    t.count_read(read)
    t.count_trained(read[:10], [0] * 10)
    got = t.to_dict({}, 0.0, {})["completion_lengths"]
    assert got == {"read": {"mean": 10.5, "p95": 19.0}, "trained": {"mean": 5.5, "p95": 10.0}}
    assert RunTotals().to_dict({}, 0.0, {})["completion_lengths"]["read"] == {
        "mean": None, "p95": None,
    }  # fmt: skip


def test_a_resume_from_a_checkpoint_without_read_counts_reports_no_admission_figures():
    t = RunTotals()
    _steps(t, [(0, [0, 0])])
    saved = t.to_dict({}, 0.0, {})
    for key in ("read_totals", "trained_token_staleness_histogram"):
        del saved[key]
    again = RunTotals()
    again.restore(saved)
    again.count_trained([G("0:9")], [0], version=4)
    assert again.admission() == {"trained_token_frac": None, "length_bias": None}


def test_tokens_masked_as_stale_are_not_counted_as_trained():
    """Under stale_tokens=mask: 2 groups of 7 tokens trained, 5 of their tokens masked, of 35
    read: 9/35 trained, mean trained length 9/4 against 35/6 read; kept across a resume."""
    t = RunTotals()
    t.count_read([G("0:1"), G("0:2"), G("0:3", num_tokens=21)])
    t.count_trained([G("0:1"), G("0:2")], [1, 1], version=4, masked_stale=5)
    assert t.admission() == {"trained_token_frac": 9 / 35, "length_bias": (9 / 4) / (35 / 6)}
    saved = t.to_dict({}, 0.0, {})
    assert saved["trained_tokens_masked_stale"] == 5 and saved["trained_totals"]["tokens"] == 14
    again = RunTotals()
    again.restore(saved)
    assert again.admission() == t.admission()


@pytest.mark.parametrize(("mode", "masked"), [("mask", 5), ("interpolate", 0), ("drop_group", 0)])
def test_the_recorder_counts_tokens_masked_as_stale_only_where_they_leave_the_loss(
    tmp_path, mode, masked
):
    """``tokens_masked_stale`` counts the tokens older than the bound; only under mask do they
    leave the loss (under interpolate they train with an estimated pi_prox)."""
    from asyncrl.core.config.job import Config
    from asyncrl.learner.hub.recorder import RunRecorder

    cfg = Config(metrics_port=0, logger=["jsonl"])
    cfg.algorithm.stale_tokens = mode
    rec = RunRecorder(cfg, str(tmp_path), None, print)
    rec.totals.count_read([G("0:1"), G("0:2")])
    fields = {"step": 4, "version": 5, "reward": 0.5}
    rec.step(fields, [G("0:1"), G("0:2")], [1, 1], {}, {"tokens_masked_stale": 5.0})
    assert rec.totals.masked_stale == masked
    assert rec.totals.admission()["trained_token_frac"] == (14 - masked) / 14


def test_token_staleness_counts_model_tokens_only():
    """An episode's environment tokens (mask 0) were sampled by no version: not counted."""
    t = RunTotals()
    episode = S(token_versions=[2, 2, 2, 4], completion_ids=[1, 2, 3, 4], loss_mask=[1, 0, 0, 1])
    t.count_trained([G("0:1", samples=[episode, S()])], [2], version=4)
    got = t.to_dict({}, 0.0, {})
    assert got["trained_token_staleness_histogram"] == {"0": 2, "1": 1, "2": 1}
    assert got["completion_lengths"]["trained"]["mean"] == 3.0  # completion tokens: 4 and 2


def _episode(turns=1, calls=0, errors=0, end="done", mask=(1, 1, 1, 1)) -> Sample:
    c = len(mask)
    return Sample([1], [2] * c, [-0.5] * c, [0] * c, 0.0, loss_mask=list(mask), turns=turns,
                  tool_calls=calls, tool_errors=errors, episode_end=end)  # fmt: skip


def test_episode_totals_count_ends_calls_and_errors_across_a_resume():
    samples = [_episode(3, 2, 1, "max_turns"), _episode(2, 1, 0), _episode(1, 0, 0, "length")]
    whole = EpisodeTally()
    whole.add(samples)
    first = EpisodeTally()
    first.add(samples[:1])
    again = EpisodeTally(first.to_dict())
    again.add(samples[1:])
    assert again.to_dict() == whole.to_dict()
    ends = {k: 0 for k in EPISODE_ENDS} | {"done": 1, "max_turns": 1, "length": 1}
    assert whole.to_dict() == {"by_end": ends, "tool_calls": 3, "tool_errors": 1}
    assert EpisodeTally(None).to_dict()["tool_calls"] == 0  # a checkpoint from before


def test_episode_metrics_closed_form():
    """4 samples: turns 3, 2, 1, 1; calls 2, 1, 0, 0 with 1 error; 16 tokens, 12 by the model."""
    samples = [
        _episode(3, 2, 1, "max_turns", (1, 0, 1, 1)),
        _episode(2, 1, 0, "done", (1, 1, 0, 1)),
        _episode(1, 0, 0, "length", (1, 1, 0, 0)),
        _episode(1, 0, 0, "done"),
    ]
    got = episode_metrics(samples)
    want = {
        "episode/turns_mean": 7 / 4,
        "episode/tool_calls_mean": 3 / 4,
        "episode/tool_call_rate": 2 / 4,
        "episode/tool_error_rate": 1 / 3,
        "episode/model_token_frac": 12 / 16,
    } | {f"episode/end_{k}": 0.0 for k in EPISODE_ENDS}
    want |= {"episode/end_done": 0.5, "episode/end_max_turns": 0.25, "episode/end_length": 0.25}
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12) and set(got) == set(want)


def test_episode_metrics_only_for_more_than_single_turns():
    """A single-turn run's metrics.jsonl records are what they were; one sign of an episode
    (a second turn, a call, another end) is enough; no calls: error rate 0."""
    assert episode_metrics([_episode(), _episode(mask=(1,))]) == {}
    for odd in (_episode(turns=2), _episode(calls=1), _episode(end="env_error")):
        got = episode_metrics([_episode(), odd])
        assert len(got) == 5 + len(EPISODE_ENDS)
    assert episode_metrics([_episode(end="max_tokens")])["episode/tool_error_rate"] == 0.0
