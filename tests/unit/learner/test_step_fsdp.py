"""With a critic and a reference model, 2 FSDP2 ranks (gloo) make exactly the update one
process makes on the same batch: the rows each rank holds are gathered back into the
batch-wide GAE, KL penalty and whitening, and the critic's loss scale matches the policy's;
also with an episode of two rows (``Sample.part``: ``episode.agent_export=all``), whose odd
row count the batch pads for two ranks.

Run by pytest; the same file is the torchrun script (``__main__``).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.core.config.load import load_config
from asyncrl.learner.compute.critic import build_critic
from asyncrl.learner.compute.model import build_policy, full_named_tensors
from asyncrl.learner.compute.reference import build_reference
from asyncrl.learner.compute.step import StepContext, train_on_batch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[3]))  # tests.random_groups, under torchrun too
from test_step_critic import _batch, critic_config  # noqa: E402

from asyncrl.core.types import Group, Sample  # noqa: E402
from asyncrl.learner.compute.batch import collate  # noqa: E402
from tests.random_groups import random_groups  # noqa: E402


def _parts_batch(minibatches: int, world: int):
    """``_batch``'s groups, the first sample's episode with a second row (part 1): 17 rows,
    each minibatch padded for ``world`` ranks, as the trainer pads."""
    groups = random_groups(4, 4, 0, 32)
    first = groups[0].samples[0]
    other = Sample(first.prompt_ids, [3, 4, 5], [-1.0, -2.0, -0.5], [0, 0, 0], first.reward,
                   part=1)  # fmt: skip
    groups[0] = Group("g0", 0, 0, [first, other, *groups[0].samples[1:]])
    return collate(groups, minibatches, world)


def one_step(model_dir: str, preset: str) -> tuple[dict, dict]:
    """(policy weights, critic weights) after one step with SGD (lr 0.5, no grad clipping);
    ``preset`` ``ppo+parts``: ppo on ``_parts_batch``."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    preset, parts = preset.removesuffix("+parts"), preset.endswith("+parts")
    algo = load_config([f"algorithm={preset}"]).algorithm
    torch.manual_seed(0)
    model = build_policy(model_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    critic = build_critic(model_dir, critic_config(algo, 0.5, 1e9))
    critic.optimizer = torch.optim.SGD(critic.model.parameters(), lr=0.5)  # AdamW ~ sign(g)
    ref = build_reference(model_dir) if algo.kl_coef > 0 else None
    ctx = StepContext(model, opt, algo, rank, world, 1e9, critic=critic, reference=ref,
                      max_tokens=5)  # fmt: skip
    if algo.advantage != "gae":
        ctx.critic = None
    train_on_batch(ctx, _parts_batch(algo.minibatches, world) if parts else _batch())
    policy = {k: v.clone() for k, v in full_named_tensors(model)}
    values = {k: v.clone() for k, v in full_named_tensors(critic.model)}
    return policy, values


@pytest.mark.parametrize("preset", ["ppo", "reinforce_pp", "ppo+parts"])
def test_two_ranks_match_one_process(tiny_model, tmp_path, preset):
    from safetensors.torch import load_file

    from asyncrl.core.runtime.torchrun import free_port as _free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", __file__, tiny_model,
           preset, str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    torch.set_num_threads(1)
    policy, values = one_step(tiny_model, preset)
    init = load_file(str(Path(tiny_model) / "model.safetensors"))
    got = load_file(str(tmp_path / "policy.safetensors"))
    for name, ref in policy.items():
        torch.testing.assert_close(got[name], ref, rtol=1e-4, atol=1e-5, msg=name)
    moved = max(float((policy[k] - init[k]).abs().max()) for k in init)
    assert moved > 1e-3, "the policy did not move: the comparison would be vacuous"
    if preset.startswith("ppo"):
        got = load_file(str(tmp_path / "critic.safetensors"))
        for name, ref in values.items():
            torch.testing.assert_close(got[name], ref, rtol=1e-4, atol=1e-5, msg=name)
        assert float(values["head.weight"].abs().max()) > 1e-4, "the critic did not move"
        body = [k for k in values if k.startswith("body.layers.0.")]
        unclipped = AlgorithmConfig(value_clip=None)
        fresh = build_critic(tiny_model, critic_config(unclipped, 0.5, 1e9)).model.state_dict()
        assert any(not torch.equal(values[k], fresh[k]) for k in body), "body did not train"


def main():
    from safetensors.torch import save_file

    from asyncrl.learner.trainer import init_distributed

    model_dir, preset, out = sys.argv[1:4]
    init_distributed()
    torch.set_num_threads(1)
    policy, values = one_step(model_dir, preset)
    if dist.get_rank() == 0:
        save_file(
            {k: v.contiguous() for k, v in policy.items()}, str(Path(out, "policy.safetensors"))
        )
        save_file(
            {k: v.contiguous() for k, v in values.items()}, str(Path(out, "critic.safetensors"))
        )
        Path(out, "done.json").write_text(json.dumps({"ok": True}))
    dist.destroy_process_group()


if __name__ == "__main__":
    from asyncrl.learner.main import exit_now

    main()
    exit_now(0)  # gloo's teardown race at interpreter exit (SIGABRT), as in learner/main.py
