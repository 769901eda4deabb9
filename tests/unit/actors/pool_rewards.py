"""A reward that does what its completion says, for tests/unit/actors/test_reward_pool.py (spec
``tests/unit/actors/pool_rewards.py:behave``): ``"sleep S V"`` sleeps S seconds and returns V;
``"hang"`` sleeps a minute; ``"raise"``, ``"str"``, ``"nan"`` fail by kind, as do
``"interrupt"`` (raises KeyboardInterrupt) and ``"exit0"`` (SystemExit(0)); ``"hog"``
allocates ``fields["mb"]`` MiB; ``"exit"`` ends
the process (``os._exit(3)``); ``"pid"`` returns its process id; ``"child"`` starts a
``sleep`` process, writes its pid to ``fields["pid_file"]`` and hangs; ``"daemon"`` starts
one in a session of its own (a sandbox or a server), writes its pid and returns 1.0,
``"daemon_exit"`` the same, then ends the process; ``"print"`` prints;
``"secret"`` returns the length of ``$ASYNCRL_REDIS_URL``; ``"sandbox"`` raises
``SandboxError``."""

import math
import os
import subprocess
import time
from pathlib import Path

from asyncrl.actors.rewards.sandbox import SandboxError


def behave(prompt, completion, **fields):
    what, *args = completion.split()
    if what == "sleep":
        time.sleep(float(args[0]))
        return float(args[1])
    if what == "hang":
        time.sleep(60)
    if what == "raise":
        raise ValueError(f"bad {prompt}")
    if what == "hog":  # allocates fields["mb"] MiB and touches it
        block = bytearray(int(fields["mb"]) << 20)
        return float(len(block) > 0)
    if what == "interrupt":
        raise KeyboardInterrupt
    if what == "exit0":
        raise SystemExit(0)
    if what == "exit":
        os._exit(3)
    if what == "child":
        child = subprocess.Popen(["sleep", "60"])
        Path(fields["pid_file"]).write_text(str(child.pid))
        time.sleep(60)
    if what in ("daemon", "daemon_exit"):
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        Path(fields["pid_file"]).write_text(str(child.pid))
        if what == "daemon_exit":
            os._exit(3)
        return 1.0
    if what == "sandbox":
        raise SandboxError("no landlock")
    if what == "print":
        print('{"id": 0, "value": 9.0}', flush=True)  # looks like a reply: must not be one
        return 1.0
    return {
        "pid": lambda: float(os.getpid()),
        "str": lambda: "1.0",
        "nan": lambda: math.nan,
        "secret": lambda: float(len(os.environ.get("ASYNCRL_REDIS_URL", ""))),
    }[what]()
