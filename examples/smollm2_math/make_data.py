"""Arithmetic word problems with ``\\boxed{}`` answers, for a real chat model (model=smollm2).

    python examples/smollm2_math/make_data.py /tmp/smollm2_math     # 2000 train, 64 val
    asyncrl run model=smollm2 task=file data=verl \\
        'data.train_files=[/tmp/smollm2_math/train.parquet]' \\
        'data.val_files=[/tmp/smollm2_math/val.parquet]' eval.every=10 eval.at_start=true

Records are in verl's parquet layout (what ``examples/data_preprocess/gsm8k.py`` writes)::

    data_source   "word_arithmetic"
    prompt        [{"role": "user", "content": "Mia has 7 pencils. She buys 5 more. How
                    many pencils does Mia have now? Put the final answer in \\boxed{}."}]
    reward_model  {"style": "rule", "ground_truth": "12"}
    extra_info    {"index": 0, "op": "add"}

The reward is the built-in ``asyncrl.actors.rewards:math_reward`` (task=file's default): math-verify
equivalence of the last ``\\boxed{...}`` (or else the last number) with the ground truth.
Four kinds of one-step problem (add, subtract, multiply, share equally) with small numbers:
SmolLM2-135M-Instruct solves some at the start, so GRPO has a signal to learn from.
Validation prompts are drawn with another seed and never repeat a training question.
Walk-through and measured results: docs/models.md.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

NAMES = [("Mia", "She"), ("Leo", "He"), ("Ava", "She"), ("Sam", "He"), ("Zoe", "She"),
         ("Ben", "He"), ("Ivy", "She"), ("Max", "He")]  # fmt: skip
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "coins", "shells"]
SUFFIX = " Put the final answer in \\boxed{}."


def problem(rng: random.Random) -> tuple[str, int, str]:
    """(question, answer, kind) for one random problem; every answer is a whole number > 0."""
    (name, pronoun), item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.choice(["add", "subtract", "multiply", "share"])
    if kind == "add":
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        text = (
            f"{name} has {a} {item}. {pronoun} buys {b} more. How many {item} does {name} have now?"
        )
        return text, a + b, kind
    if kind == "subtract":
        a = rng.randint(5, 40)
        b = rng.randint(1, a - 1)
        text = f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} are left?"
        return text, a - b, kind
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    if kind == "multiply":
        text = (
            f"There are {a} bags with {b} {item} in each bag. How many {item} are there in total?"
        )
        return text, a * b, kind
    text = f"{name} shares {a * b} {item} equally among {a} friends. How many {item} does each friend get?"
    return text, b, kind


def records(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
    """``n`` distinct problems from ``random.Random(seed)``, none of whose prompt (the user
    message) is in ``exclude``."""
    rng, rows, seen = random.Random(seed), [], set(exclude)
    while len(rows) < n:
        text, answer, kind = problem(rng)
        content = text + SUFFIX
        if content in seen:
            continue
        seen.add(content)
        rows.append(
            {
                "data_source": "word_arithmetic",
                "prompt": [{"role": "user", "content": content}],
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"index": len(rows), "op": kind},
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for train.parquet and val.parquet")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--val", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    val = records(args.val, args.seed + 1)
    train = records(args.train, args.seed, {r["prompt"][0]["content"] for r in val})
    for name, rows in (("train", train), ("val", val)):
        pq.write_table(pa.Table.from_pylist(rows), args.out / f"{name}.parquet")
    print(f"wrote {len(train)} train and {len(val)} val problems to {args.out}")


if __name__ == "__main__":
    main()
