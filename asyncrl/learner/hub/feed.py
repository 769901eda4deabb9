"""Rank 0's data feed: each step's groups from the replay buffer, what was dropped on the
way, and which groups were trained (acked after the checkpoint that holds them).

``DataFeed`` is the real one, over ``asyncrl.learner.hub.data.GroupSource`` and the buffer;
its fake for unit tests is in tests/fakes/learner.py. Both satisfy ``Feed``,
the part of it that ``asyncrl.learner.hub.hub.Hub`` uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from asyncrl.core.config.job import Config
from asyncrl.learner.hub.data import GroupSource

if TYPE_CHECKING:
    from asyncrl.buffer.faces import LearnerBuffer


class Feed(Protocol):
    """What the hub asks of its data feed."""

    epoch: int | None

    def resume(self, ceiling: int | None) -> int:
        """Re-read the entries delivered before a restart (their count); ``ceiling``: the
        newest version this run sent before it (None: a new run)."""

    def set_drop_uniform(self, on: bool) -> None: ...

    def next_entries(self, version: int, n: int) -> list | None:
        """``n`` buffer entries (``.group``, ``.entry_id``) for the step at ``version``;
        None when the hub must send weights first (an actor rejoined)."""

    def step_done(self) -> None: ...

    def mark_trained(self, entries: list) -> None: ...

    def trained_ids(self) -> list[str]: ...

    def take_trained(self) -> list[str]:
        """The trained groups' ids, forgotten here (their acks are under way)."""

    def ack(self, ids: list[str]) -> None: ...

    def data_exhausted(self) -> bool: ...

    def epoch_of(self, groups: list) -> dict: ...

    def dropped_counts(self, stats: dict) -> dict[str, int]:
        """Dropped groups by reason (``stale``, ``uniform``, ``invalid``, ``poison``, ...)."""


class DataFeed:
    """The buffer's groups through its own ``GroupSource`` (staleness admission, validation,
    drops). ``stop``, ``say``, ``interrupt`` (an actor rejoined: sync first) and ``on_read``
    (counts each read) go to the source; the run ends when every actor is exhausted."""

    def __init__(
        self, buffer: LearnerBuffer, cfg: Config, vocab_size: int, *, stop, say, interrupt, on_read
    ) -> None:
        b = cfg.buffer
        self.buffer = buffer
        self.n_actors = cfg.actor.total
        self.source = GroupSource(
            buffer,
            "learner",
            vocab_size,
            b.max_staleness,
            cfg.learner.data_timeout_s,
            stop=stop,
            say=say,
            exhausted=self.data_exhausted,
            interrupt=interrupt,
            admit_by_newest=cfg.algorithm.stale_tokens in ("mask", "interpolate"),
            on_read=on_read,
            # the actors' admission window needs what each read wants
            wants=buffer.set_learner_wants if b.admission == "window" else lambda count: None,
        )
        self._trained: list[str] = []
        self._per_epoch = 0  # prompts per epoch of a finite source (actors publish it)
        self.epoch: int | None = None
        """The newest epoch among the last step's prompts (0-based); None for an endless
        source."""

    def resume(self, ceiling: int | None) -> int:
        if ceiling is not None:
            self.source.ceiling = ceiling
        return self.source.resume()

    def set_drop_uniform(self, on: bool) -> None:
        """DAPO dynamic sampling: drop groups whose rewards are all equal where they are read."""
        self.source.drop_uniform = on

    def next_entries(self, version: int, n: int) -> list | None:
        return self.source.next_batch(version, n)

    def step_done(self) -> None:
        """The step of the last batch ran: a crash from here on is not its data's fault."""
        self.source.step_done()

    def mark_trained(self, entries: list) -> None:
        self._trained.extend(e.entry_id for e in entries)

    def trained_ids(self) -> list[str]:
        """The groups trained since the last ``take_trained`` (their acks wait for a
        checkpoint that holds them)."""
        return list(self._trained)

    def take_trained(self) -> list[str]:
        ids, self._trained = self._trained, []
        return ids

    def ack(self, ids: list[str]) -> None:
        if ids:
            self.buffer.ack(ids, "trained")

    def data_exhausted(self) -> bool:
        """Every actor is out of prompts and committed its last group (actors/actor.py)."""
        meta = self.buffer.meta()
        return all(meta.get(f"exhausted_actor_{i}") == "1" for i in range(self.n_actors))

    def epoch_of(self, groups: list) -> dict:
        """``{"epoch": e}``: the newest epoch among the step's prompts (0-based), for a finite
        prompt source; {} for an endless one."""
        if not self._per_epoch:
            self._per_epoch = int(self.buffer.meta().get("prompts_per_epoch", 0))
        if not self._per_epoch:
            return {}
        self.epoch = max(g.prompt_index for g in groups) // self._per_epoch
        return {"epoch": self.epoch}

    def dropped_counts(self, stats: dict) -> dict[str, int]:
        """Dropped groups by reason: the source's ``dropped_<reason>`` counters + the buffer's
        invalid and poison counts (dead-lettered by the buffer, job-wide; ``stats`` is
        ``ReplayBuffer.audit()``)."""
        src = self.source
        out = {k[8:]: int(getattr(src, k)) for k in vars(src) if k.startswith("dropped_")}
        out["invalid"] = stats["dropped_invalid"]
        out["poison"] = stats["dropped_poison"]
        return out
