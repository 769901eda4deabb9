"""Temporary git worktrees of this repository, for benchmarks that run older commits' code
next to the working tree (``benchmarks.demo.step_rate``): detached checkouts under a directory
of their own, removed again by ``close`` (call it from a ``finally``, so an error or Ctrl-C
leaves no worktree behind)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO


def git(*cmd: str, cwd=None) -> str:
    """``git cmd...`` in the repository (or ``cwd``): its stdout; SystemExit when it fails."""
    out = subprocess.run(["git", *cmd], cwd=cwd or REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(cmd)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


class Worktrees:
    """Detached worktrees under ``root`` (made here, removed by ``close``), one per label.

    ``hashes`` maps each label to its commit: the ones given up front, and every label that
    ``add`` resolved as a git revision."""

    def __init__(self, root: Path, hashes: dict[str, str] | None = None):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.hashes: dict[str, str] = dict(hashes or {})
        self.paths: dict[str, Path] = {}  # label -> its worktree

    def add(self, label: str) -> Path:
        """A detached worktree of ``label`` (a label of ``hashes`` or a revision), once per
        label."""
        if label not in self.paths:
            rev = self.hashes.get(label) or git("rev-parse", "--verify", f"{label}^{{commit}}")
            self.hashes[label] = rev
            path = self.root / f"checkout{len(self.paths)}"
            git("worktree", "add", "--detach", str(path), rev)
            self.paths[label] = path
        return self.paths[label]

    def close(self) -> None:
        """Remove every worktree (a failure is a warning), ``root``, then git's records of any
        worktree whose directory is gone."""
        for path in self.paths.values():
            try:
                git("worktree", "remove", "--force", str(path))
            except SystemExit as e:
                print(f"warning: {e}", file=sys.stderr)
        shutil.rmtree(self.root, ignore_errors=True)
        git("worktree", "prune")
