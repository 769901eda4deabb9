"""Rank 0's I/O for the learner loop, composed of three parts and the validation:

    feed        learner/hub/feed.py       the step's groups from the buffer; drops; acks
    publisher   learner/weights/publisher.py  the control plane and the weight channel to the actors
    recorder    learner/hub/recorder.py   metrics.jsonl, Prometheus, the state clock, totals,
                                      the ledger, summary.json
    validation  learner/hub/validation.py validations at the actors (eval.*)

The loop in ``learner/trainer.py`` calls, in order: ``start`` once, then per step
``next_groups`` -> (train) -> ``step_done`` -> ``send_weights`` (every sync_every) ->
``after_step``, and at a checkpoint ``trained_ids`` -> (save) -> ``ack_trained``; ``finish``
at the end. The other ranks call the same methods on a ``asyncrl.learner.hub.null.NullHub``.
``connect_hub`` builds the real parts; unit tests give ``Hub`` the fakes of
tests/fakes/learner.py (``ListFeed``, ``RecordingPublisher``, ``MemoryRecorder``).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.buffer import codec
from asyncrl.buffer.staleness import staleness, within_staleness
from asyncrl.core.config.job import BufferConfig, Config
from asyncrl.learner.hub.feed import DataFeed, Feed
from asyncrl.learner.hub.recorder import Recorder, RunRecorder
from asyncrl.learner.hub.reward_records import extras_means
from asyncrl.learner.hub.totals import episode_metrics
from asyncrl.learner.weights.publisher import Publisher, WeightPublisher

if TYPE_CHECKING:
    from torch import Tensor

    from asyncrl.buffer.faces import LearnerBuffer
    from asyncrl.buffer.learner_claim import LearnerClaim
    from asyncrl.core.types import Group
    from asyncrl.learner.hub.validation import Validation
    from asyncrl.learner.state.run_state import LearnerState


def connect_hub(cfg: Config, run_dir: str, redis_url: str, vocab_size: int) -> Hub:
    """Rank 0's hub on the buffer at ``redis_url``: claims the buffer for this run
    (``FatalError`` when another run's learner holds it), serves metrics, and installs the
    SIGTERM/SIGINT handler that asks the loop to stop."""
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import BufferOptions, ReplayBuffer

    b, stop = cfg.buffer, _StopFlag()
    buffer = ReplayBuffer(
        connect(redis_url, timeout_s=b.reconnect_s, say=_say),  # a restart may meet Redis away
        b.name,
        b.capacity,
        BufferOptions(
            lease_ttl_s=b.lease_ttl_s, max_deliveries=b.max_deliveries, reconnect_s=b.reconnect_s
        ),
        stop=stop,
    )
    claim = _claim_buffer(buffer, b, run_dir, stop.lost, _say)
    recorder = RunRecorder(cfg, run_dir, buffer, _say)
    publisher = WeightPublisher(cfg, buffer, _say, stop)
    feed = DataFeed(
        buffer,
        cfg,
        vocab_size,
        stop=stop,
        say=_say,
        interrupt=publisher.rejoin_pending,
        on_read=recorder.totals.count_read,
    )
    logged = {int(r["val/version"]) for r in recorder.log.val_records if "val/version" in r}
    validation = _validation(cfg, buffer, recorder.log.log_val, _say, logged)
    parts = HubParts(feed, publisher, recorder, validation, claim)
    hub = Hub(cfg, run_dir, buffer, parts, stop)
    signal.signal(signal.SIGTERM, stop.set)
    signal.signal(signal.SIGINT, stop.set)
    return hub


class _StopFlag:
    """Set by SIGTERM/SIGINT or a lost buffer claim; ends waits and Redis reconnects."""

    def __init__(self) -> None:
        self.value = False
        self.lost_why = ""
        """Why the buffer's claim was lost ("" while it is held): the run then fails."""
        self.same_run = False

    def __call__(self) -> bool:
        return self.value

    def set(self, *_) -> None:
        self.value = True

    def lost(self, why: str, same_run: bool = False) -> None:
        """Another learner took the buffer (buffer/learner_claim.py): stop, saying so; the
        run then fails with ``why`` (``Hub.claim_lost``), it does not finish as done.
        ``same_run``: the taker is a restarted learner of this run (``Hub.claim_superseded``)."""
        _say(why)
        self.lost_why, self.same_run = why, same_run
        self.value = True


@dataclass(frozen=True)
class HubParts:
    """What a ``Hub`` is made of (``connect_hub`` builds the real ones; unit tests pass the
    fakes of tests/fakes/learner.py)."""

    feed: Feed
    publisher: Publisher
    recorder: Recorder
    validation: Validation | None = None
    """None without ``eval``."""
    claim: LearnerClaim | None = None
    """The buffer's learner claim, released at the end; None in unit tests."""


class Hub:
    """``asyncrl.learner.hub.protocol.LearnerHub``: the loop's calls (module docstring) on the
    parts. ``validation`` is None without
    ``eval``; ``claim`` the buffer's learner claim (released at the end) or None; ``stop``
    the flag that stop requests set."""

    def __init__(
        self,
        cfg: Config,
        run_dir: str,
        buffer: LearnerBuffer,
        parts: HubParts,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.buffer = cfg, Path(run_dir), buffer
        self.feed, self.publisher, self.recorder = parts.feed, parts.publisher, parts.recorder
        self.validation, self.claim = parts.validation, parts.claim
        self._stop = stop or _StopFlag()
        self._entries: list = []
        self._entries_version = 0

    def say(self, text: str) -> None:
        _say(text)

    def stop_requested(self) -> bool:
        return self._stop()

    def claim_lost(self) -> str:
        return getattr(self._stop, "lost_why", "")

    def claim_superseded(self) -> bool:
        return bool(getattr(self._stop, "same_run", False))

    def start(self, version: int) -> None:
        """Publish meta, re-read pending entries, wait for actors, open the weight channel."""
        cfg, pub = self.cfg, self.publisher
        run, meta, ceiling = str(self.run_dir.resolve()), self.buffer.meta(), None
        if meta.get("learner_run_dir") == run:  # a restart of this run: the versions it sent
            sent = int(meta.get("weights_sent_max", -1))  # before are not foreign
            ceiling = pub.sent_max = max(sent, self.buffer.learner_version())
        self.buffer.set_meta(
            **pub.meta(),
            learner_run_dir=run,
            max_staleness=cfg.buffer.max_staleness,
            mode=cfg.mode.name,
            batch_groups=cfg.learner.batch_groups,
            admission=cfg.buffer.admission,
        )
        self.buffer.set_learner_version(version)
        self.buffer.set_learner_last_version(cfg.learner.steps - 1)
        if ceiling is not None and cfg.mode.name == "sync":
            self._reset_sync_quota(version, ceiling)
        codec.warm_up()  # pyarrow's lazy imports (~0.6 s) now, while the actors start
        pending = self.feed.resume(ceiling)
        if pending:
            self.say(f"re-read {pending} groups delivered before a restart")
        if cfg.learner.weight_sync:
            pub.open()
        self.recorder.ready()

    def _reset_sync_quota(self, version: int, ceiling: int) -> None:
        """A restart of a ``mode=sync`` run: the quotas of ``version`` on were held by groups
        of the earlier learner's time that may never be committed (``SyncQuota.reset``)."""
        from asyncrl.buffer.cursors import SyncQuota

        quota = SyncQuota(self.buffer, self.cfg.learner.batch_groups)
        held = quota.reset(version, ceiling + 1)
        if held:
            self.say(
                f"mode=sync restart: forgot {held} admission(s) of version {version} on, made "
                "before the restart (groups never committed would hold them forever)"
            )

    def set_dynamic_sampling(self, on: bool) -> None:
        """DAPO dynamic sampling: drop groups whose rewards are all equal where they are read."""
        self.feed.set_drop_uniform(on)

    def step_done(self) -> None:
        """The step of the last batch ran: a crash from here on is not its data's fault."""
        self.feed.step_done()

    def next_groups(self, version: int) -> list[Group] | None:
        """The step's groups, or None: send weights first (an actor rejoined), then ask again."""
        with self.recorder.timed("waiting_data"):
            entries = self.feed.next_entries(version, self.cfg.learner.batch_groups)
        if entries is None:
            return None
        self._entries, self._entries_version = entries, version
        return [e.group for e in entries]

    def send_weights(
        self, named: Iterable[tuple[str, Tensor]], version: int, attempt: int = 0
    ) -> bool:
        """One try of a weight sync (``ActorWeightChannel.attempt``); True when another try
        should follow (the ranks gather the tensors again). Counted once it ends."""
        pub, rec = self.publisher, self.recorder
        with rec.timed("weight_sync"):
            before = pub.faults()
            try:
                again = pub.attempt(named, version, attempt)
            finally:
                after = pub.faults()
                rec.count_sync(after[0] - before[0], after[1] - before[1], None)
        if again:
            return True
        rec.count_sync(0, 0, pub.last_sync())
        return False

    def after_step(self, state: LearnerState, metrics: dict) -> None:
        """Check the ledger, mark the step's groups trained, log the step's record."""
        # one round trip: counters + integrity (BufferDamaged names a wiped or edited key)
        stats = self.buffer.audit()
        dropped = self.feed.dropped_counts(stats)
        metrics = {**metrics, "dropped_uniform": dropped["uniform"]}
        for line in self.recorder.check_ledger(stats, state.version - 1, self.buffer.repairs):
            self.say(line)
        self.buffer.set_learner_version(state.version)
        entries, v = self._entries, self._entries_version
        self.feed.mark_trained(entries)
        stale = [staleness(v, e.group.version_min) for e in entries]
        groups = [e.group for e in entries]
        samples = [s for g in groups for s in g.episodes]  # an episode's other parts share it
        reward = sum(s.reward for s in samples) / len(samples)
        fields = {
            "step": state.version - 1,
            "version": state.version,
            "reward": reward,
            "staleness_max": max(stale),
            "staleness_mean": sum(stale) / len(stale),
            "dropped_stale": dropped["stale"],
            "dropped_invalid": stats["dropped_invalid"],
            "ledger_imbalance": stats["imbalance"],
            "reward_errors": sum(1 for s in samples if s.reward_error),
            **self.feed.epoch_of(groups),
            **extras_means(samples),  # reward/<key>: a dict's extras
            **episode_metrics(samples),  # episode/*: multi-turn runs only
            "wall_s": state.wall_s,
        }
        self.recorder.step(fields, groups, stale, dropped, metrics)
        if self.validation is not None:
            self.validation.poll(state.version - 1)

    # ---- validation (learner/hub/validation.py) --------------------------------------------------
    def weights_at_actors(self, version: int, start: bool = False) -> None:
        """The actors hold the weights of ``version`` now: validate them if due."""
        v = self.validation
        if v is not None and v.due(version, start=start):
            self._settle_weights()
            v.request(version)

    def sync_allowed(self, version: int, synced: int) -> bool:
        """May the weights of ``version`` go to the actors, which hold ``synced``, now? Not
        while a validation runs, unless the actors' weights fail their own admission
        (``asyncrl.buffer.staleness.within_staleness``: their groups would be too stale to train):
        then wait for it (up to ``eval.timeout_s``) and say so."""
        v = self.validation
        if v is None or not v.holding:
            return True
        v.poll(self._entries_version)
        if v.holding and not within_staleness(version, synced, self.cfg.buffer.max_staleness):
            with self.recorder.timed("waiting_data"):
                v.wait(self._entries_version, self.stop_requested)
        return not v.holding

    def _settle_weights(self) -> None:
        """Wait until the actors loaded the last sync (its deferred ack), so a validation
        requested now runs on those weights."""
        self.publisher.settle()

    def end_validation_due(self, version: int) -> bool:
        """After the last step: finish a validation under way; validate ``version`` too?"""
        v = self.validation
        if v is None:
            return False
        v.wait(version - 1, self.stop_requested)
        return v.due(version, end=True) and not self.stop_requested()

    def validate_final(self, version: int) -> None:
        """Validate the final weights (at the actors now) and wait for the result."""
        v = self.validation
        assert v is not None, "validate_final without eval: end_validation_due said no"
        self._settle_weights()
        v.request(version)
        v.wait(version - 1, self.stop_requested)

    # ---- checkpoints, the end --------------------------------------------------------------
    def no_batch_reason(self) -> str:
        """Why the run ends without a batch to train (``trainer._untrained``)."""
        stats = self.buffer.audit()
        dropped = self.feed.dropped_counts(stats)
        return no_batch_text(self.feed.data_exhausted(), stats["committed"], dropped)

    def trained_ids(self) -> list[str]:
        """Called right before a checkpoint is saved: the clock counts the save from here."""
        self.recorder.mark("checkpoint")
        return self.feed.trained_ids()

    def ack_trained(self) -> None:
        """Called right after the checkpoint is durable. Not after the buffer's claim was
        lost: its pending groups are the new holder's to read, and acking them would drop
        them from its reads."""
        trained = self.feed.take_trained()
        if not self.claim_lost():
            self.feed.ack(trained)
        self.recorder.mark("busy")

    def ack_ids(self, ids: list[str]) -> None:
        self.feed.ack(ids)

    def tallies(self) -> dict:
        """The run's totals so far (learner/hub/totals.py), saved in each checkpoint."""
        return self.recorder.tallies()

    def restore_tallies(self, saved: dict) -> None:
        """Start from a checkpoint's ``tallies()`` (absent in older checkpoints: from 0)."""
        self.recorder.restore_tallies(saved)

    def close_log(self, status: str) -> None:
        """End the run log and the experiment trackers' runs with ``status`` (idempotent);
        give the buffer's learner claim back."""
        self.recorder.close(status)
        if self.claim is not None:
            self.claim.release()

    def finish(self, state: LearnerState) -> dict:
        """Stop the actors, write summary.json and reward.png, print the summary; returns it."""
        if self.validation is not None:
            self.validation.abandon(state.version - 1)
        self.publisher.stop_actors()
        stats = self.buffer.audit()
        for line in self.recorder.check_ledger(stats, state.version, self.buffer.repairs):
            self.say(line)
        epoch = self.feed.epoch
        extra = {
            "groups_committed": stats["committed"],
            "groups_trained": stats["trained"],
            "groups_dropped_stale": stats["dropped_stale"],
            "groups_dropped_invalid": stats["dropped_invalid"],
            "groups_dropped_poison": stats["dropped_poison"],
            "groups_dropped_uniform": stats["dropped_uniform"],
            "groups_still_buffered": stats["still_buffered"],
            "wall_s": state.wall_s,
            "mode": self.cfg.mode.name,
            "max_staleness": self.cfg.buffer.max_staleness,
            "final_version": state.version,
            **({} if epoch is None else {"epoch": epoch}),
            "data_exhausted": self.feed.data_exhausted(),
            "steps_nonfinite_skipped": state.nonfinite_steps,  # counted in groups_trained
            "updates_nonfinite_skipped": state.nonfinite_updates,
            "title": f"{self.cfg.mode.name}, max_staleness={self.cfg.buffer.max_staleness}",
            **self.tallies(),  # with "ledger": did the buffer's counts balance (buffer/ledger.py)
            "dropped_by_reason": self.feed.dropped_counts(stats),
        }
        summary = self.recorder.write_summary(extra)
        self.recorder.close("KILLED" if self.stop_requested() else "FINISHED")
        self.publisher.close()
        if self.claim is not None:
            self.claim.release()
        self.say("summary " + json.dumps(summary))
        return summary


def _validation(cfg: Config, buffer: LearnerBuffer, log_val, say, logged: set[int]):
    """``asyncrl.learner.hub.validation.Validation`` when ``eval`` asks for it, else None;
    ``logged``: the versions val.jsonl already has (a resumed run)."""
    if not cfg.eval.enabled:
        return None
    from asyncrl.learner.hub.validation import Validation

    return Validation(cfg, buffer, log_val, say, logged)


def _say(text: str) -> None:
    print(f"[learner] {text}", flush=True)


def _claim_buffer(buffer: LearnerBuffer, b: BufferConfig, run_dir: str, lost, say):
    """This learner's ``LearnerClaim`` on the buffer, renewed from now on; ``FatalError``
    naming the holder when another run's learner has it (one learner per buffer)."""
    from asyncrl.buffer.learner_claim import ClaimRefused, LearnerClaim
    from asyncrl.core.runtime.fatal import FatalError

    claim = LearnerClaim(buffer.client, b.name, run_dir, b.claim_ttl_s)
    try:
        claim.acquire(say)
    except ClaimRefused as e:
        raise FatalError(str(e)) from None
    claim.keep(lost, say)
    return claim


DROP_ADVICE = {
    "invalid": "a group the buffer refused (a reward that is NaN, inf or not a number, e.g. "
    "1e300 overflowing float32; learner.log names the first reason): check task.reward_fn",
    "uniform": "every sample of a group got the same reward (no learning signal): check the "
    "reward, or algorithm.dynamic_sampling",
    "stale": "older than buffer.max_staleness versions: raise it",
    "poison": "a payload that could not be read (learner.log names it)",
}
"""What to do about groups dropped for each reason, in the no-batch message."""


def no_batch_text(exhausted: bool, committed: int, dropped: dict[str, int]) -> str:
    """The no-batch message: where the groups went and what to check (pure)."""
    where = (
        "every actor ran out of prompts"
        if exhausted
        else "the learner stopped before a batch was complete"
    )
    bad = {k: v for k, v in dropped.items() if v}
    if not bad:
        return f"{where}: {committed} groups committed, none dropped, too few for a batch"
    parts = [f"{n} {k} ({DROP_ADVICE.get(k, 'see learner.log')})" for k, n in bad.items()]
    return f"{where}: {committed} groups committed, dropped: " + "; ".join(parts)
