"""A real asyncrl job spread over network namespaces (tests/multihost/netns.py): the buffer
on host ``redis``, the learner on ``learner0`` + ``learner1`` (torchrun, 2 nodes x 1 rank),
the actors on ``actors``; ``outsider`` holds no key. Every role is the real ``asyncrl launch``
command, started in its host through ``tests.roles.Roles`` (a role that dies fails the wait).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tests.multihost.netns import Hosts
from tests.roles import Proc, Roles

HOSTS = ["learner0", "learner1", "actors", "redis", "outsider"]
CLI = [sys.executable, "-m", "asyncrl.orchestration.cli"]
RDZV_PORT = 29511


class Cluster:
    """One job named ``name`` over ``hosts``; run directories under ``tmp``."""

    def __init__(self, hosts: Hosts, roles: Roles, tmp: Path, name: str = "mh") -> None:
        self.hosts, self.roles, self.tmp, self.name = hosts, roles, tmp, name
        self.common = ["experiment=tiny", "actor.engine=sim", f"buffer.name={name}",
                       "actor.num_actors=2"]  # fmt: skip

    def start(self, host: str, role: str, *overrides: str, tag: str = "", **kw) -> Proc:
        """``asyncrl launch ROLE`` on ``host``, bound to the host's address."""
        args = ["launch", role, *self.common, f"network.bind={self.hosts.addr(host)}",
                f"run_dir={self.tmp / (tag or host)}", *overrides]  # fmt: skip
        return self.roles.start(tag or host, self.hosts.cmd(host, [*CLI, *args]), **kw)

    def start_buffer(self, *overrides: str) -> Proc:
        proc = self.start("redis", "buffer", *overrides)
        self.roles.wait_until(lambda: self.url_file("actor").is_file(), 120, "the URL files")
        return proc

    def url_file(self, user: str = "") -> Path:
        """The buffer's URL file of ACL user ``user`` ('' = the admin's)."""
        return self.tmp / "redis" / "redis" / (f"redis.{user}.url" if user else "redis.url")

    def meta(self) -> dict:
        """The buffer's meta hash, read with the admin URL from inside host ``redis`` (the
        test's own namespace cannot reach the hosts' addresses)."""
        code = ("import json, sys, redis; c = redis.Redis.from_url(sys.argv[1], "
                "decode_responses=True); print(json.dumps(c.hgetall(sys.argv[2])))")  # fmt: skip
        url = self.url_file().read_text().strip()
        out = self.hosts.run("redis", [sys.executable, "-c", code, url, f"{self.name}:meta"])
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def start_learner(self, *overrides: str, **kw) -> list[Proc]:
        """Learner nodes 0 and 1 (1 rank each), rendezvous on learner0."""
        rdzv = f"{self.hosts.addr('learner0')}:{RDZV_PORT}"
        common = ["learner.nproc=1", "learner.nnodes=2", f"learner.rdzv_endpoint={rdzv}",
                  f"learner.checkpoint_dir={self.tmp / 'shared-checkpoints'}",
                  f"buffer.url_file={self.url_file('learner')}", *overrides]  # fmt: skip
        # node 1 may end before node 0 has written the summary: its exit 0 is no death
        return [
            self.start(f"learner{r}", "learner", *common, f"learner.node_rank={r}",
                       may_exit=r == 1, **kw)
            for r in (0, 1)
        ]  # fmt: skip

    def start_actors(self, *overrides: str, **kw) -> Proc:
        return self.start("actors", "actors", f"buffer.url_file={self.url_file('actor')}",
                          *overrides, **kw)  # fmt: skip

    def wait_job(self, learners: list[Proc], actors: Proc, learner_s: float = 300) -> None:
        """Wait for both learner nodes, then the actors, to exit 0. The actors leave once the
        learner announced it is done, which may be before node 0's process has exited (it seals
        its checkpoint and writes the summary after): that exit 0 is expected, not a death."""
        self.roles.expect_exit(actors)
        for proc in learners:
            assert self.roles.wait(proc, learner_s) == 0, proc.tail(60)
        assert self.roles.wait(actors, 120) == 0, actors.tail(60)

    def summary(self) -> dict:
        return json.loads((self.tmp / "learner0" / "summary.json").read_text())

    def actor_stats(self, tag: str = "actors") -> dict[int, dict]:
        out = {}
        for path in (self.tmp / tag).glob("actor*.json"):
            if m := re.fullmatch(r"actor(\d+)\.json", path.name):
                out[int(m.group(1))] = json.loads(path.read_text())
        return out

    def listeners(self, host: str) -> list[tuple[str, int, str]]:
        """(address, port, process) of every listening TCP socket in ``host`` (``ss``)."""
        out = self.hosts.run(host, ["ss", "-ltnpH"]).stdout
        found = []
        for line in out.splitlines():
            cols = line.split()
            addr, _, port = cols[3].rpartition(":")
            proc = re.search(r'"([^"]+)"', line)
            found.append((addr.strip("[]"), int(port), proc.group(1) if proc else "?"))
        return found


def check_conservation(summary: dict) -> None:
    """Every committed group is trained, dropped for a reason, or still buffered."""
    dropped = sum(v for k, v in summary.items() if k.startswith("groups_dropped_"))
    assert summary["ledger"]["balanced"], summary["ledger"]
    assert summary["groups_committed"] == (
        summary["groups_trained"] + dropped + summary["groups_still_buffered"]
    ), summary
