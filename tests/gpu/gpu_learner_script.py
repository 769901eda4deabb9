"""Run under torchrun on a GPU machine: the learner's GPU path end to end on one batch.

    torchrun --nproc_per_node=N tests/gpu/gpu_learner_script.py MODEL_DIR GROUPS_JSON OUT_DIR DTYPE

NCCL process group on cuda:LOCAL_RANK (learner.device), FSDP2 with ``DTYPE`` compute
(float32, or bfloat16 mixed precision), one SGD update through ``train_on_batch`` (the batch
broadcast from rank 0 over the group's gloo side, then moved to the GPU), then a checkpoint
saved and loaded back into a fresh model. Writes ``loss.json`` (loss, the dtypes and devices
seen, the checkpoint round-trip check) and ``weights.safetensors`` (full float32 weights).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]  # runs without an install too
from fsdp_step_script import load_groups  # noqa: E402

from asyncrl.core.config.job import AlgorithmConfig, Config, ModelConfig  # noqa: E402
from asyncrl.learner.compute.batch import broadcast_batch, collate  # noqa: E402
from asyncrl.learner.compute.device import current_device, init_distributed  # noqa: E402
from asyncrl.learner.compute.model import build_policy, full_named_tensors  # noqa: E402
from asyncrl.learner.compute.step import StepContext, reduce_metrics, train_on_batch  # noqa: E402
from asyncrl.learner.state.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint  # noqa: E402


def main():
    model_dir, groups_json, out, dtype = sys.argv[1:5]
    rank, world = init_distributed("cuda")
    device = current_device()
    torch.manual_seed(0)
    cfg = Config(model=ModelConfig(dtype=dtype))
    model = build_policy(model_dir, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    algo = AlgorithmConfig(**json.loads(Path(out, "algo.json").read_text()))
    ctx = StepContext(model, opt, algo, rank, world, grad_clip=1e9)
    batch = broadcast_batch(collate(load_groups(groups_json)) if rank == 0 else None).to(device)
    metrics = reduce_metrics(train_on_batch(ctx, batch), world)
    weights = {k: v.detach().cpu().clone() for k, v in full_named_tensors(model)}
    param = next(model.parameters())

    save_checkpoint(out, 1, model, opt, {"version": 1}, model_dir)
    fresh = build_policy(model_dir, cfg)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.5)
    load_checkpoint(latest_checkpoint(out), fresh, fresh_opt)
    restored = {k: v.detach().cpu() for k, v in full_named_tensors(fresh)}
    roundtrip = all(torch.equal(restored[k], weights[k]) for k in weights)
    if rank == 0:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in weights.items()}, str(Path(out, "weights.safetensors"))
        )
        report = {
            "loss": metrics["loss"],
            "world": world,
            "backend": str(dist.get_backend()),
            "param_device": str(param.device),
            "param_dtype": str(param.dtype),
            "batch_device": str(batch.input_ids.device),
            "checkpoint_roundtrip_equal": roundtrip,
        }
        Path(out, "loss.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    from asyncrl.learner.main import exit_now

    main()
    exit_now(0)  # the teardown race at interpreter exit (SIGABRT), as in learner/main.py
