"""Commit messages (scripts/check_commit_msg.py, pre-commit's commit-msg stage): a subject of at
most 72 characters and the why in a body after a blank line; every commit since the rule was
made (the folders by concern, 19743aa) follows it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from check_commit_msg import MAX_SUBJECT, problems  # noqa: E402

SINCE = "19743aa"  # the first commit under the rule


def test_a_long_subject_and_a_missing_blank_line_are_named():
    assert problems("Short subject\n\nWhy it changed.\n") == []
    assert problems("Short subject only\n# a git comment line\n") == []
    long = "x" * (MAX_SUBJECT + 1)
    assert problems(long) == [
        f"the subject is {MAX_SUBJECT + 1} characters; keep it to {MAX_SUBJECT} and put the "
        "rest (the why) in the body"
    ]
    assert problems("Subject\nbody at once") == [
        "leave a blank line between the subject and the body"
    ]
    assert problems("\n\n# only comments\n") == ["the subject line is empty"]


def test_every_commit_since_the_rule_follows_it():
    git = ["git", "-C", str(ROOT)]
    if subprocess.run([*git, "cat-file", "-e", f"{SINCE}^{{commit}}"]).returncode != 0:
        pytest.skip(f"this clone lacks commit {SINCE} (shallow or exported): nothing to check")
    log = subprocess.run(
        [*git, "log", "--format=%H%x00%B%x00", f"{SINCE}~1..HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\x00")
    bad = {
        sha.strip()[:7]: problems(body)
        for sha, body in zip(log[0::2], log[1::2], strict=False)
        if sha.strip() and problems(body)
    }
    assert not bad, bad
