"""``asyncrl.core.runtime.rundir.write_atomic``: a secret file is written whole or not at all, with mode
0600 from its first byte. A write that fails part way (here: a file size limit, as a full
disk would) leaves the old file, not a part of a token that a relaunch would take for one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from asyncrl.core.runtime.rundir import write_atomic

ROOT = Path(__file__).resolve().parents[3]

# Runs ``CALL`` with writes limited to 10 bytes per file (SIGXFSZ ignored: EFBIG instead).
_LIMITED = """
import resource, signal, sys
{imports}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (10, 10))
try:
    {call}
except OSError as e:
    print("FAILED", e.errno)
"""


def _limited(imports: str, call: str) -> str:
    code = _LIMITED.format(imports=imports, call=call)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_secret_is_0600_whatever_the_umask_and_replaces_a_readable_file(tmp_path):
    path = tmp_path / "redis.url"
    path.write_text("old")
    os.chmod(path, 0o644)
    old_umask = os.umask(0)
    try:
        write_atomic(path, "redis://:pw@h:1/0\n")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "redis://:pw@h:1/0\n"
    assert os.stat(path).st_mode & 0o777 == 0o600
    write_atomic(path, b"\x00bytes", mode=0o644)
    assert path.read_bytes() == b"\x00bytes" and os.stat(path).st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["redis.url"]  # no temporary left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "secret"
    path.write_text("old secret")
    out = _limited(
        "from asyncrl.core.runtime.rundir import write_atomic",
        f"write_atomic({str(path)!r}, 'x' * 64)",
    )
    assert out.startswith("FAILED"), out
    assert path.read_text() == "old secret"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]


def test_a_launch_token_is_never_left_half_written(tmp_path):
    from asyncrl.buffer.actor_ids import launch_token

    out = _limited(
        "from asyncrl.buffer.actor_ids import launch_token", f"launch_token({str(tmp_path)!r})"
    )
    assert out.startswith("FAILED"), out
    assert not (tmp_path / "actor_ids.token").exists()
    token = launch_token(tmp_path)  # the next launch makes a whole one
    assert len(token) == 32 and launch_token(tmp_path) == token
