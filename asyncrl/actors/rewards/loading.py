"""Loading a reward function: by spec, in one of two calling conventions, checked before
the first call.

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
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from asyncrl.core.runtime.specs import load_object

RewardFn = Callable[..., "float | dict"]


def load_reward_fn(spec: str) -> RewardFn:
    """Load the reward function named by ``spec`` (``"module:function"`` or ``"file.py:function"``)
    in our calling convention: a verl-style function comes back wrapped in ``VerlReward``.

    Raises ``ValueError`` naming the spec and the fix when the spec is malformed, the module or
    file cannot be found or imported, the attribute is missing, it is not callable, or it is
    verl-style but cannot take verl's call.
    """
    attr = (spec or "").rpartition(":")[2]
    fn = load_object(spec, "reward", define=f"'def {attr}(prompt, completion, **fields)'")
    if not callable(fn):
        raise ValueError(
            f"reward spec {spec!r}: {attr} is a {type(fn).__name__}, not callable; "
            f"point the spec at a function"
        )
    return VerlReward(fn, spec) if is_verl_style(fn) else fn


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


def preflight(fn: RewardFn) -> None:
    """Run ``fn.preflight()`` if the reward function has one: a check that what it needs (e.g.
    a sandbox) is there, so a job fails at start instead of scoring every sample 0."""
    check = getattr(fn, "preflight", None)
    if callable(check):
        check()
