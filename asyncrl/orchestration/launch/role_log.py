"""A role's output, bounded: ``<run_dir>/<role>.log`` rotated by size, and long lines cut in
what the launcher keeps in memory and echoes.

Formerly a reward that printed 20 MB on one line per call grew ``actor0.log`` to 6.5 GB in 10
steps and the launcher to 4.6 GB (it kept each role's last 200 lines whole). Now:

- the log file holds at most ``role_log_max_mb`` (``LogLimits.max_bytes``; checked after each
  write, so one file may pass it by one read of ``CHUNK`` characters), then becomes
  ``<role>.log.1`` (``.1`` becomes ``.2`` ..., up to ``role_log_backups``; the oldest is
  deleted); the launcher says so once per role, and how many bytes were deleted in all
  (``RoleLog.deleted_bytes``);
- output is read in chunks of at most ``CHUNK`` characters, so a line with no end never sits
  whole in memory; a line longer than ``LogLimits.line_chars`` reaches the console and the
  in-memory tail as its first ``line_chars`` characters and a marker naming its length
  (``LineCut``), and the launcher says once per role that it cut lines. The log file keeps
  every character (within its rotation).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

CHUNK = 1 << 16
"""The most characters read from a role's pipe at once."""


@dataclass(frozen=True)
class LogLimits:
    """How much of a role's output is kept (``Config.role_log_max_mb`` and friends)."""

    max_bytes: int = 256 << 20
    """One log file's size before it is rotated (>= 1)."""
    backups: int = 3
    """Rotated files kept (``<role>.log.1`` .. ``.N``); 0 = the full file is deleted."""
    line_chars: int = 4000
    """The most characters of one line the console and the in-memory tail show."""


def parts(stream: IO[str], chunk: int = CHUNK) -> Iterator[str]:
    """``stream``'s text in pieces of at most ``chunk`` characters, each ending at a newline
    or at ``chunk`` (a piece without ``\\n`` continues the same line); ends at EOF."""
    while True:
        piece = stream.readline(chunk)
        if not piece:
            return
        yield piece


class LineCut:
    """Joins pieces of a line back into one line of at most ``limit`` characters (plus a
    marker when cut). ``feed(piece)`` returns the line once it ends (its ``\\n`` seen), else
    None; ``flush()`` returns an unfinished last line at EOF. ``cut_lines`` counts lines cut."""

    def __init__(self, limit: int, where: str) -> None:
        self.limit, self.where = limit, where
        self.cut_lines = 0
        self.last_cut = False
        """Whether the line ``feed``/``flush`` returned last was cut."""
        self._head: list[str] = []
        self._kept = 0
        self._total = 0

    def feed(self, piece: str) -> str | None:
        ends = piece.endswith("\n")
        body = piece[:-1] if ends else piece
        self._total += len(body)
        room = self.limit - self._kept
        if room > 0:
            self._head.append(body[:room])
            self._kept += min(room, len(body))
        return self._line() if ends else None

    def flush(self) -> str | None:
        return self._line() if self._total or self._head else None

    def _line(self) -> str:
        text, total = "".join(self._head), self._total
        self._head, self._kept, self._total = [], 0, 0
        self.last_cut = total > self.limit
        if not self.last_cut:
            return text + "\n"
        self.cut_lines += 1
        return f"{text} [... cut: {total:,} characters in all, the whole line is in {self.where}]\n"


class RoleLog:
    """``path`` opened for appending, rotated past ``limits.max_bytes`` (module docstring).
    ``rotated(message)`` is called at the first rotation. Raises ``OSError`` from writes
    and rotations (the launcher then keeps the output only in memory)."""

    def __init__(self, path: Path, limits: LogLimits, rotated: Callable[[str], None]) -> None:
        self.path, self.limits, self._rotated = path, limits, rotated
        self.rotations = 0
        self.deleted_bytes = 0
        self._file = open(path, "a", buffering=1)
        self._size = self._file.tell()

    def write(self, text: str) -> None:
        self._file.write(text)
        self._size += len(text.encode("utf-8", "replace"))
        if self._size >= self.limits.max_bytes:
            self.rotate()

    def rotate(self) -> None:
        """``log`` -> ``log.1`` -> ... -> ``log.<backups>``; the oldest is deleted."""
        self._file.close()
        n = self.limits.backups
        oldest = self._backup(n) if n else self.path
        if oldest.exists():
            self.deleted_bytes += oldest.stat().st_size
            oldest.unlink()
        for i in range(n - 1, 0, -1):
            if self._backup(i).exists():
                os.replace(self._backup(i), self._backup(i + 1))
        if n and self.path.exists():
            os.replace(self.path, self._backup(1))
        self._file = open(self.path, "a", buffering=1)
        self._size = 0
        self.rotations += 1
        if self.rotations == 1:
            self._rotated(
                f"{self.path.name} reached role_log_max_mb="
                f"{self.limits.max_bytes / (1 << 20):g}: rotated ({n} older file(s) kept, "
                f"{self.path.name}.1{f' .. .{n}' if n > 1 else ''}: role_log_backups; older "
                "output is deleted, counted in run.json's role_log_deleted_bytes)"
                if n
                else f"{self.path.name} reached role_log_max_mb="
                f"{self.limits.max_bytes / (1 << 20):g} and role_log_backups=0: its output so "
                "far was deleted (counted in run.json's role_log_deleted_bytes)"
            )

    def _backup(self, i: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{i}")

    def close(self) -> None:
        self._file.close()
