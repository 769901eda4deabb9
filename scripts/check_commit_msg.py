"""Commit-message check (pre-commit's ``commit-msg`` stage): a subject of at most 72
characters, then a blank line and a body that says why, unless the subject alone says all.

    python scripts/check_commit_msg.py .git/COMMIT_EDITMSG
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72  # what `git log --oneline` and most tools show whole


def problems(message: str) -> list[str]:
    """What is wrong with ``message`` (git's comment lines ignored); [] when it is fine."""
    lines = [ln for ln in message.splitlines() if not ln.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or not lines[0].strip():
        return ["the subject line is empty"]
    out = []
    if len(lines[0]) > MAX_SUBJECT:
        out.append(
            f"the subject is {len(lines[0])} characters; keep it to {MAX_SUBJECT} and put "
            "the rest (the why) in the body"
        )
    if len(lines) > 1 and lines[1].strip():
        out.append("leave a blank line between the subject and the body")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_commit_msg.py COMMIT_MSG_FILE", file=sys.stderr)
        return 2
    found = problems(Path(argv[0]).read_text())
    for p in found:
        print(f"commit message: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
