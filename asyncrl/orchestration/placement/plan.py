"""Which GPUs each process of one node gets: pure functions (no CUDA, no I/O).

    the node's GPUs (as its launcher sees them)    0 1 2 3 4 5 6 7
    asyncrl run learner=gpu actor=gpu learner.nproc=2 actor.num_actors=3 actor.tensor_parallel_size=2
                                                   L L a a b b c c
    placement: learner ranks 0-1 on GPUs 0,1; actor 0 on GPUs 2,3; actor 1 on GPUs 4,5; ...

The launcher gives torchrun the learner's GPUs, and each actor process its own, as
``CUDA_VISIBLE_DEVICES`` (asyncrl/orchestration/placement/gpus.py); learner rank r then uses
``cuda:LOCAL_RANK`` within its list (learner/compute/device.py), i.e. the r-th GPU of the list.

Rules of ``place`` (the invariants of the ``Plan`` it returns):

- Explicit lists first: ``learner.gpus`` names exactly ``learner.nproc`` GPUs (local rank r:
  the r-th), ``actor.gpus`` exactly ``num_actors x g`` (``g`` = ``actor.tensor_parallel_size``) (the launch's actor j:
  entries ``j*g .. j*g+g-1``).
- Auto (a key left ''): the GPUs the lists leave free, lowest index first, the learner's ranks
  before the actors. So ``asyncrl run`` gives the learner the first ``nproc`` GPUs and each
  actor the next ``g``; ``asyncrl launch actors`` starts the actors at GPU 0.
- Only GPU users take part: a learner with ``learner.device=cpu``, simulated actors
  (``actor.engine=sim``) and a role that does not run on this node get nothing, and their
  keys are ignored here (one config can serve every node).
- Every GPU serves at most one process and every index exists on the node; anything else is a
  ``ValueError`` naming the keys, the numbers and a fix (the launcher calls ``place`` before it
  starts anything). The one exception is asked for: ``learner.share_gpu`` (``layout=gpu1``)
  lets the actors run on the learner's GPUs (auto: actor j on the learner's GPUs from the
  j-th on, round the list), their memory split checked by asyncrl/orchestration/placement/share.py.
- No GPU on the node and no list given: the empty plan (a CPU run: nothing is set).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from asyncrl.core.config.checks import format_indices, parse_indices

_SHARE = "a GPU serves one process (NCCL refuses two ranks on one device; vLLM takes most of it)"


@dataclass(frozen=True)
class Request:
    """What the roles of one node ask for (``request_for`` builds it from the config)."""

    devices: tuple[str, ...]
    """The node's GPUs in index order, as ``CUDA_VISIBLE_DEVICES`` names them ("0", "3",
    "GPU-<uuid>"): index i of ``learner.gpus`` / ``actor.gpus`` is ``devices[i]``."""
    learner_ranks: int = 0
    """The node's learner ranks that run on a GPU (``learner.nproc``; 0 = none here)."""
    learner_gpus: str = ""
    """``learner.gpus`` ('' = auto)."""
    actors: int = 0
    """The launch's actors that run on a GPU (``actor.num_actors``; 0 = none here)."""
    gpus_per_actor: int = 1
    """GPUs per actor (``gpus_needed_per_actor``), >= 1."""
    actor_gpus: str = ""
    """``actor.gpus`` ('' = auto)."""
    share: bool = False
    """The actors may run on the learner's GPUs (``learner.share_gpu``, both roles here)."""

    @property
    def wants_gpus(self) -> bool:
        return bool(self.learner_ranks or self.actors)


@dataclass(frozen=True)
class Plan:
    """GPU entries (``Request.devices`` values) per process; ``()`` = leave it alone."""

    learner: tuple[str, ...] = ()
    """Learner local rank r runs on ``learner[r]``; its length is ``learner.nproc``."""
    actors: tuple[tuple[str, ...], ...] = ()
    """The launch's j-th actor runs on ``actors[j]`` (``gpus_per_actor`` entries each)."""

    @property
    def empty(self) -> bool:
        return not (self.learner or self.actors)

    def learner_visible(self) -> str | None:
        """torchrun's ``CUDA_VISIBLE_DEVICES``; None = inherit the launcher's environment."""
        return ",".join(self.learner) or None

    def actor_visible(self, j: int) -> str | None:
        """The launch's j-th actor's ``CUDA_VISIBLE_DEVICES``; None = inherit."""
        return ",".join(self.actors[j]) if self.actors else None

    def by_role(self, actor_ids: Sequence[int]) -> dict[str, str]:
        """``{"learner": "0,1", "actor4": "2"}`` for the launch's actors ``actor_ids``."""
        roles = {"learner": ",".join(self.learner)} if self.learner else {}
        return roles | {f"actor{i}": ",".join(g) for i, g in self._actor_pairs(actor_ids)}

    def describe(self, actor_ids: Sequence[int]) -> str:
        """``placement: learner ranks 0-1 on GPUs 0,1; actor 0 on GPU 2; actor 1 on GPU 3``."""
        parts = []
        if self.learner:
            n = len(self.learner)
            ranks = "rank 0" if n == 1 else f"ranks 0-{n - 1}"
            parts.append(f"learner {ranks} on {_gpus(self.learner)}")
        parts += [f"actor {i} on {_gpus(g)}" for i, g in self._actor_pairs(actor_ids)]
        return "placement: " + "; ".join(parts or ["no GPUs"])

    def _actor_pairs(self, actor_ids: Sequence[int]) -> list[tuple[int, tuple[str, ...]]]:
        """(actor id, its GPUs) for the launch's actors; [] when they have none."""
        return list(zip(actor_ids, self.actors, strict=True)) if self.actors else []


NO_GPUS = Plan()


def _gpus(entries: Sequence[str]) -> str:
    return f"GPU{'s' if len(entries) > 1 else ''} {','.join(entries)}"


def gpus_needed_per_actor(cfg) -> int:
    """GPUs one actor's vLLM engine gets: ``actor.gpus_per_actor``, which the config derives
    equal to ``actor.tensor_parallel_size`` (one engine worker per GPU)."""
    return cfg.actor.gpus_per_actor


def request_for(cfg, roles: Collection[str], devices: Sequence[str] = ()) -> Request:
    """What ``roles`` (``learner``, ``actors``; ``asyncrl run`` has both) ask of ``devices``."""
    learner = "learner" in roles and cfg.learner.device != "cpu"
    actors = "actors" in roles and cfg.actor.engine == "vllm"
    return Request(
        devices=tuple(devices),
        learner_ranks=cfg.learner.nproc if learner else 0,
        learner_gpus=cfg.learner.gpus if learner else "",
        actors=cfg.actor.num_actors if actors else 0,
        gpus_per_actor=gpus_needed_per_actor(cfg),
        actor_gpus=cfg.actor.gpus if actors else "",
        share=bool(cfg.learner.share_gpu and learner and actors),
    )


def place(req: Request) -> Plan:
    """The node's plan under the module's rules; ValueError for a layout they refuse."""
    n, per_actor = len(req.devices), req.actors * req.gpus_per_actor
    learner = _listed(req, "learner.gpus", req.learner_gpus, req.learner_ranks)
    actors = _listed(req, "actor.gpus", req.actor_gpus, per_actor)
    if learner is not None and actors is not None and not req.share:
        shared = sorted(set(learner) & set(actors))
        if shared:
            raise ValueError(
                f"learner.gpus={req.learner_gpus} and actor.gpus={req.actor_gpus} share "
                f"GPU(s) {format_indices(shared)}; {_SHARE}: give them disjoint lists"
            )
    if n == 0:  # a CPU node (a list naming a GPU was refused above)
        return NO_GPUS
    busy = {*(learner or ()), *(() if req.share else actors or ())}
    free = [g for g in range(n) if g not in busy]
    if learner is None:
        learner = _take(free, req.learner_ranks, lambda: _learner_short(req, free, actors))
    if actors is None and req.share:
        actors = [learner[i % len(learner)] for i in range(per_actor)]
    if actors is None:
        actors = _take(free, per_actor, lambda: _actors_short(req, free, learner))
    dev, g = req.devices, req.gpus_per_actor
    return Plan(
        learner=tuple(dev[i] for i in learner),
        actors=tuple(tuple(dev[i] for i in actors[j * g : j * g + g]) for j in range(req.actors)),
    )


def _listed(req: Request, key: str, spec: str, want: int) -> list[int] | None:
    """The indices ``spec`` lists, checked; None = auto (no list, or no such role here)."""
    if not spec or not want:
        return None
    got = parse_indices(spec)
    twice = sorted({i for i in got if got.count(i) > 1})
    if twice:
        raise ValueError(
            f"{key}={spec} lists GPU(s) {format_indices(twice)} more than once; {_SHARE}: "
            "list each GPU once"
        )
    n = len(req.devices)
    missing = [i for i in got if i >= n]
    if missing:
        fix = f"use indices 0-{n - 1}" if n else f"run it on a GPU node or set {key}=''"
        raise ValueError(
            f"{key}={spec} names GPU(s) {format_indices(missing)}, but this node has "
            f"{n} GPU(s) (counted as the launcher sees them: its CUDA_VISIBLE_DEVICES when "
            f"set, else nvidia-smi -L): {fix}"
        )
    if len(got) != want:
        raise ValueError(
            f"{key}={spec} lists {len(got)} GPU(s) but " + _wrong_length(req, key, len(got))
        )
    return got


def _wrong_length(req: Request, key: str, m: int) -> str:
    if key == "learner.gpus":
        r = req.learner_ranks
        return f"learner.nproc={r} ranks use one each: list {r} or set learner.nproc={m}"
    a, g = req.actors, req.gpus_per_actor
    fix = f" or set actor.num_actors={m // g}" if m % g == 0 else ""
    return f"actor.num_actors={a} x actor.tensor_parallel_size={g} use {a * g}: list {a * g}{fix}"


def _take(free: list[int], k: int, short) -> list[int]:
    """The first ``k`` of ``free`` (taken out of it); ValueError(``short()``) if too few."""
    if k > len(free):
        raise ValueError(short())
    taken = free[:k]
    del free[:k]
    return taken


LAYOUTS = {8: "node8", 4: "node4", 2: "node2", 1: "gpu1"}
"""The ``layout=`` preset (configs/layout/) for a node of this many GPUs."""


def fitting_layout(req: Request) -> str | None:
    """A layout of learner and actors that fits this node's GPUs, as overrides (``layout=node4``
    or ``learner.nproc=A actor.num_actors=B``; one GPU: ``layout=gpu1``, which shares it);
    None if no layout fits or the request is not for both roles."""
    n, g = len(req.devices), max(1, req.gpus_per_actor)
    if not (req.learner_ranks and req.actors):
        return None
    if n in LAYOUTS and g == 1:
        return f"layout={LAYOUTS[n]}"
    if n < 1 + g:
        return None
    actors = max(1, (n // 2) // g)
    return f"learner.nproc={n - actors * g} actor.num_actors={actors}"


def _layout_fix(req: Request) -> list[str]:
    if req.learner_gpus or req.actor_gpus:
        return []
    fit = fitting_layout(req)
    if fit == "layout=gpu1":
        return ["for the learner and one vLLM actor sharing the GPU: layout=gpu1"]
    if fit:
        return [f"for a layout that fits all {len(req.devices)}: {fit}"]
    return []


def _learner_short(req: Request, free: list[int], actors: list[int] | None) -> str:
    r, k = req.learner_ranks, len(free)
    after = f" besides the actors' {len(actors)} (actor.gpus={req.actor_gpus})" if actors else ""
    fixes = [f"lower learner.nproc to {k}"] if k else []
    fixes += ["give the actors fewer GPUs (actor.gpus)"] if actors else []
    fixes += _layout_fix(req)
    return (
        f"learner.nproc={r} needs {r} GPU(s) (one per rank){after}, this node has "
        f"{len(req.devices)}: {', or '.join(fixes)}"
    )


def _actors_short(req: Request, free: list[int], learner: list[int]) -> str:
    a, g = req.actors, req.gpus_per_actor
    k = len(free) // g
    after = f" after the learner's {len(learner)} (learner.gpus={format_indices(learner)})"
    fixes = [f"lower actor.num_actors to {k}"] if k else []
    fixes += ["give the learner fewer GPUs (learner.nproc)"] if learner else []
    fixes += ["start the other actors on another node (actor.nnodes, docs/multinode.md)"]
    fixes += _layout_fix(req)
    return (
        f"actor.num_actors={a} x actor.tensor_parallel_size={g} needs {a * g} GPU(s)"
        f"{after if learner else ''}, this node has {len(req.devices)}: {', or '.join(fixes)}"
    )
