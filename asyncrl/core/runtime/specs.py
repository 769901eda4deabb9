"""User code named by a spec: ``"package.module:name"`` (imported) or ``"path/to/file.py:name"``
(loaded from the file with importlib; nothing is ``eval``-ed). One loader for every kind a
config names: ``task.reward_fn``, ``episode.env``, ``episode.tools``.

A file is registered in ``sys.modules`` while it runs, so a ``@dataclass`` in a file with
``from __future__ import annotations`` loads (dataclasses look their module up). ``share=True``
keeps it registered and hands every later spec of the same file the same module (an
environment and its tools in one file); otherwise each load runs the file afresh.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


def load_object(spec: str, kind: str, *, define: str = "it", share: bool = False) -> Any:
    """The object named by ``spec``; ``kind`` names it in errors (``"reward"``,
    ``"environment"``, ``"tool"``) and ``define`` says what to define when the name is missing.
    A ``ValueError`` naming the spec and the fix when the spec is malformed, the module cannot
    be found or imported, or it has no such name."""
    target, sep, attr = (spec or "").rpartition(":")
    if not sep or not target or not attr.isidentifier():
        noun = "function" if kind in ("reward", "tool") else "Name"
        raise ValueError(
            f"{kind} spec {spec!r} is malformed: expected 'package.module:{noun}' or "
            f"'path/to/file.py:{noun}'"
        )
    if target.endswith(".py"):
        module = load_file(spec, kind, Path(target), share)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(
                f"{kind} spec {spec!r}: cannot import module {target!r} ({e}); check the name "
                "and that it is on PYTHONPATH, or give a file path ending in .py"
            ) from e
    if not hasattr(module, attr):
        raise ValueError(
            f"{kind} spec {spec!r}: {target!r} has no attribute {attr!r}; define {define} there "
            "or fix the name after ':'"
        )
    return getattr(module, attr)


def load_file(spec: str, kind: str, path: Path, share: bool = False) -> Any:
    """The Python file ``path`` as a module (see the module docstring for ``share``)."""
    if not path.is_file():
        raise ValueError(
            f"{kind} spec {spec!r}: file {str(path)!r} not found (relative paths are resolved "
            f"from {Path.cwd()}); fix the path or use 'package.module:name'"
        )
    name = f"asyncrl_user_{abs(hash(str(path.resolve())))}"
    if share and name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"{kind} spec {spec!r}: cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise ValueError(
            f"{kind} spec {spec!r}: importing {str(path)!r} failed: {type(e).__name__}: {e}"
        ) from e
    if not share:
        sys.modules.pop(name, None)
    return module


def check_constructor(cls: type, kwargs: dict, what: str, key: str, fix: str) -> None:
    """``cls(**kwargs)`` binds (not called: making one may start things); else a
    ``ValueError`` naming ``what`` (``"environment spec 'x.py:Env'"``), the signature, the
    config ``key`` that gave ``kwargs``, why, and ``fix``. A signature Python cannot read
    passes (the first instance tells)."""
    import inspect

    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(**kwargs)
    except TypeError as e:
        raise ValueError(
            f"{what}: {cls.__qualname__}{sig} cannot take {key}={kwargs} ({e}); {fix}"
        ) from e
