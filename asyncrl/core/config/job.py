"""Config schema: one dataclass per Hydra group, every field documented and validated.

Mirrored by ``configs/<group>/*.yaml``; ``configs/config.yaml`` picks the defaults (the CPU demo).
Overrides are ``key=value`` (``learner.steps=50``) or group choices (``mode=sync``,
``algorithm=grpo``). Dotted paths stay at most two levels deep.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from asyncrl.core.config.actor import ActorConfig
from asyncrl.core.config.algorithm import (  # noqa: F401 (registry names: tests import them here)
    _ADVANTAGES,
    _AGGREGATIONS,
    _LOSSES,
    AlgorithmConfig,
)
from asyncrl.core.config.checks import bound as _bound
from asyncrl.core.config.checks import require as _require
from asyncrl.core.config.checks import require_finite as _require_finite
from asyncrl.core.config.episode import EpisodeConfig
from asyncrl.core.config.learner import LEARNER_DEVICES, LearnerConfig, ModelConfig  # noqa: F401
from asyncrl.core.config.network import (
    NetworkConfig,
    check_buffer_tls,
    check_buffer_url,
    read_secret_file,
)
from asyncrl.core.config.sampling import SamplingConfig
from asyncrl.core.config.task import _TASKS, SEED_MAX, DataConfig, EvalConfig, TaskConfig  # noqa: F401

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
"""The names ``logger`` takes; asyncrl/core/observe/trackers.py has one class per external one."""
ADMISSIONS = ("capacity", "window")
"""``buffer.admission``: when an actor may start a group (``BufferConfig.admission``)."""
_BUFFER_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
# the ports a job serves metrics on: metrics_port + 0..1 (launcher, learner), + 2 + i (actor i);
# asyncrl.core.observe.metrics.*_OFFSET (not imported here: it imports prometheus_client)
_METRICS_PORTS_BEYOND_ACTORS = 2


def derived_max_model_len(cfg: Config) -> int:
    """The context the data needs: the longest prompt kept plus the longest response. vLLM's
    ``max_model_len`` is this unless ``actor.max_model_len`` sets more (actors/data/tasks.py).
    An episode's response is its whole token budget (``episode.max_tokens``)."""
    response = cfg.sampling.max_tokens
    if cfg.episode.enabled:
        response = cfg.episode.token_budget(cfg.sampling.max_tokens)
    return cfg.data.max_prompt_length + response


def engine_batch(cfg: Config) -> int:
    """vLLM's ``max_num_seqs``: ``actor.max_num_seqs``, or for 0 every sequence the actor
    submits at once, ``actor.max_inflight x sampling.n_samples``."""
    return cfg.actor.max_num_seqs or cfg.actor.max_inflight * cfg.sampling.n_samples


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
    admission: str = "capacity"
    """When an actor may start a group (``ADMISSIONS``). ``capacity``: while leased + unread
    < ``capacity``. ``window``: also while it stays within the admission window, which
    shrinks as the actors' weights fall behind the learner (asyncrl/buffer/staleness.py
    ``admission_window``), so that a started group is read before it turns stale; async
    mode only (mode=sync paces by its per-version quota)."""
    lease_ttl_s: float = 120.0
    """A slot leased by an actor that died comes back after this long; >= 0.001 (Redis
    keeps the deadline in whole milliseconds)."""
    claim_ttl_s: float = 30.0
    """The learner's lease on the buffer (one learner per buffer, buffer/learner_claim.py),
    renewed every third of it: after a learner dies, or stalls (with Redis) this long,
    another run's learner may take the buffer; > 0."""
    stop_grace_s: float = 20.0
    """How long ``asyncrl launch buffer``, asked to stop (SIGTERM, Ctrl-C), keeps serving while
    the job's learner holds its claim or actors hold their ids, so they stop cleanly first (a
    last checkpoint, ``summary.json``, the ids released): a scheduler (``scancel``, a
    Kubernetes pod deletion) signals every role at once. Keep it under the scheduler's grace
    (Slurm's ``KillWait``, 30 s by default); >= 0, 0 = stop at once."""
    reconnect_s: float = 60.0
    """How long a role retries a lost Redis connection (a restarting server, a network
    partition between hosts) before it fails with the reason, > 0. Each retry is logged."""
    tls_dir: str = ""
    """Serve the job's own Redis (``asyncrl launch buffer`` / ``asyncrl run``) over TLS only,
    with ``ca.crt``, ``redis.crt``, ``redis.key`` from this directory; an empty or missing
    directory gets a private CA and a certificate for ``network.advertise`` made
    (buffer/service/tls.py). The URL files then read ``rediss://...?ssl_ca_certs=<dir>/ca.crt``:
    ``ca.crt`` must be at that path on every host (a shared directory, or copy it).
    '' = plain TCP (password-authenticated, not encrypted)."""
    max_deliveries: int = 3
    """A group handed to the learner this many times without a completed step (the learner
    crashed or was stopped each time) is dead-lettered as poison (``dropped_poison``); >= 1."""
    port: int = 0
    """The TCP port of the job's own Redis (``asyncrl launch buffer`` / ``asyncrl run``),
    0..65535; 0 = a free one, which a restart in the same run directory reuses while it is
    free. A fixed port is for a Service in front of it (Kubernetes, docs/multinode.md)."""
    passwords_dir: str = ""
    """A directory holding the passwords of the job's own Redis's ACL users, one file per user
    named ``actor`` and ``learner``, each mode 0600 or stricter and holding the password only
    (URL-safe characters, at least 16, no newline), e.g. a Kubernetes Secret mounted as a
    volume. Read when the server starts; they replace the ones a restart would reuse from
    ``redis.conf``. '' = generated (``secrets.token_urlsafe``), kept in the run directory."""

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
        _require(
            self.admission in ADMISSIONS,
            f"buffer.admission={self.admission!r}: give one of {', '.join(ADMISSIONS)}",
        )
        _bound(self, "buffer.max_staleness", ge=0)
        _bound(self, "buffer.lease_ttl_s", ge=0.001)
        _bound(self, "buffer.max_deliveries", ge=1)
        _bound(self, "buffer.reconnect_s", gt=0)
        _bound(self, "buffer.claim_ttl_s", gt=0)
        _bound(self, "buffer.stop_grace_s", ge=0)
        _bound(self, "buffer.port", ge=0, le=65535, hint=" (0 = a free one)")


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
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
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
    ``<run_dir>/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set (asyncrl/core/observe/trackers.py)."""
    project_name: str = "asyncrl"
    """The W&B project and the MLflow experiment the run is logged under."""
    experiment_name: str = ""
    """The run's name in W&B and MLflow; '' = the run directory's name."""
    role_log_max_mb: float = 256.0
    """A role's log (``<run_dir>/actor0.log`` ...) is rotated at this size (MiB, > 0):
    it becomes ``<role>.log.1``, ``.1`` becomes ``.2`` ... (asyncrl/orchestration/launch/role_log.py)."""
    role_log_backups: int = 3
    """Rotated files kept per role, 0 .. 100; older output is deleted, and the bytes deleted
    are counted in ``run.json`` (``role_log_deleted_bytes``)."""
    role_log_line_chars: int = 4000
    """The most characters of one output line the console and the launcher's memory keep
    (>= 80); the log file keeps the whole line. Lines cut: ``run.json`` ``role_lines_cut``."""
    allow_config_change: bool = False
    """Resume a run_dir with a configuration that changes what the run means (the algorithm,
    model, batch, sampling, task or data: asyncrl/orchestration/launch/resume_config.py); refused
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
        _bound(self, "role_log_max_mb", gt=0)
        _bound(self, "role_log_backups", ge=0, le=100)
        _bound(self, "role_log_line_chars", ge=80)
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
        rows = self.learner.batch_groups * self.sampling.n_samples
        _require(
            rows % (self.learner.world_size * self.algorithm.minibatches) == 0,
            f"learner.batch_groups x sampling.n_samples={rows} must split evenly over {self.learner.world_size} "
            f"learner rank(s) (learner.nproc x learner.nnodes) x algorithm.minibatches="
            f"{self.algorithm.minibatches}",
        )
        _check_roles(self)
        _check_network(self)
        _check_max_model_len(self)
        _check_lora(self)
        _check_mode(self)


def _check_roles(cfg: Config) -> None:
    """Learner, actors and GPU settings that must agree with one another."""
    # weights of version v sample groups trained up to version v + sync_every - 1
    _require(
        not cfg.learner.weight_sync or cfg.learner.sync_every <= cfg.buffer.max_staleness + 1,
        f"learner.sync_every={cfg.learner.sync_every} with buffer.max_staleness="
        f"{cfg.buffer.max_staleness}: between two weight syncs the actors' groups would "
        "grow too stale to train and the learner would wait forever; set learner.sync_every "
        "<= buffer.max_staleness + 1",
    )
    _require(
        cfg.model.attn_implementation != "flash_attention_2" or cfg.learner.device != "cpu",
        "model.attn_implementation=flash_attention_2 needs a CUDA learner "
        "(learner.device=cuda or auto on a GPU machine); use auto or sdpa with "
        "learner.device=cpu",
    )
    _require(
        not (cfg.episode.enabled and cfg.algorithm.overlong_frac > 0),
        "algorithm.overlong_frac > 0 penalizes one completion's length against "
        "sampling.max_tokens, which is per turn in a multi-turn episode (episode.env / "
        "episode.tools / episode.agent set); turn it off (0) and use algorithm.truncated for "
        "episodes cut by a limit",
    )
    _require(
        not cfg.learner.share_gpu
        or cfg.learner.gpu_memory_fraction + cfg.actor.gpu_memory_utilization < 1,
        f"learner.share_gpu=true: learner.gpu_memory_fraction="
        f"{cfg.learner.gpu_memory_fraction} + actor.gpu_memory_utilization="
        f"{cfg.actor.gpu_memory_utilization} must leave room on the GPU (sum < 1, e.g. "
        "0.45 each: layout=gpu1)",
    )


def _check_lora(cfg: Config) -> None:
    """``model.lora`` against the algorithm and the engine."""
    _require(
        not (cfg.model.lora.enabled and cfg.algorithm.advantage == "gae"),
        "model.lora.rank > 0 with algorithm.advantage=gae: the critic has no LoRA adapters "
        "(it would train whole beside an adapted policy); use a critic-free advantage "
        "(grpo, rloo, reinforce_pp) or model.lora.rank=0",
    )
    _require(
        not (cfg.model.lora.adapter_sync and cfg.actor.engine == "vllm")
        or cfg.model.lora.rank <= 512,
        f"model.lora.rank={cfg.model.lora.rank} with model.lora.sync=adapter: vLLM serves "
        "adapters of rank <= 512; lower the rank or send merged weights "
        "(model.lora.sync=merged)",
    )


def _check_mode(cfg: Config) -> None:
    """``mode=sync``: on-policy with a per-version quota, and what that rules out."""
    if cfg.mode.name != "sync":
        return
    _require(cfg.buffer.max_staleness == 0, "mode=sync requires buffer.max_staleness=0")
    _require(
        cfg.buffer.admission == "capacity",
        "mode=sync paces the actors by its per-version quota; buffer.admission=window "
        "is for mode=async (leave buffer.admission=capacity)",
    )
    # actors make exactly batch_groups groups per version there: nothing could refill
    _require(
        not cfg.algorithm.dynamic_sampling,
        "mode=sync cannot refill groups dropped by algorithm.dynamic_sampling; "
        "use mode=async or algorithm.dynamic_sampling=false",
    )


def _check_max_model_len(cfg: Config) -> None:
    """A set ``actor.max_model_len`` holds the data."""
    a, need = cfg.actor, derived_max_model_len(cfg)
    _require(
        a.max_model_len == 0 or a.max_model_len >= need,
        f"actor.max_model_len={a.max_model_len} is shorter than the data needs: "
        f"data.max_prompt_length={cfg.data.max_prompt_length} + "
        f"{_response_key(cfg)} = {need}; give 0 (derived) or at least {need}",
    )


def _response_key(cfg: Config) -> str:
    """The key that sets the response length, and its value (for messages)."""
    if cfg.episode.enabled:
        return f"the episode budget {cfg.episode.token_budget(cfg.sampling.max_tokens)}"
    return f"sampling.max_tokens={cfg.sampling.max_tokens}"


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
