"""Runtime guard: no pickle on asyncrl's wires and files.

``install()`` adds a ``sys.addaudithook`` hook on the ``pickle.find_class`` audit event (fired
whenever an unpickler resolves a global: every pickle that could build an object other than
plain containers and numbers does). If a frame of asyncrl's own packages (``asyncrl``,
``actors``, ``buffer``, ``learner``) is on the calling stack and the global is not in
``ALLOWED``, the hook records the violation, logs it and raises ``PickleForbidden``, which
aborts the unpickling before the global is used.

Scope (documented in docs/reliability.md, Security):

* Our code paths only: a frame of ours in the calling chain, up to the start of the current
  asyncio task step, thread or ``multiprocessing`` process. vLLM and torch.multiprocessing
  pickle between their own processes (engine core, workers) and in their own tasks and
  threads; those are out of scope, as is pickle in tests and benchmarks.
* ``ALLOWED_CALL_SITES``: unpicklers called directly by these library functions are not on
  one of our wires, even with our frames further down the stack. Today one: vLLM's
  ``registry._run_in_subprocess``, which inspects a model class in a child process the first
  time a machine sees an architecture, and reads the child's answer back with pickle from a
  file in a ``TemporaryDirectory`` (mode 0700) it created a moment before; the answer is then
  cached as JSON under ``$VLLM_CACHE_ROOT/modelinfos``. Only a machine without that cache
  takes this path (CI with a warm cache hid it). The exemption matches the file
  *and* the function name of the unpickler's direct caller, so our own code calling pickle
  (or any other vLLM function doing so on our behalf) is still blocked. And torch's compile
  cache (``torch/_inductor/codecache.py``): ``torch.compile`` (flex attention in the packed
  learner on a GPU) reads the graphs it compiled earlier back from its own cache directory
  (``/tmp/torchinductor_$USER`` by default), pickled. The first GPU check (2026-11-27, H200)
  found the guard refusing that read in a test: torch then recompiles, slower, and logs it.
  A remote inductor cache (``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE``, off by default) goes
  through the same function; turning it on is trusting that cache.
* ``ALLOWED`` is what PyTorch Distributed Checkpoint (DCP) needs to read a checkpoint's
  ``.metadata`` and to exchange load plans between learner ranks (``all_gather_object``):
  DCP's own metadata dataclasses, ``torch.Size``, dtypes and layouts, ``pathlib`` paths, and
  a rank's failure (a built-in exception class with its ``traceback`` summary).
  With the guard on, that is the whole of what a checkpoint file or a rank can make the
  unpickler build (a restricted unpickler), so a crafted ``.metadata`` cannot run code.

Enabled in every asyncrl process when ``ASYNCRL_FORBID_PICKLE=1`` (``asyncrl/__init__.py``)
and in the test session (``tests/conftest.py``), which also fails a test that tripped it.
An audit hook cannot be removed: ``install()`` is once per process, idempotent.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from types import FrameType

log = logging.getLogger(__name__)

ENV = "ASYNCRL_FORBID_PICKLE"
OUR_PACKAGES = ("asyncrl",)  # one installed name: every part is a subpackage
_DCP = "torch.distributed.checkpoint."
_TORCH_NAMES = {"Size", "device", "layout", "memory_format", "strided", "sparse_coo"}
ALLOWED = {
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
    ("traceback", "StackSummary"),  # DCP's wrapped exceptions (below)
    ("traceback", "FrameSummary"),
}
"""(module, name) globals our code paths may unpickle (see the module docstring)."""
_INDUCTOR_CACHE = os.path.join("torch", "_inductor", "codecache.py")
ALLOWED_CALL_SITES = {
    (os.path.join("vllm", "model_executor", "models", "registry.py"), "_run_in_subprocess"),
    (_INDUCTOR_CACHE, "iterate_over_candidates"),
    (_INDUCTOR_CACHE, "_emit_triton_bundle"),
}
"""(path suffix, function) of library code whose unpickling is its own business: vLLM reading
the answer of its own model-inspection child from its private temp dir, torch reading its own
compile cache (module docstring)."""

_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
_OUR_DIRS = tuple(os.path.join(_ROOT, p) + os.sep for p in OUR_PACKAGES)
_SELF = os.path.abspath(__file__)
_installed = False
_lock = threading.Lock()
_violations: list[str] = []


class PickleForbidden(RuntimeError):
    """Our code tried to unpickle a global that is not allowed (see ``asyncrl.core.net.wireguard``)."""


def allowed(module: str, name: str) -> bool:
    """True for the globals in ``ALLOWED``, DCP's own classes and torch dtypes/Size/layouts."""
    if (module, name) in ALLOWED or module.startswith(_DCP) or _builtin_exception(module, name):
        return True
    torch = sys.modules.get("torch")
    if module == "torch" and torch is not None:
        return name in _TORCH_NAMES or isinstance(getattr(torch, name, None), torch.dtype)
    return False


def _builtin_exception(module: str, name: str) -> bool:
    """A built-in exception class (``builtins.OSError``, ...): DCP gathers a rank's failure
    as ``(exception, traceback summary)`` through pickle, even on one rank, so a full disk
    during a checkpoint reached the user as "pickle is forbidden" instead of ENOSPC (found by
    the chaos run). Building one calls the class with its saved arguments: no code runs."""
    if module != "builtins":
        return False
    import builtins

    cls = getattr(builtins, name, None)
    return isinstance(cls, type) and issubclass(cls, BaseException)


def _our_frame() -> str | None:
    """``file:line`` of the innermost frame of our packages in the calling chain, or None.

    The walk stops at an asyncio callback/task step (``Handle._run``), at a thread's start
    and at a process's start: a task, thread or process that a library created (e.g. vLLM's
    output handler, or its engine core forked from our actor) is not our code path just
    because our frames are further down the same stack (a forked child keeps its parent's).
    """
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        if path.startswith(_OUR_DIRS) and path != _SELF:
            return f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno}"
        if _boundary(path, code.co_name):
            return None
        frame = frame.f_back
    return None


def _allowed_call_site(frame) -> bool:
    """True if the unpickler's direct caller is one of ``ALLOWED_CALL_SITES``.

    ``frame`` is the first Python frame below the hook: the caller of the C unpickler, or
    frames of the pure-Python one (``pickle.py``), which are skipped.
    """
    while frame is not None and frame.f_code.co_filename.endswith(os.sep + "pickle.py"):
        frame = frame.f_back
    if frame is None:
        return False
    code = frame.f_code
    return any(
        code.co_name == name and code.co_filename.endswith(os.sep + suffix)
        for suffix, name in ALLOWED_CALL_SITES
    )


def _boundary(path: str, name: str) -> bool:
    """A frame that starts an unrelated call chain: an event-loop callback, a new thread, or
    a new ``multiprocessing`` process (forked: the frames below it are the parent's)."""
    if name == "_run" and path.endswith(os.path.join("asyncio", "events.py")):
        return True
    if name == "_bootstrap" and path.endswith(os.path.join("multiprocessing", "process.py")):
        return True
    return name == "_bootstrap_inner" and path.endswith("threading.py")


def _hook(event: str, args: tuple) -> None:
    if event != "pickle.find_class":
        return
    module, name = str(args[0]), str(args[1])
    if allowed(module, name):
        return
    if _allowed_call_site(sys._getframe(1)):
        return
    where = _our_frame()
    if where is None:
        return  # vLLM / torch internals between their own processes: out of scope
    msg = (
        f"pickle is forbidden on asyncrl's wires and files: unpickling {module}.{name} "
        f"called from {where}. Use Arrow IPC, JSON or safetensors (see asyncrl/core/net/wireguard.py); "
        f"{ENV}=1 enables this guard."
    )
    with _lock:
        _violations.append(msg)
    log.error(msg)
    raise PickleForbidden(msg)


def install() -> None:
    """Add the audit hook to this process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        sys.addaudithook(_hook)
        _installed = True


def installed() -> bool:
    return _installed


def violations() -> list[str]:
    """Messages of every violation in this process so far (also those someone caught)."""
    with _lock:
        return list(_violations)


def install_from_env() -> None:
    """``install()`` if ``ASYNCRL_FORBID_PICKLE=1``."""
    if os.environ.get(ENV) == "1":
        install()
