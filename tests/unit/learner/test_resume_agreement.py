"""Ranks of a learner resume from rank 0's checkpoint, which every rank must see: a learner
over several nodes whose ``learner.checkpoint_dir`` is not shared fails on every rank with the
reason instead of loading different versions. Two real gloo ranks (torchrun); the same file
is the rank script (``__main__``): rank R looks in ``ROOT/rank<R>`` if told so, else ``ROOT``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


def _complete(root: Path, version: int) -> None:
    step = root / "checkpoints" / f"step_{version:06d}"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text(str(version))


def _run(root: Path, split: bool) -> subprocess.CompletedProcess:
    from asyncrl.core.runtime.torchrun import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__, str(root),
           "split" if split else "shared"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_every_rank_takes_rank_0s_checkpoint(tmp_path):
    _complete(tmp_path, 4)
    _complete(tmp_path, 8)
    proc = _run(tmp_path, split=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the two ranks share the pipe: their lines may interleave, so find them in the text
    picked = sorted(re.findall(r"[01]:(?:step_\d+|None)", proc.stdout))
    assert picked == ["0:step_000008", "1:step_000008"], proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize("rank1_has", [None, 4])
def test_a_checkpoint_dir_not_shared_fails_every_rank_naming_it(tmp_path, rank1_has):
    _complete(tmp_path / "rank0", 8)
    (tmp_path / "rank1").mkdir()
    if rank1_has:  # an older checkpoint only: rank 1 must not resume from it
        _complete(tmp_path / "rank1", rank1_has)
    proc = _run(tmp_path, split=True)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "resumes from checkpoints/step_000008, which not every learner rank sees" in out, out
    assert f"rank 1 lacks {tmp_path / 'rank1' / 'checkpoints' / 'step_000008'}" in out, out
    assert "must be one directory shared by every learner node" in out, out
    assert "0:" not in proc.stdout and "1:" not in proc.stdout, proc.stdout  # nobody loaded


def main(root: str, mode: str) -> None:
    import torch.distributed as dist

    from asyncrl.learner.state.run_state import agreed_checkpoint as _agreed_checkpoint

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run_dir = Path(root) / f"rank{rank}" if mode == "split" else Path(root)
    try:
        path = _agreed_checkpoint(str(run_dir), rank)
        sys.stdout.write(f"{rank}:{path.name if path else None}\n")  # one write per line
        sys.stdout.flush()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    from asyncrl.learner.main import exit_now

    try:
        main(*sys.argv[1:3])
    except Exception as e:  # the reason on stderr, and a non-zero exit
        print(f"rank failed: {e}", file=sys.stderr, flush=True)
        exit_now(1)
    exit_now(0)
