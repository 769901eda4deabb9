"""Run under torchrun: one learner update with FSDP2; writes the loss and new weights.

torchrun --nproc_per_node=2 tests/integration/fsdp_step_script.py MODEL_DIR GROUPS_JSON OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from asyncrl.core.config.job import AlgorithmConfig, Config
from asyncrl.core.config.learner import LoraConfig, ModelConfig
from asyncrl.core.types import Group, Sample
from asyncrl.learner.compute.batch import broadcast_batch, collate
from asyncrl.learner.compute.model import build_policy, full_named_tensors
from asyncrl.learner.compute.step import StepContext, train_on_batch
from asyncrl.learner.trainer import init_distributed


def load_groups(path):
    raw = json.loads(Path(path).read_text())
    return [Group(g["id"], i, 0, [Sample(**s) for s in g["samples"]]) for i, g in enumerate(raw)]


def one_update(model_dir, groups, algo, lr, lora=None, ckpt_dir=None):
    """(loss summed over ranks, full weights) after one SGD update on ``groups``; ``lora``:
    ``model.lora``'s fields (adapters on the policy, the merged weights returned).
    ``ckpt_dir``: then saved there as a checkpoint (adapter-only with ``lora``), loaded into a
    fresh policy of other random adapters, and that policy's weights returned."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    torch.manual_seed(0)
    cfg = Config(model=ModelConfig(lora=LoraConfig(**lora))) if lora else None
    model = build_policy(model_dir, cfg)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    ctx = StepContext(model, opt, algo, rank, world, grad_clip=1e9)
    batch = collate(groups) if rank == 0 else None
    if dist.is_initialized():
        batch = broadcast_batch(batch)
    metrics = train_on_batch(ctx, batch)
    loss = torch.tensor([metrics["loss"]], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(loss)
    if ckpt_dir is not None:
        model = _reloaded(model, opt, model_dir, cfg, ckpt_dir)
    weights = {k: v.clone() for k, v in full_named_tensors(model)}
    return float(loss), weights


def _reloaded(model, opt, model_dir, cfg, ckpt_dir):
    """``model`` saved with ``opt`` at version 1 and loaded into a policy built afresh."""
    from asyncrl.learner.state.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint(ckpt_dir, 1, model, opt, {"version": 1}, model_dir, hf_export=False)
    torch.manual_seed(1)  # other random lora_A: the load must replace them
    fresh = build_policy(model_dir, cfg)
    params = [p for p in fresh.parameters() if p.requires_grad]
    load_checkpoint(path, fresh, torch.optim.SGD(params, lr=0.5))
    return fresh


def main():
    model_dir, groups_json, out = sys.argv[1:4]
    init_distributed()
    torch.set_num_threads(1)
    algo = AlgorithmConfig(**json.loads(Path(out, "algo.json").read_text()))
    lora_json = Path(out, "lora.json")
    lora = json.loads(lora_json.read_text()) if lora_json.is_file() else None
    ckpt = Path(out, "ckpt") if lora else None  # adapter-only checkpoints, sharded
    loss, weights = one_update(model_dir, load_groups(groups_json), algo, 0.5, lora, ckpt)
    if dist.get_rank() == 0:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in weights.items()}, str(Path(out, "weights.safetensors"))
        )
        Path(out, "loss.json").write_text(json.dumps({"loss": loss}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    from asyncrl.learner.main import exit_now

    main()
    exit_now(0)  # no interpreter finalization: it can abort after destroy (learner/main.py)
