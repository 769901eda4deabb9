"""Atomic checkpoints: DCP (sharded, for resume) + an HF safetensors export + state.json.

Layout: ``<run_dir>/checkpoints/step_<V>/{dcp/, hf/, state.json, COMPLETE}`` (with LoRA:
``{dcp/, adapter/, state.json, COMPLETE}``, adapter-only, ``hf/`` on request). A checkpoint is
written under ``.tmp-step_<V>``; once every file is fsynced, the ``COMPLETE`` marker (holding
``V``) is written and fsynced, the directory is renamed to ``step_<V>`` (one atomic rename) and
the parent directory is fsynced. ``latest_checkpoint`` trusts only a ``step_<V>`` whose marker
says ``V``, so a process killed at any point of a save leaves either the previous checkpoint
or the new one, never a partial one (tests/faults/test_checkpoint_kills.py kills it at every
phase). Only after that are the trained groups acknowledged in the buffer (ack-on-checkpoint).

A checkpoint never holds non-finite weights: ``save_checkpoint`` checks every rank's shards
of each model first and refuses (``NonFiniteError``) before it writes anything, so the previous
checkpoint stays the newest.

Failpoints (``asyncrl.core.runtime.faults``, test-only) mark the phases: ``checkpoint.begin``,
``checkpoint.after_dcp``, ``checkpoint.after_hf``, ``checkpoint.before_marker``,
``checkpoint.before_rename``, ``checkpoint.after_rename``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from asyncrl.core.runtime.fatal import FatalError
from asyncrl.core.runtime.faults import failpoint
from asyncrl.learner.compute.finite import NonFiniteError, nonfinite_models
from asyncrl.learner.state.complete import MARKER, complete_version, latest_checkpoint
from asyncrl.learner.state.export import export_adapter, export_hf
from asyncrl.learner.state.export import rank as _rank


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    run_dir: str | Path,
    version: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    source_model_dir: str | Path,
    extra: dict[str, tuple[nn.Module, torch.optim.Optimizer]] | None = None,
    export_dtype: torch.dtype | None = None,
    hf_export: bool = True,
) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint directory.
    ``export_dtype``: the HF export's (the training dtype); None keeps float32. ``hf_export``:
    write ``hf/`` (a LoRA run writes it on request only: ``model.lora.export_merged``).

    With LoRA adapters on the policy (``model.lora``) the checkpoint is adapter-only: dcp/
    holds the adapters and their optimizer state, not the frozen base (``adapter_only``),
    and ``adapter/`` the adapters in PEFT's format; ``state`` should name the base
    (asyncrl/learner/lora/base.py) for a resume to check.

    ``extra``: more (model, optimizer) pairs saved in the same DCP checkpoint under their
    name (e.g. ``{"critic": ...}``); only the policy is exported to ``hf/``. Raises
    ``NonFiniteError``, writing nothing, if a model has a NaN/inf weight on any rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{version:06d}"
    tmp = root / f".tmp-step_{version:06d}"
    broken = nonfinite_models({"policy": model, **{k: m for k, (m, _) in (extra or {}).items()}})
    if broken:
        raise NonFiniteError(
            f"refusing to write checkpoint {final}: the {' and '.join(broken)} weights are "
            f"non-finite (NaN/inf); the newest checkpoint stays {latest_checkpoint(run_dir)}"
        )
    if _rank() == 0:
        _remove_leftovers(root)
        tmp.mkdir(parents=True)
    _barrier()
    failpoint("checkpoint.begin", version=version)
    try:
        dcp.save(_state_dicts(model, optimizer, extra), checkpoint_id=str(tmp / "dcp"))
        failpoint("checkpoint.after_dcp", version=version)
        if hf_export:
            export_hf(model, tmp / "hf", source_model_dir, export_dtype)
        export_adapter(model, tmp / "adapter", source_model_dir)  # LoRA only
        failpoint("checkpoint.after_hf", version=version)
        if _rank() == 0:
            (tmp / "state.json").write_text(json.dumps(state, indent=2))
    except (Exception, CheckpointException) as e:  # DCP's is a BaseException
        if disk_full(e, root):
            shutil.rmtree(tmp, ignore_errors=True)  # give the space back
            raise FatalError(
                f"no space left on {root} while writing checkpoint {final.name} "
                f"({shutil.disk_usage(root).free >> 20} MiB free; torch said: {e}); free "
                "space there or set learner.checkpoint_dir to a larger disk; the newest "
                f"complete checkpoint stays {latest_checkpoint(run_dir)}"
            ) from e
        raise
    _barrier()  # every rank's files are written before rank 0 seals the checkpoint
    if _rank() == 0:
        write_manifest(tmp)
        _fsync_tree(tmp)
        failpoint("checkpoint.before_marker", version=version)
        _write_durably(tmp / MARKER, str(version))
        failpoint("checkpoint.before_rename", version=version)
        if final.exists():  # a same-version leftover: move it aside atomically, then delete
            trash = root / f".old-{final.name}"
            shutil.rmtree(trash, ignore_errors=True)
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)
        failpoint("checkpoint.after_rename", version=version)
    _barrier()
    return final


MANIFEST = "manifest.json"
"""Every file of a checkpoint with its size and XXH3-64, written before the marker."""


def _xxh3(path: Path) -> str:
    import xxhash

    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    skip = {MARKER, MANIFEST}
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in skip)


def write_manifest(root: Path) -> None:
    """``root/manifest.json``: each file's size and checksum (a truncated shard
    otherwise meets torch's bare "checkpoint file is corrupted" on resume)."""
    files = {
        str(p.relative_to(root)): {"bytes": p.stat().st_size, "xxh3": _xxh3(p)}
        for p in _files(root)
    }
    (root / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def verify_checkpoint(path: Path, under: str = "", hashes: bool = True) -> str | None:
    """None when every file of ``path`` (under the folder ``under``, e.g. ``"hf/"``; all by
    default) matches its manifest (or there is no manifest: a checkpoint from before
    manifests), else what is wrong, naming the file. ``hashes=False`` checks presence and
    sizes only (no file is read: what a prune after every save can afford)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as e:
        return f"its {MANIFEST} cannot be read ({e})"
    for rel, want in manifest.items():
        if not rel.startswith(under):
            continue
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if (size := f.stat().st_size) != want["bytes"]:
            return f"{rel} has {size} bytes, {want['bytes']} were written (truncated?)"
        if hashes and _xxh3(f) != want["xxh3"]:
            return f"{rel} does not match its checksum (damaged)"
    return None


def latest_good_checkpoint(run_dir: str | Path, say=print) -> Path | None:
    """The newest complete checkpoint whose files match its manifest; each damaged newer one
    is named (``say``) and skipped. ``FatalError`` when every one is damaged: starting again
    from version 0 would silently throw the run away."""
    root = Path(run_dir) / "checkpoints"
    done = sorted(
        ((v, p) for p in root.glob("step_*") if (v := complete_version(p)) is not None),
        reverse=True,
    )
    damaged: list[str] = []
    for _, p in done:
        problem = verify_checkpoint(p)
        if problem is None:
            if damaged:
                say(f"resuming from {p.name}, the newest checkpoint that is intact")
            return p
        damaged.append(f"{p.name}: {problem}")
        say(f"checkpoint {p} is damaged: {problem}; trying the one before")
    if damaged:
        exports = [p / "hf" for _, p in done if _intact_export(p)]
        offer = (
            f"; its weights are intact in the export {exports[0]}: a new run_dir with "
            f"model=local model.path={exports[0]} starts from them (without the optimizer state)"
            if exports
            else ""
        )
        raise FatalError(
            f"every checkpoint under {root} is damaged ({'; '.join(damaged)}); restore one "
            f"from a backup, or start a new run_dir{offer}"
        )
    return None


def _intact_export(path: Path) -> bool:
    """Whether ``path/hf`` (the checkpoint's HF export) exists and matches its manifest."""
    return (path / "hf" / "config.json").is_file() and verify_checkpoint(path, "hf/") is None


LOW_SPACE_BYTES = 64 << 20
"""A failed write with less free space than this is taken as a full disk."""


def disk_full(e: BaseException | None, where: Path) -> bool:
    """``e`` (or an error it came from) is ENOSPC/EDQUOT, or ``where``'s file system has less
    than ``LOW_SPACE_BYTES`` free: torch's checkpoint writer reports a full disk as
    "unexpected pos 704 vs 598", not as ENOSPC, or as a ``CheckpointException`` holding each
    rank's ``OSError``."""
    import errno

    seen = [e]
    while seen:
        e = seen.pop()
        if e is None:
            continue
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        # DCP's CheckpointException: each rank's failure as (exception, traceback summary)
        seen += [f[0] for f in getattr(e, "failures", {}).values() if isinstance(f, tuple)]
        seen.append(e.__cause__ or e.__context__)
    try:
        return shutil.disk_usage(where).free < LOW_SPACE_BYTES
    except OSError:
        return False


def prune_checkpoints(run_dir: str | Path, keep: int, say=print) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (``keep`` 0: none), never the
    newest one that matches its manifest nor any newer; returns what was deleted. So with
    ``keep=1`` and a damaged newest checkpoint the intact one that ``latest_good_checkpoint``
    falls back to stays (formerly it was deleted, by the COMPLETE marker alone). Checked
    newest first, only when something would be deleted, by presence and size
    (``_newest_verified``); a damaged one is named (``say``). Incomplete directories are ``_remove_leftovers``'."""
    if keep <= 0:
        return []
    root = Path(run_dir) / "checkpoints"
    done = sorted((v, p) for p in root.glob("step_*") if (v := complete_version(p)) is not None)
    if len(done) <= keep:
        return []
    floor = _newest_verified(done, say)
    old = [p for v, p in done[:-keep] if floor is not None and v < floor]
    for p in old:
        trash = root / f".old-{p.name}"  # renamed first: never a half-deleted step_<V>
        os.replace(p, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return old


def _newest_verified(done: list[tuple[int, Path]], say) -> int | None:
    """The version of the newest of ``done`` (ascending) whose files are all there at their
    manifest's sizes; None if none is (then nothing may be pruned). Sizes only: a prune
    follows every save, and re-reading a large model's checkpoint (and its optimizer state)
    each time would double the checkpoint's I/O; a truncated or missing file is caught here,
    a flipped bit at resume (``latest_good_checkpoint`` reads the checksums)."""
    for v, p in reversed(done):
        problem = verify_checkpoint(p, hashes=False)
        if problem is None:
            return v
        say(f"checkpoint {p} is damaged ({problem}): the checkpoints before it are kept")
    return None


def _remove_leftovers(root: Path) -> None:
    """Delete the ``.tmp-*`` / ``.old-*`` directories of saves that were interrupted."""
    root.mkdir(parents=True, exist_ok=True)
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(p, ignore_errors=True)


def load_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, tuple[nn.Module, torch.optim.Optimizer]] | None = None,
) -> dict:
    """Collective: restore model and optimizer shards (and ``extra``'s); returns state.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    sd = _state_dicts(model, optimizer, extra)
    dcp.load(sd, checkpoint_id=str(path / "dcp"))
    pairs = {"": (model, optimizer), **{f"{k}_": v for k, v in (extra or {}).items()}}
    for prefix, (m, o) in pairs.items():
        keys = set_state_dict(
            m,
            o,
            model_state_dict=sd[f"{prefix}model"],
            optim_state_dict=sd[f"{prefix}optim"],
            options=_options(m),
        )
        _check_loaded(m, keys)
    return json.loads((path / "state.json").read_text())


def adapter_only(model: nn.Module) -> bool:
    """Whether ``model`` carries LoRA adapters: then only its trainable parameters (the
    adapters) are saved and loaded; the frozen base comes from ``model.path``."""
    from asyncrl.learner.lora.adapters import adapted_layers

    return bool(adapted_layers(model))


def _options(model: nn.Module):
    """DCP's state-dict options for ``model``: frozen parameters left out with adapters;
    a load then is not strict (the base is absent), ``_check_loaded`` checks it instead."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = adapter_only(model)
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def _check_loaded(model: nn.Module, keys) -> None:
    """A non-strict (adapter-only) load must still have set every trainable parameter:
    ``keys`` (torch's missing/unexpected keys) may only miss frozen ones."""
    if keys is None or not adapter_only(model):
        return
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    missing = [k for k in keys.missing_keys if k not in frozen]
    if missing or keys.unexpected_keys:
        raise FatalError(
            f"the checkpoint does not fit this model's adapters: missing {missing[:5]}, "
            f"unexpected {list(keys.unexpected_keys)[:5]}; resume with the model.lora settings "
            "(rank, targets) the run was trained with"
        )


def _state_dicts(model, optimizer, extra) -> dict:
    """``{"model", "optim"}`` for the policy and ``{"<name>_model", "<name>_optim"}`` per
    extra; a model with adapters gives its trainable parameters only (``_options``)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    pairs = {"": (model, optimizer), **{f"{k}_": v for k, v in (extra or {}).items()}}
    out: dict = {}
    for prefix, (m, o) in pairs.items():
        msd, osd = get_state_dict(m, o, options=_options(m))
        if adapter_only(m):  # a tied head is an alias DCP's frozen filter does not see
            trained = {n for n, p in m.named_parameters(remove_duplicate=False) if p.requires_grad}
            msd = {k: v for k, v in msd.items() if k in trained}
        out[f"{prefix}model"], out[f"{prefix}optim"] = msd, osd
    return out


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (and ``root`` itself)."""
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir():
            _fsync_dir(p)
    _fsync_dir(root)


def _write_durably(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` and fsync it."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """fsync a directory, so the names created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
