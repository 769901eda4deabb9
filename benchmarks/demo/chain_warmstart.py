"""Does the demo model answer a chain's second question? Warm start on single chat questions
against warm start on 2-question chains (``model.sft_chat_turns``), at the demo's 500 SFT steps
and at ``experiment=chain``'s 1500, greedy, no RL.

    python -m benchmarks.demo.chain_warmstart               # 128 eval prompts, ~1 min once built

For each warm start (``prepare_demo_model(chat_turns=1 | 2, sft_steps=500 | 1500)``, built
into ``model.cache_dir`` if missing) and each of the first ``--prompts`` eval-split
addition prompts, three greedy answers (transformers ``generate``, one CPU thread, at most 8
new tokens): the chain's first question (``experiment=chain``'s ``ChainAddition``); its second
question after the first answered with the true sum, as an episode holds it; and that second
question asked alone. Per warm start: the exact-answer rate of each and how often an answer
ended with EOS. Why: the episode's second question comes after an earlier turn, a context the
single-question warm start never saw (asyncrl/orchestration/demo/warmstart.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import RESULTS, write_result

ARMS = ((1, 500), (2, 500), (2, 1500))
"""(``model.sft_chat_turns``, ``model.sft_steps``) of each warm start probed."""


def greedy(model, tok, messages: list[dict]) -> tuple[str, bool]:
    """The model's greedy answer to ``messages`` (chat template, generation prompt), and
    whether it ended with EOS."""
    import torch

    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    new = out[0, ids.shape[1] :].tolist()
    return tok.decode(new, skip_special_tokens=True).strip(), tok.eos_token_id in new


def probe(model_dir: Path, prompts: int) -> dict:
    """The three exact-answer rates (and EOS rates) of one warm-started model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.actors.data.addition import CHAT_QUESTION, AdditionSource
    from asyncrl.actors.data.chain import chain_pairs

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ask = lambda a, b: {"role": "user", "content": CHAT_QUESTION.format(a=a, b=b)}  # noqa: E731
    hits = {"turn1": 0, "turn2_in_chain": 0, "turn2_alone": 0}
    eos = dict.fromkeys(hits, 0)
    source = AdditionSource(seed=0, split="eval")
    for i in range(prompts):
        f = source.get(i).fields
        (a, b), (c, d) = chain_pairs(int(f["a"]), int(f["b"]), 2)
        first = [ask(a, b)]
        chain = [*first, {"role": "assistant", "content": str(a + b)}, ask(c, d)]
        for key, messages, want in [("turn1", first, a + b), ("turn2_in_chain", chain, c + d),
                                    ("turn2_alone", [ask(c, d)], c + d)]:  # fmt: skip
            text, ended = greedy(model, tok, messages)
            hits[key] += text == str(want)
            eos[key] += ended
    return {"exact": {k: v / prompts for k, v in hits.items()},
            "eos": {k: v / prompts for k, v in eos.items()}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.demo.chain_warmstart",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--name", default="chain_warmstart")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import torch

    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.demo.warmstart import prepare_demo_model

    torch.set_num_threads(1)
    cache = load_config(["metrics_port=0"]).model.cache_dir
    arms = {}
    for turns, steps in ARMS:
        model_dir = prepare_demo_model(cache, chat_turns=turns, sft_steps=steps)
        name = f"sft_chat_turns={turns},sft_steps={steps}"
        arms[name] = figs = probe(model_dir, args.prompts)
        print(f"[chain_warmstart] {name}: exact {figs['exact']}, eos {figs['eos']}")
    payload = {"config": {"prompts": args.prompts, "split": "eval", "seed": 0, "max_new_tokens": 8,
                          "decoding": "greedy", "threads": 1},
               "pinning": "one process, torch.set_num_threads(1), no core pinned", "arms": arms}  # fmt: skip
    print(f"[chain_warmstart] wrote {write_result(args.name, payload, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
