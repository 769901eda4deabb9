"""The bench of ``benchmarks.demo.step_rate``: what every arm shares (the random-weight demo
model directory and the demo-shaped batch), the processes (each arm's ``torchrun`` worker, kept
alive across rounds and driven through files in a control directory; the whole demo runs of
``--full``) and the temp directory and worktrees they run in, which ``Bench.close`` removes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from benchmarks.common import REPO
from benchmarks.demo import step_rate_worker
from benchmarks.worktrees import Worktrees

WORKER_NAME = "demo_step_rate_worker.py"  # the worker's copy in the temp directory


# ---------------------------------------------------------------------------- the inputs


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

    from asyncrl.actors.data.addition import AdditionSource
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    tok, rng = build_tokenizer(), random.Random(seed)
    src = AdditionSource(seed, split="train")
    cap, digits = cfg.sampling.max_tokens, tok.encode("0123456789")
    groups = []
    for i in range(cfg.learner.batch_groups):
        p = src.get(cfg.learner.batch_groups + i)  # the 2nd batch: rows 16 wide, as is typical
        samples = []
        for _ in range(cfg.sampling.n_samples):
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


def batch_shape(spec: dict) -> dict:
    """Rows, token means, the longest row and the padding of the batch ``spec``."""
    rows = [(len(g["prompt"]), len(s["ids"])) for g in spec["groups"] for s in g["samples"]]
    return {
        "groups": len(spec["groups"]),
        "rows": len(rows),
        "prompt_tokens_mean": sum(p for p, _ in rows) / len(rows),
        "completion_tokens_mean": sum(c for _, c in rows) / len(rows),
        "row_len_max": max(p + c for p, c in rows),
        "padding_frac": 1 - sum(p + c for p, c in rows) / (len(rows) * max(p + c for p, c in rows)),
    }


# ---------------------------------------------------------------------------- the processes


class Bench:
    """The temp directory, the worktrees and the workers; ``close`` removes them all."""

    def __init__(self, args, base_hash: str):
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="asyncrl-steprate-"))
        self.trees = Worktrees(self.tmp / "worktrees", {"base": base_hash})
        self.hashes = self.trees.hashes  # checkout label -> its commit
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def add_worktree(self, label: str) -> Path:
        """A detached worktree of ``label`` (``base`` or a revision), once per label."""
        return self.trees.add(label)

    def checkout(self, which: str) -> Path:
        return REPO if which == "new" else self.trees.paths[which]

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
        from asyncrl.core.runtime.torchrun import free_port

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
        try:
            self.stop_workers()
        finally:
            try:
                self.trees.close()
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)


def measure(bench: Bench, arms: list[dict], model_dir: Path, batch: Path) -> dict:
    """Start every arm's ranks, then ``rounds`` interleaved rounds: name -> results."""
    a = bench.args
    ctl = bench.tmp / "ctl"
    ctl.mkdir()
    wdir = bench.tmp / "worker"
    wdir.mkdir()
    worker_py = wdir / WORKER_NAME
    shutil.copyfile(step_rate_worker.__file__, worker_py)
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
        line = "  ".join(f"{n} {median(rounds[n][-1]):.3f}s" for n in rounds)
        print(f"round {r + 1}/{a.rounds}: {line}", flush=True)
    return {"ready": ready, "rounds": rounds, "cpu": cpu, "order": order_log}


# ---------------------------------------------------------------------------- --full


def run_full(bench: Bench, checkout: str, rep: int) -> dict:
    """One whole demo run (``asyncrl run``) in ``checkout``: steps/s from its summary."""
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
    return {"busy_s_median": median([r["busy_s"] for r in steps]),
            "cpu_s_median": median([r["cpu_s"] for r in steps])}  # fmt: skip


def full_part(bench: Bench) -> dict:
    """``--full-reps`` pairs of whole demo runs (base, new; then new, base; ...)."""
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


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None
