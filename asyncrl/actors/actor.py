"""One actor process: lease a slot -> next prompt -> n samples -> rewards -> commit a group.

    control task:  weights_init -> join the weight collective;  update v -> receive weights
                   (actors/control_plane.py)
    producer:      take every free engine slot (actors/slots.py), then one worker-thread
                   trip for all of them (actors/claims.py): [admission: weights fresh
                   enough? sync quota left?] -> leases (blocks while the buffer is full)
                   -> prompt indices from the cursor; then spawn a group task per claim
    group task:    vLLM generate (n, logprobs, per-token versions) -> reward
                   (actors/groups.py; the n rewards at once in a worker pool, each with
                   a deadline: actors/rewards/scoring.py) -> commit

Many prompts are in flight at once (``actor.max_inflight``); groups are committed as they
finish, not in lockstep.

Prompt cursor (survives SIGKILL; ``asyncrl.buffer.cursors.PromptCursor``): actor i takes prompts i,
i+K, i+2K, ... (K actors). A claimed index stays in flight in the buffer until its group was
committed (or found already committed); a restarted actor first re-generates the indices left
in flight, then claims new ones, so no prompt is skipped. The commit takes the index out of
the in-flight set in the same script, so no kill falls between them; group ids are still
deterministic (``task_seed:index``) and commit dedupes by group id, so a commit retried after
a lost reply stores the group once (counted as a duplicate by the actor).

End of the data: a finite source (``task.name=file``: ``data.epochs`` passes over the data)
has an ``end`` index; the cursor claims no index from there on. The actor then stops
producing, lets its groups in flight finish and commit, and marks itself exhausted in the
buffer meta (``exhausted_actor_<i>``); the learner ends the run once every actor is
exhausted and no group is left to read (learner/hub/data.py). The actor itself stays up, serving
the control plane, until the learner stops it.

Where the actor's time goes (``asyncrl.core.observe.metrics.StateClock``, exported as
``asyncrl_actor_time_seconds_total{state}``), in priority order::

    paused           a weight update holds the engine (pause -> receive -> resume)
    generating       at least one group is generating, scoring or committing
    waiting_env      multi-turn: groups in flight, but none at the engine: every episode in
                     flight waits for its environment or tools (``episodes/activity.py``)
    waiting_weights  nothing in flight; admission refused (weights too stale, or the sync
                     quota of this version is used up)
    waiting_buffer   nothing in flight; no free slot in the buffer (backpressure), or none
                     within the admission window (``buffer.admission=window``)
    idle             nothing in flight, nothing blocking (between loop iterations)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asyncrl.actors.claims import Claims
from asyncrl.actors.control_plane import ControlPlane
from asyncrl.actors.engine.protocol import Engine
from asyncrl.actors.groups import GroupMaker
from asyncrl.actors.slots import Slots
from asyncrl.core.config.job import Config
from asyncrl.core.observe.metrics import ACTOR_STATES, ActorMetrics, StateClock
from asyncrl.core.types import Group

if TYPE_CHECKING:
    from asyncrl.buffer.faces import ActorBuffer
    from asyncrl.core.net.control import ControlClient


@dataclass
class ActorState:
    actor_id: int
    version: int = 0
    """Version of the weights the engine holds now."""
    stop: bool = False
    committed: int = 0
    duplicates: int = 0
    reward_errors: int = 0
    reward_errors_by_kind: dict[str, int] = field(default_factory=dict)
    """Failed reward calls by kind (``asyncrl.learner.hub.reward_records.REWARD_ERROR_KINDS``)."""
    groups_generated: int = 0
    samples_generated: int = 0
    tokens_generated: int = 0
    """Completion tokens."""
    weight_syncs: int = 0
    weight_sync_s: float = 0.0
    weight_sync_failures: int = 0
    """Joins or receives that failed (the learner rebuilt the group and sent again)."""
    epoch: int = 0
    """Epoch of the last prompt index claimed (a finite source: ``index // prompts per
    epoch``; always 0 for an endless one)."""
    data_exhausted: bool = False
    """The prompt source has no index left for this actor; it produces no more groups."""


class Actor:
    """One actor: ``produce`` (admission -> lease -> cursor -> group tasks) and
    ``control_loop`` (weight syncs), over a ``ReplayBuffer`` (its ``ActorBuffer`` face) and
    an ``Engine``."""

    def __init__(
        self,
        cfg: Config,
        actor_id: int,
        model_dir: str,
        buffer: ActorBuffer,
        engine: Engine,
        prompts,
        reward_fn,
    ):
        from asyncrl.actors.rewards.scoring import RewardScorer
        from asyncrl.core.tokenizer import load_tokenizer

        self.cfg = cfg
        self.state = ActorState(actor_id)
        self.buffer = buffer
        scorer = RewardScorer(reward_fn, cfg.task, self._say, self._count_reward_error)
        tokenizer = load_tokenizer(model_dir)
        self.groups = GroupMaker(cfg, actor_id, engine, prompts, tokenizer, scorer)
        self._tasks: dict[asyncio.Task, str] = {}  # group task -> its lease
        self._version_changed = asyncio.Event()
        self.error: Exception | None = None
        self.clock = StateClock(ACTOR_STATES, "starting")
        self.metrics = ActorMetrics(
            {"buffer_name": cfg.buffer.name, "actor_id": actor_id}, self.clock
        )
        self._watch_tallies()
        self._inflight = 0
        self._paused = False
        self._blocked = "idle"
        if self.groups.activity is not None:  # episodes: their env waits are waiting_env
            self.groups.activity.on_change = self._refresh_state
        paced = cfg.buffer.admission == "window"
        window = (lambda: self.state.version) if paced else None
        self.claims = Claims(buffer, actor_id, cfg, prompts.end, window)
        self.cursor = self.claims.cursor
        self.control = ControlPlane(
            cfg, engine, buffer, self.state, self.metrics, self._set_paused, self._version_changed
        )

    # the group maker's parts, read-only here (one home: replace them on ``self.groups``)
    engine = property(lambda self: self.groups.engine)
    prompts = property(lambda self: self.groups.prompts)
    tokenizer = property(lambda self: self.groups.tokenizer)
    scorer = property(lambda self: self.groups.scorer)

    def _say(self, text: str) -> None:
        print(f"[actor {self.state.actor_id}] {text}", flush=True)

    def _count_reward_error(self, kind: str) -> None:
        by_kind = self.state.reward_errors_by_kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
        self.state.reward_errors += 1

    def _refresh_state(self) -> None:
        """Derive the clock's state from (paused, in-flight groups, what blocks admission)."""
        if self._paused:
            state = "paused"
        elif self._inflight:
            busy = self.groups.activity is None or not self.groups.activity.waiting_env
            state = "generating" if busy else "waiting_env"
        else:
            state = self._blocked
        if state != self.clock.state:
            self.clock.set(state)

    def _block(self, reason: str) -> None:
        self._blocked = reason
        self._refresh_state()

    def _set_paused(self, paused: bool) -> None:
        self._paused = paused
        self._refresh_state()

    async def control_loop(self, client: ControlClient) -> None:
        """Serve the learner's messages until ``stop`` (actors/control_plane.py)."""
        await self.control.run(client)

    # ---- production ------------------------------------------------------------------------
    async def produce(self) -> None:
        slots = Slots(self.cfg.actor.max_inflight)
        self._block("idle")
        await asyncio.to_thread(self._publish_data)
        await asyncio.to_thread(self._resume_prompts)
        while not self.state.stop:
            if self.error is not None:
                await self._cancel_groups()  # give their slots back before failing
                raise self.error
            want = await slots.take()
            self._block("waiting_buffer")  # lease_many() waits while the buffer is full
            outcome, claims = await asyncio.to_thread(
                self.claims.claim,
                want,
                self.state.version,
                self.engine.weights_valid,
                self._track_epoch,
            )
            slots.give(want - len(claims))
            if outcome == "refused":  # wait for new weights; "full": backpressure, again
                await self._wait_for_weights()
            self._block("idle")
            for lease, index in claims:
                task = asyncio.create_task(self._group_task(index, lease, slots))
                self._tasks[task] = lease
                task.add_done_callback(lambda t: self._tasks.pop(t, None))
            if outcome == "exhausted":  # no prompt left: finish what is in flight, then idle
                await self._finish_data()
                return
        await self._cancel_groups()

    def _publish_data(self) -> None:
        """A finite source: its prompts per epoch for the learner's ``epoch`` metric, and this
        actor not exhausted (yet: a resumed run may have been given more epochs)."""
        size = getattr(self.prompts, "size", None)
        if self.prompts.end is not None and size:
            self.buffer.set_meta(
                prompts_per_epoch=size, **{f"exhausted_actor_{self.state.actor_id}": 0}
            )

    async def _finish_data(self) -> None:
        """Wait for the groups in flight (a stop cancels them instead), then say so and mark
        this actor exhausted in the buffer meta."""
        while self._tasks and not self.state.stop:
            await asyncio.wait(list(self._tasks), timeout=0.5)
        if self.state.stop:
            await self._cancel_groups()
            return
        if self.error is not None:
            raise self.error
        self.state.data_exhausted = True
        self._block("idle")
        await asyncio.to_thread(
            self.buffer.set_meta, **{f"exhausted_actor_{self.state.actor_id}": 1}
        )
        self._say(
            f"no prompts left ({self.prompts.end} = {getattr(self.prompts, 'epochs', '?')} "
            f"epoch(s) of {getattr(self.prompts, 'size', '?')} over "
            f"{self.cfg.actor.total} actor(s)); committed {self.state.committed} groups, "
            "now idle until the learner ends the run"
        )

    async def _cancel_groups(self) -> None:
        """Stop: cancel the groups in flight and give their slots back (their prompt indices
        stay in flight for the next run). A task cancelled before it started never ran its
        own release, so every lease is released here too (a no-op for released ones)."""
        held = dict(self._tasks)
        for t in held:
            t.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        await asyncio.to_thread(lambda: [self.buffer.release(x) for x in held.values()])

    async def _wait_for_weights(self) -> None:
        """Admission refused: wait (at most 0.2 s) for the control task's next update."""
        self._block("waiting_weights")
        self._version_changed.clear()
        try:
            await asyncio.wait_for(self._version_changed.wait(), timeout=0.2)
        except asyncio.TimeoutError:
            pass

    def _resume_prompts(self) -> None:
        """Read the prompt indices an earlier run of this actor left in flight (the cursor
        hands them out first) and say so."""
        left = self.cursor.resume()
        if left:
            self._say(
                f"resuming {len(left)} prompt(s) left in flight by an earlier run: {left[:8]}"
            )

    def _track_epoch(self, index: int) -> int:
        """Say when this actor's prompts enter a new epoch (finite sources); ``index``."""
        epoch = self.prompts.epoch_of(index)
        if epoch > self.state.epoch or (epoch and not self.state.groups_generated):
            epochs = getattr(self.prompts, "epochs", "?")
            self._say(f"epoch {epoch + 1}/{epochs} (prompt index {index})")
        self.state.epoch = max(self.state.epoch, epoch)
        return index

    async def _group_task(self, index: int, lease: str, slots: Slots) -> None:
        """One group: generate (holding one of ``max_inflight`` engine slots, given back as
        soon as the completions are in, so scoring and committing overlap the next prompts'
        generation), score, commit. The lease bounds the groups in flight in all."""
        self._inflight += 1
        self.metrics.inflight.inc()
        self._refresh_state()
        t0 = time.monotonic()
        slot = [True]  # held

        def give_back() -> None:
            if slot[0]:
                slot[0] = False
                slots.give()

        try:
            group = await self.make_group(index, give_back)
            self._count_generated(group, time.monotonic() - t0)
            # A stop cancels this task; a commit already under way (in a thread, so it lands
            # in Redis either way) finishes and is counted first, or the actor's tally and
            # its in-flight set would disagree with the buffer.
            commit = asyncio.ensure_future(self._commit_and_count(index, lease, group))
            try:
                await asyncio.shield(commit)
            except asyncio.CancelledError:
                await commit
                raise
        except asyncio.CancelledError:
            await asyncio.to_thread(self.buffer.release, lease)
            raise
        except Exception as e:  # surfaced by produce(): the actor exits non-zero with it
            await asyncio.to_thread(self.buffer.release, lease)
            self.error = self.error or e
        finally:
            give_back()
            self._inflight -= 1
            self.metrics.inflight.dec()
            self._refresh_state()

    async def _commit_and_count(self, index: int, lease: str, group: Group) -> None:
        fresh = await asyncio.to_thread(
            self.claims.commit, lease, group, index, lambda: self.state.stop
        )
        if fresh is None:  # stopping with no slot: the index stays in flight for a restart
            return
        self.state.committed += int(fresh)
        self.state.duplicates += int(not fresh)
        (self.metrics.committed if fresh else self.metrics.duplicates).inc()

    def _count_generated(self, group: Group, seconds: float) -> None:
        tokens = sum(len(s.completion_ids) for s in group.samples)
        errors = sum(1 for s in group.samples if s.reward_error)
        st, m = self.state, self.metrics
        st.groups_generated += 1
        st.samples_generated += len(group.samples)
        st.tokens_generated += tokens
        m.groups.inc()
        m.samples.inc(len(group.samples))
        m.tokens.inc(tokens)
        m.reward_errors.inc(errors)
        m.group_seconds.observe(seconds)

    def _watch_tallies(self) -> None:
        """Episodes' and agents' counts as Prometheus counters (read at scrape time)."""
        from asyncrl.core.observe.tallies import AGENT_TALLY, EPISODE_TALLY

        episodes, agents = self.groups.episodes, self.groups.agents
        if episodes is not None:
            self.metrics.watch(EPISODE_TALLY, lambda: episodes.counts.to_dict())
        if agents is not None:
            self.metrics.watch(AGENT_TALLY, lambda: agents.counts.to_dict())

    def stats(self) -> dict:
        """What this actor did, for ``<run_dir>/actor<i>.json`` (benchmarks read it)."""
        from dataclasses import asdict

        out = {**asdict(self.state), "time_s": self.clock.totals()}
        if self.groups.episodes is not None:  # multi-turn: how the episodes ended
            out["episodes"] = self.groups.episodes.counts.to_dict()
        if self.groups.agents is not None:  # episode.agent: what the agents and endpoint did
            out["agents"] = self.groups.agents.counts.to_dict()
        return out

    async def make_group(self, index: int, generated: Callable[[], None] = lambda: None) -> Group:
        """Prompt ``index`` -> one scored Group (``asyncrl.actors.groups.GroupMaker.make``)."""
        return await self.groups.make(index, generated)


async def wait_for_learner(buffer: ActorBuffer, wait, admission: str = "capacity"):
    """The learner publishes its control endpoint (``asyncrl.core.net.control.Endpoint``: address and
    keys) in the buffer's meta; wait for it.

    ``wait`` (``asyncrl.core.runtime.waiting.Wait``) reports progress, raises ``TimeoutError`` at its
    deadline and ``StopRequested`` once a stop was requested. ``FatalError`` if the learner
    runs another ``buffer.admission`` (published with the endpoint): actors pacing by a window
    whose ``wants`` no learner publishes would wait for it forever.
    """
    from asyncrl.core.net.control import Endpoint

    wait.begin()
    while True:
        meta = await asyncio.to_thread(buffer.meta)
        endpoint = Endpoint.from_meta(meta)
        if endpoint:
            _check_admission(meta.get("admission", "capacity"), admission)
            return endpoint
        wait.check()
        await asyncio.sleep(0.5)


def _check_admission(learner: str, actor: str) -> None:
    from asyncrl.core.runtime.fatal import FatalError

    if learner != actor:
        raise FatalError(
            f"the learner of this buffer runs buffer.admission={learner} and this actor "
            f"buffer.admission={actor}: give every role of the job the same buffer.admission"
        )
