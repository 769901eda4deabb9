"""Built-in math rewards: ``math_reward`` (math-verify, then plain numbers) and
``math_answer_reward`` (plain numbers and text only).

Specs: ``asyncrl.actors.rewards:math_reward``, ``asyncrl.actors.rewards:math_answer_reward`` (``asyncrl.actors.rewards``
re-exports them). Both read the reference answer from the prompt's ``ground_truth`` field (verl
datasets), else its ``answer`` field (the demo task).

math-verify (Hugging Face's ``math-verify``, import ``math_verify``) parses LaTeX into SymPy and
compares symbolically: ``\\frac12`` == ``0.5``, ``\\frac{\\sqrt2}{2}`` == ``\\frac{1}{\\sqrt2}``,
``5\\text{ cm}`` == ``5``. Its own timeouts use ``signal.alarm``, which works only in a
process's main thread: ``math_reward`` asks for them there (a reward worker process) and turns
them off in any other thread, where the actor's ``task.reward_timeout_s`` bounds the call.
"""

from __future__ import annotations

import logging
import math
import re
import threading

MATH_VERIFY_TIMEOUT_S = 5
"""math-verify's own limit per parse / comparison, in the main thread only (see above)."""
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def math_reward(
    prompt: str,
    completion: str,
    answer: str | float | None = None,
    ground_truth: str | float | None = None,
    **fields,
) -> float:
    """1.0 if the completion's final answer equals the reference, else 0.0.

    The final answer is the content of the last ``\\boxed{...}`` (nested braces balanced), else
    the last number of the completion; none scores 0.0. It is equal when math-verify says the
    two parse to equivalent expressions, or else when ``math_answer_reward`` would score it
    1.0 (numbers compared numerically, anything else as whitespace-free text). The reference
    is ``ground_truth`` if given, else ``answer``; neither raises ``ValueError``.
    """
    truth = ground_truth if ground_truth is not None else answer
    if truth is None:
        raise ValueError("math_reward needs a 'ground_truth' or 'answer' field")
    pred = extract_final_answer(completion)
    if pred is None:
        return 0.0
    if _math_verify_equal(str(truth), pred):
        return 1.0
    return _plain_equal(pred, str(truth))


def _math_verify_equal(truth: str, pred: str) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    limit = MATH_VERIFY_TIMEOUT_S if in_main else None  # signal.alarm: main thread only
    targets = (LatexExtractionConfig(), ExprExtractionConfig())
    # both sides boxed, so math-verify reads each as one LaTeX answer (verl does the same)
    gold = parse(_boxed(truth), extraction_config=targets, parsing_timeout=limit)
    got = parse(_boxed(pred), extraction_config=targets, parsing_timeout=limit)
    return bool(gold and got and verify(gold, got, timeout_seconds=limit))


def _boxed(text: str) -> str:
    return text if "\\boxed" in text else f"\\boxed{{{text}}}"


def math_answer_reward(
    prompt: str, completion: str, answer: str | float | None = None, **fields
) -> float:
    """Plain math reward: 1.0 if the final answer equals ``answer``, else 0.0.

    The final answer is the content of the last ``\\boxed{...}`` if there is one, else the last
    number in the completion. Numbers compare numerically (``"1,000"`` == ``"1000.0"``);
    anything else compares as whitespace-stripped text.
    """
    if answer is None:
        raise ValueError("math_answer_reward needs an 'answer' field")
    pred = extract_final_answer(completion)
    return 0.0 if pred is None else _plain_equal(pred, str(answer))


def _plain_equal(pred: str, truth: str) -> float:
    a, b = _as_number(pred), _as_number(truth)
    if a is not None and b is not None:
        return float(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9))
    return float(_normalize(pred) == _normalize(truth))


def extract_final_answer(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), else the last number, else None."""
    start = text.rfind("\\boxed{")
    if start >= 0:
        depth, i = 1, start + len("\\boxed{")
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _as_number(s: str) -> float | None:
    """Parse ``s`` as a number after dropping ``$``, ``,`` and spaces; None if it is not one."""
    try:
        return float(s.replace(",", "").replace("$", "").replace(" ", ""))
    except ValueError:
        return None


def _normalize(s: str) -> str:
    """Whitespace-free text for non-numeric answer comparison."""
    return "".join(s.split())


def _math_verify_preflight() -> None:
    """Fail at start, naming the fix, when math-verify is not installed."""
    try:
        import math_verify  # noqa: F401
    except ImportError as e:
        raise ValueError(
            f"math_reward needs the math-verify package ({e}); install it with "
            "`pip install 'math-verify[antlr4_9_3]'` (scripts/setup.sh does)"
        ) from e


class _NoTimeoutWarning(logging.Filter):
    """Drops math-verify's warning that its timeout is off: off only in threads, where the
    actor's ``task.reward_timeout_s`` bounds the call instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


math_reward.preflight = _math_verify_preflight
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutWarning())
