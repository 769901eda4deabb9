"""Learner half of ``benchmarks/parts/overheads.py`` (run under torchrun; rank 0 writes JSON).

Same batch (``learner.batch_groups`` random demo-sized groups, on-policy), same model:
``bare`` = FSDP2 forward, token log-probs, REINFORCE loss, backward, AdamW step;
``ours`` = ``asyncrl.learner.compute.step.train_on_batch``; ``gather`` = ``asyncrl.learner.compute.model.full_named_tensors``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.common import timed


def _dtype_only(cfg):
    """``cfg``'s compute dtype, every other key of ``build_policy`` at its default: the bare
    model (no checkpointing, compile or offload), as this benchmark has always built it."""
    from asyncrl.core.config.job import Config, ModelConfig

    return Config(model=ModelConfig(dtype=cfg.model.dtype))


def _context(cfg, model_dir: str, rank: int, world: int):
    try:  # the loop's own builder where it exists (critic / reference when configured)
        from asyncrl.learner.trainer import build_step_context

        return build_step_context(cfg, model_dir, rank, world)
    except ImportError:
        from asyncrl.learner.compute.model import build_policy
        from asyncrl.learner.compute.step import StepContext

        model = build_policy(model_dir, _dtype_only(cfg))
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.learner.lr)
        return StepContext(model, opt, cfg.algorithm, rank, world, cfg.learner.grad_clip)


def _batch(cfg, vocab: int, rank: int):
    from asyncrl.buffer.testing import random_group
    from asyncrl.learner.compute.batch import broadcast_batch, collate

    if rank != 0:
        return broadcast_batch(None)
    rng = random.Random(0)
    groups = [
        random_group(rng, f"g{i}", n=cfg.sampling.n_samples, vocab_size=vocab, versions=(0, 0),
                     max_len=cfg.sampling.max_tokens)
        for i in range(cfg.learner.batch_groups)
    ]  # fmt: skip
    return broadcast_batch(collate(groups))


def _merge(runs: list[dict]) -> dict:
    import statistics

    times = [r["median_s"] for r in runs]
    return {"median_s": statistics.median(times), "min_s": min(times), "repeat": len(times)}


def _broadcast_text(text: str) -> str:
    """Rank 0's ``text`` on every rank, as UTF-8 bytes (broadcast_object_list would pickle)."""
    data = torch.tensor(list(text.encode()), dtype=torch.uint8)
    size = torch.tensor([data.numel()])
    dist.broadcast(size, 0)
    buf = data if dist.get_rank() == 0 else torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(buf, 0)
    return bytes(buf.tolist()).decode()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    torch.set_num_threads(1)

    from asyncrl.core.config.load import load_config
    from asyncrl.learner.compute.model import build_policy, full_named_tensors, token_logprobs
    from asyncrl.learner.compute.step import train_on_batch
    from asyncrl.learner.trainer import init_distributed
    from asyncrl.orchestration.launch.preflight import resolve_model

    rank, world = init_distributed()
    cfg = load_config(["metrics_port=0", f"learner.nproc={world}", *args.set])
    model_dir = _broadcast_text(resolve_model(cfg) if rank == 0 else "")
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    batch = _batch(cfg, vocab, rank)
    ctx = _context(cfg, model_dir, rank, world)

    bare_model = build_policy(model_dir, _dtype_only(cfg))
    opt = torch.optim.AdamW(bare_model.parameters(), lr=cfg.learner.lr)
    per = batch.num_rows // world
    rows = slice(rank * per, (rank + 1) * per)
    ids, att = batch.input_ids[rows], batch.attention_mask[rows]
    mask, adv = batch.loss_mask[rows], torch.randn(per, 1)

    def bare_step():
        logp, _ = token_logprobs(bare_model, ids, att)
        loss = -(logp * adv * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # interleaved rounds, so machine noise (other processes on shared cores) hits both alike
    ours_t, bare_t = [], []
    for _ in range(args.repeat):
        ours_t.append(timed(lambda: train_on_batch(ctx, batch), 1, warmup=0 if ours_t else 2))
        bare_t.append(timed(bare_step, 1, warmup=0 if bare_t else 2))
    ours, bare = _merge(ours_t), _merge(bare_t)
    gather = timed(lambda: list(full_named_tensors(ctx.model)), args.repeat, warmup=1)
    if rank == 0:
        res = {"world": world, "rows": batch.num_rows, "seq_len": int(batch.input_ids.shape[1]),
               "bare": bare, "ours": ours, "gather": gather,
               "ours_vs_bare": ours["median_s"] / bare["median_s"]}  # fmt: skip
        Path(args.out).write_text(json.dumps(res))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
