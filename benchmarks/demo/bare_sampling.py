"""Batched sampling and log-probabilities for the demo model in plain PyTorch.

Used by the warm start (greedy evaluation) and by the bare GRPO sanity loop; the real system
samples with vLLM. Layout of a batch of ``B`` sequences: prompts are *left*-padded to a common
length ``P`` and completions *right*-padded to ``C``, so every completion starts at column ``P``.
Position ids count real tokens only, so padding does not shift positions.
"""

from __future__ import annotations

import torch


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B] lists -> ids [B, P], mask [B, P]`` with padding on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids, mask


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B] lists -> ids [B, C], mask [B, C]`` with padding on the right (C >= 1)."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids [B, T] that count only real tokens (padding gets position 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def sample(
    model,
    prompt_ids: list[list[int]],
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Sample one completion per prompt with a KV cache; ``temperature == 0`` means greedy.

    Returns ``[B]`` lists of token ids, each ending with ``eos_id`` unless it hit
    ``max_new_tokens`` first (then it is exactly ``max_new_tokens`` long, no EOS).
    """
    from transformers import DynamicCache

    ids, mask = left_pad(prompt_ids, pad_id)
    batch = ids.shape[0]
    out = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool)
    cache = DynamicCache()
    inputs, pos = ids, _positions(mask)
    for _ in range(max_new_tokens):
        logits = model(
            input_ids=inputs, attention_mask=mask, position_ids=pos, past_key_values=cache
        ).logits[:, -1, :]
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        for i in torch.nonzero(~done).flatten().tolist():
            out[i].append(int(nxt[i]))
        done |= nxt == eos_id
        if bool(done.all()):
            break
        inputs = nxt.unsqueeze(-1)
        pos = pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype)], dim=-1)
    return out


def completion_logprobs(
    model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log pi(completion token | prefix) under ``model``, with gradient.

    Returns ``logprobs [B, C]`` and ``mask [B, C]`` (1.0 on real completion tokens, 0.0 on padding).
    """
    p_ids, p_mask = left_pad(prompt_ids, pad_id)
    c_ids, c_mask = right_pad(completion_ids, pad_id)
    ids = torch.cat([p_ids, c_ids], dim=1)
    mask = torch.cat([p_mask, c_mask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits
    plen = p_ids.shape[1]
    # The token at column t is predicted by the logits at column t - 1.
    pred = logits[:, plen - 1 : -1, :].float().log_softmax(-1)
    logprobs = pred.gather(-1, c_ids.unsqueeze(-1)).squeeze(-1)
    return logprobs, c_mask.to(logprobs.dtype)
