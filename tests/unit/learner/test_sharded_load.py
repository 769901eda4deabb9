"""Sharded loading (learner/compute/sharded_load.py). On 2 FSDP2 ranks (gloo), the policy, the
policy with LoRA adapters, the reference (bfloat16) and the critic that ``build_*`` load shard
by shard equal, bit for bit, the models the full load then ``fully_shard`` gives: every parameter and buffer, the forward
log-probs and values. Checkpoints: float32 untied in one file; bfloat16 tied (the head read
once) in a sharded index; a ``pytorch_model.bin`` (the full load, said). No rank wrote a
tensor larger than one local shard, and the file's tensors were read once over the ranks,
each rank its block. In one process: the errors for a missing, an unexpected or a misshapen
tensor, and what cannot be streamed.

Run by pytest; the same file is the torchrun script (``__main__``).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

VARIANTS = ("untied_f32", "tied_bf16_index", "bin")


class _Allocations(TorchDispatchMode):
    """Each op's new storages on a real device (bytes, op); views, in-place results and
    storages an op was handed (safetensors' mmapped file) are not new. A DTensor counts its
    local shard."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[int, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {_ptr(a) for a in tree_leaves((args, kwargs or {}))} - {None}
        for t in tree_leaves(out):
            local = t._local_tensor if isinstance(t, DTensor) else t
            real = isinstance(local, torch.Tensor) and not local.is_meta and local.numel()
            if real and _ptr(local) not in given:
                self.seen.append((local.untyped_storage().nbytes(), str(func)))
        return out


def _ptr(x):
    if isinstance(x, DTensor):
        x = x._local_tensor
    if isinstance(x, torch.Tensor) and not x.is_meta:
        return x.untyped_storage().data_ptr()
    if isinstance(x, torch.UntypedStorage | torch.TypedStorage):
        return x.data_ptr()
    return None


def _full_state(model) -> dict[str, torch.Tensor]:
    from asyncrl.learner.compute.model import full_named_tensors

    state = {k: v.clone() for k, v in full_named_tensors(model)}
    state.update({f"buffer.{k}": b.clone() for k, b in model.named_buffers()})
    return state


def _rows(rank):
    ids = torch.randint(0, 32, (4, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids[2 * rank : 2 * rank + 2], mask[2 * rank : 2 * rank + 2]


def run_variant(model_dir: str, out: dict, reads: list) -> None:
    """The sharded and the full-then-shard load of the three models (collective)."""
    from asyncrl.core.config.job import AlgorithmConfig, Config, LearnerConfig, ModelConfig
    from asyncrl.core.config.learner import LoraConfig
    from asyncrl.learner.compute.critic import build_critic, load_value_model, shard_value_model
    from asyncrl.learner.compute.model import (
        AdapterSpec,
        build_policy,
        load_hf_model,
        shard_model,
        token_logprobs,
    )
    from asyncrl.learner.compute.reference import build_reference, reference_logprobs

    rank = dist.get_rank()
    ids, mask = _rows(rank)
    reads.clear()
    with _Allocations() as new:
        policy = build_policy(model_dir)
    with _Allocations() as old:
        full = shard_model(load_hf_model(model_dir))
    out["new_allocs"], out["old_allocs"] = new.seen, old.seen
    out["reads"] = list(reads)
    out["local_numel"] = {n: p.to_local().numel() for n, p in policy.named_parameters()}
    out["shapes"] = {n: list(p.shape) for n, p in full.named_parameters()}
    out["tied"] = policy.lm_head.weight is policy.model.embed_tokens.weight
    tensors = {f"policy.new.{k}": v for k, v in _full_state(policy).items()}
    tensors |= {f"policy.old.{k}": v for k, v in _full_state(full).items()}
    for name, model in (("new", policy), ("old", full)):
        tensors[f"lp.policy.{name}"] = token_logprobs(model, ids, mask)[0].detach()

    reads.clear()  # LoRA (model.lora): the base read shard by shard, the adapters set after
    lora = Config(model=ModelConfig(lora=LoraConfig(rank=4, alpha=8.0)))
    lora_new = build_policy(model_dir, lora)
    out["lora_reads"] = list(reads)
    lora_old = shard_model(AdapterSpec(lora.model.lora, lora.seed).add(load_hf_model(model_dir)))
    for name, model in (("new", lora_new), ("old", lora_old)):
        tensors |= {f"lora.{name}.{k}": v for k, v in _full_state(model).items()}
        tensors[f"lp.lora.{name}"] = token_logprobs(model, ids, mask)[0].detach()
    out["lora_a_moved"] = any(
        ".lora_A." in n and p.full_tensor().abs().max().item() > 0
        for n, p in lora_new.named_parameters()
    )

    ref_new = build_reference(model_dir, Config(model=ModelConfig(dtype="bfloat16")))
    ref_old = shard_model(load_hf_model(model_dir, "bfloat16").requires_grad_(False)).eval()
    for name, model in (("new", ref_new), ("old", ref_old)):
        tensors |= {f"ref.{name}.{k}": v for k, v in _full_state(model).items()}
        tensors[f"lp.ref.{name}"] = reference_logprobs(model, ids, mask)
    out["ref_grad"] = any(p.requires_grad for p in ref_new.parameters())

    critic_cfg = Config(
        algorithm=AlgorithmConfig(critic_lr=1e-3, value_clip=None),
        learner=LearnerConfig(grad_clip=1.0),
    )
    critic_new = build_critic(model_dir, critic_cfg).model
    critic_old = shard_value_model(load_value_model(model_dir))
    for name, model in (("new", critic_new), ("old", critic_old)):
        tensors |= {f"critic.{name}.{k}": v for k, v in _full_state(model).items()}
        with torch.no_grad():
            tensors[f"values.{name}"] = model(ids, mask)
    out["tensors"] = tensors


def _tiny(tie: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie)  # fmt: skip
    torch.manual_seed(1)
    return Qwen2ForCausalLM(cfg)


@pytest.fixture(scope="module")
def checkpoints(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    dirs = {"untied_f32": Path(tiny_model), "tied_bf16_index": root / "tied", "bin": root / "bin"}
    _tiny(True).to(torch.bfloat16).save_pretrained(dirs["tied_bf16_index"], max_shard_size="8KB")
    index = json.loads((dirs["tied_bf16_index"] / "model.safetensors.index.json").read_text())
    assert (
        len(set(index["weight_map"].values())) > 1 and "lm_head.weight" not in index["weight_map"]
    )
    model = _tiny(False)
    model.config.save_pretrained(dirs["bin"])
    torch.save(model.state_dict(), dirs["bin"] / "pytorch_model.bin")
    return {k: str(v) for k, v in dirs.items()}


def test_two_ranks_load_only_their_shards(checkpoints, tmp_path):
    from safetensors.torch import load_file

    from asyncrl.core.runtime.torchrun import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__, str(tmp_path),
           *[checkpoints[v] for v in VARIANTS]]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("has no model.safetensors") == 4, proc.stdout  # bin: 4 models
    for variant in VARIANTS:
        ranks = [json.loads((tmp_path / f"{variant}.rank{r}.json").read_text()) for r in (0, 1)]
        got = [load_file(str(tmp_path / f"{variant}.rank{r}.safetensors")) for r in (0, 1)]
        for t in got:
            _assert_same_models(t, variant)
        assert all(r["tied"] == (variant == "tied_bf16_index") for r in ranks), variant
        assert not any(r["ref_grad"] for r in ranks)
        if variant != "bin":
            _assert_streamed(ranks, variant)


def _assert_same_models(tensors: dict, variant: str) -> None:
    new = {k for k in tensors if ".new." in k or k.endswith(".new")}
    assert len(new) > 60, sorted(tensors)  # 3 models' parameters and buffers, 3 forwards
    for key in new:
        want, got = tensors[key.replace("new", "old", 1)], tensors[key]
        same = got.dtype == want.dtype and torch.equal(got, want)
        assert same, (variant, key)
    assert tensors["ref.new.model.embed_tokens.weight"].dtype == torch.bfloat16
    assert tensors["values.new"].abs().max() == 0  # the zeroed value head


def _assert_streamed(ranks: list[dict], variant: str) -> None:
    shapes = ranks[0]["shapes"]
    full = {n: math.prod(s) * 4 for n, s in shapes.items()}  # float32 bytes
    shard = max(math.ceil(s[0] / 2) * math.prod(s[1:]) * 4 for s in shapes.values())
    for r in ranks:
        # every tensor written with data is at most one local shard; larger ones are only
        # the constructor's uninitialised parameters, moved to meta at once (one at a time)
        big = {op for size, op in r["new_allocs"] if size > shard}
        assert big <= {"aten.empty.memory_format"}, (variant, big)
        assert max(size for size, _ in r["new_allocs"]) <= max(full.values())
        local = sum(r["local_numel"].values()) * 4
        assert local <= sum(full.values()) / 2 + sum(full[n] / s[0] for n, s in shapes.items())
        if variant == "tied_bf16_index":  # the measure sees a full load: the old path
            # converts each whole bfloat16 tensor to float32 (a float32 file it uses mmapped)
            full_writes = [op for size, op in r["old_allocs"] if size == max(full.values())]
            assert "aten._to_copy.default" in full_writes, variant
    assert sum(sum(r["local_numel"].values()) for r in ranks) == sum(full.values()) / 4
    # the policy's load: each rank read its blocks only, and the ranks each tensor once
    for r in ranks:
        assert [n for _, n in r["reads"]] == [r["local_numel"][k] for k, _ in r["reads"]]
    assert sum(n for r in ranks for _, n in r["reads"]) == sum(full.values()) / 4, variant
    # with adapters, the base is read the same way: each rank its blocks, each tensor once
    assert sorted(x for r in ranks for x in r["lora_reads"]) == sorted(
        x for r in ranks for x in r["reads"]
    ), variant
    assert all(r["lora_a_moved"] for r in ranks), "lora_A was left at zero (or uninitialised)"


def _empty_policy(model_dir: Path):
    """The tiny model built by ``build_sharded`` in one process (nothing to shard)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from asyncrl.learner.compute.sharded_load import build_sharded

    config = AutoConfig.from_pretrained(model_dir)
    construct = lambda: AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # noqa: E731
    return build_sharded(construct, lambda m: m, torch.device("cpu"))


def _write(tiny_model: str, path: Path, edit) -> Path:
    """``tiny_model``'s config and its tensors after ``edit(tensors)``, in ``path``."""
    from safetensors.torch import load_file, save_file

    path.mkdir()
    (path / "config.json").write_text((Path(tiny_model) / "config.json").read_text())
    tensors = load_file(str(Path(tiny_model) / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))
    return path


@pytest.mark.parametrize(
    "edit, error",
    [
        (lambda t: t.pop("model.norm.weight"), r"model.norm.weight is not in .*model.safetensors"),
        (lambda t: t.update(extra=torch.ones(2)), r"'extra' in .*model.safetensors is no param"),
        (
            lambda t: t.update({"lm_head.weight": torch.ones(3, 32)}),
            r"shape \[3, 32\]; .*\[32, 32\]",
        ),
        (lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}), None),
    ],
    ids=["missing", "unexpected", "shape", "old_inv_freq_ignored"],
)
def test_checkpoint_errors_name_the_tensor_and_the_file(tiny_model, tmp_path, edit, error):
    """A missing, an unexpected or a misshapen tensor is an error naming it and its file;
    old per-layer ``inv_freq`` buffers are dropped, as transformers drops them."""
    from transformers import AutoModelForCausalLM

    from asyncrl.learner.compute.sharded_load import SafetensorsCheckpoint, load_local_shards

    model = _empty_policy(Path(tiny_model))
    with SafetensorsCheckpoint.find(_write(tiny_model, tmp_path / "ckpt", edit)) as checkpoint:
        if error:
            with pytest.raises(ValueError, match=error):
                load_local_shards(model, checkpoint)
            return
        load_local_shards(model, checkpoint)
    want = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    for name, tensor in want.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_what_cannot_be_streamed_is_said(tiny_model, tmp_path, capsys):
    """No safetensors, or a model type whose names transformers converts: the builders load
    the full model (``open_streamable`` returns None and says why)."""
    from asyncrl.learner.compute.sharded_load import (
        NotStreamable,
        check_streamable,
        open_streamable,
    )

    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    assert open_streamable(tmp_path, "qwen2") is None
    said = capsys.readouterr().out
    assert "has no model.safetensors" in said and "pytorch_model.bin" in said, said
    with pytest.raises(NotStreamable, match="qwen2_moe"):
        check_streamable("qwen2_moe")
    check_streamable("qwen2")
    assert open_streamable(Path(tiny_model), "qwen2") is not None


def main():
    from safetensors.torch import save_file

    from asyncrl.learner.compute import sharded_load
    from asyncrl.learner.trainer import init_distributed

    out_dir, dirs = Path(sys.argv[1]), sys.argv[2:]
    init_distributed()
    torch.set_num_threads(1)
    # transformers loads in a thread pool, which the (thread-local) _Allocations cannot see
    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
    reads, read = [], sharded_load.SafetensorsCheckpoint.read

    def spy(self, key, index):  # (the model's name, elements read) per block
        block = read(self, key, index)
        reads.append((key, block.numel()))
        return block

    sharded_load.SafetensorsCheckpoint.read = spy
    for variant, model_dir in zip(VARIANTS, dirs, strict=True):
        out = {}
        run_variant(model_dir, out, reads)
        tensors = out.pop("tensors")
        rank = dist.get_rank()
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(out_dir / f"{variant}.rank{rank}.safetensors"))  # fmt: skip
        (out_dir / f"{variant}.rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    from asyncrl.learner.main import exit_now

    main()
    exit_now(0)  # gloo's teardown race at interpreter exit (SIGABRT), as in learner/main.py
