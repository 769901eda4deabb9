"""The built-in code-task reward, ``python_code_reward``: model-written code run sandboxed
(``asyncrl.actors.rewards.sandbox.run_untrusted``) against the prompt's tests."""

from __future__ import annotations

import re

from asyncrl.actors.rewards.sandbox import run_untrusted

CODE_TIMEOUT_S = 10.0
"""Wall-clock limit of one ``python_code_reward`` run (the sandbox is killed after it)."""
CODE_CPU_S = 5.0
CODE_MEM_MB = 512
CODE_REQUIRE = ("rlimits", "netns", "pidns", "landlock")
"""Sandbox layers model-written code needs (no network, nothing outlives the run, writes only
in its directory): where the kernel lacks one, the reward refuses to run code at all."""
_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def python_code_reward(prompt: str, completion: str, tests: str = "", **fields) -> dict:
    """Code-task reward: 1.0 if the completion's code passes ``tests``, else 0.0.

    The code is the last fenced code block of the completion (the whole completion if it has
    none), followed by ``tests`` (the prompt's field: e.g. ``assert add(2, 3) == 5``). It runs
    model-written code, so it runs in ``asyncrl.actors.rewards.sandbox.run_untrusted``: a subprocess with CPU,
    memory, process and time limits, no network, and writes only in a fresh temporary
    directory. ``"sandbox"`` in the returned dict says why a run failed ("" if it passed).
    """
    blocks = _CODE_BLOCK.findall(completion)
    code = (blocks[-1] if blocks else completion) + "\n\n" + (tests or "")
    result = run_untrusted(
        code, timeout_s=CODE_TIMEOUT_S, mem_mb=CODE_MEM_MB, cpu_s=CODE_CPU_S, require=CODE_REQUIRE
    )
    return {"score": 1.0 if result.ok else 0.0, "sandbox": result.reason}


def _code_sandbox_preflight() -> None:
    """Raise ``SandboxError`` (naming the missing layers and the fix) unless this machine
    can confine model-written code; the launcher and each actor call it at start."""
    run_untrusted("pass", timeout_s=CODE_TIMEOUT_S, require=CODE_REQUIRE)


python_code_reward.preflight = _code_sandbox_preflight
