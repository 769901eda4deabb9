"""One GPU shared by the learner and vLLM (``layout=gpu1``): the learner's memory cap is real
on a GPU, and the memory the launcher reads from nvidia-smi is the memory torch sees.
Skipped without a CUDA GPU; the logic is tested on CPU in tests/unit/orchestration/test_gpu_share.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.learner.compute.device import limit_memory
from asyncrl.orchestration.placement.gpus import gpu_memory_gib

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); runs on a GPU machine",
    ),
]


def test_the_learner_cap_refuses_an_allocation_past_its_share():
    """In a child process: the cap is per process and stays set."""
    code = (
        "import torch\n"
        "from asyncrl.learner.compute.device import limit_memory\n"
        "gpu = torch.device('cuda', 0)\n"
        "total = torch.cuda.get_device_properties(gpu).total_memory\n"
        "assert limit_memory(gpu, 0.1)\n"
        "small = torch.empty(int(total * 0.05), dtype=torch.uint8, device=gpu)\n"
        "try:\n"
        "    torch.empty(int(total * 0.2), dtype=torch.uint8, device=gpu)\n"
        "except torch.OutOfMemoryError:\n"
        "    print('REFUSED')\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert "REFUSED" in done.stdout, done.stdout + done.stderr
    assert not limit_memory(torch.device("cuda", 0), 1.0)


def test_nvidia_smi_reports_the_memory_torch_sees():
    total = torch.cuda.get_device_properties(0).total_memory / 1024**3
    try:
        smi = gpu_memory_gib("0")
    except subprocess.SubprocessError:
        smi = None
    if smi is None:
        pytest.skip("nvidia-smi did not report GPU 0's memory on this machine")
    assert abs(smi - total) / total < 0.05, (smi, total)
