"""The multi-turn demo task with a long-tailed environment: ``ChainAddition`` whose every
``step`` first waits ``d`` seconds, ``d`` lognormal (a tool or a simulator that usually answers
in a second and now and then takes twenty).

    episode.env=benchmarks.multi_turn.slow_env:SlowChain

The latency. ``d = min(cap, median * exp(sigma * z))``, ``z`` standard normal, ``sigma =
ln(p99 / median) / 2.3263`` (2.3263 = the standard normal's 99th percentile), so ``median`` and
``p99`` are the distribution's median and 99th percentile, and the cap is 3 x p99 unless given
(0.07% of draws are cut at any scale). Issue 42's example is median 1 s, p99 20 s (sigma 1.288:
mean ``median * exp(sigma^2 / 2)`` = 2.29 s a step, p90 5.2 s, p99.9 53 s, cap 60 s): tool calls
that mostly answer in about a second and now and then take tens of seconds. The default here
is that shape (the same sigma, p99 / median = 20) at a quarter of the scale, median 0.25 s,
p99 5 s, cap 15 s: measured here, a synchronous step of the demo's 16 x 8 episodes then still
waits 8.4 s for the environment against 1.5 s of generation and 3.1 s of training (the ideal
overlap bound 4.15x), while 150 steps of 4-5 arms x 2 seeds fit the benchmark's 3 hours; at
1 s / 20 s a synchronous step waits ~35 s and only ~60 steps fit, a length in which the chain
task's validation did not rise (benchmarks/README.md). The arms' ``episode.env_timeout_s`` is
set above the cap (``benchmarks/multi_turn/run.py``), so no drawn delay is ever an
``env_timeout``.

The parameters come from environment variables (``MEDIAN_VAR``, ``P99_VAR``, ``CAP_VAR``,
``SEED_VAR``), set by the benchmark on each ``asyncrl run`` it starts; written before
``episode.env_kwargs`` existed and not yet moved there. The environment workers inherit the
actor's environment (less the buffer's password: ``asyncrl/actors/episodes/env_process.py``). The benchmark records the values in its result's
``config`` and each run's ``env``; unset, the defaults above apply, so the class also runs as
``asyncrl run experiment=chain episode.env=benchmarks.multi_turn.slow_env:SlowChain``.

Deterministic, so every arm sees the same latencies: ``z`` is a hash of (``SEED_VAR``, the
row, the turn), not of a global random state; the row names the prompt's group and which of
its ``n`` episodes this is (``row["group_id"]``, ``row["episode"]``), so a prompt's ``n``
episodes draw ``n`` distinct delays per turn, the same in every arm, whatever worker hosts
them. The seconds an episode waited so far are in every step's ``info`` as
``env_delay_s`` (and its draw count ``env_steps``): the run's own ``reward/env_delay_s`` per
step and ``val/env_delay_s`` per validation, which the benchmark reads as measured
environment time.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import statistics

from asyncrl.actors.data.chain import ChainAddition

MEDIAN_VAR = "ASYNCRL_BENCH_ENV_MEDIAN_S"
P99_VAR = "ASYNCRL_BENCH_ENV_P99_S"
CAP_VAR = "ASYNCRL_BENCH_ENV_CAP_S"
SEED_VAR = "ASYNCRL_BENCH_ENV_SEED"
DEFAULT_MEDIAN_S, DEFAULT_P99_S = 0.25, 5.0
CAP_P99S = 3.0
"""The default cap, in p99s: 15 s for p99 5 s."""
Z99 = statistics.NormalDist().inv_cdf(0.99)  # 2.3263...


def sigma_of(median_s: float, p99_s: float) -> float:
    """The lognormal's sigma whose 99th percentile is ``p99_s`` (0: a fixed delay)."""
    if median_s < 0 or p99_s < median_s:
        raise ValueError(f"need 0 <= median ({median_s}) <= p99 ({p99_s})")
    return math.log(p99_s / median_s) / Z99 if median_s > 0 else 0.0


def latency_params(environ=os.environ) -> dict:
    """``{"median_s", "p99_s", "cap_s", "sigma", "seed", "mean_s"}`` from ``environ``;
    ``mean_s`` is the uncapped lognormal mean ``median * exp(sigma^2 / 2)``."""
    median = float(environ.get(MEDIAN_VAR, DEFAULT_MEDIAN_S))
    p99 = float(environ.get(P99_VAR, DEFAULT_P99_S))
    cap = float(environ.get(CAP_VAR, CAP_P99S * p99))
    sigma = sigma_of(median, p99)
    return {"median_s": median, "p99_s": p99, "cap_s": cap, "sigma": sigma,
            "seed": int(environ.get(SEED_VAR, 0)),
            "mean_s": median * math.exp(sigma * sigma / 2)}  # fmt: skip


def delay_s(params: dict, key: str) -> float:
    """The delay for ``key``: a pure function of the parameters and the key."""
    digest = hashlib.sha256(f"{params['seed']}|{key}".encode()).digest()
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64  # in (0, 1)
    z = statistics.NormalDist().inv_cdf(u)
    return min(params["cap_s"], params["median_s"] * math.exp(params["sigma"] * z))


class SlowChain(ChainAddition):
    """``ChainAddition`` whose ``step`` first sleeps a lognormal delay (module docstring)."""

    async def reset(self, row: dict) -> list[dict]:
        self._key = json.dumps(row, sort_keys=True, default=str)  # names group and episode
        self._params = latency_params()
        self._waited, self._steps = 0.0, 0
        return super().reset(row)

    async def step(self, message: dict) -> tuple[list[dict], float, bool, dict]:
        d = delay_s(self._params, f"{self._key}|{self.turn}")
        await asyncio.sleep(d)
        self._waited += d
        self._steps += 1
        messages, reward, done, info = super().step(message)
        # in every step's info: an episode's extras are its last step's (one cut by a limit
        # after its first step still reports what it waited)
        info = {**info, "env_delay_s": self._waited, "env_steps": float(self._steps)}
        return messages, reward, done, info
