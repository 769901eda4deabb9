"""The learner-throughput benchmark's runs (``benchmarks.learner.throughput``): the random model
made once (or a real model's directory), then every arm's worker processes, ``--rounds``
interleaved rounds at the preset batch and the largest-batch search (each try one step in its
own process, so an out-of-memory error cannot poison the rest)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from benchmarks.learner.throughput_model import build_model_dir, real_tokens
from benchmarks.learner.throughput_report import first_of, stated_peak, summarise
from benchmarks.learner.throughput_worker import run_worker
from benchmarks.real_model import param_counts


def run_arms(args, cfg: dict, hf_config, real: int, model_dir: str | None = None,
             measured=None):  # fmt: skip
    """Make the model (unless ``model_dir`` is a real one), measure every arm, search the
    largest batch of each arm in ``cfg["fit"]["arms"]`` (none with ``--no-fit``):
    ``(parameter counts, worker results per arm, per-arm figures, stated peak)``.
    ``measured(counts, runs, arms, peak, partial, per_arm)``, when given, is called after
    every arm's worker but the last (``per_arm``; ``partial`` says which are left) and once
    the timings are in, before the search: a run cut short keeps what it measured."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-throughput-") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        t0 = time.monotonic()
        if model_dir:
            counts = param_counts(model_dir)
            kind = f"real model {cfg['real_model']}"
        else:
            model_dir, counts = build_model_dir(hf_config, work, args.seed, cfg["dtype"],
                                                cfg["device"])  # fmt: skip
            kind = "random model"
        print(
            f"{kind}: {counts['n_params']:,} parameters ({time.monotonic() - t0:.0f} s)",
            flush=True,
        )
        runner = Runner(args, cfg, model_dir, hf_config.vocab_size)

        def figures(runs: dict) -> tuple[dict, tuple]:
            peak = stated_peak(first_of(runs, "gpu"), args.peak_tflops)
            arms = summarise(cfg, runs, counts, real, peak)
            for arm, a in arms.items():
                a["fit"], a["fit_skipped_reason"] = None, _fit_skipped(cfg["fit"], arm)
            return arms, peak

        def after_arm(runs: dict, left: list[str]) -> None:  # a run cut short keeps these
            done = {arm: rs for arm, rs in runs.items() if rs}
            if measured is not None and left:
                arms, peak = figures(done)
                measured(counts, done, arms, peak, f"written before {', '.join(left)} ran", True)

        runs = runner.measure(after_arm)
        arms, peak = figures(runs)
        if measured is not None:
            measured(counts, runs, arms, peak, "timings only: the largest-batch search was "
                     "still running", False)  # fmt: skip
        for arm, a in arms.items():
            if a["fit_skipped_reason"] is None:
                a["fit"] = runner.fit(arm, runs[arm][0])
    return counts, runs, arms, peak


def _fit_skipped(fit: dict | None, arm: str) -> str | None:
    """Why ``arm``'s largest batch is not searched, or None when it is."""
    if fit is None:
        return "--no-fit"
    if fit["arms"] is not None and arm not in fit["arms"]:
        return f"not in --fit-arms ({','.join(fit['arms'])})"
    return None


class Runner:
    """Worker processes of one run: their spec, environment (threads pinned) and log lines."""

    def __init__(self, args, cfg: dict, model_dir: Path, vocab: int):
        self.args, self.cfg, self.model_dir, self.vocab = args, cfg, model_dir, vocab
        self.t0 = time.monotonic()
        self.env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}

    def env_of(self, spec: dict) -> dict:
        """The worker's environment: its OpenMP and MKL pools as many threads as its torch."""
        threads = str(spec["threads"])
        return {**self.env, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.0f} s] {text}", flush=True)

    def spec(self, arm: str, groups: int, repeat: int, mem_limit=None) -> dict:
        a = self.cfg["arms"][arm]
        from asyncrl.core.config.checks import parse_cores

        return {"kind": a["kind"], "overrides": a.get("overrides"), "bare": a.get("settings"),
                "model_dir": str(self.model_dir), "batch": self.cfg["batch"], "groups": groups,
                "seed": self.cfg["seed"], "vocab": self.vocab, "device": self.cfg["device"],
                "threads": int(a.get("threads", self.args.threads)),
                "cores": parse_cores(a.get("cores", self.args.cores)),
                "repeat": repeat, "mem_limit_gib": mem_limit}  # fmt: skip

    def measure(self, after=None) -> dict[str, list[dict]]:
        """``rounds`` interleaved rounds: every arm's worker in turn, at the preset batch;
        ``after(runs, left)`` after each worker, ``left`` the workers still to run."""
        groups = self.cfg["batch"]["groups"]
        runs: dict[str, list[dict]] = {arm: [] for arm in self.cfg["arms"]}
        order = [(r, arm) for r in range(self.cfg["rounds"]) for arm in runs]
        for i, (r, arm) in enumerate(order):
            if runs[arm] and runs[arm][0]["status"] != "ok":
                continue  # it did not fit (or failed): once is enough
            spec = self.spec(arm, groups, self.cfg["repeat"])
            if r == 0 and arm in self.cfg.get("profile", {}):
                spec["profile"] = str(Path(self.args.out) / self.cfg["profile"][arm])
            res = run_worker(spec, self.env_of(spec), self.args.timeout)
            runs[arm].append(res)
            if res["status"] == "ok":
                steps = ", ".join(f"{t:.2f}" for t in res["times_s"])
                self.say(f"round {r + 1}/{self.cfg['rounds']} {arm} ({res['layout']}): "
                         f"steps {steps} s "
                         f"(warm-up {res['warmup_s']:.2f} s), peak "
                         f"{res['peak_memory_mib']:.0f} MiB")  # fmt: skip
                if "profile" in res:
                    p = res["profile"]
                    self.say(f"  profiled step {p['wall_s']:.2f} s, kernels "
                             f"{p['device_busy_s']:.2f} s: {p['path']}")  # fmt: skip
            else:
                self.say(f"round {r + 1} {arm}: {res['status']}: {res['error'][-300:]}")
            if after is not None:
                after(runs, [f"{a} (round {k + 1})" for k, a in order[i + 1 :]])
        return runs

    def fit(self, arm: str, first: dict) -> dict:
        """Largest number of groups whose step completes: doubling from the measured batch (or
        halving when it did not fit), then bisecting; every try one step in a fresh process."""
        fit = self.cfg["fit"]
        base, top = self.cfg["batch"]["groups"], max(1, fit["max_groups"])
        tries: list[dict] = []

        def fits(g: int) -> bool:
            spec = self.spec(arm, g, 0, fit["mem_limit_gib"])
            res = run_worker(spec, self.env_of(spec), self.args.timeout)
            tries.append({"groups": g, "real_tokens": real_tokens(self.cfg["batch"], g,
                          self.cfg["seed"]), "status": res["status"],
                          "peak_memory_mib": res.get("peak_memory_mib"),
                          "error": res.get("error")})  # fmt: skip
            self.say(f"fit {arm}: {g} groups -> {res['status']}")
            return res["status"] == "ok"

        start = min(base, top)
        if fit["mem_limit_gib"] is None and start == base and first["status"] in ("ok", "oom"):
            ok = first["status"] == "ok"  # the timing run was this try
            tries.append({"groups": base, "real_tokens": real_tokens(self.cfg["batch"], base,
                          self.cfg["seed"]), "status": first["status"], "from": "timing run",
                          "peak_memory_mib": first.get("peak_memory_mib")})  # fmt: skip
        else:
            ok = fits(start)
        lo, hi = largest_fitting(fits, start, top, ok)
        failures = [t for t in tries if t["status"] == "failed"]
        return {
            "largest_groups": lo,
            "largest_rows": lo * self.cfg["batch"]["n"],
            "largest_real_tokens": real_tokens(self.cfg["batch"], lo, self.cfg["seed"]),
            "first_failing_groups": hi,
            "at_bound": hi is None,
            "max_groups": top,
            "mem_limit_gib": fit["mem_limit_gib"],
            "tries": tries,
            "note": ("bounded by --fit-max-groups: the arm may fit more" if hi is None else
                     "a try counts as not fitting when it runs out of memory (oom) or its process "
                     "dies (failed: see its error)") + ("" if not failures else
                     f"; {len(failures)} tr{'y' if len(failures) == 1 else 'ies'} failed"),
        }  # fmt: skip


def largest_fitting(fits, start: int, top: int, ok: bool) -> tuple[int, int | None]:
    """``(lo, hi)``: ``lo`` the largest number of groups found to fit (0: none), ``hi`` the
    smallest found not to (None: ``top`` fits). ``ok`` says whether ``start`` fits; from there
    it doubles up to ``top`` (or halves down to 1), then bisects between the two."""
    lo, hi = (start, None) if ok else (0, start)
    while ok and hi is None and lo < top:
        g = min(2 * lo, top)
        if fits(g):
            lo = g
        else:
            hi = g
    while not ok and hi > 1:
        g = hi // 2
        if fits(g):
            lo, ok = g, True
        else:
            hi = g
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi
