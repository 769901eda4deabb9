"""The checks a launch runs before it starts any process, so that a wrong setting fails with
its key named while nothing is running (jobs.py calls them in this order):

    check_one_node    ``asyncrl run``: one machine's roles only
    check_placement   this node: ``network.bind``, the GPU plan, learner node 0's rendezvous
                      host, the cores (``auto`` resolved); before the run directory is made
    check_buffer_url  ``asyncrl launch learner|actors``: a ``buffer.url`` to join
    check_inputs      what the roles will read: reward function, tracker, model (the demo's
                      warm start), shared-GPU memory, data; returns the model directory
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path

from asyncrl.core.config import cores
from asyncrl.core.config.job import Config
from asyncrl.core.observe.trackers import check_available
from asyncrl.orchestration.models.directory import check_model_dir
from asyncrl.orchestration.placement.gpus import check_shared_gpu, node_gpus, plan_node
from asyncrl.orchestration.placement.plan import Plan


def check_one_node(cfg: Config) -> None:
    """``asyncrl run`` starts the roles of one machine: a layout over several nodes is
    refused with the commands that start it instead."""
    if cfg.learner.nnodes > 1 or cfg.actor.nnodes > 1:
        raise ValueError(
            f"asyncrl run starts the roles of one machine, but learner.nnodes="
            f"{cfg.learner.nnodes} and actor.nnodes={cfg.actor.nnodes}; run `asyncrl launch "
            "buffer|learner|actors` on each node group instead (docs/multinode.md)"
        )


def check_placement(cfg: Config, roles: Collection[str]) -> tuple[Plan, str]:
    """This node's layout for ``roles`` (``buffer``, ``learner``, ``actors``), checked before
    the run directory is made: ``network.bind`` is this host's, the GPU plan fits (a refused
    layout fails here), learner node 0 holds the rendezvous address, and ``auto`` core lists
    are resolved in ``cfg`` (split between both sides only when ``roles`` holds both).
    Returns the plan and the cores note to print ('' when no key was ``auto``)."""
    check_network(cfg)
    plan = plan_node(cfg, roles)
    if "learner" in roles:
        check_rendezvous_host(cfg)  # a no-op on one node
    both_sides = "learner" in roles and "actors" in roles
    pinned = cores.resolve(cfg, sorted(os.sched_getaffinity(0)), both_sides=both_sides)
    return plan, pinned


def check_network(cfg: Config) -> None:
    """This host holds ``network.bind`` (else ValueError listing its addresses); off loopback
    say what listens where and that every service authenticates."""
    from asyncrl.orchestration.launch import hostnet

    hostnet.check(cfg.network)
    if not cfg.network.local:
        net = cfg.network
        print(
            f"[asyncrl] network: binding {net.bind}, advertised as {net.address}: Redis "
            "(password, ACL users), the control plane (CURVE keys) and the weight group "
            "(no authentication: keep this address on the cluster network) are reachable "
            "from other hosts; metrics stay on loopback",
            flush=True,
        )


def check_rendezvous_host(cfg: Config) -> None:
    """Learner node 0 of several hosts the rendezvous store: ``learner.rdzv_endpoint``'s
    host must be this host's (else ValueError listing its addresses, before torchrun waits)."""
    from asyncrl.orchestration.launch import hostnet

    lc = cfg.learner
    if lc.nnodes > 1 and lc.node_rank == 0:
        host = lc.rdzv_endpoint.rsplit(":", 1)[0]
        try:
            hostnet.interface_name(hostnet.resolve(host))
        except ValueError as e:
            raise ValueError(
                f"learner.rdzv_endpoint={lc.rdzv_endpoint} on learner.node_rank=0: node 0 "
                f"serves the rendezvous, so its host must be this host's. {e}"
            ) from None


def check_buffer_url(cfg: Config, role: str) -> None:
    """A launched learner or actors join a buffer that runs elsewhere: ``buffer.url`` must
    be set (whether it answers is checked when the buffer is joined: buffer_start.py)."""
    if not cfg.buffer.url:
        raise ValueError(
            f"`asyncrl launch {role}` needs buffer.url_file=FILE, a file (mode 0600) holding "
            "redis://USER:PASSWORD@HOST:PORT/0 (`asyncrl launch buffer` writes one per role "
            "and prints where)"
        )


def check_inputs(cfg: Config, roles: Collection[str], plan: Plan) -> str:
    """What ``roles`` (``learner`` and/or ``actors``) will read, checked as they will read
    it; returns the model directory. The reward function (with a file task's first record)
    fails before the model resolves (the demo's warm start, a Hub download); the data, which
    needs the model's tokenizer, after it."""
    if "actors" in roles:
        check_reward_fn(cfg)  # bad input fails here, before the warm start and any process
        check_episode(cfg)
    if "learner" in roles:
        check_available(cfg.logger)  # a tracker's missing library too
    warn_model_settings(cfg)  # config only: shown even when the model is refused next
    # simulated actors read only the model's config; a learner or vLLM needs its weights
    model_dir = resolve_model(cfg, weights="learner" in roles or cfg.actor.engine != "sim")
    one_node = "learner" in roles and "actors" in roles  # only then can they share a GPU
    if one_node and (split := check_shared_gpu(cfg, plan, Path(model_dir))):
        print(f"[asyncrl] {split}", flush=True)  # learner.share_gpu: refused above if no fit
    if "actors" in roles:
        check_data(cfg, model_dir)  # and bad data (files, columns, templates, lengths)
    if "learner" in roles:
        from asyncrl.orchestration.launch.checkpoint_checks import check_learner_start

        check_learner_start(cfg, model_dir)  # a writable checkpoint_dir, resume_from's model
    return model_dir


def heavy_modules(cfg: Config, roles: Collection[str]) -> tuple[str, ...]:
    """The heavy modules ``check_inputs(cfg, roles, ...)`` may import, for the launcher to
    import first with the stop signals held (stop_signals.py ``import_heavy_modules``).

    torch is skipped only where every check runs code known not to import it: the demo model
    already built (its tokenizer loads through its named class, not ``AutoTokenizer``, whose
    import pulls torch in) and asyncrl's own reward function and episode code. Building the
    demo model, another model (a GGUF conversion, ``AutoTokenizer``) or a user's module
    (which may import torch) gets both, as every launch did before. transformers comes with
    a tokenizer: the actors' data is checked with the model's."""
    code = [cfg.task.reward_fn] if "actors" in roles else []  # what check_inputs imports
    if "actors" in roles and cfg.episode.enabled:
        code += [cfg.episode.env, *cfg.episode.tools, cfg.episode.agent]
    ours = all(spec.startswith("asyncrl.") for spec in code if spec)
    built = cfg.model.path == "demo" and (demo_model(cfg, build=False) / "config.json").is_file()
    if not (ours and built):
        return ("torch", "transformers")
    return ("transformers",) if "actors" in roles else ()


def check_reward_fn(cfg: Config) -> None:
    """Import ``task.reward_fn`` and check that it can be called as ``fn(prompt, completion,
    **fields)`` with the task's fields, so a wrong name or signature fails at once with the
    key named (the actors import and check the same function when they start)."""
    from asyncrl.actors.data.tasks import example_fields
    from asyncrl.actors.rewards.loading import check_signature, load_reward_fn, preflight

    fields = example_fields(cfg)  # a file task: its first record (bad data fails here)
    try:
        fn = load_reward_fn(cfg.task.reward_fn)
        check_signature(fn, fields, cfg.task.reward_fn)
    except ValueError as e:
        raise ValueError(f"task.reward_fn: {e}") from e
    preflight(fn)  # e.g. python_code_reward: can this machine sandbox model-written code?


def check_episode(cfg: Config) -> None:
    """Import ``episode.env`` and ``episode.tools`` and build each tool's schema, so a wrong
    name, a class without ``reset``/``step`` or a tool without type hints and docstring fails
    at once with the key named (each actor's environment workers load them again); or load
    ``episode.agent`` with ``episode.agent_kwargs`` (``check_agent``)."""
    if not cfg.episode.enabled:
        return
    if cfg.episode.agent:
        check_agent(cfg)
        return
    from asyncrl.actors.episodes.env import load_environment, load_tools
    from asyncrl.actors.episodes.tools import tool_from_function

    if cfg.episode.env:
        try:
            load_environment(cfg.episode.env, dict(cfg.episode.env_kwargs))
        except ValueError as e:
            raise ValueError(f"episode.env: {e}") from e
    try:
        for fn in load_tools(cfg.episode.tools):
            tool_from_function(fn)
    except ValueError as e:
        raise ValueError(f"episode.tools: {e}") from e


def check_agent(cfg: Config) -> None:
    """Load ``episode.agent`` as its workers will (``agents.spec.load_agent``: the name, the
    signature, ``agent_kwargs`` against it), and find aiohttp, which serves its endpoint and
    comes with vLLM only."""
    import importlib.util

    from asyncrl.actors.agents.spec import load_agent

    try:
        load_agent(cfg.episode.agent, dict(cfg.episode.agent_kwargs))
    except ValueError as e:
        raise ValueError(f"episode.agent: {e}") from e
    if importlib.util.find_spec("aiohttp") is None:
        raise ValueError(
            "episode.agent: the agent endpoint needs aiohttp, which is installed with vLLM "
            "(pip install -e '.[cpu]' or '.[gpu]'); install it, or pip install aiohttp"
        )


def warn_model_settings(cfg: Config, detect: Callable[[], tuple[str, ...]] | None = None) -> None:
    """Print each setting far outside a pretrained model's range, and a pretrained model's CPU
    learner on a node with GPUs (model_advice.py; ``detect``: this node's GPUs, default
    ``node_gpus``, asked only then): once per run or launched role, before its model
    resolves (benchmarks resolve models silently)."""
    from asyncrl.orchestration.models.advice import model_warnings, placement_warnings

    for warning in model_warnings(cfg) + placement_warnings(cfg, detect or node_gpus):
        print(f"[asyncrl] warning: {warning}", flush=True)


def resolve_model(cfg: Config, weights: bool = True) -> str:
    """``demo`` -> build (or reuse) the cached tiny model; else the local HF directory that
    ``model.path`` names or becomes (a GGUF file converted, a Hub id fetched:
    asyncrl/orchestration/models/source.py), checked (its weight files too when ``weights``:
    not for simulated actors, which read only the config)."""
    if cfg.model.path == "demo":
        return str(demo_model(cfg))
    from asyncrl.orchestration.models.source import resolve_model_path

    say = lambda text: print(f"[asyncrl] {text}", flush=True)  # noqa: E731
    path = resolve_model_path(cfg.model.path, cfg.model.cache_dir, say)
    check_model_dir(path, "model.path", weights)  # asyncrl/orchestration/models/directory.py
    return str(path.resolve())


def demo_model(cfg: Config, build: bool = True) -> Path:
    """The demo model's directory, built (the warm start) unless it is or ``build`` is False."""
    from asyncrl.orchestration.demo.warmstart import prepare_demo_model

    m = cfg.model
    return prepare_demo_model(
        m.cache_dir, seed=cfg.seed, sft_steps=m.sft_steps, chat_turns=m.sft_chat_turns, build=build
    )


def check_data(cfg: Config, model_dir: str) -> None:
    """Load the prompts as the actors will, so bad data fails before any process starts."""
    from asyncrl.actors.data.tasks import check_data as check

    check(cfg, model_dir, lambda text: print(f"[asyncrl] {text}", flush=True))
