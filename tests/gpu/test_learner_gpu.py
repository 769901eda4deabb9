"""The learner's GPU path (learner.device=cuda): NCCL, FSDP2 on cuda:LOCAL_RANK, float32
and bfloat16 mixed precision, checkpoints. Skipped on machines without a CUDA GPU.

The float32 GPU step must equal the CPU step on the same groups (the same check as
tests/integration/test_learner_fsdp.py, across devices); the bfloat16 step must stay close
to it with float32 master weights. One rank per GPU: NCCL refuses two ranks on one device,
so the rank count is the number of GPUs (capped at 2).
"""

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); runs on a GPU machine",
    ),
]

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "integration"))
from fsdp_step_script import load_groups, one_update  # noqa: E402
from test_learner_fsdp import _groups_json  # noqa: E402

from asyncrl.core.config.job import AlgorithmConfig  # noqa: E402
from asyncrl.core.runtime.torchrun import free_port  # noqa: E402


def _run_on_gpu(model_dir: str, tmp_path: Path, algo: AlgorithmConfig, dtype: str):
    (tmp_path / "algo.json").write_text(json.dumps(asdict(algo)))
    groups_json = _groups_json(tmp_path)
    nproc = min(2, torch.cuda.device_count())
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           str(HERE / "gpu_learner_script.py"), model_dir, str(groups_json), str(tmp_path), dtype]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from safetensors.torch import load_file

    report = json.loads((tmp_path / "loss.json").read_text())
    return report, load_file(str(tmp_path / "weights.safetensors")), groups_json


@pytest.mark.parametrize("minibatches", [1, 2])
def test_float32_gpu_step_equals_the_cpu_step(tiny_model, tmp_path, minibatches):
    algo = AlgorithmConfig(minibatches=minibatches)
    report, gpu_weights, groups_json = _run_on_gpu(tiny_model, tmp_path, algo, "float32")
    assert report["backend"] == "cpu:gloo,cuda:nccl"
    assert report["param_device"].startswith("cuda") and report["batch_device"].startswith("cuda")
    assert report["param_dtype"] == "torch.float32"
    assert report["checkpoint_roundtrip_equal"], "a checkpoint saved on the GPU did not load back"

    torch.set_num_threads(1)
    cpu_loss, cpu_weights = one_update(tiny_model, load_groups(groups_json), algo, lr=0.5)
    if minibatches == 1:
        assert report["loss"] == pytest.approx(cpu_loss, rel=1e-4, abs=1e-6)
    for name, ref in cpu_weights.items():
        torch.testing.assert_close(gpu_weights[name], ref, rtol=1e-4, atol=1e-5, msg=name)


def test_bfloat16_mixed_precision_keeps_float32_masters_close_to_float32(tiny_model, tmp_path):
    algo = AlgorithmConfig()
    report, bf16_weights, groups_json = _run_on_gpu(tiny_model, tmp_path, algo, "bfloat16")
    assert report["param_dtype"] == "torch.float32", "master weights must stay float32"
    assert report["checkpoint_roundtrip_equal"]
    torch.set_num_threads(1)
    cpu_loss, cpu_weights = one_update(tiny_model, load_groups(groups_json), algo, lr=0.5)
    assert report["loss"] == pytest.approx(cpu_loss, rel=5e-2, abs=1e-3)
    from safetensors.torch import load_file

    init = load_file(str(Path(tiny_model) / "model.safetensors"))
    for name, ref in cpu_weights.items():
        assert bf16_weights[name].dtype == torch.float32, name
        d_ref, d_bf16 = (ref - init[name]).flatten(), (bf16_weights[name] - init[name]).flatten()
        if d_ref.norm() > 1e-4:  # the bf16 update points where the float32 update does
            cos = torch.nn.functional.cosine_similarity(d_ref, d_bf16, dim=0)
            assert cos > 0.95, f"{name}: cosine {float(cos):.3f} between bf16 and fp32 updates"
