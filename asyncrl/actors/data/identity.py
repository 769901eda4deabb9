"""What the buffer's prompt cursors depend on, and the check that a (re)started actor agrees.

Actor ``a`` of ``K`` takes prompt indices ``a, a+K, a+2K, ...`` through its cursor in Redis
(buffer/cursors.py). That is exactly-once only while the mapping index -> prompt and the stride
``K`` stay what they were when the buffer's first actor started: a restarted actor, or a run
resumed in the same run_dir and buffer with other data, would otherwise skip or repeat prompts
without a word. So the first actor to start claims the buffer meta field ``data_identity``
(``ReplayBuffer.claim_meta``: HSETNX, the first writer wins atomically); every later one
compares its own and refuses to start on a difference (``FatalError``: a restart cannot fix
it), naming each part that changed.

The parts (``identity(cfg, source)``), each under the config key a user would change:

    task.name, task.seed, actor.num_actors           always (the seed also makes group ids)
    task=file:
      data.train_files      sha256 of the files' bytes, in order (not their paths: the same
                            data moved elsewhere is the same data)
      data.prompt_key ... data.extra_info_key, data.max_prompt_length, data.shuffle
      data.prompt_template  sha256 of the template file's text ('' = none)
      prompts kept          how many prompts the length filter kept, and a hash of them: the
                            model's tokenizer decides that too
    task=addition: addition.digit_weights, addition.eval_fraction (the source's parameters)

Not a part: ``data.epochs``. Index ``i`` is position ``i % N`` of epoch ``i // N`` and each
epoch's order is a function of ``(task.seed, epoch)`` alone (actors/data/file_source.py), so more
(or fewer) epochs leave the prompt of every existing index unchanged: a resumed run may be
given more epochs and the actors go on past the old end. Likewise what is done with a prompt
(``sampling.n_samples``, ``max_tokens``, the reward) is not a part.

Invariant: ``fingerprint(parts)`` is a pure function of the parts (sorted-key JSON, sha256),
stable across processes and Python versions.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.core.runtime.fatal import FatalError

if TYPE_CHECKING:
    from asyncrl.buffer.faces import ActorBuffer

META_KEY = "data_identity"
"""The buffer meta field holding ``{"fingerprint": ..., "parts": {...}}`` as JSON."""
KEPT = "prompts kept"
_HASHED = ("data.train_files", "data.prompt_template")  # parts whose value is a content hash
_CHUNK = 1 << 20  # bytes read at a time while hashing a data file


def identity(cfg, source) -> dict:
    """The parts (module docstring) of ``cfg``'s prompt stream, as built in ``source``."""
    parts: dict = {
        "task.name": cfg.task.name,
        "task.seed": cfg.task.seed,
        "actor.num_actors": cfg.actor.total,
    }
    if cfg.task.name == "file":
        d = cfg.data
        parts |= {
            "data.train_files": _files_sha256(d.train_files),
            "data.prompt_key": d.prompt_key,
            "data.answer_key": d.answer_key,
            "data.data_source_key": d.data_source_key,
            "data.extra_info_key": d.extra_info_key,
            "data.prompt_template": _files_sha256([d.prompt_template]) if d.prompt_template else "",
            "data.max_prompt_length": d.max_prompt_length,
            "data.shuffle": d.shuffle,
            KEPT: _kept(source),
        }
    elif cfg.task.name == "addition":
        parts |= {
            "addition.digit_weights": list(source.digit_weights),
            "addition.eval_fraction": source.eval_fraction,
        }
    return parts


def fingerprint(parts: dict) -> str:
    """16 hex digits of the sha256 of ``parts`` (sorted-key JSON)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(old: dict, new: dict) -> list[str]:
    """One phrase per part that differs: ``data.shuffle was true, now false``."""
    out = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key in _HASHED and a and b:
            out.append(f"the content of {key} changed")
        elif key == KEPT and isinstance(a, list) and isinstance(b, list):
            more = f"{a[0]}, now {b[0]}" if a[0] != b[0] else f"{a[0]}, other ones now"
            out.append(
                f"the prompts kept by the length filter changed (were {more}: "
                "data.max_prompt_length or the model's tokenizer changed)"
            )
        else:
            out.append(f"{key} was {json.dumps(a)}, now {json.dumps(b)}")
    return out


def check(buffer: ActorBuffer, parts: dict, say=lambda text: None) -> bool:
    """Claim the buffer's data identity with ``parts``, or check ``parts`` against the one
    claimed before; True when this call claimed it. ``FatalError`` naming what changed and the
    fix when it differs (or when the stored value is not one this module wrote)."""
    fp = fingerprint(parts)
    mine = json.dumps({"fingerprint": fp, "parts": parts}, sort_keys=True)
    stored = buffer.claim_meta(META_KEY, mine)
    if stored is None:
        say(f"data identity {fp} recorded in buffer {buffer.name!r}")
        return True
    try:
        theirs = json.loads(stored)
        old_fp, old_parts = theirs["fingerprint"], theirs["parts"]
    except (ValueError, TypeError, KeyError):
        raise FatalError(
            f"buffer {buffer.name!r}: its meta field {META_KEY} holds {stored[:80]!r}, not a "
            "data identity this version wrote; use a new run_dir / buffer.name"
        ) from None
    if old_fp == fp:
        say(f"data identity {fp} matches buffer {buffer.name!r}")
        return False
    what = "; ".join(differences(old_parts, parts)) or "a part this version does not list"
    raise FatalError(
        f"the prompt data differs from what buffer {buffer.name!r} was started with: {what}. "
        "Its actors' prompt cursors (actor a of K takes prompts a, a+K, ...) count in the old "
        "data, so continuing would skip or repeat prompts. Use a new run_dir / buffer.name "
        "for a new run, or restore the original data and settings to continue this one"
    )


def _files_sha256(files: list[str]) -> str:
    """``sha256:<hex>`` over each file's own sha256, in order (so file boundaries count)."""
    outer = hashlib.sha256()
    for name in files:
        inner = hashlib.sha256()
        with open(Path(name).expanduser(), "rb") as f:
            while chunk := f.read(_CHUNK):
                inner.update(chunk)
        outer.update(inner.digest())
    return f"sha256:{outer.hexdigest()[:16]}"


def _kept(source) -> list:
    """``[N, hash]``: the number of prompts kept and a hash of them, in file order."""
    h = hashlib.sha256()
    for row in source.rows:
        h.update(json.dumps(row.prompt, sort_keys=True).encode() + b"\n")
    return [source.size, h.hexdigest()[:16]]
