"""One actor process: lease a slot -> next prompt -> n samples -> rewards -> commit a group.

    control task:  weights_init -> join the weight collective;  update v -> receive weights
    producer:      take every free engine slot (actors/slots.py), then one worker-thread
                   trip for all of them (actors/claims.py): [admission: weights fresh
                   enough? sync quota left?] -> leases (blocks while the buffer is full)
                   -> prompt indices from the cursor; then spawn a group task per claim
    group task:    vLLM generate (n, logprobs, per-token versions) -> reward -> commit
                   (the n rewards at once in a worker pool, each with a deadline:
                   actors/scoring.py)

Many prompts are in flight at once (``actor.max_inflight``); groups are committed as they
finish, not in lockstep.

Prompt cursor (survives SIGKILL; ``buffer.cursors.PromptCursor``): actor i takes prompts i,
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
exhausted and no group is left to read (learner/data.py). The actor itself stays up, serving
the control plane, until the learner stops it.

Where the actor's time goes (``asyncrl.metrics.StateClock``, exported as
``asyncrl_actor_time_seconds_total{state}``), in priority order::

    paused           a weight update holds the engine (pause -> receive -> resume)
    generating       at least one group is generating, scoring or committing
    waiting_weights  nothing in flight; admission refused (weights too stale, or the sync
                     quota of this version is used up)
    waiting_buffer   nothing in flight; no free slot in the buffer (backpressure)
    idle             nothing in flight, nothing blocking (between loop iterations)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.claims import Claims
from actors.engine_protocol import Engine
from actors.slots import Slots
from asyncrl.config import Config
from asyncrl.faults import failpoint
from asyncrl.metrics import ACTOR_STATES, ActorMetrics, StateClock
from asyncrl.types import Group, Sample


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
    """Failed reward calls by kind (``asyncrl.reward_records.REWARD_ERROR_KINDS``)."""
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
    ``control_loop`` (weight syncs), over a ``ReplayBuffer`` and an ``Engine``."""

    def __init__(
        self,
        cfg: Config,
        actor_id: int,
        model_dir: str,
        buffer,
        engine: Engine,
        prompts,
        reward_fn,
    ):
        from transformers import AutoTokenizer

        from actors.scoring import RewardScorer

        self.cfg = cfg
        self.state = ActorState(actor_id)
        self.buffer = buffer
        self.engine = engine
        self.prompts = prompts
        self.scorer = RewardScorer(reward_fn, cfg.task, self._say, self._count_reward_error)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._tasks: dict[asyncio.Task, str] = {}  # group task -> its lease
        self._version_changed = asyncio.Event()
        self.error: Exception | None = None
        self.clock = StateClock(ACTOR_STATES, "starting")
        self.metrics = ActorMetrics(
            {"buffer_name": cfg.buffer.name, "actor_id": actor_id}, self.clock
        )
        self._inflight = 0
        self._paused = False
        self._blocked = "idle"
        # the stride: every actor of the job (num_actors on each of actor.nnodes hosts)
        self.claims = Claims(buffer, actor_id, cfg.actor.total, prompts.end,
                             cfg.learner.batch_groups, cfg.buffer.max_staleness,
                             cfg.mode.name == "sync")  # fmt: skip
        self.cursor = self.claims.cursor

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
            state = "generating"
        else:
            state = self._blocked
        if state != self.clock.state:
            self.clock.set(state)

    def _block(self, reason: str) -> None:
        self._blocked = reason
        self._refresh_state()

    # ---- control plane -------------------------------------------------------------------
    async def control_loop(self, client) -> None:
        """Serve the learner's messages until ``stop``.

        A failed join or receive does not end the actor: the engine marks its weights invalid
        (generation waits), the learner pings every actor, rebuilds the weight group with
        those that answer ``pong`` and sends the weights again in full (learner/weight_sender
        ``ActorWeightChannel``). A restarted actor rejoins the same way: it registers, the
        learner rebuilds the group with it and sends it the current weights in full.
        """
        from asyncrl.weights import WeightSyncError

        await client.send({"type": "register"})
        heard = time.monotonic()
        while not self.state.stop:
            msg = await client.recv(0.5)
            if msg is None:
                if time.monotonic() - heard > _LEARNER_QUIET_S:
                    heard = time.monotonic()
                    await self._follow_learner(client)
                continue
            heard = time.monotonic()
            try:
                await self._on_control(client, msg)
            except WeightSyncError as e:
                self.state.weight_sync_failures += 1
                print(
                    f"[actor {self.state.actor_id}] {e}; waiting for the learner to rebuild "
                    "the weight group",
                    flush=True,
                )
        self._version_changed.set()

    async def _follow_learner(self, client) -> None:
        """After a quiet spell, re-read the learner's address from the buffer meta: a learner
        that restarted (or a run dir reused, whose meta held the previous learner's address
        until the new one published its own) listens elsewhere. Re-register there; it sends
        ``weights_init`` and the current weights as to any newly registered actor."""
        from asyncrl.control import Endpoint

        endpoint = Endpoint.from_meta(await asyncio.to_thread(self.buffer.meta))
        if endpoint and endpoint != client.endpoint:
            print(f"[actor {self.state.actor_id}] the learner's control plane moved to "
                  f"{endpoint.address} (a restarted learner); registering there",
                  flush=True)  # fmt: skip
            client.connect(endpoint)
            await client.send({"type": "register"})

    async def _on_control(self, client, msg: dict) -> None:
        kind = msg["type"]
        if kind == "weights_init":
            info = {k: v for k, v in msg.items() if k != "type"}
            # gloo binds this host's own address (the learner's is master_address)
            await self.engine.join_weight_sync(
                {**info, "local_address": self.cfg.network.interface}
            )
        elif kind == "update":
            await self._update_weights(int(msg["version"]))
            self._version_changed.set()
            await client.send({"type": "updated", "version": self.state.version})
        elif kind == "ping":
            await client.send({"type": "pong", "nonce": msg.get("nonce")})
        elif kind == "stop":
            self.state.stop = True

    async def _update_weights(self, version: int) -> None:
        failpoint("actor.before_weight_receive", version=version)  # a slow or frozen actor
        t0 = time.monotonic()
        self._paused = True
        self._refresh_state()
        try:
            await self.engine.update_weights(version, self.cfg.actor.update_mode)
        finally:
            self._paused = False
            self._refresh_state()
        seconds = time.monotonic() - t0
        self.state.version = version
        self.state.weight_syncs += 1
        self.state.weight_sync_s += seconds
        self.metrics.version.set(version)
        self.metrics.sync_seconds.observe(seconds)

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
                self.claims.claim, want, self.state.version, self.engine.weights_valid,
                self._track_epoch,
            )  # fmt: skip
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

    def stats(self) -> dict:
        """What this actor did, for ``<run_dir>/actor<i>.json`` (benchmarks read it)."""
        from dataclasses import asdict

        return {**asdict(self.state), "time_s": self.clock.totals()}

    async def _generate(self, prompt_ids: list[int], seed: int) -> list:
        a = self.cfg.actor
        return await generate_whole(
            self.engine,
            prompt_ids,
            a.n_samples,
            a.max_tokens,
            a.temperature,
            seed,
            top_p=a.top_p,
            top_k=a.top_k,
            stop=a.stop,
        )

    async def make_group(self, index: int, generated: Callable[[], None] = lambda: None) -> Group:
        """Prompt ``index`` -> ``n_samples`` whole completions -> rewards -> one Group.
        ``generated()`` is called once the completions are in, before scoring (the caller
        gives the engine's slot to the next prompt then).

        A reward function that fails gives its sample reward 0 and the reason in
        ``Sample.reward_error`` (counted in ``reward_errors``); the group is still committed.
        Too many failures among the recent rewards raise ``actors.scoring.RewardErrorRate``.
        """
        prompt = self.prompts.get(index)
        ids = prompt.token_ids  # set by a source that tokenized it (a chat template)
        prompt_ids = ids if ids is not None else self.tokenizer.encode(prompt.text)
        seed = (self.cfg.seed * 1_000_003 + index) % (2**31)
        completions = await self._generate(prompt_ids, seed)  # abort-mode cuts resubmitted
        generated()
        texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        rewards = await self.scorer.score_all(prompt.text, texts, prompt.fields)  # at once
        samples = []
        for c, scored in zip(completions, rewards, strict=True):
            samples.append(
                Sample(
                    list(prompt_ids),
                    list(c.token_ids),
                    list(c.logprobs),
                    list(c.token_versions),
                    scored.value,
                    c.finish_reason,
                    scored.reason,
                    scored.extras,
                )
            )
        return Group(f"{self.cfg.task.seed}:{index}", index, self.state.actor_id, samples)


_LEARNER_QUIET_S = 5.0  # no learner message for this long: check its address in the meta
_MAX_RESUBMITS = 10  # update_mode=abort: a request cut by more syncs than this is an error


async def generate_whole(
    engine: Engine,
    prompt_ids: list[int],
    n: int,
    max_tokens: int,
    temperature: float,
    seed: int,
    **sampling: Any,
) -> list:
    """n completions, none of them aborted (``abort`` updates cut requests: resubmit them).
    ``sampling``: ``Engine.generate``'s keyword options (``top_p``, ``top_k``, ``stop``),
    passed on as given (validation passes none: it samples without them)."""
    for _ in range(_MAX_RESUBMITS):
        completions = await engine.generate(
            prompt_ids, n, max_tokens, temperature, seed, **sampling
        )
        if all(c.finish_reason != "abort" for c in completions):
            return completions
    raise RuntimeError(f"a request was aborted by {_MAX_RESUBMITS} weight updates in a row")


async def wait_for_learner(buffer, wait):
    """The learner publishes its control endpoint (``asyncrl.control.Endpoint``: address and
    keys) in the buffer's meta; wait for it.

    ``wait`` (``asyncrl.waiting.Wait``) reports progress, raises ``TimeoutError`` at its
    deadline and ``StopRequested`` once a stop was requested.
    """
    from asyncrl.control import Endpoint

    wait.begin()
    while True:
        endpoint = Endpoint.from_meta(await asyncio.to_thread(buffer.meta))
        if endpoint:
            return endpoint
        wait.check()
        await asyncio.sleep(0.5)
