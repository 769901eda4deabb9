"""The run's totals that ``summary.json`` reports and every checkpoint carries, so that a
resumed run's summary covers the whole run (as its steps and rewards do).

``RunTotals`` counts what was trained (groups, samples, tokens, the staleness histograms per
group and per model token, reward errors, episodes by how they ended and their tool calls),
what the learner read (trained or dropped as stale or
uniform: the generated groups that reached it) and the weight syncs; ``to_dict`` adds the
learner's seconds per state and its training wall time to those saved before a resume
(``restore``), and the two admission figures (stale tokens and admission):

    trained_token_frac  trained completion tokens / read completion tokens
    length_bias         trained mean completion length / read mean completion length
                        (below 1: admission favoured short answers)
    completion_lengths  mean and p95 completion length, read and trained (from the
                        histograms ``{read,trained}_length_histogram``: length -> completions)

Tokens and lengths here are completion tokens (``len(completion_ids)``: in a multi-turn
episode the template/environment tokens too, the context the learner processes); the
per-token staleness histogram counts model tokens only (``loss_mask`` 1: the others were not
sampled by any version). A trained completion token is one of a trained group that stayed in
the loss: under
``algorithm.stale_tokens=mask`` the tokens masked as stale are counted apart
(``trained_tokens_masked_stale``) and left out of both figures' trained side.

Invariant: ``restore(to_dict(...))`` then more counting gives the same totals as counting
without the restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from asyncrl.core.types import EPISODE_ENDS
from asyncrl.learner.hub.reward_records import RewardErrorTally


class RunTotals:
    def __init__(self) -> None:
        self.staleness_hist: dict[int, int] = {}
        self.sync = {"count": 0, "bytes": 0, "seconds": 0.0, "failures": 0, "regroups": 0}
        self.trained = {"groups": 0, "samples": 0, "tokens": 0}
        self.read = {"groups": 0, "samples": 0, "tokens": 0}
        self.masked_stale = 0  # tokens of trained groups left out of the loss as stale
        self.token_staleness: dict[int, int] = {}
        self.lengths: dict[str, dict[int, int]] = {"read": {}, "trained": {}}
        self.base: dict[str, Any] = {"learner_time_s": {}, "train_wall_s": 0.0}  # before a resume
        self.reward_errors = RewardErrorTally()  # over the samples trained
        self.episodes = EpisodeTally()  # over the samples trained

    def count_read(self, groups: list) -> None:
        """Groups the learner read, before admission (trained or dropped stale or uniform)."""
        _add(self.read, groups)
        _count_lengths(self.lengths["read"], groups)

    def count_trained(
        self, groups: list, stale: list[int], version: int | None = None, masked_stale: int = 0
    ) -> None:
        """One step's groups and their staleness (learner version - oldest token version);
        with ``version``, each model token's staleness too (``version - v``);
        ``masked_stale``: how many of their tokens the loss left out as stale."""
        self.masked_stale += masked_stale
        for s in stale:
            self.staleness_hist[s] = self.staleness_hist.get(s, 0) + 1
        if version is not None:
            for g in groups:
                for sample in g.samples:
                    mask = sample.loss_mask or [1] * len(sample.token_versions)
                    for v, m in zip(sample.token_versions, mask, strict=True):
                        if m:
                            k = version - v
                            self.token_staleness[k] = self.token_staleness.get(k, 0) + 1
        _add(self.trained, groups)
        _count_lengths(self.lengths["trained"], groups)
        for g in groups:  # per episode: an episode's other parts share its reward and end
            for s in g.episodes:
                self.reward_errors.add(s.reward_error, g.group_id)
            self.episodes.add(g.episodes)

    def count_sync(self, nbytes: int, seconds: float) -> None:
        self.sync["count"] += 1
        self.sync["bytes"] += nbytes
        self.sync["seconds"] += seconds

    def count_sync_faults(self, failures: int, regroups: int) -> None:
        self.sync["failures"] += failures
        self.sync["regroups"] += regroups

    def to_dict(self, time_s: dict[str, float], train_wall_s: float, ledger: dict) -> dict:
        """The totals so far: ``time_s`` (seconds per learner state) and ``train_wall_s`` of
        this learner are added to those restored from before a resume."""
        base = self.base["learner_time_s"]
        return {
            "learner_time_s": {
                k: base.get(k, 0.0) + time_s.get(k, 0.0) for k in set(time_s) | set(base)
            },
            "train_wall_s": self.base["train_wall_s"] + train_wall_s,
            "trained_staleness_histogram": _keyed(self.staleness_hist),
            "trained_totals": dict(self.trained),
            "trained_token_staleness_histogram": _keyed(self.token_staleness),
            "read_totals": dict(self.read),
            "trained_tokens_masked_stale": self.masked_stale,
            **self.admission(),
            "completion_lengths": {k: length_stats(h) for k, h in self.lengths.items()},
            **{f"{k}_length_histogram": _keyed(h) for k, h in self.lengths.items()},
            "weight_sync": dict(self.sync),
            "reward_errors": self.reward_errors.to_dict(),
            "episodes": self.episodes.to_dict(),
            "ledger": ledger,
        }

    def restore(self, saved: dict) -> None:
        """Start from a checkpoint's ``to_dict()`` (the ledger is the caller's)."""
        self.base = {k: saved[k] for k in ("learner_time_s", "train_wall_s")}
        self.staleness_hist = {int(k): n for k, n in saved["trained_staleness_histogram"].items()}
        self.trained = dict(saved["trained_totals"])
        self.sync.update(saved.get("weight_sync", {}))  # absent before 2026-11-23
        self.reward_errors = RewardErrorTally(saved.get("reward_errors"))  # absent: from 0
        self.episodes = EpisodeTally(saved.get("episodes"))  # absent before multi-turn: from 0
        # absent in checkpoints written before the per-token staleness histogram
        hist = saved.get("trained_token_staleness_histogram", {})
        self.token_staleness = {int(k): n for k, n in hist.items()}
        self.read = dict(saved.get("read_totals", self.read))
        self.masked_stale = saved.get("trained_tokens_masked_stale", 0)  # absent: none masked
        for k in self.lengths:  # absent before the admission window: from 0
            hist = saved.get(f"{k}_length_histogram", {})
            self.lengths[k] = {int(n): c for n, c in hist.items()}

    def admission(self) -> dict[str, float | None]:
        """``trained_token_frac`` and ``length_bias`` so far (module doc); None before any
        read, or after a resume from a checkpoint that did not count reads."""
        t, r = self.trained, self.read
        if not r["samples"] or not t["samples"] or r["tokens"] < t["tokens"]:
            return {"trained_token_frac": None, "length_bias": None}
        tokens = t["tokens"] - self.masked_stale
        return {
            "trained_token_frac": tokens / r["tokens"],
            "length_bias": (tokens / t["samples"]) / (r["tokens"] / r["samples"]),
        }


class EpisodeTally:
    """Episodes over some samples (summary.json ``episodes``): ``by_end`` (samples per
    ``Sample.episode_end``, every kind of ``EPISODE_ENDS`` in its order), ``tool_calls`` and
    ``tool_errors`` (their sums)."""

    def __init__(self, saved: dict | None = None) -> None:
        saved = saved or {}
        self.by_end = {k: int(saved.get("by_end", {}).get(k, 0)) for k in EPISODE_ENDS}
        self.tool_calls = int(saved.get("tool_calls", 0))
        self.tool_errors = int(saved.get("tool_errors", 0))

    def add(self, samples: Iterable) -> None:
        for s in samples:
            self.by_end[s.episode_end] += 1
            self.tool_calls += s.tool_calls
            self.tool_errors += s.tool_errors

    def to_dict(self) -> dict:
        return {
            "by_end": dict(self.by_end),
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
        }


def episode_metrics(samples: list) -> dict[str, float]:
    """A step's ``episode/*`` metrics (metrics.jsonl), only when some sample is more than a
    single turn (``turns > 1``, a tool call or an end other than ``done``), so a single-turn
    run's records stay as they were; ``{}`` otherwise. Per sample: ``turns_mean``,
    ``tool_calls_mean``, ``tool_call_rate`` (samples with >= 1 call), ``end_<kind>`` (the
    fraction that ended so, for every kind of ``EPISODE_ENDS``); ``tool_error_rate`` = errors
    / calls (0 without calls); ``model_token_frac`` = model tokens / completion tokens."""
    if not any(s.turns > 1 or s.tool_calls or s.episode_end != "done" for s in samples):
        return {}
    n = len(samples)
    calls = sum(s.tool_calls for s in samples)
    tokens = sum(len(s.completion_ids) for s in samples)
    return {
        "episode/turns_mean": sum(s.turns for s in samples) / n,
        "episode/tool_calls_mean": calls / n,
        "episode/tool_call_rate": sum(1 for s in samples if s.tool_calls) / n,
        "episode/tool_error_rate": sum(s.tool_errors for s in samples) / calls if calls else 0.0,
        "episode/model_token_frac": sum(s.model_tokens for s in samples) / max(tokens, 1),
        **{
            f"episode/end_{k}": sum(1 for s in samples if s.episode_end == k) / n
            for k in EPISODE_ENDS
        },
    }


def _add(totals: dict[str, int], groups: list) -> None:
    totals["groups"] += len(groups)
    totals["samples"] += sum(len(g.samples) for g in groups)
    totals["tokens"] += sum(g.num_tokens for g in groups)


def _count_lengths(hist: dict[int, int], groups: list) -> None:
    for g in groups:
        for s in g.samples:
            n = len(s.completion_ids)
            hist[n] = hist.get(n, 0) + 1


def _keyed(hist: dict[int, int]) -> dict[str, int]:
    """A histogram as JSON keeps it: string keys, in order."""
    return {str(k): n for k, n in sorted(hist.items())}


def length_stats(hist: dict[int, int]) -> dict[str, float | None]:
    """``mean`` and ``p95`` (the smallest length with at least 95% of the completions at or
    below it) of a length -> count histogram; None for an empty one."""
    total = sum(hist.values())
    if not total:
        return {"mean": None, "p95": None}
    mean = sum(k * n for k, n in hist.items()) / total
    seen = 0
    for k in sorted(hist):
        seen += hist[k]
        if seen >= 0.95 * total:
            return {"mean": mean, "p95": float(k)}
    raise AssertionError("unreachable: the counts sum to total")
