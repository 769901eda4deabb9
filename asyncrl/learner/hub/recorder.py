"""Rank 0's run recorder: where the learner's time goes, the step records, the run totals and
the buffer's ledger, written to ``metrics.jsonl``, the trackers, Prometheus and, at the end,
``summary.json``.

Where the learner's time goes is read off the hub's calls (``asyncrl.core.observe.metrics.StateClock``)::

    starting      until every actor registered and the weight channel is open
    waiting_data  inside next_groups (reading, validating, dropping stale groups)
    weight_sync   inside send_weights (broadcast + every actor's ack, or with
                  learner.defer_weight_ack the packing and the wait for the last sync's ack;
                  the FSDP gather before it is not visible here and counts as busy)
    checkpoint    from trained_ids to ack_trained (the save between them)
    busy          everything else: collate/scatter, forward/backward/step, gather

``RunRecorder`` is the real one; tests/fakes/learner.py has its fake for unit tests (records in
lists, no files or ports). Both satisfy ``Recorder``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Protocol

from asyncrl.buffer.ledger import LedgerWatch
from asyncrl.core.config.job import Config
from asyncrl.core.net.endpoints import register_endpoint
from asyncrl.core.observe.metrics import (
    LEARNER_STATES,
    LearnerMetrics,
    StateClock,
    role_port,
    serve,
)
from asyncrl.core.observe.trackers import open_trackers
from asyncrl.learner.hub.runlog import RunLog
from asyncrl.learner.hub.totals import RunTotals

if TYPE_CHECKING:
    from asyncrl.buffer.faces import LearnerBuffer


class Recorder(Protocol):
    """What the hub asks of its recorder."""

    def ready(self) -> None: ...

    def mark(self, state: str) -> None: ...

    def timed(self, state: str) -> AbstractContextManager[None]: ...

    def count_sync(self, failures: int, regroups: int, done: tuple[int, float] | None) -> None:
        """A sync attempt's faults; ``done`` = (bytes, seconds) once the sync succeeded."""

    def step(
        self, fields: dict, groups: list, stale: list[int], dropped: dict, metrics: dict
    ) -> None: ...

    def check_ledger(self, stats: dict, version: int, repairs) -> list[str]: ...

    def tallies(self) -> dict: ...

    def restore_tallies(self, saved: dict) -> None: ...

    def write_summary(self, extra: dict) -> dict: ...

    def close(self, status: str) -> None: ...


class TimedMarks:
    """``timed`` on top of a recorder's ``mark`` (one home for both recorders)."""

    def mark(self, state: str) -> None:
        raise NotImplementedError

    @contextmanager
    def timed(self, state: str) -> Iterator[None]:
        """Count the block's time as ``state``, then ``busy`` again."""
        self.mark(state)
        try:
            yield
        finally:
            self.mark("busy")


class RunRecorder(TimedMarks):
    """The run log, the learner's Prometheus metrics, the state clock, the run totals and the
    ledger watch of one learner run."""

    def __init__(self, cfg: Config, run_dir: str, buffer: LearnerBuffer, say) -> None:
        self.totals = RunTotals()
        self.clock = StateClock(LEARNER_STATES, "starting")
        self.log = RunLog(
            run_dir,
            quiet="console" not in cfg.logger,
            total_steps=cfg.learner.steps,
            trackers=open_trackers(cfg, run_dir),
        )
        self.ledger = LedgerWatch(cfg.buffer.name)  # the buffer's conservation law, every step
        info = {
            "buffer_name": cfg.buffer.name,
            "mode": cfg.mode.name,
            "max_staleness": cfg.buffer.max_staleness,
        }
        self.metrics = LearnerMetrics(info, self.clock, buffer)
        port = serve(
            self.metrics.registry, role_port(cfg.metrics_port, "learner"), cfg.network.metrics
        )
        if port:
            register_endpoint(buffer.client, cfg.buffer.name, "learner", port, cfg.network)
            say(f"metrics on http://{cfg.network.metrics}:{port}/metrics")
        self._dropped_seen: dict[str, int] = {}
        self._masks_stale = cfg.algorithm.stale_tokens == "mask"  # else stale tokens train
        self._start_clock()

    def ready(self) -> None:
        """The start-up is over: the learner is ``busy`` from now, and the run's clock
        (elapsed time, step timing) starts."""
        self.clock.set("busy")
        self._start_clock()

    def _start_clock(self) -> None:
        self._last_t = self._ready_t = time.monotonic()
        self._last_totals = self.clock.totals()
        self._last_cpu = time.process_time()

    def mark(self, state: str) -> None:
        """The learner is in ``state`` from now (LEARNER_STATES)."""
        self.clock.set(state)

    def count_sync(self, failures: int, regroups: int, done: tuple[int, float] | None) -> None:
        self.metrics.sync_failures.inc(failures)
        self.metrics.sync_regroups.inc(regroups)
        self.totals.count_sync_faults(failures, regroups)
        if done is not None:
            nbytes, seconds = done
            self.metrics.sync_seconds.observe(seconds)
            self.metrics.sync_bytes.inc(nbytes)
            self.totals.count_sync(nbytes, seconds)

    def step(
        self, fields: dict, groups: list, stale: list[int], dropped: dict, metrics: dict
    ) -> None:
        """Log one step: the hub's ``fields`` (``step``: the version the batch was read at,
        ``version``, ``reward``, ...), the groups' rates, the admission totals, the step's
        timing and the loss ``metrics``; ``stale[i]`` is group i's staleness; ``dropped``
        (run totals by reason) counts into Prometheus."""
        now = time.monotonic()
        dt, self._last_t = max(now - self._last_t, 1e-9), now
        version = fields["version"]
        masked = int(metrics.get("tokens_masked_stale", 0)) if self._masks_stale else 0
        self.totals.count_trained(groups, stale, fields["step"], masked)
        for reason, count in dropped.items():
            seen = self._dropped_seen.get(reason, 0)
            self.metrics.dropped.labels(reason).inc(max(0, count - seen))
            self._dropped_seen[reason] = max(seen, count)
        record = {
            **fields,
            "groups_per_s": len(groups) / dt,
            "tokens_per_s": sum(g.num_tokens for g in groups) / dt,
            **{k: x for k, x in self.totals.admission().items() if x is not None},
            **self._step_timing(now),
            **{k: float(x) for k, x in metrics.items()},
        }
        losses = {k: float(x) for k, x in metrics.items() if not k.startswith("dropped_")}
        self.metrics.observe_step(version, groups, stale, fields["reward"], dt, losses)
        self.log.log(record)

    def _step_timing(self, now: float) -> dict:
        """This step's seconds per learner state (a checkpoint lands in the step after it)."""
        totals = self.clock.totals()
        delta = {k: totals[k] - self._last_totals[k] for k in totals}
        self._last_totals = totals
        cpu = time.process_time()
        cpu_s, self._last_cpu = cpu - self._last_cpu, cpu
        return {
            "elapsed_s": now - self._ready_t,
            "step_s": sum(delta.values()),
            **{f"{k}_s": delta[k] for k in ("busy", "waiting_data", "weight_sync", "checkpoint")},
            # rank 0's CPU seconds in the step: busy_s far above it means the process was
            # starved (cores shared with other processes) or waiting in collectives
            "cpu_s": cpu_s,
        }

    def check_ledger(self, stats: dict, version: int, repairs) -> list[str]:
        """The buffer's conservation law at ``version`` (buffer/ledger.py): lines to say."""
        return self.ledger.check(stats, version, repairs)

    def write_summary(self, extra: dict) -> dict:
        return self.log.write_summary(extra)

    def close(self, status: str) -> None:
        """End the run log and the trackers' runs with ``status`` (idempotent)."""
        self.log.close(status)

    def tallies(self) -> dict:
        """The run's totals so far (learner/hub/totals.py), saved in each checkpoint."""
        wall = time.monotonic() - self._ready_t
        return self.totals.to_dict(self.clock.totals(), wall, self.ledger.to_dict())

    def restore_tallies(self, saved: dict) -> None:
        """Start from a checkpoint's ``tallies()`` (absent in older checkpoints: from 0)."""
        if not saved:
            return
        self.totals.restore(saved)
        self.ledger.restore(saved.get("ledger"))  # absent: from a balanced ledger
