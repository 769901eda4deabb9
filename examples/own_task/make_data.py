"""Write a small addition dataset in verl's parquet layout, to try ``task=file data=verl``.

    python examples/own_task/make_data.py /tmp/own            # 2000 train, 200 val prompts
    asyncrl run task=file data=verl 'data.train_files=[/tmp/own/train.parquet]' \\
        'data.val_files=[/tmp/own/val.parquet]' data.max_prompt_length=64 \\
        task.reward_fn=examples/own_task/reward.py:compute_score \\
        'logger=[console,jsonl,tensorboard]'

Each record is what verl's ``examples/data_preprocess/*.py`` scripts write::

    data_source   "addition"
    prompt        [{"role": "user", "content": "what is 27+5? answer with the number only."}]
    reward_model  {"style": "rule", "ground_truth": "32"}
    extra_info    {"index": 0}

The wording is lowercase because the demo model's tokenizer has no capital letters
(asyncrl/orchestration/demo/tokenizer.py); chat-templated, the longest prompt is 61 tokens, under
``data.max_prompt_length=64`` (the demo model's context is 256 tokens, less than ``data=verl``'s
default of 512 plus ``sampling.max_tokens``). Walk-through: docs/own_task.md.

``--format jsonl`` writes the other layout a user brings: JSON Lines of plain-text prompts
(``{"prompt": "27+5=", "answer": "32"}``, used as they are, no chat template), for the
asyncrl-signature reward ``examples/own_task/reward_plain.py:score``::

    python examples/own_task/make_data.py /tmp/own_jsonl --format jsonl
    asyncrl run task=file 'data.train_files=[/tmp/own_jsonl/train.jsonl]' \\
        'data.val_files=[/tmp/own_jsonl/val.jsonl]' \\
        task.reward_fn=examples/own_task/reward_plain.py:score eval.every=20
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

QUESTION = "what is {a}+{b}? answer with the number only."


def records(n: int, seed: int) -> list[dict]:
    """``n`` addition prompts with operands in 0..99, drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append(
            {
                "data_source": "addition",
                "prompt": [{"role": "user", "content": QUESTION.format(a=a, b=b)}],
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": i},
            }
        )
    return rows


def plain_records(n: int, seed: int) -> list[dict]:
    """``n`` plain-text prompts ``"a+b="`` with ``answer``, operands as in ``records``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


def write(path: Path, rows: list[dict]) -> None:
    """``rows`` as parquet or JSON Lines, by ``path``'s suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="where train.parquet and val.parquet go")
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--val-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="val uses seed + 1")
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet",
                        help="parquet: verl's chat layout; jsonl: plain-text prompts")  # fmt: skip
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (
        ("train", args.train_size, args.seed),
        ("val", args.val_size, args.seed + 1),
    ):
        path = args.out_dir / f"{name}.{args.format}"
        write(path, (records if args.format == "parquet" else plain_records)(n, seed))
        print(f"wrote {n} records to {path}")


if __name__ == "__main__":
    main()
