"""Config groups of what a run trains and validates on: ``task`` (prompt source and reward),
``data`` (dataset files, formatting, length bound, epochs) and ``eval`` (validation during
training). Part of the schema in asyncrl/core/config/job.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.core.config.checks import bound as _bound
from asyncrl.core.config.checks import require as _require
from asyncrl.core.config.checks import require_finite as _require_finite
from asyncrl.core.config.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE

# the prompt sources of actors/data/tasks.py's TASKS registry, repeated here so the CLI validates a
# config without importing actor code; tests/unit/core/test_config.py checks they match
_TASKS = ("addition", "file")
SEED_MAX = 2**31 - 1
"""Largest ``seed`` / ``task.seed``: vLLM seeds numpy (unsigned 32-bit) with seed + actor id."""
MAX_LOG_SAMPLES = 64
"""Most ``eval.log_samples``: each sample's text rides a validation record through Redis and is
written to val.jsonl, summary.json, the console and every tracker at every validation."""


@dataclass
class TaskConfig:
    """Where prompts and rewards come from."""

    name: str = "addition"
    """Prompt source, one of ``_TASKS``: ``addition`` (the demo task in actors/data/addition.py) or
    ``file`` (prompts from ``data.train_files``: actors/data/file_source.py)."""
    reward_fn: str = "asyncrl.actors.data.addition:addition_reward"
    """``module:function`` or ``path/to/file.py:function``; the only code a config can name."""
    seed: int | None = None
    """Seed of the deterministic prompt stream, 0 .. ``SEED_MAX``; unset (null) follows the
    top-level ``seed``."""
    reward_timeout_s: float = 60.0
    """Longest one reward call may run (> 0 seconds), counted from when a worker takes it; a
    call still running then scores 0 as a reward error of kind ``timeout`` (a process worker
    is killed and replaced; a thread is left to finish). It holds up no stop or weight sync."""
    reward_executor: str = "process"
    """Where an actor runs reward calls, off its event loop (actors/rewards/scoring.py). ``auto`` (the
    addition task's): ``inline`` for the built-in addition reward (``INLINE_SAFE_REWARDS``),
    ``process`` for any other, so a user's reward on the demo task is isolated and timed out
    (it ran inline, and ``os._exit`` in it killed the actor). ``process``
    (default): worker processes, each calling the function one call at a time in its main
    thread, so it need not be thread-safe, CPU-bound Python (math-verify) runs in parallel,
    signal-based timeouts work and a timed-out call is killed; fields and results travel as
    JSON lines, and module-level state is per worker. ``thread``: threads in the actor, for
    rewards that wait on I/O (an HTTP verifier) or release the GIL; with
    ``reward_workers > 1`` the function runs concurrently and must be thread-safe, and a
    timed-out call keeps its thread until it returns. ``inline``: on the actor's event loop,
    one call at a time, no timeout: only for rewards that take microseconds (the built-in
    addition task's default), where a worker's round trip costs more than the call."""
    reward_workers: int = 4
    """Reward calls an actor runs at once (its workers), 1..256; the n samples of a group are
    scored at once. A pool keeps up while the actor makes fewer than ``reward_workers /
    latency`` samples/s (4 workers, 50 ms: 80/s; benchmarks/parts/reward_pool.py measured no loss
    of generated tokens/s at 34 samples/s, and 0.60x with one call at a time)."""
    reward_memory_mb: int = 0
    """The most memory (MiB) one reward worker process may allocate (``RLIMIT_DATA``: heap
    and private mappings): 0 = auto, half of this machine's memory shared among the
    ``reward_workers`` (at least 1024); -1 = no limit. A call that passes it fails with
    ``MemoryError``, scored 0 as a ``raised`` reward error that names this key; formerly
    nothing capped a worker, and the kernel's OOM killer chose the actor. A reward that loads
    a large model at import may need more. ``task.reward_executor=process`` only (threads
    share the actor's memory)."""
    max_reward_error_frac: float = 0.5
    """Fail the run (the actor exits non-zero, naming the function and its first error) once
    more than this fraction of the last ``reward_error_window`` rewards failed (raised,
    returned a non-number or NaN, timed out); 0..1, 1.0 = never fail on reward errors."""
    reward_error_window: int = 256
    """How many of an actor's most recent rewards ``max_reward_error_frac`` looks at (>= 1).
    Before that many were scored the missing ones count as successes, so a run fails only
    after more than ``max_reward_error_frac * reward_error_window`` errors."""

    def __post_init__(self) -> None:
        _require_finite(self, "task")
        _require(
            self.reward_timeout_s > 0,
            f"task.reward_timeout_s must be > 0, got {self.reward_timeout_s}",
        )
        _require(
            0.0 <= self.max_reward_error_frac <= 1.0,
            f"task.max_reward_error_frac must be in [0, 1] (1.0 = never fail), "
            f"got {self.max_reward_error_frac}",
        )
        _require(
            self.reward_error_window >= 1,
            f"task.reward_error_window must be >= 1, got {self.reward_error_window}",
        )
        _require(
            self.name in _TASKS,
            f"task.name={self.name!r} is not a known task; known tasks: {', '.join(_TASKS)}",
        )
        _require(
            ":" in self.reward_fn, f"task.reward_fn={self.reward_fn!r} must be 'module:function'"
        )
        target = self.reward_fn.rpartition(":")[0]
        moved = not target.endswith(".py") and target.split(".")[0] in MOVED_PACKAGES
        _require(
            not moved,
            f"task.reward_fn={self.reward_fn!r}: asyncrl's parts moved into the package; write "
            f"'asyncrl.{self.reward_fn}' (docs/architecture.md, 'One package')",
        )
        _require(
            target not in MOVED_MODULES,
            f"task.reward_fn={self.reward_fn!r}: that module moved; write "
            f"'{MOVED_MODULES.get(target)}:{self.reward_fn.rpartition(':')[2]}'",
        )
        _bound(self, "task.seed", ge=0, le=SEED_MAX, hint=" or null")
        _bound(self, "task.reward_workers", ge=1, le=256)
        _bound(self, "task.reward_memory_mb", ge=-1, hint=" (0 = auto, -1 = no limit)")
        _require(
            self.reward_executor in ("auto", "process", "thread", "inline"),
            "task.reward_executor must be auto, process, thread or inline, got "
            f"{self.reward_executor!r}",
        )
        if self.reward_executor == "auto":  # resolved here: the rest sees a concrete executor
            builtin = self.reward_fn in INLINE_SAFE_REWARDS
            self.reward_executor = "inline" if builtin else "process"


MOVED_PACKAGES = ("actors", "buffer", "learner")
"""Top-level names of earlier versions, now ``asyncrl.<name>``: a spec naming one is refused."""
MOVED_MODULES = {
    "asyncrl.actors.addition": "asyncrl.actors.data.addition",
    "asyncrl.actors.math_reward": "asyncrl.actors.rewards.math_reward",
    "asyncrl.actors.code_reward": "asyncrl.actors.rewards.code_reward",
}
"""Reward modules of the flat layout before the folders by concern, and where they are now (a
spec naming one, e.g. in a resumed run's config, is refused with the new name)."""
INLINE_SAFE_REWARDS = ("asyncrl.actors.data.addition:addition_reward",)
"""Rewards ``task.reward_executor=auto`` runs inline: ours, microseconds a call, never raising."""


@dataclass
class DataConfig:
    """Prompt data of ``task.name=file`` (actors/data/datafile.py, actors/data/file_source.py), and the
    prompt length bound of every task."""

    train_files: list[str] = field(default_factory=list)
    """Parquet (``.parquet``) or JSON Lines (``.jsonl``) files of prompts, read with pyarrow
    (``data.train_files=[a.parquet,b.jsonl]``); required by ``task.name=file``."""
    val_files: list[str] = field(default_factory=list)
    """Held-out prompts in the same format, validated during training by the ``eval`` group
    (file order, one pass; checked at launch)."""
    prompt_key: str = "prompt"
    """Column of the prompt: a string (used as it is) or a list of chat messages
    ``{role, content}`` (through the tokenizer's chat template, with the generation prompt).
    Keys may be dotted into struct columns (``reward_model.ground_truth``)."""
    answer_key: str = "answer"
    """Column passed to the reward as the field ``ground_truth`` (every column other than the
    prompt is passed too, under its own name)."""
    data_source_key: str = ""
    """Column passed to the reward as ``data_source``; '' = none."""
    extra_info_key: str = ""
    """Column passed to the reward as ``extra_info``; '' = none."""
    prompt_template: str = ""
    """A Jinja2 file rendered with ``content`` (the prompt; for chat, the last user message)
    and the record's columns; its output replaces the prompt (EasyR1's ``format_prompt``).
    '' = none."""
    max_prompt_length: int = 64
    """Longest prompt in tokens (>= 1): longer ones are dropped when the data is loaded
    (counted and shown). vLLM's ``max_model_len`` is this plus ``sampling.max_tokens``, which must
    fit the model's ``max_position_embeddings``."""
    epochs: int = 1
    """Passes over ``data.train_files`` (>= 1); then the actors stop and the learner ends the
    run (before ``learner.steps`` if the data runs out first)."""
    shuffle: bool = True
    """Visit each epoch in a different order, seeded by ``task.seed`` and the epoch; false =
    file order."""

    def __post_init__(self) -> None:
        _require_finite(self, "data")
        _bound(self, "data.max_prompt_length", ge=1)
        _bound(self, "data.epochs", ge=1)
        _require(bool(self.prompt_key), "data.prompt_key is empty; name the prompt column")
        _require(bool(self.answer_key), "data.answer_key is empty; name the answer column")


@dataclass
class EvalConfig:
    """Validation during training (actors/validation.py, learner/hub/validation.py): the held-out
    prompts (``data.val_files``; the addition task's ``eval`` split) scored with the weights of
    one version V, at a step interval, while training goes on. See docs/architecture.md."""

    every: int = 0
    """Validate the first weights synced at or after every ``every``-th step (>= 0; 0 = no
    interval)."""
    at_start: bool = False
    """Validate the weights the run starts from (version 0, or a resumed checkpoint's)."""
    at_end: bool = False
    """Validate the final weights after the last step (the run waits for it, up to
    ``eval.timeout_s``)."""
    n_samples: int = 1
    """Completions per prompt, 1..1024: 1 = greedy (temperature 0); more are sampled at
    ``eval.temperature`` and give ``val/pass@k`` for k = 1, 2, 4, ... up to n."""
    temperature: float = 1.0
    """Sampling temperature when ``eval.n_samples > 1``, 0.01 .. 10 (as ``sampling``'s)."""
    max_prompts: int = 0
    """Validate on the first this many prompts (>= 0; 0 = all of ``data.val_files``, and 64
    for the endless addition task)."""
    pass_threshold: float = 1.0
    """A sample counts as solved for ``val/pass@k`` when its reward is >= this."""
    timeout_s: float = 300.0
    """Longest a validation may take (> 0 seconds); one that has not finished by then is
    logged with the prompts that finished (``val/complete`` 0) and a warning. Weight syncs
    wait for a running validation (that is what keeps it on one version), so this also bounds
    how long the actors' weights can lag behind."""
    chunk_prompts: int = 4
    """Prompts an actor claims at a time (>= 1); the actors share the validation set."""
    prompts_in_flight: int = 32
    """Validation prompts one actor generates at once (>= 1): it keeps claiming chunks of
    ``eval.chunk_prompts`` until this many are in flight. They share the engine's batch with
    the training groups, so more in flight gives validation a larger share while it runs: it
    finishes sooner, and training groups come slower meanwhile (docs/architecture.md)."""
    log_samples: int = 3
    """Generations shown per validation, 0..``MAX_LOG_SAMPLES`` (0 = none): the prompt, the
    first completion and its reward for the first this many prompts of the validation set
    (the same prompts at every version), on the console, in ``val.jsonl`` and in the
    trackers (learner/hub/validation.py ``samples_of``)."""

    @property
    def enabled(self) -> bool:
        return bool(self.every or self.at_start or self.at_end)

    def __post_init__(self) -> None:
        _require_finite(self, "eval")
        _bound(self, "eval.every", ge=0, hint=" (0 = no interval)")
        _bound(self, "eval.n_samples", ge=1, le=1024)
        _bound(self, "eval.temperature", ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)
        _bound(self, "eval.max_prompts", ge=0, hint=" (0 = all)")
        _bound(self, "eval.timeout_s", gt=0)
        _bound(self, "eval.chunk_prompts", ge=1)
        _bound(self, "eval.prompts_in_flight", ge=1)
        _bound(self, "eval.log_samples", ge=0, le=MAX_LOG_SAMPLES, hint=" (0 = none)")
