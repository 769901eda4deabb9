"""Arithmetic word problems that a calculator tool solves, for SmolLM2-135M-Instruct (multi-turn).

    python examples/smollm2_tools/make_data.py                # 512 train, 48 val (committed)
    asyncrl run model=smollm2 experiment=smollm2_tools

The numbers are large enough that this model gets them wrong in its head (greedy, it answers
"17 + 25" with 32; here the sums, differences and products have 2-4 digit answers) and easy
to get right with the tool ``examples/smollm2_tools/tools.py:calculate``. An episode is up to
``episode.max_turns`` model turns: the model may write a Hermes tool call::

    <tool_call>
    {"name": "calculate", "arguments": {"expression": "24 * 37"}}
    </tool_call>

read the tool's answer (a ``tool`` message, ``888``) and then answer in words. The last answer
is scored by the built-in ``asyncrl.actors.rewards:math_reward`` (task=file's default):
math-verify equivalence of the last ``\\boxed{}`` or, as here, the last number in the text.
The final answer format is "The answer is 888.": plain words the model copies from the tool's
result, with the number last so the reward reads it; no LaTeX for a 135M model to get wrong.

Records are in verl's parquet layout (as examples/smollm2_math). The prompt is a short
instruction (``INSTRUCTION``), ``N_SHOTS`` worked examples as chat turns (user, the assistant's
call, the tool's answer, the assistant's answer) and the question. SmolLM2's chat template
ignores ``tools=``, so the actor appends the tool's schema to the system message in the Hermes
format (``asyncrl.actors.episodes.render.hermes_tools_section``): ~475 tokens in all::

    data_source   "tool_arithmetic"
    prompt        [{"role": "system", "content": INSTRUCTION},
                   {"role": "user", "content": "A box holds 24 pencils. How many ..."},
                   {"role": "assistant", "content": "<tool_call>\n{...24 * 37...}\n</tool_call>"},
                   {"role": "tool", "content": "888"},
                   {"role": "assistant", "content": "The answer is 888."},
                   ... the second worked example ...,
                   {"role": "user", "content": "A box holds 19 pencils. How many pencils
                                                are in 43 boxes?"}]
    reward_model  {"style": "rule", "ground_truth": "817"}
    extra_info    {"index": 0, "op": "multiply", "expression": "19 * 43"}

The prompt was chosen by measuring the untrained model (``base_rate.py``, numbers in
``base_rate.json``): worked examples as chat turns made it call the tool far more often than
the same example written into the system message, and two were as good as three for fewer
tokens. Four kinds of problem (add, subtract, multiply, multiply then add) in equal shares.
Validation problems are drawn with another seed and never repeat a training question.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
NAMES = [("Mia", "She"), ("Leo", "He"), ("Ava", "She"), ("Sam", "He"), ("Zoe", "She"),
         ("Ben", "He"), ("Ivy", "She"), ("Max", "He")]  # fmt: skip
ITEMS = [("apples", "crate"), ("pencils", "box"), ("stickers", "sheet"), ("marbles", "bag"),
         ("cookies", "tray"), ("books", "shelf"), ("coins", "jar"), ("shells", "bucket")]  # fmt: skip
KINDS = ("add", "subtract", "multiply", "two_step")

INSTRUCTION = (
    "You solve arithmetic word problems. Do not compute in your head: first call the "
    "calculate tool with the arithmetic expression, then read its result and reply with "
    '"The answer is N." where N is the result.'
)
"""The system message of every record (the actor appends the tools section after it)."""
SHOTS = [
    ("A box holds 24 pencils. How many pencils are in 37 boxes?", "24 * 37", "888"),
    ("Zoe has 156 shells. She gets 278 more. How many shells does Zoe have now?", "156 + 278", "434"),
    ("Sam has 6 jars with 35 coins in each, and 42 more coins on the table. How many coins does "
     "Sam have in all?", "35 * 6 + 42", "252"),
]  # fmt: skip
"""Worked examples (question, expression, result); no training or validation question is one."""
N_SHOTS = 2
"""How many of ``SHOTS`` each prompt shows, as chat turns: measured best (base_rate.json)."""


def tool_call(expression: str) -> str:
    """A Hermes call of the calculator, as the examples write it."""
    call = {"name": "calculate", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def messages(
    question: str, system: str = INSTRUCTION, shots: int = N_SHOTS, hint: str = ""
) -> list[dict]:
    """The chat prompt of one question: the system message, the first ``shots`` worked
    examples as turns (user, assistant's call, tool's answer, assistant's answer), then the
    question; ``hint`` is appended to every question."""
    out = [{"role": "system", "content": system}]
    for q, expression, result in SHOTS[:shots]:
        out += [
            {"role": "user", "content": q + hint},
            {"role": "assistant", "content": tool_call(expression)},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": f"The answer is {result}."},
        ]
    return [*out, {"role": "user", "content": question + hint}]


def problem(rng: random.Random) -> tuple[str, int, str, str]:
    """(question, answer, kind, expression) for one random problem; answers are whole numbers
    > 0 with 2-4 digits."""
    (name, pronoun), (items, holder) = rng.choice(NAMES), rng.choice(ITEMS)
    holders = (
        "shelves" if holder == "shelf" else f"{holder}es" if holder.endswith("x") else f"{holder}s"
    )
    kind = rng.choice(KINDS)
    if kind == "add":
        a, b = rng.randint(23, 489), rng.randint(23, 489)
        text = f"{name} has {a} {items}. {pronoun} gets {b} more. How many {items} does {name} have now?"
        return text, a + b, kind, f"{a} + {b}"
    if kind == "subtract":
        a = rng.randint(120, 900)
        b = rng.randint(23, a - 11)
        text = f"{name} had {a} {items} and gave away {b} of them. How many {items} are left?"
        return text, a - b, kind, f"{a} - {b}"
    if kind == "multiply":
        a, b = rng.randint(12, 49), rng.randint(12, 49)
        text = f"A {holder} holds {a} {items}. How many {items} are in {b} {holders}?"
        return text, a * b, kind, f"{a} * {b}"
    a, b, c = rng.randint(12, 39), rng.randint(3, 9), rng.randint(11, 99)
    text = (
        f"{name} has {b} {holders} with {a} {items} in each, and {c} more {items} on the table. "
        f"How many {items} does {name} have in all?"
    )
    return text, a * b + c, kind, f"{a} * {b} + {c}"


def records(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
    """``n`` distinct problems from ``random.Random(seed)``, none of whose question is in
    ``exclude`` or is a worked example's."""
    rng, rows, seen = random.Random(seed), [], {*exclude, *(q for q, _, _ in SHOTS)}
    while len(rows) < n:
        text, answer, kind, expression = problem(rng)
        if text in seen:
            continue
        seen.add(text)
        rows.append(
            {
                "data_source": "tool_arithmetic",
                "prompt": messages(text),
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"index": len(rows), "op": kind, "expression": expression},
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=HERE / "data",
                        help="directory for train.parquet and val.parquet (default: data/ here)")  # fmt: skip
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--val", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    val = records(args.val, args.seed + 1)
    train = records(args.train, args.seed, {r["prompt"][-1]["content"] for r in val})
    for name, rows in (("train", train), ("val", val)):
        pq.write_table(pa.Table.from_pylist(rows), args.out / f"{name}.parquet")
    print(f"wrote {len(train)} train and {len(val)} val problems to {args.out}")


if __name__ == "__main__":
    main()
