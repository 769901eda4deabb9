"""Role output, bounded (asyncrl/orchestration/launch/role_log.py; issue 43 round 4: a reward
printing 20 MB lines grew ``actor0.log`` to 6.5 GB and the launcher to 4.6 GB): the log
rotates by size, long lines are cut in memory and on the console, and both are said and
counted. The pump is exercised with real child processes, as ``asyncrl run`` starts roles."""

from __future__ import annotations

import io
import json
import sys

import pytest

from asyncrl.orchestration.launch.launcher import spawn
from asyncrl.orchestration.launch.role_log import LineCut, LogLimits, RoleLog, parts
from asyncrl.orchestration.launch.run_info import record_restarts


def test_parts_never_exceed_the_chunk_and_keep_every_character():
    text = "a" * 25 + "\nshort\n" + "b" * 7
    pieces = list(parts(io.StringIO(text), chunk=10))
    assert "".join(pieces) == text
    assert max(map(len, pieces)) <= 10
    assert pieces[2] == "aaaaa\n" and pieces[3] == "short\n"


def test_a_long_line_is_cut_with_a_marker_naming_its_length_and_the_log():
    cut = LineCut(limit=8, where="run/actor0.log")
    assert cut.feed("0123") is None  # an unfinished line is held, not returned
    line = cut.feed("456789ABCDEF\n")
    assert line == "01234567 [... cut: 16 characters in all, the whole line is in run/actor0.log]\n"
    assert cut.last_cut and cut.cut_lines == 1
    assert cut.feed("short\n") == "short\n" and not cut.last_cut
    assert cut.feed("no end") is None and cut.flush() == "no end\n"
    assert cut.flush() is None and cut.cut_lines == 1


def test_the_log_rotates_keeping_backups_and_counts_what_it_deleted(tmp_path):
    said: list[str] = []
    log = RoleLog(tmp_path / "actor0.log", LogLimits(max_bytes=100, backups=2), said.append)
    for i in range(10):
        log.write(f"{i}" * 60 + "\n")  # 61 bytes: every second write rotates
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["actor0.log", "actor0.log.1", "actor0.log.2"]
    assert all(p.stat().st_size <= 122 for p in tmp_path.iterdir())
    assert (tmp_path / "actor0.log.1").read_text().startswith("8" * 60)  # newest backup
    assert log.rotations == 5 and log.deleted_bytes == 3 * 122  # 5 full files, 2 kept
    assert len(said) == 1 and "rotated (2 older file(s) kept, actor0.log.1 .. .2" in said[0]


def test_no_backups_deletes_the_full_file(tmp_path):
    said: list[str] = []
    log = RoleLog(tmp_path / "learner.log", LogLimits(max_bytes=10, backups=0), said.append)
    log.write("x" * 20 + "\n")
    log.write("kept\n")
    log.close()
    assert [p.name for p in tmp_path.iterdir()] == ["learner.log"]
    assert (tmp_path / "learner.log").read_text() == "kept\n"
    assert log.deleted_bytes == 21 and "role_log_backups=0" in said[0]


@pytest.mark.timeout(60)
def test_a_role_printing_huge_lines_stays_bounded_in_memory_and_on_disk(tmp_path, capsys):
    """A child prints ten 2-MB lines; the log rotates at 3 MiB keeping one backup, the
    launcher keeps 100 characters of each line, says both once, and run.json counts them."""
    code = "import sys\nfor i in range(10):\n    sys.stdout.write(str(i) * 2_000_000 + '\\n')\n"
    code += "print('[actor0] last words')\n"
    limits = LogLimits(max_bytes=3 << 20, backups=1, line_chars=100)
    role = spawn("actor0", [sys.executable, "-c", code], {}, tmp_path, lambda ln: True,
                 limits=limits)  # fmt: skip
    assert role.proc.wait(30) == 0
    role.pump.join(30)
    kept = list(role.output)
    assert max(map(len, kept)) < 200 and kept[-1] == "[actor0] last words\n"
    assert kept[0].startswith("0" * 100 + " [... cut: 2,000,000 characters in all")
    sizes = {p.name: p.stat().st_size for p in tmp_path.glob("actor0.log*")}
    assert set(sizes) == {"actor0.log", "actor0.log.1"}, sizes
    assert all(size <= (3 << 20) + (1 << 17) for size in sizes.values()), sizes
    written = 10 * 2_000_001 + len("[actor0] last words\n")
    assert role.log_deleted_bytes == written - sum(sizes.values())  # every byte accounted
    assert role.cut_lines == 10
    out = capsys.readouterr().out
    assert out.count("wrote a line longer than role_log_line_chars=100") == 1
    assert out.count("actor0.log reached role_log_max_mb=3: rotated") == 1
    assert len(out) < 10_000
    record_restarts(tmp_path, [role])
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["role_lines_cut"] == {"actor0": 10}
    assert info["role_log_deleted_bytes"] == {"actor0": role.log_deleted_bytes}
