"""examples/smollm2_tools: the committed data is make_data.py's default output, the calculator
computes and refuses what it should (it is the model's tool: never ``eval``), and it loads as
a tool the way ``episode.tools`` loads it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from asyncrl.actors.episodes.env import load_tools
from asyncrl.actors.episodes.tool_calls import ToolCall
from asyncrl.actors.episodes.tools import ToolBox

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples/smollm2_tools"
SPEC = "examples/smollm2_tools/tools.py:calculate"


def test_committed_data_is_what_make_data_writes(tmp_path):
    make = [sys.executable, str(EXAMPLE / "make_data.py"), str(tmp_path)]
    subprocess.run(make, cwd=REPO, check=True, capture_output=True, text=True, timeout=60)
    for name in ("train.parquet", "val.parquet"):
        made = pq.read_table(tmp_path / name).to_pylist()
        assert made == pq.read_table(EXAMPLE / "data" / name).to_pylist(), name
    question = lambda rows: {r["prompt"][-1]["content"] for r in rows}  # noqa: E731
    train = question(pq.read_table(tmp_path / "train.parquet").to_pylist())
    val = question(pq.read_table(tmp_path / "val.parquet").to_pylist())
    assert len(train) == 512 and len(val) == 48 and not train & val


@pytest.fixture(scope="module")
def box():
    import os

    here = os.getcwd()
    os.chdir(REPO)  # the spec is relative to the repository, as in the config
    try:
        return ToolBox(load_tools([SPEC]))
    finally:
        os.chdir(here)


@pytest.mark.parametrize(
    "expression, answer",
    [("19 * 43", "817"), ("(725 - 127)", "598"), ("7*25+11", "186"), ("19 x 43 =", "817")],
)
def test_the_calculator_computes(box, expression, answer):
    got = asyncio.run(box.call(ToolCall("calculate", {"expression": expression})))
    assert got.error is None and got.content == answer


@pytest.mark.parametrize(
    "expression, says",
    [("__import__('os')", "use only numbers"), ("2 ** 100", "**"), ("1/0", "division by zero")],
)
def test_the_calculator_refuses_anything_else_with_a_reason(box, expression, says):
    got = asyncio.run(box.call(ToolCall("calculate", {"expression": expression})))
    assert got.error == "raised" and says in got.content
