"""Which base model a LoRA checkpoint's adapters belong to.

An adapter-only checkpoint (``model.lora``: the frozen base is not stored) is only meaningful
on top of the base it was trained on. ``base_fingerprint`` names that base cheaply: each weight
file of the model directory with its size and the XXH3-64 of its first and last MiB (a whole
read of a 14 GB model at every save would double its I/O; two models of one architecture
differ in every MiB of their weights). ``base_mismatch`` compares a saved fingerprint with a
directory's and says what differs, for a resume or an evaluation to refuse.
"""

from __future__ import annotations

from pathlib import Path

_EDGE = 1 << 20
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def _edges(path: Path, size: int) -> str:
    import xxhash

    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        h.update(f.read(_EDGE))
        if size > 2 * _EDGE:
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
    return h.hexdigest()


def base_fingerprint(model_dir: str | Path) -> dict:
    """``{"path": str, "files": {name: {"bytes": int, "edges_xxh3": str}}}`` over the weight
    files directly in ``model_dir`` (sorted by name; none for a directory without any)."""
    root = Path(model_dir)
    files = {}
    for p in sorted(root.iterdir()):
        if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES):
            size = p.stat().st_size
            files[p.name] = {"bytes": size, "edges_xxh3": _edges(p, size)}
    return {"path": str(root.resolve()), "files": files}


def base_mismatch(saved: dict | None, model_dir: str | Path) -> str | None:
    """None when ``model_dir``'s weights are the ones ``saved`` (a ``base_fingerprint``)
    names, or when nothing was saved (a checkpoint that holds its base); else what differs."""
    if not saved:
        return None
    now = base_fingerprint(model_dir)
    if now["files"] == saved.get("files"):
        return None
    theirs, ours = set(saved.get("files", {})), set(now["files"])
    if theirs != ours:
        return (
            f"the adapters were trained on {saved.get('path')} (weight files "
            f"{', '.join(sorted(theirs)) or 'none'}), {now['path']} has "
            f"{', '.join(sorted(ours)) or 'none'}"
        )
    differ = sorted(n for n in ours if now["files"][n] != saved["files"][n])
    return (
        f"the adapters were trained on {saved.get('path')}, whose {', '.join(differ)} "
        f"differ(s) from {now['path']}'s (size or content)"
    )
