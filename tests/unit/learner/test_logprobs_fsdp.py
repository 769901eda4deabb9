"""Chunked log-probs under FSDP2: 2 ranks (gloo), each scoring its own rows through
``asyncrl.learner.compute.model.shard_model`` (decoder layers + root), give the log-probs, entropy and
full-batch gradient that the closed form on full logits gives in one process, in float64,
tied and untied heads, with and without per-layer gradient checkpointing (enabled before
and after sharding). Each rank also scores its rows once without gradient first (pi_prox),
which leaves the root unsharded differently from a training forward.

Run by pytest; the same file is the torchrun script (``__main__``).
"""

import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from test_logprobs import assert_same, batch, count_layer_calls, reference, tiny_qwen  # noqa: E402

VARIANTS = {  # name: (tied head, gradient checkpointing: None | "before" | "after" sharding)
    "untied": (False, None),
    "tied": (True, None),
    "untied_ckpt_before": (False, "before"),
    "tied_ckpt_after": (True, "after"),
}
CHUNK = 3  # positions per chunk: does not divide a rank's scored positions


def rank_rows(rank: int, world: int) -> slice:
    per = 4 // world
    return slice(rank * per, (rank + 1) * per)


def run_variant(tied: bool, ckpt: str | None) -> dict[str, torch.Tensor]:
    """This rank's log-probs and entropy and the full gradients (collective)."""
    from asyncrl.learner.compute.model import (
        enable_gradient_checkpointing,
        shard_model,
        token_logprobs,
    )

    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_qwen(tied)
    if ckpt == "before":
        enable_gradient_checkpointing(model)
    shard_model(model)
    if ckpt == "after":
        enable_gradient_checkpointing(model)
    ids, mask, w_lp, w_ent = (t[rank_rows(rank, world)] for t in batch())
    with torch.no_grad():
        prox, _ = token_logprobs(model, ids, mask, chunk_tokens=CHUNK, entropy=False)
    calls = count_layer_calls(model)
    lp, ent = token_logprobs(model, ids, mask, chunk_tokens=CHUNK)
    # FSDP2 averages gradients over ranks: x world makes the sum, the full batch's gradient
    (((lp * w_lp).sum() + (ent * w_ent).sum()) * world).backward()
    out = {"prox": prox, "lp": lp.detach(), "ent": ent.detach(), "calls": torch.tensor(calls)}
    for name, p in model.named_parameters():
        out[f"grad.{name}"] = p.grad.full_tensor()
    return out


def test_two_ranks_match_full_logits(tmp_path):
    from safetensors.torch import load_file

    from asyncrl.core.runtime.torchrun import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__,
           str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids, mask, w_lp, w_ent = batch()
    for name, (tied, _) in VARIANTS.items():
        model = tiny_qwen(tied)
        want_lp, want_ent = reference(model, ids, mask)
        ((want_lp * w_lp).sum() + (want_ent * w_ent).sum()).backward()
        want_grads = {n: p.grad for n, p in model.named_parameters()}
        ranks = [load_file(str(tmp_path / f"{name}.rank{r}.safetensors")) for r in range(2)]
        got_lp = torch.cat([r["lp"] for r in ranks])
        got_ent = torch.cat([r["ent"] for r in ranks])
        got_grads = {k[len("grad.") :]: v for k, v in ranks[0].items() if k.startswith("grad.")}
        assert_same((got_lp, got_ent, got_grads), (want_lp.detach(), want_ent.detach(), want_grads))
        torch.testing.assert_close(torch.cat([r["prox"] for r in ranks]), got_lp, msg=name)
        layer_calls = 2 * (2 if VARIANTS[name][1] else 1)  # 2 layers, recomputed in backward
        assert [int(r["calls"][0]) for r in ranks] == [layer_calls] * 2, name
        for k, v in got_grads.items():  # every rank holds the same full gradient
            torch.testing.assert_close(ranks[1][f"grad.{k}"], v, rtol=0, atol=0, msg=k)


def main():
    from safetensors.torch import save_file

    from asyncrl.learner.trainer import init_distributed

    out = Path(sys.argv[1])
    init_distributed()
    torch.set_num_threads(1)
    for name, (tied, ckpt) in VARIANTS.items():
        tensors = run_variant(tied, ckpt)
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(out / f"{name}.rank{dist.get_rank()}.safetensors"))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    from asyncrl.learner.main import exit_now

    main()
    exit_now(0)  # gloo's teardown race at interpreter exit (SIGABRT), as in learner/main.py
