"""LoRA adapters as weight versions in one vLLM engine (``model.lora.sync=adapter``).

With adapter-only sync the engine keeps the base model and receives, at each version ``V``,
only the adapters (the worker writes them in PEFT's format into ``root/vV``: the receiver in
asyncrl/actors/weights/receiver.py). Each version is its own ``LoRARequest`` named ``vV``
(id ``V + 1``): a request keeps the adapter it started with, every token of a completion
carries that one version, and vLLM's prefix cache, which keys on the adapter, never mixes two
policies. No pause: requests in flight go on with their own adapter while the next arrives.

An adapter that is not the current one and that no request in flight uses is removed from
the engine and its directory deleted (``unused``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def adapter_root() -> Path:
    """A private directory for this engine's adapters: in shared memory where there is one
    (``/dev/shm``: no disk I/O per sync), else the system's temporary directory."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else None
    return Path(tempfile.mkdtemp(prefix="asyncrl-adapters-", dir=base))


class Adapters:
    """The adapters of one engine. ``rank``, ``alpha``: ``model.lora``'s (the worker writes
    them into each adapter's config). Version 0 before any sync is the base model itself
    (adapters start at B = 0): ``current`` is None until the first ``publish``."""

    def __init__(self, rank: int, alpha: float, root: Path | None = None) -> None:
        self.rank, self.alpha = rank, alpha
        self.root = root or adapter_root()
        self.current: Any = None  # vLLM's LoRARequest of the newest version
        self.version: int | None = None
        self._in_flight: Counter[int] = Counter()

    def dir_for(self, version: int) -> Path:
        return self.root / f"v{version}"

    def update_info(self, version: int) -> dict[str, Any]:
        """What the worker needs to write version ``version``'s adapter (``receiver.py``)."""
        return {
            "version": version,
            "adapter_dir": str(self.dir_for(version)),
            "adapter_config": {"r": self.rank, "lora_alpha": self.alpha},
        }

    def publish(self, version: int, path: Path | None = None) -> None:
        """New requests run with ``version``'s adapter (its directory is written). ``path``:
        an adapter kept elsewhere (a LoRA checkpoint's ``adapter/``, which ``asyncrl eval``
        serves as the checkpoint's version); it is outside ``root``, so never deleted here."""
        from vllm.lora.request import LoRARequest

        path = path or self.dir_for(version)
        if not (path / ADAPTER_FILE).is_file():
            raise FileNotFoundError(f"adapter of version {version} missing: {path}")
        self.current, self.version = LoRARequest(f"v{version}", version + 1, str(path)), version

    @contextlib.contextmanager
    def hold(self) -> Iterator[tuple[Any, int | None]]:
        """``(LoRARequest or None, its version)`` for one request, counted in flight until
        the block ends."""
        request, version = self.current, self.version
        if version is not None:
            self._in_flight[version] += 1
        try:
            yield request, version
        finally:
            if version is not None:
                self._in_flight[version] -= 1

    def unused(self) -> list[int]:
        """Versions older than the current one whose adapter no request in flight uses (a
        newer one may be being written by a sync under way)."""
        if self.version is None:
            return []
        out = []
        for path in self.root.glob("v*"):
            v = int(path.name[1:])
            if v < self.version and self._in_flight[v] <= 0:
                out.append(v)
        return sorted(out)

    def forget(self, version: int) -> None:
        """Delete ``version``'s directory (after the engine removed it)."""
        shutil.rmtree(self.dir_for(version), ignore_errors=True)
        self._in_flight.pop(version, None)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
