"""Fakes of the learner hub's parts for unit tests: a ``Feed`` over a list, a ``Publisher``
that records versions, a ``Recorder`` that keeps everything in lists. Each satisfies the
protocol the real part does (``asyncrl.learner.hub.feed.Feed``,
``asyncrl.learner.weights.publisher.Publisher``, ``asyncrl.learner.hub.recorder.Recorder``)."""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.learner.hub.recorder import TimedMarks


class ListFeed:
    """A ``Feed`` over a list of entries (unit tests): ``n`` at a time, acks recorded."""

    def __init__(self, entries: list, exhausted: Callable[[], bool] = lambda: False) -> None:
        self.entries = list(entries)
        self.acked: list[str] = []
        self.steps_done = 0
        self.drop_uniform = False
        self.epoch: int | None = None
        self._trained: list[str] = []
        self._exhausted = exhausted

    def resume(self, ceiling: int | None) -> int:
        return 0

    def set_drop_uniform(self, on: bool) -> None:
        self.drop_uniform = on

    def next_entries(self, version: int, n: int) -> list | None:
        batch, self.entries = self.entries[:n], self.entries[n:]
        return batch

    def step_done(self) -> None:
        self.steps_done += 1

    def mark_trained(self, entries: list) -> None:
        self._trained.extend(e.entry_id for e in entries)

    def trained_ids(self) -> list[str]:
        return list(self._trained)

    def take_trained(self) -> list[str]:
        ids, self._trained = self._trained, []
        return ids

    def ack(self, ids: list[str]) -> None:
        self.acked.extend(ids)

    def data_exhausted(self) -> bool:
        return self._exhausted()

    def epoch_of(self, groups: list) -> dict:
        return {}

    def dropped_counts(self, stats: dict) -> dict[str, int]:
        return {
            "stale": 0,
            "uniform": 0,
            "invalid": stats.get("dropped_invalid", 0),
            "poison": stats.get("dropped_poison", 0),
        }


class RecordingPublisher:
    """A ``Publisher`` that sends nothing and records each version it was given (unit tests);
    ``fail_first`` tries of each sync fail and are retried."""

    def __init__(self, fail_first: int = 0, nbytes: int = 1) -> None:
        self.versions: list[int] = []
        self.fail_first, self.nbytes = fail_first, nbytes
        self.failures = self.settled = 0
        self.sent_max = -1
        self.events: list[str] = []

    def meta(self) -> dict:
        return {"control": "recording"}

    def open(self) -> None:
        self.events.append("open")

    def stop_actors(self) -> None:
        self.events.append("stop_actors")

    def close(self) -> None:
        self.events.append("close")

    def attempt(self, named, version: int, attempt: int) -> bool:
        for _ in named:  # take part in the gather, as the real one does
            pass
        if attempt < self.fail_first:
            self.failures += 1
            return True
        self.versions.append(version)
        return False

    def faults(self) -> tuple[int, int]:
        return self.failures, self.failures

    def last_sync(self) -> tuple[int, float]:
        return self.nbytes, 0.0

    def rejoin_pending(self) -> bool:
        return False

    def settle(self) -> None:
        self.settled += 1


class MemoryRecorder(TimedMarks):
    """A ``Recorder`` that keeps everything in lists (unit tests): no files, ports or clock."""

    def __init__(self) -> None:
        self.states: list[str] = []
        self.syncs: list[tuple[int, int, tuple[int, float] | None]] = []
        self.records: list[dict] = []
        self.summary: dict | None = None
        self.status: str | None = None
        self.saved: dict = {}

    def ready(self) -> None:
        self.states.append("busy")

    def mark(self, state: str) -> None:
        self.states.append(state)

    def count_sync(self, failures: int, regroups: int, done: tuple[int, float] | None) -> None:
        self.syncs.append((failures, regroups, done))

    def step(
        self, fields: dict, groups: list, stale: list[int], dropped: dict, metrics: dict
    ) -> None:
        self.records.append({**fields, **metrics, "stale": stale, "dropped": dropped})

    def check_ledger(self, stats: dict, version: int, repairs) -> list[str]:
        return []

    def tallies(self) -> dict:
        return dict(self.saved)

    def restore_tallies(self, saved: dict) -> None:
        self.saved = dict(saved or {})

    def write_summary(self, extra: dict) -> dict:
        self.summary = dict(extra)
        return self.summary

    def close(self, status: str) -> None:
        self.status = self.status or status
