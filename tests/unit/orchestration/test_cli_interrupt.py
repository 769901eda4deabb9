"""A Ctrl-C that lands while ``asyncrl``'s command line is still importing its signal handler
(a fresh clone compiles its bytecode first, so this takes a while) ends it with the usual
message and 130, not a traceback (fresh-clone CI once caught the traceback)."""

import subprocess
import sys

# Python's own KeyboardInterrupt, raised in the middle of the handler's import, exactly where
# a SIGINT would raise it
PROBE = """
import sys
from importlib.abc import MetaPathFinder

class CtrlC(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "asyncrl.orchestration.launch.stop_signals":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
from asyncrl.orchestration import cli
sys.exit(cli.main(["status"]))
"""


def test_ctrl_c_during_the_first_import_is_a_message_not_a_traceback():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "asyncrl: interrupted (Ctrl-C or SIGTERM)"
