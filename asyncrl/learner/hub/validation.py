"""Validation during training, the learner's side (rank 0): when to validate, holding weight
syncs while a validation runs, and the ``val/*`` metrics.

    weights of V reach the actors (a sync, or the run's start) and V is due
      -> post "validate V" (buffer/eval_queue.py); actors validate between their groups
      -> every step: read the records that arrived; all N in, or eval.timeout_s passed
      -> log val/* tagged val/version = V; release the hold

Why hold syncs: every token of a validation must come from the weights of V, and actors
load new weights for everyone at once (one collective). So while a validation runs, the
learner keeps training but sends no weights, until it must: once the actors' V is more than
``buffer.max_staleness`` versions behind, the groups they make are too stale to train, and
the learner waits for the validation before it syncs (``must_sync``). With
``max_staleness >= 1`` validation overlaps training; with 0 (on-policy) training waits for it.

Metrics (one record per validation; pure math in ``summarize``): ``val/reward`` (mean over
samples), ``val/<key>`` (a dict reward's extras), ``val/pass@k`` for k = 1, 2, 4, ... <= n
(unbiased estimator, solved = reward >= ``eval.pass_threshold``), ``val/response_length``
(tokens), ``val/prompts``, ``val/complete`` (1: every prompt came back), ``val/off_version``
(prompts left out: a token from another version), ``val/reward_errors``, ``val/seconds``.

Samples (``eval.log_samples`` = S): the record also carries ``samples``, the generations of
the first S prompts of the validation set, so each validation shows the same prompts and a
reader can watch their completions change from version to version (``samples_of``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeGuard

from asyncrl.buffer.eval_queue import EvalQueue

if TYPE_CHECKING:
    from asyncrl.buffer.faces import LearnerBuffer

REQUEUE_FRACTION = 4
"""No prompt back for ``eval.timeout_s / REQUEUE_FRACTION`` (75 s by default): the chunks still
missing prompts are handed out again, so the other actors finish the set of one that died."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are solved (Chen et al., 2021):
    ``1 - C(n - c, k) / C(n, k)``; requires ``1 <= k <= n``."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to ``n``, and ``n`` itself."""
    out = [k for k in (2**i for i in range(11)) if k <= n]
    return out if out[-1] == n else [*out, n]


def summarize(records: list[dict], threshold: float) -> dict[str, float]:
    """``val/*`` means over prompt records (actors/validation.py); records with off-version
    tokens or a malformed body are counted and left out."""
    good = [r for r in records if "rewards" in r and not r.get("off_version") and r["rewards"]]
    out: dict[str, float] = {
        "val/prompts": float(len(good)),
        "val/off_version": float(sum(1 for r in records if r.get("off_version"))),
        "val/malformed": float(sum(1 for r in records if "malformed" in r)),
    }
    if not good:
        return out
    rewards = [x for r in good for x in r["rewards"]]
    lengths = [x for r in good for x in r["lengths"]]
    out["val/reward"] = sum(rewards) / len(rewards)
    out["val/response_length"] = sum(lengths) / len(lengths)
    out["val/reward_errors"] = float(sum(r.get("errors", 0) for r in good))
    keys = sorted({k for r in good for k in r.get("extras", {})})
    for key in keys:
        values = [x for r in good for x in r.get("extras", {}).get(key, [])]
        if values:
            out[f"val/{key}"] = sum(values) / len(values)
    n = min(len(r["rewards"]) for r in good)
    for k in ks(n):
        solved = [sum(x >= threshold for x in r["rewards"][:n]) for r in good]
        out[f"val/pass@{k}"] = sum(pass_at_k(n, c, k) for c in solved) / len(good)
    return out


def samples_of(by_index: dict[int, dict], count: int) -> list[dict]:
    """The generations to show of prompts ``0 .. count-1`` (``eval.log_samples``), in index
    order: ``{"index": i, "prompt": str, "completion": str, "reward": float}``, the prompt
    and its first completion whole (the console shortens them: asyncrl/learner/hub/runlog.py). A prompt
    is left out if its record did not come back, has tokens of another version (its text is
    not the validated version's), or carries no well-formed ``sample`` (actors/validation.py)."""
    out = []
    for i in range(count):
        record = by_index.get(i, {})
        sample = record.get("sample")
        if record.get("off_version") or not isinstance(sample, dict):
            continue
        prompt, completion, reward = (sample.get(k) for k in ("prompt", "completion", "reward"))
        if isinstance(prompt, str) and isinstance(completion, str) and _is_number(reward):
            shown = {"prompt": prompt, "completion": completion, "reward": float(reward)}
            out.append({"index": i, **shown})
    return out


def _is_number(x) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Validation:
    """Rank 0's validation state. ``log(record)`` receives each finished validation."""

    def __init__(
        self,
        cfg,
        buffer: LearnerBuffer,
        log: Callable[[dict], None],
        say: Callable[[str], None],
        logged: set[int] | None = None,
    ):
        self.cfg = cfg
        self.queue = EvalQueue(buffer)
        self.buffer = buffer
        self.log = log
        self.say = say
        self.active: dict | None = None  # {"version", "size", "t0", "records"}
        self.last_bucket = 0  # every: the newest `version // every` validated (or started at)
        self.done_versions: set[int] = set(logged or ())
        """Versions validated, those in val.jsonl before a resume included."""
        self.queue.clear()  # a restarted learner: nothing is under way

    # ---- when ---------------------------------------------------------------------------
    def due(self, version: int, *, start: bool = False, end: bool = False) -> bool:
        """Validate the weights of ``version`` now that they reached the actors?"""
        e = self.cfg.eval
        if start and e.every:  # a resumed run: count from the newest validation it logged,
            # so one the kill interrupted (its version's interval has no record) runs now;
            # a run that never validated (a fresh one, resume_from) counts from its version
            newest = max(self.done_versions, default=None)
            self.last_bucket = version // e.every if newest is None else newest // e.every
        if self.active is not None or version in self.done_versions:
            return False
        if (start and e.at_start) or (end and e.at_end):
            return True
        return bool(e.every) and version // e.every > self.last_bucket

    def request(self, version: int) -> None:
        """Post "validate ``version``" (its weights are at the actors now)."""
        size = int(self.buffer.meta().get("val_prompts", 0))
        if self.cfg.eval.every:  # due once per interval, whether or not it can run
            self.last_bucket = max(self.last_bucket, version // self.cfg.eval.every)
        if not size:
            self.say(
                "validation skipped: the actors published no validation set (val_prompts "
                "in the buffer meta); are they an older asyncrl?"
            )
            return
        e = self.cfg.eval
        self.queue.post(version, size, e.chunk_prompts, min(e.log_samples, size))
        now = time.monotonic()
        # by_index: the first record of each prompt; other: malformed ones; progress: when the
        # last new prompt came in (a requeue restarts it)
        self.active = {
            "version": version,
            "size": size,
            "t0": now,
            "progress": now,
            "read": 0,
            "by_index": {},
            "other": [],
        }
        self.say(f"validating v{version} on {size} prompt(s) while training goes on")

    # ---- holding and collecting --------------------------------------------------------------
    @property
    def holding(self) -> bool:
        """A validation is under way: weight syncs wait (module docstring)."""
        return self.active is not None

    def poll(self, step: int) -> None:
        """Read the records that arrived; log and release the hold once all are in or the
        deadline passed."""
        a = self.active
        if a is None:
            return
        self._collect(a)
        now, timeout = time.monotonic(), self.cfg.eval.timeout_s
        late = now - a["t0"] > timeout
        if len(a["by_index"]) >= a["size"] or late:
            self._finish(step, complete=not late)
        elif now - a["progress"] > timeout / REQUEUE_FRACTION:
            self._requeue(a)

    def _collect(self, a: dict) -> None:
        """Read the new records; keep the first of each prompt index."""
        new = self.queue.results(a["version"], a["read"])
        a["read"] += len(new)
        for record in new:
            index = record.get("index")
            if not isinstance(index, int) or not 0 <= index < a["size"]:
                a["other"].append(record)
            elif index not in a["by_index"]:
                a["by_index"][index] = record
                a["progress"] = time.monotonic()

    def _requeue(self, a: dict) -> None:
        """No prompt came back for a while: hand the chunks still missing prompts out again
        (an actor holding them died, or is slow: then the first record of a prompt counts)."""
        c = self.cfg.eval.chunk_prompts
        starts = sorted({i - i % c for i in range(a["size"]) if i not in a["by_index"]})
        self.queue.requeue(a["version"], starts)
        a["progress"] = time.monotonic()
        self.say(
            f"validation of v{a['version']}: no prompt came back for "
            f"{self.cfg.eval.timeout_s / REQUEUE_FRACTION:.0f} s; handing {len(starts)} "
            "chunk(s) out again (an actor holding them may have died)"
        )

    def wait(self, step: int, stop: Callable[[], bool]) -> None:
        """Poll until the validation under way ends (its deadline bounds this), or a stop."""
        last_say = time.monotonic()
        while self.active is not None and not stop():
            self.poll(step)
            if self.active is not None and time.monotonic() - last_say > 15:
                a, last_say = self.active, time.monotonic()
                self.say(
                    f"waiting for validation of v{a['version']}: {len(a['by_index'])}/"
                    f"{a['size']} prompts in (eval.timeout_s={self.cfg.eval.timeout_s:g})"
                )
            time.sleep(0.1)

    def _finish(self, step: int, complete: bool) -> None:
        a, self.active = self.active, None
        assert a is not None, "poll() finishes only a validation under way"
        seconds = time.monotonic() - a["t0"]
        self.queue.finish(a["version"])
        self.done_versions.add(a["version"])
        records = [a["by_index"][i] for i in sorted(a["by_index"])] + a["other"]
        metrics = summarize(records, self.cfg.eval.pass_threshold)
        record = {
            "step": step,
            "val/version": float(a["version"]),
            **metrics,
            "val/complete": float(complete),
            "val/seconds": seconds,
        }
        samples = samples_of(a["by_index"], min(self.cfg.eval.log_samples, a["size"]))
        if samples:
            record["samples"] = samples
        if not complete:
            self.say(
                f"validation of v{a['version']} timed out after {seconds:.0f} s "
                f"(eval.timeout_s) with {len(a['by_index'])}/{a['size']} prompts; logged "
                "what came back (val/complete 0). Are the actors alive and is "
                "eval.timeout_s long enough for the set?"
            )
        if metrics.get("val/off_version"):
            self.say(
                f"validation of v{a['version']}: {metrics['val/off_version']:.0f} prompt(s) "
                "had tokens of another version and were left out"
            )
        self.log(record)

    def abandon(self, step: int) -> None:
        """The run ends: log a validation that has just come in; withdraw one still running."""
        self.poll(step)
        a = self.active
        if a is not None:
            self.active = None
            self.queue.finish(a["version"])
            self.say(
                f"validation of v{a['version']} was still running when the run ended "
                f"({len(a['by_index'])}/{a['size']} prompts in); not logged (eval.at_end "
                "waits for the final one)"
            )
