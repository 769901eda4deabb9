"""The worker of ``benchmarks.demo.step_rate``: one arm's learner ranks under ``torchrun``.

The parent copies this file into a temp directory and runs it in the arm's checkout (first on
``PYTHONPATH`` and the working directory), so it imports only the stdlib, torch and that
checkout's packages (no ``benchmarks.*``), through APIs that exist at 1f45a05^ and now. Each
rank builds the step context from the checkout's default config plus the arm's overrides, runs
``--warmup`` steps, then serves rounds through files in ``--ctl``: ``go_<arm>_<r>`` starts
round r (one untimed step, then ``--steps`` timed ones; rank 0 writes
``done_<arm>_<r>.json``), ``stop`` ends it.

    python step_rate_worker.py --worker --arm-name NAME --ctl DIR --model-dir DIR \\
        --batch batch.json --overrides '["k=v"]' --steps 5 --warmup 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """The flags the parent passes (``benchmarks.demo.step_rate_bench.Bench.start_worker``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help="run as the worker (always)")
    p.add_argument("--arm-name", dest="name", required=True)
    p.add_argument("--ctl", required=True, help="the control directory")
    p.add_argument("--model-dir", dest="model_dir", required=True)
    p.add_argument("--batch", required=True, help="the batch spec (JSON)")
    p.add_argument("--overrides", required=True, help="a JSON list of key=value")
    p.add_argument("--steps", type=int, required=True, help="timed steps per round")
    p.add_argument("--warmup", type=int, required=True, help="untimed steps at start")
    p.add_argument("--threads", type=int, required=True, help="torch threads per rank")
    return p.parse_args(argv)


def _write_atomic(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _worker_batch(path: Path):
    from asyncrl.core.types import Group, Sample
    from asyncrl.learner.compute.batch import collate

    spec = json.loads(path.read_text())
    groups = [
        Group(f"g{i}", i, 0, [Sample(list(g["prompt"]), s["ids"], s["logprobs"], [0] * len(s["ids"]),
                                     s["reward"]) for s in g["samples"]])
        for i, g in enumerate(spec["groups"])
    ]  # fmt: skip
    return collate(groups)


def worker(args) -> None:
    """Build the arm's step context, warm up, say ready, serve rounds until ``stop``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    try:
        import asyncrl.learner as learner
    except ModuleNotFoundError as exc:
        raise SystemExit(
            f"{Path.cwd()}: {exc}; this arm's commit predates the one-package layout "
            "(asyncrl/learner/, 2b490e3): give --arm a commit from 2b490e3 on"
        ) from exc
    from asyncrl.core.config.load import load_config
    from asyncrl.learner.compute.step import train_on_batch
    from asyncrl.learner.trainer import build_step_context, init_distributed

    rank, world = init_distributed()
    ctl = Path(args.ctl)
    where = str(Path(learner.__file__).resolve())
    if not where.startswith(str(Path.cwd().resolve()) + os.sep):
        raise SystemExit(
            f"learner imported from {where}, not from this arm's checkout {Path.cwd()}"
        )
    cfg = load_config([*json.loads(args.overrides), f"learner.nproc={world}"])
    torch.manual_seed(0)
    ctx = build_step_context(cfg, args.model_dir, rank, world)
    batch = _worker_batch(Path(args.batch))
    first = train_on_batch(ctx, batch)
    for _ in range(args.warmup - 1):
        train_on_batch(ctx, batch)
    if rank == 0:
        _write_atomic(ctl / f"ready_{args.name}.json", {
            "learner_file": where, "world": world, "torch_threads": torch.get_num_threads(),
            "batch_rows": batch.num_rows, "batch_width": int(batch.input_ids.shape[1]),
            "first_step": {k: float(v) for k, v in first.items()},
        })  # fmt: skip
    _serve_rounds(args, ctx, batch, rank)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown can abort at interpreter exit (see the unit tests' scripts)


def _serve_rounds(args, ctx, batch, rank: int) -> None:
    """Round r on ``go_<arm>_<r>``: one re-warming step, ``--steps`` timed ones; until ``stop``."""
    import torch
    import torch.distributed as dist

    from asyncrl.learner.compute.step import train_on_batch

    ctl = Path(args.ctl)
    r = 0
    while True:
        go = ctl / f"go_{args.name}_{r}"
        while not go.exists() and not (ctl / "stop").exists():
            if not ctl.is_dir():  # the parent is gone and its temp directory with it
                os._exit(1)
            time.sleep(0.05)
        if not go.exists():
            break
        train_on_batch(ctx, batch)  # re-warm after the other arm had the cores
        dist.barrier()
        times, cpu = [], torch.zeros(args.steps, dtype=torch.float64)
        for i in range(args.steps):
            t0, c0 = time.perf_counter(), time.process_time()
            train_on_batch(ctx, batch)
            times.append(time.perf_counter() - t0)
            cpu[i] = time.process_time() - c0
        dist.all_reduce(cpu)  # CPU seconds of every rank's process (all its threads)
        if rank == 0:
            _write_atomic(ctl / f"done_{args.name}_{r}.json",
                          {"step_s": times, "cpu_s": cpu.tolist()})  # fmt: skip
        r += 1


def main(argv=None) -> None:
    worker(parse_args(argv))


if __name__ == "__main__":
    main()
