"""Reward functions: loading by spec, the two calling conventions, calling safely, and the
built-ins.

Two signatures load from ``task.reward_fn``; ``load_reward_fn`` tells them apart by the
parameter names and hands every caller (the scorer, ``check_signature``, reward workers) ours:

- **ours**: ``fn(prompt: str, completion: str, **fields)``. ``fields`` are the prompt's fields
  (``Prompt.fields``: the demo's ``a``, ``b``, ``answer``; a dataset's columns, with
  ``ground_truth``, ``data_source``, ``extra_info``). ``completion`` is the decoded text
  without the EOS token. Any function without a parameter named ``solution_str`` is taken as
  ours (also ``(*args, **kwargs)``); ``check_signature`` then checks, at start, that the call
  binds with the task's fields.
- **verl's**: ``compute_score(data_source, solution_str, ground_truth, extra_info)``: any
  function with a parameter named ``solution_str``. It must accept verl's call, all four
  by keyword (``data_source=..., solution_str=..., ground_truth=..., extra_info=...``, as
  verl's reward managers call it; defaults and ``**kwargs`` are fine), else loading fails.
  ``VerlReward`` wraps it once at load: ``data_source`` = the field (``""`` if absent),
  ``solution_str`` = the completion, ``ground_truth`` = the ``ground_truth`` field, else
  ``answer``, ``extra_info`` = a copy of the field (``{}`` if absent).

Either returns a float or a dict with the reward under ``"score"``. A dict's other numeric
values (bools count as 0/1: verl's ``acc``) are the sample's ``Scored.extras``
(``Sample.reward_extras``): the learner logs their mean per step as ``reward/<key>``
(metrics.jsonl); other values (strings) are ignored.

Specs: ``"package.module:function"`` (imported) or ``"path/to/file.py:function"`` (loaded from
the file with importlib; nothing is ``eval``-ed).

A call that fails scores 0 with a reason ``"<kind>: <message>"`` (``Sample.reward_error``),
``<kind>`` one of ``asyncrl.reward_records.REWARD_ERROR_KINDS``; ``error_kind`` there reads it back (the learner's summary
counts errors by kind). Actors call the function through ``actors.scoring.RewardScorer``
(off the event loop, with a deadline).

Built-ins: ``math_reward`` and ``math_answer_reward``
(actors/math_reward.py), ``python_code_reward`` (sandboxed); the demo's
``addition_reward`` lives with its task in actors/addition.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from actors.math_reward import (  # noqa: F401 (specs name them here: actors.rewards:math_reward)
    extract_final_answer,
    math_answer_reward,
    math_reward,
)
from asyncrl.sandbox import SandboxError, run_untrusted
from asyncrl.types import MAX_REWARD_EXTRAS

RewardFn = Callable[..., "float | dict"]


def load_reward_fn(spec: str) -> RewardFn:
    """Load the reward function named by ``spec`` (``"module:function"`` or ``"file.py:function"``)
    in our calling convention: a verl-style function comes back wrapped in ``VerlReward``.

    Raises ``ValueError`` naming the spec and the fix when the spec is malformed, the module or
    file cannot be found or imported, the attribute is missing, it is not callable, or it is
    verl-style but cannot take verl's call.
    """
    target, sep, attr = (spec or "").rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise ValueError(
            f"reward spec {spec!r} is malformed: expected 'package.module:function' or "
            f"'path/to/file.py:function'"
        )
    if target.endswith(".py"):
        module = _load_file(spec, Path(target))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ValueError(
                f"reward spec {spec!r}: cannot import module {target!r} ({exc}); check the name "
                f"and that it is on PYTHONPATH, or give a file path ending in .py"
            ) from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(
            f"reward spec {spec!r}: {target!r} has no attribute {attr!r}; define "
            f"'def {attr}(prompt, completion, **fields)' there or fix the name after ':'"
        )
    if not callable(fn):
        raise ValueError(
            f"reward spec {spec!r}: {target}:{attr} is a {type(fn).__name__}, not callable; "
            f"point the spec at a function"
        )
    return VerlReward(fn, spec) if is_verl_style(fn) else fn


def _load_file(spec: str, path: Path):
    """Import the Python file ``path`` as a fresh module (for ``file.py:function`` specs)."""
    if not path.is_file():
        raise ValueError(
            f"reward spec {spec!r}: file {str(path)!r} not found (relative paths are resolved "
            f"from {Path.cwd()}); fix the path or use 'package.module:function'"
        )
    name = f"asyncrl_reward_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"reward spec {spec!r}: cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise ValueError(
            f"reward spec {spec!r}: importing {str(path)!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module


VERL_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""verl's reward arguments; its reward managers pass all four by keyword."""


def is_verl_style(fn: RewardFn) -> bool:
    """Whether ``fn`` is verl's ``compute_score``: it has a parameter named ``solution_str``
    (ours calls the completion ``completion``; no task has a field of that name)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins: taken as ours, the first call tells
        return False
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(p.name == "solution_str" and p.kind in named for p in params)


class VerlReward:
    """A verl ``compute_score(data_source, solution_str, ground_truth, extra_info)`` called as
    ours, ``reward(prompt, completion, **fields)``; see the module docstring for the mapping.

    Raises ``ValueError`` at construction when ``fn`` cannot take verl's keyword call."""

    def __init__(self, fn: RewardFn, spec: str = "") -> None:
        sig = inspect.signature(fn)
        try:
            sig.bind(**dict.fromkeys(VERL_PARAMS))
        except TypeError as e:
            name = getattr(fn, "__name__", "compute_score")
            raise ValueError(
                f"reward spec {spec!r}: {fn_name(fn)} has a parameter 'solution_str', so it is "
                f"taken as verl-style, but its signature {sig} cannot take verl's call "
                f"compute_score(data_source=..., solution_str=..., ground_truth=..., "
                f"extra_info=...) ({e}); define it as 'def {name}(data_source, "
                f"solution_str, ground_truth, extra_info=None, **kwargs)', or as ours, "
                f"'def {name}(prompt, completion, **fields)'"
            ) from None
        self.fn = fn
        self.preflight = getattr(fn, "preflight", None)

    def __call__(self, prompt: str, completion: str, **fields) -> float | dict:
        extra_info = fields.get("extra_info")
        return self.fn(
            data_source=fields.get("data_source", ""),
            solution_str=completion,
            ground_truth=fields.get("ground_truth", fields.get("answer")),
            # a copy: verl's managers add keys to it; the prompt's fields stay as they were
            extra_info=dict(extra_info) if isinstance(extra_info, dict) else extra_info or {},
        )


@dataclass(frozen=True)
class Scored:
    """The outcome of one reward call."""

    value: float
    """The reward; 0.0 when the call failed."""
    kind: str = ""
    """"" on success, else one of ``REWARD_ERROR_KINDS``."""
    reason: str = ""
    """"" on success, else ``"<kind>: <message>"`` (one line; stored in the group)."""
    detail: str = ""
    """For the actor's log: the traceback of a raise, the repr of a bad return value."""
    extras: dict[str, float] = field(default_factory=dict)
    """A dict result's other numeric values (``Sample.reward_extras``); {} on failure."""


def score_call(fn: RewardFn, prompt: str, completion: str, fields: dict | None = None) -> Scored:
    """Call ``fn(prompt, completion, **fields)`` and classify the outcome. Raises only
    ``SandboxError`` (this machine cannot confine model-written code: no sample can be scored).
    """
    try:
        out = fn(prompt, completion, **(fields or {}))
    except SandboxError:  # the machine cannot confine code: a setup error, not a 0 reward
        raise
    except Exception as exc:  # a user's reward function must not kill the actor
        message = f"reward function raised {type(exc).__name__}: {exc}"
        return _failed("raised", message, "".join(traceback.format_exception(exc)))

    def returned() -> str:  # only on a failure: naming the function is not free (~0.3 ms)
        return f"{fn_name(fn)} returned {_short_repr(out)}"

    if isinstance(out, dict) and "score" not in out:
        keys = sorted(map(str, out))
        message = f"reward dict has no 'score' key (keys: {keys})"
        return _failed("missing_score", message, returned())
    value = out.get("score") if isinstance(out, dict) else out
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        message = f"reward is {type(value).__name__}, expected a float or a dict with 'score'"
        return _failed("wrong_type", message, returned())
    value = float(value)
    if not math.isfinite(value):
        return _failed("non_finite", f"reward is not finite: {value}", returned())
    return Scored(value, extras=reward_extras(out) if isinstance(out, dict) else {})


def reward_extras(result: dict) -> dict[str, float]:
    """A dict result's values other than ``"score"`` that are finite numbers (bools as 0/1),
    by key; the first ``MAX_REWARD_EXTRAS`` keys in sorted order. Anything else is ignored
    (``python_code_reward``'s ``"sandbox"`` reason, verl's ``"pred"`` string)."""
    out = {}
    for key in sorted(k for k in result if isinstance(k, str) and k and k != "score"):
        value = result[key]
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
            if len(out) == MAX_REWARD_EXTRAS:
                break
    return out


def score(
    fn: RewardFn, prompt: str, completion: str, fields: dict | None = None
) -> tuple[float, str]:
    """``score_call`` as ``(reward, "")``, or ``(0.0, reason)`` if the call failed."""
    s = score_call(fn, prompt, completion, fields)
    return s.value, s.reason


def _failed(kind: str, message: str, detail: str = "") -> Scored:
    return Scored(0.0, kind, f"{kind}: {' '.join(message.split())[:500]}", detail)


def _short_repr(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def fn_name(fn: RewardFn) -> str:
    """``name (file:line)`` where the source is known, for messages about the function."""
    fn = fn.fn if isinstance(fn, VerlReward) else fn
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        where = f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return name
    return f"{name} ({where})"


def check_signature(fn: RewardFn, fields: dict, spec: str = "") -> None:
    """Raise ``ValueError`` unless ``fn(prompt, completion, **fields)`` binds to ``fn``'s
    signature for the task's prompt ``fields`` (e.g. ``a``, ``b``, ``answer``). ``fn`` is what
    ``load_reward_fn`` returned: a verl-style function is wrapped by then and passes.

    Any form that binds passes: ``(prompt, completion, **fields)``, ``(*args, **kwargs)``,
    ``(prompt, completion, answer=None, **_)``. A function without ``**`` fails when the task
    has fields it does not name; one whose signature Python cannot read (some builtins)
    passes, and its first call tells. The error names both accepted signatures.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind("prompt", "completion", **fields)
    except TypeError as e:
        name = getattr(fn, "__name__", "f")
        raise ValueError(
            f"reward spec {spec!r}: {fn_name(fn)} has the signature {sig}, but a reward "
            f"function is called as fn(prompt, completion, **fields) with this task's fields "
            f"{sorted(fields)}, which fails ({e}), and it is not verl's compute_score("
            f"data_source, solution_str, ground_truth, extra_info) either (that one is told by "
            f"its parameter 'solution_str'); define it as "
            f"'def {name}(prompt, completion, **fields)' or as 'def {name}(data_source, "
            f"solution_str, ground_truth, extra_info=None, **kwargs)'"
        ) from None


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
    model-written code, so it runs in ``asyncrl.sandbox.run_untrusted``: a subprocess with CPU,
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


def preflight(fn: RewardFn) -> None:
    """Run ``fn.preflight()`` if the reward function has one: a check that what it needs (e.g.
    a sandbox) is there, so a job fails at start instead of scoring every sample 0."""
    check = getattr(fn, "preflight", None)
    if callable(check):
        check()
