"""``asyncrl`` command line. Heavy imports (torch, vLLM) happen after argument parsing.

asyncrl run [overrides]                      everything on this machine (the CPU demo)
asyncrl launch buffer|learner|actors [ovr]   one role on this node group
asyncrl status [overrides]                   buffer counters of a running job
asyncrl eval [--checkpoint PATH] [overrides] score a model or checkpoint on the validation set
asyncrl run|launch ROLE|eval --cfg [ovr]     print the composed config as YAML and exit
asyncrl k8s render --image IMG --out DIR [ovr]  Kubernetes manifests of a job (writes YAML)

Inside a Slurm job, ``launch`` and ``status`` take the keys the user did not set from Slurm's
variables first (``slurm_overrides``; ``ASYNCRL_SLURM=0`` turns that off).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

_OVERRIDES_HELP = (
    "Hydra overrides: key=value (learner.steps=50, buffer.max_staleness=2) or group=option "
    "(mode=sync, algorithm=grpo, experiment=tiny). Groups and options: below."
)

_CFG_HELP = "print the composed config as YAML and exit (Hydra's --cfg job); starts nothing"


def groups_help() -> str:
    """The config groups and their options (``configs/<group>/*.yaml``), for ``--help``."""
    from asyncrl.core.config.load import CONFIG_DIR

    lines = ["config groups (group=option; files in asyncrl/configs/<group>/):"]
    for group in sorted(
        d for d in CONFIG_DIR.iterdir() if d.is_dir() and not d.name.startswith("_")
    ):
        options = sorted(f.stem for f in group.glob("*.yaml"))
        if options:
            lines.append(f"  {group.name:<10} {', '.join(options)}")
    lines.append("every key with its value: asyncrl run --cfg [overrides] (starts nothing)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asyncrl", description="Asynchronous off-policy RL for LLMs.")
    sub = p.add_subparsers(dest="command", required=True)
    raw = argparse.RawDescriptionHelpFormatter
    run = sub.add_parser("run", help="run buffer, learner and actors on this machine",
                         epilog=groups_help(), formatter_class=raw)  # fmt: skip
    run.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    run.add_argument("--cfg", action="store_true", help=_CFG_HELP)
    launch = sub.add_parser("launch", help="run one role against a shared buffer.url",
                            epilog=groups_help(), formatter_class=raw)  # fmt: skip
    launch.add_argument("role", choices=["learner", "actors", "buffer"])
    launch.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    launch.add_argument("--cfg", action="store_true", help=_CFG_HELP)
    status = sub.add_parser("status", help="print the buffer counters of a job")
    status.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    add_eval_parser(sub, groups_help())
    from asyncrl.orchestration.kubernetes.command import add_parser as add_k8s_parser

    add_k8s_parser(sub, _OVERRIDES_HELP, groups_help())
    return p


def add_eval_parser(sub, epilog: str) -> None:
    """``asyncrl eval``: the run's overrides, and the two things a run has no key for."""
    ev = sub.add_parser(
        "eval",
        help="score a model or checkpoint on the validation prompts (no learner, no Redis)",
        description="Score model.path, or a learner checkpoint, on the task's validation prompts\n"
        "(data.val_files; the addition task's eval split) with the task's reward: mean reward,\n"
        "pass@1 and pass@k for k = eval.n_samples, in <run_dir>/eval.json (docs/eval.md).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    ev.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="a learner checkpoint: RUN_DIR/checkpoints/step_<V> (or its hf/), or a run "
        "directory (its newest complete checkpoint); default: model.path",
    )
    ev.add_argument(
        "--output", metavar="FILE", help="the result JSON (default: <run_dir>/eval.json)"
    )
    ev.add_argument("--cfg", action="store_true", help=_CFG_HELP)


def main(argv: list[str] | None = None) -> int:
    # First thing: Ctrl-C or SIGTERM at any moment (even while torch imports) ends the command
    # with a message, not a traceback, also when SIGINT was inherited as ignored (a job
    # started in the background by a shell, nohup, some CI runners). A second signal while the
    # job stops hurries it instead of breaking the shutdown (launch/stop_signals.py on_stop_signal).
    # The import is inside the try: a Ctrl-C that lands while it runs (a fresh clone compiles
    # its bytecode first) is Python's KeyboardInterrupt, and gets the same message.
    try:
        from asyncrl.orchestration.launch.stop_signals import on_stop_signal

        signal.signal(signal.SIGINT, on_stop_signal)
        signal.signal(signal.SIGTERM, on_stop_signal)
        return _main(argv)
    except KeyboardInterrupt:
        print("asyncrl: interrupted (Ctrl-C or SIGTERM)", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "k8s":  # writes files; composes each role's config itself
        from asyncrl.orchestration.kubernetes.command import run as render_k8s

        return render_k8s(args)
    from asyncrl.core.config.load import ConfigError, load_config
    from asyncrl.orchestration.evaluate.args import eval_overrides, explain_config_error
    from asyncrl.orchestration.slurm.job import SlurmError

    evaluating = args.command == "eval"
    try:
        overrides = [*args.overrides, *slurm_overrides(args)]
    except SlurmError as e:  # the variable named, with the fix
        print(f"asyncrl: Slurm: {e}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(eval_overrides(overrides) if evaluating else overrides)
    except ConfigError as e:
        message = explain_config_error(str(e)) if evaluating else str(e)
        print(f"asyncrl: config error: {message}", file=sys.stderr)
        return 2
    problem = secret_in_argv(args.overrides, cfg)
    if problem:
        print(f"asyncrl: {problem}", file=sys.stderr)
        if not problem.startswith("warning"):
            return 2
    if getattr(args, "cfg", False):
        from asyncrl.core.config.load import config_to_yaml

        print(config_to_yaml(cfg), end="")
        return 0
    try:
        if args.command == "run":
            from asyncrl.orchestration.launch.jobs import run_local

            return run_local(cfg)
        if args.command == "launch":
            from asyncrl.orchestration.launch.jobs import launch_role

            return launch_role(cfg, args.role)
        if evaluating:
            from asyncrl.orchestration.evaluate.command import run_eval

            return run_eval(cfg, args.checkpoint, args.output)
        from asyncrl.orchestration.status import print_status

        return print_status(cfg)
    except (FileNotFoundError, ValueError, ConnectionError, TimeoutError, RuntimeError) as e:
        print(f"asyncrl: error: {e}", file=sys.stderr)
        return 1


def slurm_overrides(args) -> list[str]:
    """Inside a Slurm job, what ``asyncrl launch ROLE`` and ``asyncrl status`` take from Slurm
    for the keys the user did not set (asyncrl/orchestration/slurm/fill.py), said on the
    console (on stderr with ``--cfg``, whose stdout is the YAML); [] elsewhere."""
    from asyncrl.orchestration.slurm.fill import from_environment

    role = args.role if args.command == "launch" else args.command
    taken = from_environment(os.environ, role, args.overrides)
    out = sys.stderr if getattr(args, "cfg", False) else sys.stdout
    for line in taken.lines:
        print(line, file=out, flush=True)
    return taken.overrides


def secret_in_argv(overrides: list[str], cfg) -> str:
    """'' when no password is on the command line; else the problem: an error off loopback,
    a warning on a job confined to loopback (other users of the host can still read argv)."""
    from urllib.parse import urlsplit

    from asyncrl.core.config.network import is_loopback

    urls = [o.partition("=")[2] for o in overrides if o.lstrip("+").startswith("buffer.url=")]
    if not any(urlsplit(u).password for u in urls):
        return ""
    host = urlsplit(urls[-1]).hostname or ""
    fix = (
        "buffer.url on the command line carries a password that every user of this host can "
        "read (ps, /proc/PID/cmdline); put the URL in a file only you can read (chmod 600) and "
        "pass buffer.url_file=PATH (asyncrl launch buffer writes such files)"
    )
    if cfg.network.local and (is_loopback(host) or urlsplit(urls[-1]).scheme == "unix"):
        return f"warning: {fix}"
    return fix


if __name__ == "__main__":
    sys.exit(main())
