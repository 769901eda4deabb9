"""Rank 0's I/O for the learner loop: buffer, control plane, weight sender, run log.

The loop in ``learner/trainer.py`` calls, in order: ``start`` once, then per step
``next_groups`` -> (train) -> ``step_done`` -> ``send_weights`` (every sync_every) ->
``after_step``, and at a checkpoint ``trained_ids`` -> (save) -> ``ack_trained``; ``finish``
at the end. The other ranks call the same methods on a ``learner.null_hub.NullHub``.

Where the learner's time goes is read off those calls (``asyncrl.metrics.StateClock``)::

    starting      until every actor registered and the weight channel is open
    waiting_data  inside next_groups (reading, validating, dropping stale groups)
    weight_sync   inside send_weights (broadcast + every actor's ack, or with
                  learner.defer_weight_ack the packing and the wait for the last sync's ack;
                  the FSDP gather before it is not visible here and counts as busy)
    checkpoint    from trained_ids to ack_trained (the save between them)
    busy          everything else: collate/scatter, forward/backward/step, gather
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from asyncrl.config import Config
from asyncrl.control import ControlServer
from asyncrl.endpoints import register_endpoint
from asyncrl.metrics import LEARNER_STATES, LearnerMetrics, StateClock, role_port, serve
from asyncrl.reward_records import extras_means
from asyncrl.runlog import RunLog
from asyncrl.trackers import open_trackers
from asyncrl.waiting import Wait
from buffer import codec
from buffer.staleness import staleness, within_staleness
from learner.data import GroupSource
from learner.totals import RunTotals


class Hub:
    def __init__(self, cfg: Config, run_dir: str, redis_url: str, vocab_size: int) -> None:
        from buffer.connection import connect
        from buffer.ledger import LedgerWatch
        from buffer.redis_buffer import ReplayBuffer

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self._stop = False  # set by SIGTERM/SIGINT; ends waits and Redis reconnects
        b = cfg.buffer
        self.buffer = ReplayBuffer(
            connect(redis_url), b.name, b.capacity, b.lease_ttl_s, max_deliveries=b.max_deliveries,
            reconnect_s=b.reconnect_s, stop=self.stop_requested,
        )  # fmt: skip
        self.claim = _claim_buffer(self.buffer, b.name, run_dir, self._claim_lost, self.say)
        self.totals = RunTotals()
        self.source = GroupSource(
            self.buffer, "learner", vocab_size, b.max_staleness, cfg.learner.data_timeout_s,
            stop=self.stop_requested, say=self.say, exhausted=self.data_exhausted,
            interrupt=self.rejoin_pending,
            admit_by_newest=cfg.algorithm.stale_tokens in ("mask", "interpolate"),
            on_read=self.totals.count_read,
        )  # fmt: skip
        net = cfg.network
        self.control = ControlServer(net.bind, advertise=net.advertise)
        self.log = RunLog(
            run_dir,
            quiet="console" not in cfg.logger,
            total_steps=cfg.learner.steps,
            trackers=open_trackers(cfg, run_dir),
        )
        self.sender = None
        self._sent_max = -1  # the newest version sent to actors in this run (weights_sent_max)
        self._sync_t0 = 0.0  # when the sync under way began (its first try)
        self._trained: list[str] = []
        self._step_entries: list = []
        self._step_version = 0
        self._last_t = time.monotonic()
        self.clock = StateClock(LEARNER_STATES, "starting")
        self._serve_metrics(cfg)
        self._ready_t = time.monotonic()
        self._last_totals = self.clock.totals()
        self._last_cpu = time.process_time()
        self._dropped_seen: dict[str, int] = {}
        self._per_epoch = 0  # prompts per epoch of a finite source (actors publish it)
        self._epoch: int | None = None
        self.ledger = LedgerWatch(b.name)  # the buffer's conservation law, checked every step
        self.validation = _validation(cfg, self.buffer, self.log, self.say)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _serve_metrics(self, cfg: Config) -> None:
        info = {
            "buffer_name": cfg.buffer.name,
            "mode": cfg.mode.name,
            "max_staleness": cfg.buffer.max_staleness,
        }
        self.metrics = LearnerMetrics(info, self.clock, self.buffer)
        port = serve(
            self.metrics.registry, role_port(cfg.metrics_port, "learner"), cfg.network.metrics
        )
        if port:
            register_endpoint(self.buffer.client, cfg.buffer.name, "learner", port, cfg.network)
            self.say(f"metrics on http://{cfg.network.metrics}:{port}/metrics")

    def _on_signal(self, *_) -> None:
        self._stop = True

    def say(self, text: str) -> None:
        print(f"[learner] {text}", flush=True)

    def _claim_lost(self, why: str) -> None:
        """Another learner took the buffer (buffer/learner_claim.py): stop, saying so."""
        self.say(why)
        self._stop = True

    def stop_requested(self) -> bool:
        return self._stop

    def start(self, version: int) -> None:
        """Publish meta, re-read pending entries, wait for actors, open the weight channel."""
        cfg = self.cfg
        run, meta = str(self.run_dir.resolve()), self.buffer.meta()
        if meta.get("learner_run_dir") == run:  # a restart of this run: the versions it sent
            sent = int(meta.get("weights_sent_max", -1))  # before are not foreign (issue 29)
            self.source.ceiling = self._sent_max = max(sent, self.buffer.learner_version())
        self.buffer.set_meta(
            **self.control.meta(),
            learner_run_dir=run,
            max_staleness=cfg.buffer.max_staleness,
            mode=cfg.mode.name,
            batch_groups=cfg.learner.batch_groups,
        )
        self.buffer.set_learner_version(version)
        codec.warm_up()  # pyarrow's lazy imports (~0.6 s) now, while the actors start
        pending = self.source.resume()
        if pending:
            self.say(f"re-read {pending} groups delivered before a restart")
        if cfg.learner.weight_sync:
            self.say(f"control plane on {self.control.address}")
            wait = Wait(
                f"{cfg.actor.total} actor(s) to register",
                cfg.learner.actor_wait_s,
                self.say,
                self.stop_requested,
                hint=(
                    "start them with `asyncrl launch actors` pointed at the same buffer.url "
                    f"and buffer.name ({cfg.buffer.name!r}), or raise learner.actor_wait_s"
                ),
            )
            wait.begin()
            self.control.wait_for_actors(cfg.actor.total, wait)
            _check_actor_ids(sorted(self.control.actors), cfg)
            self.sender = _open_weight_channel(self.control, cfg, self.stop_requested)
        self._last_t = self._ready_t = time.monotonic()
        self.clock.set("busy")
        self._last_totals = self.clock.totals()
        self._last_cpu = time.process_time()

    def set_dynamic_sampling(self, on: bool) -> None:
        """DAPO dynamic sampling: drop groups whose rewards are all equal where they are read."""
        self.source.drop_uniform = on

    def step_done(self) -> None:
        """The step of the last batch ran: a crash from here on is not its data's fault."""
        self.source.step_done()

    def rejoin_pending(self) -> bool:
        """Did an actor register again (restarted, relaunched on its host, or back after a
        partition) and wait for weights? Then the learner syncs before reading on."""
        return self.sender is not None and self.sender.rejoin_pending()

    def next_groups(self, version: int) -> list | None:
        """The step's groups, or None: send weights first (``rejoin_pending``), then ask again."""
        self.clock.set("waiting_data")
        try:
            entries = self.source.next_batch(version, self.cfg.learner.batch_groups)
        finally:
            self.clock.set("busy")
        if entries is None:
            return None
        self._step_entries = entries
        self._step_version = version
        return [e.group for e in entries]

    def send_weights(self, named, version: int, attempt: int = 0) -> bool:
        """One try of a weight sync (``ActorWeightChannel.attempt``); True when another try
        should follow (the ranks gather the tensors again). Counted once it ends."""
        self.clock.set("weight_sync")
        if attempt == 0:
            self._sync_t0 = time.monotonic()
            if version > self._sent_max:  # before any actor can hold it (learner/data.py)
                self._sent_max = version
                self.buffer.set_meta(weights_sent_max=version)
        before = (self.sender.failures, self.sender.rebuilds)
        try:
            again = self.sender.attempt(named, version, attempt)  # re-forms a broken group
        finally:
            self.clock.set("busy")
            failures = self.sender.failures - before[0]
            regroups = self.sender.rebuilds - before[1]
            self.metrics.sync_failures.inc(failures)
            self.metrics.sync_regroups.inc(regroups)
            self.totals.count_sync_faults(failures, regroups)
        if again:
            return True
        seconds = time.monotonic() - self._sync_t0
        stats = self.sender.last_stats
        self.metrics.sync_seconds.observe(seconds)
        self.metrics.sync_bytes.inc(stats.bytes)
        self.totals.count_sync(stats.bytes, seconds)
        return False

    def after_step(self, state, metrics: dict) -> None:
        metrics = {**metrics, "dropped_uniform": self.source.dropped_uniform}
        # one round trip: counters + integrity (BufferDamaged names a wiped or edited key)
        stats = self.buffer.audit()
        for line in self.ledger.check(stats, state.version - 1, self.buffer.repairs):
            self.say(line)
        self.buffer.set_learner_version(state.version)
        entries, v = self._step_entries, self._step_version
        self._trained.extend(e.entry_id for e in entries)
        now = time.monotonic()
        dt, self._last_t = max(now - self._last_t, 1e-9), now
        stale = [staleness(v, e.group.version_min) for e in entries]
        groups = [e.group for e in entries]
        reward = sum(sum(g.rewards) for g in groups) / sum(len(g.samples) for g in groups)
        self._count_trained(groups, stale, stats, v)
        record = {
            "step": state.version - 1,
            "version": state.version,
            "reward": reward,
            "staleness_max": max(stale),
            "staleness_mean": sum(stale) / len(stale),
            "groups_per_s": len(groups) / dt,
            "tokens_per_s": sum(g.num_tokens for g in groups) / dt,
            "dropped_stale": self.source.dropped_stale,
            "dropped_invalid": stats["dropped_invalid"],
            "ledger_imbalance": stats["imbalance"],
            "reward_errors": sum(1 for g in groups for s in g.samples if s.reward_error),
            **{k: x for k, x in self.totals.admission().items() if x is not None},
            **self._epoch_of(groups),
            **extras_means(s for g in groups for s in g.samples),  # reward/<key>: a dict's extras
            "wall_s": state.wall_s,
            **self._step_timing(now),
            **{k: float(x) for k, x in metrics.items()},
        }
        loss_metrics = {k: float(x) for k, x in metrics.items() if not k.startswith("dropped_")}
        self.metrics.observe_step(state.version, groups, stale, reward, dt, loss_metrics)
        self.log.log(record)
        if self.validation is not None:
            self.validation.poll(state.version - 1)

    # ---- validation (learner/validation.py) --------------------------------------------------
    def weights_at_actors(self, version: int, start: bool = False) -> None:
        """The actors hold the weights of ``version`` now: validate them if due."""
        v = self.validation
        if v is not None and v.due(version, start=start):
            self._settle_weights()
            v.request(version)

    def sync_allowed(self, version: int, synced: int) -> bool:
        """May the weights of ``version`` go to the actors, which hold ``synced``, now? Not
        while a validation runs, unless the actors' weights fail their own admission
        (``buffer.staleness.within_staleness``: their groups would be too stale to train):
        then wait for it (up to ``eval.timeout_s``) and say so."""
        v = self.validation
        if v is None or not v.holding:
            return True
        v.poll(self._step_version)
        if v.holding and not within_staleness(version, synced, self.cfg.buffer.max_staleness):
            self.clock.set("waiting_data")
            try:
                v.wait(self._step_version, self.stop_requested)
            finally:
                self.clock.set("busy")
        return not v.holding

    def _settle_weights(self) -> None:
        """Wait until the actors loaded the last sync (its deferred ack), so a validation
        requested now runs on those weights."""
        if self.sender is not None:
            self.sender.settle()

    def end_validation_due(self, version: int) -> bool:
        """After the last step: finish a validation under way; validate ``version`` too?"""
        v = self.validation
        if v is None:
            return False
        v.wait(version - 1, self.stop_requested)
        return v.due(version, end=True) and not self.stop_requested()

    def validate_final(self, version: int) -> None:
        """Validate the final weights (at the actors now) and wait for the result."""
        self._settle_weights()
        self.validation.request(version)
        self.validation.wait(version - 1, self.stop_requested)

    def data_exhausted(self) -> bool:
        """Every actor is out of prompts and committed its last group (actors/actor.py)."""
        meta = self.buffer.meta()
        n = self.cfg.actor.total
        return all(meta.get(f"exhausted_actor_{i}") == "1" for i in range(n))

    def _epoch_of(self, groups: list) -> dict:
        """``{"epoch": e}``: the newest epoch among the step's prompts (0-based), for a finite
        prompt source; {} for an endless one."""
        if not self._per_epoch:
            self._per_epoch = int(self.buffer.meta().get("prompts_per_epoch", 0))
        if not self._per_epoch:
            return {}
        self._epoch = max(g.prompt_index for g in groups) // self._per_epoch
        return {"epoch": self._epoch}

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

    def _count_trained(self, groups: list, stale: list[int], stats: dict, version: int) -> None:
        self.totals.count_trained(groups, stale, version)
        for reason, count in self._dropped_counts(stats).items():
            seen = self._dropped_seen.get(reason, 0)
            self.metrics.dropped.labels(reason).inc(max(0, count - seen))
            self._dropped_seen[reason] = max(seen, count)

    def no_batch_reason(self) -> str:
        """Why the run ends without a batch to train (``trainer._untrained``)."""
        stats = self.buffer.audit()
        return no_batch_text(self.data_exhausted(), stats["committed"], self._dropped_counts(stats))

    def _dropped_counts(self, stats: dict) -> dict[str, int]:
        """Dropped groups by reason: the source's ``dropped_<reason>`` counters + the buffer's
        invalid and poison counts (dead-lettered by the buffer, job-wide)."""
        src = self.source
        out = {k[8:]: int(getattr(src, k)) for k in vars(src) if k.startswith("dropped_")}
        out["invalid"] = stats["dropped_invalid"]
        out["poison"] = stats["dropped_poison"]
        return out

    def trained_ids(self) -> list[str]:
        """Called right before a checkpoint is saved: the clock counts the save from here."""
        self.clock.set("checkpoint")
        return list(self._trained)

    def ack_trained(self) -> None:
        """Called right after the checkpoint is durable."""
        self.ack_ids(self._trained)
        self._trained = []
        self.clock.set("busy")

    def ack_ids(self, ids: list[str]) -> None:
        if ids:
            self.buffer.ack(ids, "trained")

    def tallies(self) -> dict:
        """The run's totals so far (learner/totals.py), saved in each checkpoint."""
        wall = time.monotonic() - self._ready_t
        return self.totals.to_dict(self.clock.totals(), wall, self.ledger.to_dict())

    def restore_tallies(self, saved: dict) -> None:
        """Start from a checkpoint's ``tallies()`` (absent in older checkpoints: from 0)."""
        if not saved:
            return
        self.totals.restore(saved)
        self.ledger.restore(saved.get("ledger"))  # absent: from a balanced ledger

    def close_log(self, status: str) -> None:
        """End the run log and the experiment trackers' runs with ``status`` (idempotent);
        give the buffer's learner claim back."""
        self.log.close(status)
        self.claim.release()

    def finish(self, state) -> dict:
        """Stop the actors, write summary.json and reward.png, print the summary; returns it."""
        if self.validation is not None:
            self.validation.abandon(state.version - 1)
        self.control.broadcast({"type": "stop"})
        stats = self.buffer.audit()
        for line in self.ledger.check(stats, state.version, self.buffer.repairs):
            self.say(line)
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
            **({} if self._epoch is None else {"epoch": self._epoch}),
            "data_exhausted": self.data_exhausted(),
            "steps_nonfinite_skipped": state.nonfinite_steps,  # counted in groups_trained
            "updates_nonfinite_skipped": state.nonfinite_updates,
            "title": f"{self.cfg.mode.name}, max_staleness={self.cfg.buffer.max_staleness}",
            **self.tallies(),  # with "ledger": did the buffer's counts balance (buffer/ledger.py)
            "dropped_by_reason": self._dropped_counts(stats),
        }
        summary = self.log.write_summary(extra)
        self.log.close("KILLED" if self._stop else "FINISHED")  # a stop request ended it
        if self.sender is not None:
            self.sender.close()
        self.control.close()
        self.claim.release()
        self.say("summary " + json.dumps(summary))
        return summary


def _open_weight_channel(control: ControlServer, cfg: Config, stop=lambda: False):
    """Tell every actor where to join the weight group, then host it as rank 0.

    ``learner.weight_transport`` picks the transport (``auto``: nccl for a learner on a GPU
    feeding vLLM actors; else shm when the network is loopback, so every actor is on this
    host; else gloo; asyncrl/transports/). Each actor takes ``actor.tensor_parallel_size``
    receiver ranks, one per vLLM worker. The channel re-forms the group with the live actors
    when a receiver dies, and takes a restarted actor back (learner/weight_sender.py)."""
    from asyncrl import transports
    from learner.device import current_device
    from learner.model import _DTYPES
    from learner.weight_sender import ActorWeightChannel

    device = current_device()
    # a shared GPU (learner.share_gpu): NCCL cannot join two ranks on one device
    gpus_both_ends = (
        device.type == "cuda" and cfg.actor.engine == "vllm" and not cfg.learner.share_gpu
    )
    name = transports.resolve(cfg.learner.weight_transport, gpus_both_ends, cfg.network.local)
    # float32 masters go out in the actors' dtype (model.dtype): half the bytes for bf16
    channel = ActorWeightChannel(
        control, timeout_s=cfg.learner.weight_sync_timeout_s, log=_say,
        wire_dtype=_DTYPES[cfg.model.dtype], stop=stop, network=cfg.network, transport=name,
        workers_per_actor=cfg.actor.tensor_parallel_size, device=device,
        defer_ack=cfg.learner.defer_weight_ack,
    )  # fmt: skip
    _say(f"weights travel over {name} (learner.weight_transport={cfg.learner.weight_transport})")
    return channel.open()


def _check_actor_ids(ids: list[int], cfg: Config) -> None:
    """Actors' ids run 0 .. total-1 for the total the actors were given: a larger id means the
    learner was told fewer actors than run (it would ignore some and misjudge exhaustion)."""
    extra = [i for i in ids if i >= cfg.actor.total]
    if extra:
        raise ValueError(
            f"actor id(s) {extra} registered, but this learner expects {cfg.actor.total} "
            f"actor(s) (actor.num_actors={cfg.actor.num_actors} x actor.nnodes="
            f"{cfg.actor.nnodes}); give the learner the actors' actor.num_actors and actor.nnodes"
        )


def _validation(cfg: Config, buffer, log: RunLog, say):
    """``learner.validation.Validation`` when ``eval`` asks for it, else None."""
    if not cfg.eval.enabled:
        return None
    from learner.validation import Validation

    return Validation(cfg, buffer, log.log_val, say)


def _say(text: str) -> None:
    print(f"[learner] {text}", flush=True)


def _claim_buffer(buffer, name: str, run_dir: str, lost, say):
    """This learner's ``LearnerClaim`` on the buffer, renewed from now on; ``FatalError``
    naming the holder when another run's learner has it (issue 29)."""
    from asyncrl.fatal import FatalError
    from buffer.learner_claim import ClaimRefused, LearnerClaim

    claim = LearnerClaim(buffer.client, name, run_dir)
    try:
        claim.acquire(say)
    except ClaimRefused as e:
        raise FatalError(str(e)) from None
    claim.keep(lost)
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
    where = ("every actor ran out of prompts" if exhausted else
             "the learner stopped before a batch was complete")  # fmt: skip
    bad = {k: v for k, v in dropped.items() if v}
    if not bad:
        return f"{where}: {committed} groups committed, none dropped, too few for a batch"
    parts = [f"{n} {k} ({DROP_ADVICE.get(k, 'see learner.log')})" for k, n in bad.items()]
    return f"{where}: {committed} groups committed, dropped: " + "; ".join(parts)
