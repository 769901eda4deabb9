"""The demo's learner steps/s before and after issue 15, side by side in one run.

Issue 15's learner changes (chunked log-probs from the final hidden states,
``model.logprob_chunk_tokens``; scoring at ``actor.temperature``; micro-batch planning;
sharded loading; packing) start at commit 1f45a05. This script checks out ``--base``
(default ``1f45a05^``, the commit before them) in a temporary ``git worktree`` (removed at the
end, also on an error or Ctrl-C) and times the demo's learner step at that checkout and at the
working tree:

  base    the base checkout, the default config (``load_config([])``: the demo / cpu preset);
  new     the working tree, the same;
  extra   ``--arm NAME[@REV]:key=value,...``: the working tree with these overrides, or with
          ``@REV`` a checkout of that commit (``@base``: the base's), e.g.
          ``--arm full_logits:model.logprob_chunk_tokens=0`` or ``--arm first@1f45a05:`` (each
          commit in a worktree of its own, removed at the end like the base's).

Every arm runs the same small worker (this file, copied into a temp directory) under
``torchrun --nproc_per_node=--nproc`` (default 2: the cpu preset's two gloo ranks), with the
arm's checkout first on ``PYTHONPATH`` and as the working directory, so each arm imports its own
``asyncrl``/``learner``/``buffer`` (the worker checks where ``learner`` came from). Each rank
pins ``torch.set_num_threads(--threads)`` (default 1, as ``learner.cpu_threads``) and
``OMP_NUM_THREADS``. The worker builds the step context with the checkout's own
``learner.trainer.build_step_context`` from the default config (policy, AdamW, the grpo preset),
on one shared model directory: the demo architecture built by ``asyncrl``'s demo code with
random weights (seed 0), made once by this process. The batch is demo-shaped and the same for
every arm: ``learner.batch_groups`` (16) groups of ``actor.n_samples`` (8), prompts of the demo
task (``actors.addition``, tokenized by the demo tokenizer), completions of 1 to
``actor.max_tokens`` (8) tokens (mostly the answer's digits, some wrong, then EOS; some cut at
the limit), behaviour log-probs and rewards drawn from a fixed seed.

Timing: ``train_on_batch`` only (what ``learner.trainer`` calls once per step). Each arm's
ranks stay alive across rounds (idle ones poll a file); at start they run ``--warmup`` steps;
each round runs one more untimed step, then ``--steps`` timed ones (rank 0's wall clock, and
every rank's process CPU seconds, summed). Rounds alternate the order of arms (A B, B A, ...),
so machine noise (the cores are shared) hits every arm alike. Reported per arm: the median and
fastest step seconds over every timed step, steps/s = 1 / median; against ``base``, the
steps/s ratio (arm / base; < 1 is a drop) of each round's medians paired by round: median,
quartiles, min-max, how many rounds were slower; the fastest steps' ratio; and the same
per-round ratio of CPU seconds per step (less sensitive to other jobs on the cores).

``--full``: the whole demo too, ``asyncrl run learner.steps=--full-steps`` (default 30) in a
temp run directory, same overrides for both checkouts (the warm-started demo model from this
checkout's ``.cache/asyncrl``, shared), ``--full-reps`` pairs in A B / B A order; steps/s =
steps / ``train_wall_s`` from each run's ``summary.json`` (as benchmarks/own_task.py), and the
learner's busy seconds per step. About 1.5 min per run here.

    python -m benchmarks.demo_step_rate                 # ~1.5-2 min on 2 shared cores
    python -m benchmarks.demo_step_rate --full          # + 2 whole demo runs, ~3 min more
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

WORKER_NAME = "demo_step_rate_worker.py"


# --------------------------------------------------------------------------------------------
# worker: runs under torchrun in an arm's checkout; imports only the stdlib, torch and that
# checkout's packages (no benchmarks.*), through APIs that exist at 1f45a05^ and now.
# --------------------------------------------------------------------------------------------


def _write_atomic(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _worker_batch(path: Path):
    from asyncrl.types import Group, Sample
    from learner.batch import collate

    spec = json.loads(path.read_text())
    groups = [
        Group(f"g{i}", i, 0, [Sample(list(g["prompt"]), s["ids"], s["logprobs"], [0] * len(s["ids"]),
                                     s["reward"]) for s in g["samples"]])
        for i, g in enumerate(spec["groups"])
    ]  # fmt: skip
    return collate(groups)


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    import learner
    from asyncrl.configload import load_config
    from learner.step import train_on_batch
    from learner.trainer import build_step_context, init_distributed

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
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown can abort at interpreter exit (see the unit tests' scripts)


# --------------------------------------------------------------------------------------------
# parent
# --------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="1f45a05^", help="the commit before the change")
    p.add_argument("--rounds", type=int, default=30, help="interleaved rounds (every arm each)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per arm per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps at each worker's start")
    p.add_argument("--nproc", type=int, default=2, help="learner ranks (cpu preset: 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--arm", action="append", default=[], metavar="NAME[@REV]:k=v,...",
                   help="an extra arm: the working tree (or commit REV, or @base) with these "
                   "overrides")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="model weights and batch")
    p.add_argument("--full", action="store_true", help="also time whole `asyncrl run`s")
    p.add_argument("--full-steps", type=int, default=30)
    p.add_argument("--full-reps", type=int, default=1, help="pairs of whole runs")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per round / per whole run")
    p.add_argument("--out", default=None, help="results directory (benchmarks/results)")
    p.add_argument("--name", default=None, help="result name (demo_step_rate[_full])")
    # worker
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for k in ("ctl", "model_dir", "batch", "overrides"):
        p.add_argument("--" + k.replace("_", "-"), dest=k, help=argparse.SUPPRESS)
    p.add_argument("--arm-name", dest="arm_name", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _git(*cmd: str, cwd=None) -> str:
    import subprocess

    from benchmarks.common import REPO

    out = subprocess.run(["git", *cmd], cwd=cwd or REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(cmd)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def parse_arms(specs: list[str]) -> list[dict]:
    """``base`` and ``new`` (default config), then ``--arm NAME[@REV]:k=v,...``; an arm's
    ``checkout`` is ``base``, ``new`` (the working tree) or a git revision."""
    arms = [{"name": "base", "checkout": "base", "overrides": []},
            {"name": "new", "checkout": "new", "overrides": []}]  # fmt: skip
    for spec in specs:
        name, sep, rest = spec.partition(":")
        name, _, where = name.partition("@")
        if not name.isidentifier() or not sep:
            raise SystemExit(f"--arm {spec!r}: expected NAME[@REV]:key=value,...")
        if name in {a["name"] for a in arms}:
            raise SystemExit(f"--arm {spec!r}: arm {name!r} already exists")
        over = [o for o in rest.split(",") if o]
        arms.append({"name": name, "checkout": where or "new", "overrides": over})
    return arms


def build_model_dir(out: Path, seed: int) -> Path:
    """The demo architecture (asyncrl's demo model code), random weights of ``seed``."""
    from asyncrl.orchestration.demo.model import demo_config, init_model, save_model_dir

    return save_model_dir(init_model(demo_config(), seed=seed), out)


def build_batch_spec(cfg, seed: int) -> dict:
    """Demo-shaped groups as plain lists: the demo task's train prompts 16..31 through the demo
    tokenizer (the first 16 happen to be the shortest: rows 15 wide, against 16-18 in a real
    run); completions of 1..max_tokens tokens like the warm-started demo model's (a real demo run
    here: 5-6 tokens on average, padding 0.2-0.4 of the padded batch): one in three runs to the
    limit, the rest are the answer's digits (one in four wrong), a stray character now and
    then, and EOS; behaviour log-probs -Exp(1), rewards on 0..1."""
    import random

    from actors.addition import AdditionSource
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    tok, rng = build_tokenizer(), random.Random(seed)
    src = AdditionSource(seed, split="train")
    cap, digits = cfg.actor.max_tokens, tok.encode("0123456789")
    groups = []
    for i in range(cfg.learner.batch_groups):
        p = src.get(cfg.learner.batch_groups + i)  # the 2nd batch: rows 16 wide, as is typical
        samples = []
        for _ in range(cfg.actor.n_samples):
            if rng.random() < 1 / 3:
                ids = [rng.randrange(3, 64) for _ in range(cap)]
            else:
                ids = [d if rng.random() < 0.75 else rng.choice(digits)
                       for d in tok.encode(p.fields["answer"])]  # fmt: skip
                while rng.random() < 0.3:
                    ids.insert(rng.randint(0, len(ids)), rng.randrange(3, 64))
                ids = (ids + [tok.eos_token_id])[:cap]
            samples.append({"ids": ids, "logprobs": [-rng.expovariate(1.0) for _ in ids],
                            "reward": round(rng.random(), 2)})  # fmt: skip
        groups.append({"prompt": tok.encode(p.text), "samples": samples})
    return {"groups": groups}


def _batch_shape(spec: dict) -> dict:
    rows = [(len(g["prompt"]), len(s["ids"])) for g in spec["groups"] for s in g["samples"]]
    return {
        "groups": len(spec["groups"]),
        "rows": len(rows),
        "prompt_tokens_mean": sum(p for p, _ in rows) / len(rows),
        "completion_tokens_mean": sum(c for _, c in rows) / len(rows),
        "row_len_max": max(p + c for p, c in rows),
        "padding_frac": 1 - sum(p + c for p, c in rows) / (len(rows) * max(p + c for p, c in rows)),
    }


class Bench:
    """The temp directory, the worktrees and the workers; ``close`` removes them all."""

    def __init__(self, args, base_hash: str):
        import tempfile

        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="asyncrl-steprate-"))
        self.worktrees: dict[str, Path] = {}  # checkout label -> its worktree
        self.hashes = {"base": base_hash}
        self.procs: dict[str, object] = {}
        self.logs: dict[str, Path] = {}

    def add_worktree(self, label: str) -> Path:
        """A detached worktree of ``label`` (``base`` or a revision), once per label."""
        if label not in self.worktrees:
            rev = self.hashes.get(label) or _git("rev-parse", "--verify", f"{label}^{{commit}}")
            self.hashes[label] = rev
            path = self.tmp / f"checkout{len(self.worktrees)}"
            _git("worktree", "add", "--detach", str(path), rev)
            self.worktrees[label] = path
        return self.worktrees[label]

    def checkout(self, which: str) -> Path:
        from benchmarks.common import REPO

        return REPO if which == "new" else self.worktrees[which]

    def env(self, which: str, threads: bool = True) -> dict:
        """This environment with ``which``'s checkout first on ``PYTHONPATH`` (and the thread
        counts pinned to ``--threads`` when ``threads``)."""
        root = str(self.checkout(which))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, PYTHONPATH=path, TOKENIZERS_PARALLELISM="false",
                   PYTHONUNBUFFERED="1")  # fmt: skip
        if threads:
            env.update(
                OMP_NUM_THREADS=str(self.args.threads), MKL_NUM_THREADS=str(self.args.threads)
            )
        return env

    def start_worker(self, arm: dict, worker_py: Path, model_dir: Path, batch: Path) -> None:
        import subprocess

        from asyncrl.torchrun import free_port

        a = self.args
        log = self.tmp / f"worker_{arm['name']}.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={a.nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(worker_py),
               "--worker", "--arm-name", arm["name"], "--ctl", str(self.tmp / "ctl"),
               "--model-dir", str(model_dir), "--batch", str(batch),
               "--overrides", json.dumps(arm["overrides"]), "--steps", str(a.steps),
               "--warmup", str(a.warmup), "--threads", str(a.threads)]  # fmt: skip
        with log.open("w") as f:
            self.procs[arm["name"]] = subprocess.Popen(
                cmd, cwd=self.checkout(arm["checkout"]), env=self.env(arm["checkout"]),
                stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.logs[arm["name"]] = log

    def wait_file(self, name: str, path: Path, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            proc = self.procs[name]
            if proc.poll() is not None:
                tail = self.logs[name].read_text()[-4000:]
                raise RuntimeError(f"arm {name}: worker exited {proc.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"arm {name}: no {path.name} after {timeout_s:.0f} s")
            time.sleep(0.05)
        return json.loads(path.read_text())

    def stop_workers(self) -> None:
        import signal
        import subprocess

        ctl = self.tmp / "ctl"
        if ctl.is_dir():
            (ctl / "stop").write_text("stop")  # each worker leaves after its current round
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.terminate()  # torchrun stops its ranks
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)  # the session this script started
                    proc.wait()

    def close(self) -> None:
        import shutil

        try:
            self.stop_workers()
        finally:
            for path in self.worktrees.values():
                try:
                    _git("worktree", "remove", "--force", str(path))
                except SystemExit as e:
                    print(f"warning: {e}", file=sys.stderr)
            shutil.rmtree(self.tmp, ignore_errors=True)
            _git("worktree", "prune")


def measure(bench: Bench, arms: list[dict], model_dir: Path, batch: Path) -> dict:
    """Start every arm's ranks, then ``rounds`` interleaved rounds: name -> results."""
    import shutil

    a = bench.args
    ctl = bench.tmp / "ctl"
    ctl.mkdir()
    wdir = bench.tmp / "worker"
    wdir.mkdir()
    worker_py = wdir / WORKER_NAME
    shutil.copyfile(__file__, worker_py)
    for arm in arms:
        bench.start_worker(arm, worker_py, model_dir, batch)
    ready = {arm["name"]: bench.wait_file(arm["name"], ctl / f"ready_{arm['name']}.json",
                                          a.timeout_s) for arm in arms}  # fmt: skip
    rounds: dict[str, list[list[float]]] = {arm["name"]: [] for arm in arms}
    cpu: dict[str, list[list[float]]] = {arm["name"]: [] for arm in arms}
    order_log = []
    for r in range(a.rounds):
        order = arms if r % 2 == 0 else arms[::-1]
        order_log.append([arm["name"] for arm in order])
        for arm in order:
            name = arm["name"]
            (ctl / f"go_{name}_{r}").write_text("run")
            done = bench.wait_file(name, ctl / f"done_{name}_{r}.json", a.timeout_s)
            rounds[name].append(done["step_s"])
            cpu[name].append(done["cpu_s"])
        line = "  ".join(f"{n} {_median(rounds[n][-1]):.3f}s" for n in rounds)
        print(f"round {r + 1}/{a.rounds}: {line}", flush=True)
    return {"ready": ready, "rounds": rounds, "cpu": cpu, "order": order_log}


def _median(xs):
    import statistics

    return statistics.median(xs)


def _quartiles(xs: list[float]) -> tuple[float, float]:
    import statistics

    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def summarise(arms: list[dict], measured: dict, hashes: dict) -> dict:
    """Per arm: median and fastest step, steps/s, and steps/s against ``base``: each round's
    median step pairs with base's of the same round (median, quartiles, min, max over rounds),
    plus the pooled medians' ratio and the fastest steps' ratio."""
    base_rounds = [_median(r) for r in measured["rounds"]["base"]]
    base_all = [t for r in measured["rounds"]["base"] for t in r]
    base_cpu = [_median(r) for r in measured["cpu"]["base"]]
    out = {}
    for arm in arms:
        name = arm["name"]
        per_round = [_median(r) for r in measured["rounds"][name]]
        every = [t for r in measured["rounds"][name] for t in r]
        step_s = _median(every)
        ratios = [b / t for b, t in zip(base_rounds, per_round, strict=True)]
        q1, q3 = _quartiles(ratios)
        cpu_rounds = [_median(r) for r in measured["cpu"][name]]
        cpu_ratios = [b / t for b, t in zip(base_cpu, cpu_rounds, strict=True)]
        c1, c3 = _quartiles(cpu_ratios)
        ready = measured["ready"][name]
        out[name] = {
            "checkout": arm["checkout"],
            "commit": hashes[arm["checkout"]],
            "overrides": arm["overrides"],
            "step_s_median": step_s,
            "step_s_min": min(every),
            "steps_per_s": 1.0 / step_s,
            "step_s_round_medians": per_round,
            "step_s_all": measured["rounds"][name],
            "steps_per_s_vs_base": {
                "median": _median(ratios),
                "q1": q1,
                "q3": q3,
                "min": min(ratios),
                "max": max(ratios),
                "rounds": len(ratios),
                "rounds_slower": sum(r < 1 for r in ratios),
                "pooled": _median(base_all) / step_s,
                "fastest_step": min(base_all) / min(every),
                "per_round": ratios,
            },
            "cpu_s_per_step_median": _median([t for r in measured["cpu"][name] for t in r]),
            "cpu_s_all": measured["cpu"][name],
            "cpu_s_vs_base": {  # base's CPU seconds per step / the arm's: > 1 = less work
                "median": _median(cpu_ratios),
                "q1": c1,
                "q3": c3,
                "min": min(cpu_ratios),
                "max": max(cpu_ratios),
                "per_round": cpu_ratios,
            },
            "learner_imported_from": _short_path(ready["learner_file"]),
            "world": ready["world"],
            "torch_threads_per_rank": ready["torch_threads"],
            "first_step": ready["first_step"],
        }
    return out


def _short_path(path: str) -> str:
    """``learner/__init__.py`` under which checkout, without machine-specific directories."""
    from benchmarks.common import REPO

    p = Path(path)
    if p.is_relative_to(REPO):
        return f"<working tree>/{p.relative_to(REPO)}"
    return f"<worktree>/{Path(*p.parts[-2:])}"


def run_full(bench: Bench, checkout: str, rep: int) -> dict:
    """One whole demo run (``asyncrl run``) in ``checkout``: steps/s from its summary."""
    import subprocess

    from benchmarks.common import REPO

    a = bench.args
    run_dir = bench.tmp / f"full_{checkout}_{rep}"
    overrides = [f"learner.steps={a.full_steps}", "metrics_port=0",
                 f"model.cache_dir={REPO / '.cache' / 'asyncrl'}"]  # fmt: skip
    cmd = [sys.executable, "-m", "asyncrl.orchestration.cli", "run", f"run_dir={run_dir}",
           *overrides]  # fmt: skip
    env = bench.env(checkout, threads=False)  # the run sets each role's own thread counts
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=bench.checkout(checkout), env=env, capture_output=True,
                          text=True, timeout=a.timeout_s)  # fmt: skip
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"full run ({checkout}, rep {rep}) failed ({proc.returncode}):\n{tail}")
    s = json.loads((run_dir / "summary.json").read_text())
    busy = (s.get("learner_time_s") or {}).get("busy")
    res = {
        "checkout": checkout,
        "rep": rep,
        "overrides": ["run_dir=RUN_DIR", *overrides[:-1], "model.cache_dir=<repo>/.cache/asyncrl"],
        "wall_s": wall,
        "steps": s["steps"],
        "train_wall_s": s["train_wall_s"],
        "steps_per_s": s["steps"] / s["train_wall_s"],
        "learner_busy_s_per_step": busy / s["steps"] if busy is not None else None,
        "learner_time_s": s.get("learner_time_s"),
        "reward_initial": s.get("reward_initial"),
        "reward_final": s.get("reward_final"),
        **_step_medians(run_dir / "metrics.jsonl"),
    }
    print(f"full {checkout} rep {rep}: {res['steps_per_s']:.3f} steps/s "
          f"(train_wall_s {res['train_wall_s']:.1f})", flush=True)  # fmt: skip
    return res


def _step_medians(path: Path) -> dict:
    """Medians over the run's steps after the first (metrics.jsonl): rank 0's ``busy_s`` (wall
    seconds training, waits on the other rank included) and ``cpu_s`` (its process CPU
    seconds: less sensitive to the actor and other jobs on the cores)."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in recs if "busy_s" in r and "cpu_s" in r][1:]
    if not steps:
        return {"busy_s_median": None, "cpu_s_median": None}
    return {"busy_s_median": _median([r["busy_s"] for r in steps]),
            "cpu_s_median": _median([r["cpu_s"] for r in steps])}  # fmt: skip


def full_part(bench: Bench) -> dict:
    runs = []
    for rep in range(bench.args.full_reps):
        for checkout in ("base", "new") if rep % 2 == 0 else ("new", "base"):
            runs.append(run_full(bench, checkout, rep))
    by = {c: [r for r in runs if r["checkout"] == c] for c in ("base", "new")}
    ratios = [
        n["steps_per_s"] / b["steps_per_s"] for b, n in zip(by["base"], by["new"], strict=True)
    ]
    summary = {}
    for c, rs in by.items():
        summary[c] = {
            "steps_per_s_mean": sum(r["steps_per_s"] for r in rs) / len(rs),
            "learner_busy_s_per_step_mean": _mean([r["learner_busy_s_per_step"] for r in rs]),
            "busy_s_median_mean": _mean([r["busy_s_median"] for r in rs]),
            "cpu_s_median_mean": _mean([r["cpu_s_median"] for r in rs]),
        }
    return {"runs": runs, "summary": summary, "steps_per_s_new_vs_base": ratios}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def report(args, arms, results: dict, full: dict | None, extra: dict) -> None:
    from benchmarks.common import REPO, RESULTS, md_table, write_result

    name = args.name or ("demo_step_rate_full" if args.full else "demo_step_rate")
    payload = {"config": extra["config"], "batch": extra["batch"], "arms": results,
               "round_order": extra["order"], "full": full, "wall_s": extra["wall_s"],
               "notes": extra["notes"]}  # fmt: skip
    path = write_result(name, payload, Path(args.out) if args.out else RESULTS)
    header = ["arm", "checkout", "overrides", "median step s", "fastest step s", "steps/s",
              "steps/s vs base, per round: median [IQR] (min-max)", "rounds slower",
              "fastest vs base", "CPU s/step (ranks)", "CPU vs base: median [IQR]"]  # fmt: skip
    rows = []
    for arm in arms:
        r = results[arm["name"]]
        v, c = r["steps_per_s_vs_base"], r["cpu_s_vs_base"]
        rows.append([arm["name"], f"{arm['checkout']} `{r['commit'][:7]}`",
                     ",".join(arm["overrides"]) or "-", f"{r['step_s_median']:.4f}",
                     f"{r['step_s_min']:.4f}", f"{r['steps_per_s']:.2f}",
                     f"{v['median']:.3f} [{v['q1']:.3f}, {v['q3']:.3f}] "
                     f"({v['min']:.2f}-{v['max']:.2f})",
                     f"{v['rounds_slower']}/{v['rounds']}", f"{v['fastest_step']:.3f}",
                     f"{r['cpu_s_per_step_median']:.4f}",
                     f"{c['median']:.3f} [{c['q1']:.3f}, {c['q3']:.3f}]"])  # fmt: skip
    print(md_table(header, rows))
    if full:
        print()
        fr = [[r["checkout"], r["rep"], f"{r['steps_per_s']:.3f}", f"{r['train_wall_s']:.1f}",
               f"{r['learner_busy_s_per_step']:.3f}" if r["learner_busy_s_per_step"] else "-",
               _fmt(r["busy_s_median"]), _fmt(r["cpu_s_median"])]
              for r in full["runs"]]  # fmt: skip
        print(md_table(["whole demo", "rep", "steps/s", "train_wall_s", "learner busy s/step",
                        "median busy_s", "median cpu_s (rank 0)"], fr))  # fmt: skip
        ratios = ", ".join(f"{x:.3f}" for x in full["steps_per_s_new_vs_base"])
        print(f"whole demo steps/s new/base per pair: {ratios}")
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    import signal

    args = parse_args()
    if args.worker:
        args.name = args.arm_name
        return worker(args)
    from asyncrl.configload import load_config
    from benchmarks.common import git_commit

    t_start = time.monotonic()
    arms = parse_arms(args.arm)
    base_hash = _git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    signal.signal(signal.SIGTERM, _interrupt)  # clean up as on Ctrl-C
    bench = Bench(args, base_hash)
    try:
        for arm in arms:
            if arm["checkout"] != "new":
                bench.add_worktree(arm["checkout"])
        hashes = {**bench.hashes, "new": git_commit()}
        cfg = load_config([])
        model_dir = build_model_dir(bench.tmp / "model", args.seed)
        spec = build_batch_spec(cfg, args.seed)
        batch = bench.tmp / "batch.json"
        batch.write_text(json.dumps(spec))
        measured = measure(bench, arms, model_dir, batch)
        bench.stop_workers()
        results = summarise(arms, measured, hashes)
        full = full_part(bench) if args.full else None
    finally:
        bench.close()
    config = {k: v for k, v in vars(args).items()
              if k not in ("worker", "ctl", "model_dir", "batch", "overrides", "arm_name", "out")}  # fmt: skip
    config |= {
        "base_commit": base_hash,
        "new_commit": hashes["new"],
        "arms": arms,
        "launch": f"torchrun --nproc_per_node={args.nproc} (gloo, CPU), one worker per arm "
        "alive across rounds",
        "pinned": {
            "torch_threads_per_rank": args.threads,
            "OMP_NUM_THREADS": args.threads,
            "core_affinity": "none (the OS schedules the ranks on the shared cores)",
        },  # fmt: skip
        "model": "demo architecture (asyncrl.orchestration.demo.model.demo_config()), random "
        f"weights, seed {args.seed}; one directory for every arm",
        "algorithm": "default config (grpo preset) of each checkout, load_config([])",
        "timed": "learner.step.train_on_batch, rank 0's wall clock per step",
    }
    notes = ("steps/s vs base = base's step seconds / the arm's, per round (each round's "
             "median over its timed steps); < 1 means the arm is slower. 'new' is the working "
             "tree, with whatever uncommitted changes it had (commit ends in -dirty then). "
             "CPU only; the cores are shared with other jobs (see machine.load_avg).")  # fmt: skip
    extra = {"config": config, "batch": _batch_shape(spec), "order": measured["order"],
             "wall_s": time.monotonic() - t_start, "notes": notes}  # fmt: skip
    report(args, arms, results, full, extra)


if __name__ == "__main__":
    main()
