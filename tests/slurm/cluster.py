"""A real Slurm cluster on one machine, for the tests: Debian's ``slurm-wlm`` daemons, each in a
"host" of its own (tests/multihost/netns.py: a network namespace with its own address).

::

    with SlurmCluster(tmp_path, nodes=4) as slurm:      # needs root and the Slurm packages
        job = slurm.sbatch(["-N", "4", "script.sbatch"], env={...})
        slurm.wait_state(job, {"RUNNING"}, 60)
        slurm.scancel(job)

Layout: host ``ctl`` runs ``munged`` and ``slurmctld``; hosts ``n1..nN`` run one ``slurmd``
each. Every daemon runs in a UTS namespace of its own whose host name is its host's name, so a
job's ``hostname`` is its node's (``unshare --uts``), and every host's ``/etc/hosts`` (through
``ip netns exec``'s ``/etc/netns/<ns>/hosts``) maps every name to its address: node names
resolve as on a real cluster. ``slurm.conf`` is written here (``SLURM_CONF`` names it for
every command); state, spool, logs and munge's key and socket live under ``root``.

The configuration is the smallest that runs jobs without cgroups or a database:
``proctrack/linuxproc``, ``task/none``, no accounting, ``select/cons_tres`` with
``CR_CPU``. Nodes declare ``CPUS`` CPUs each (fewer than the machine has is allowed).
``KillWait`` is what a user's cluster typically has (30 s): the time between SIGTERM and
SIGKILL when a job is cancelled or requeued.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.multihost.netns import Hosts, available, namespaces

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun")
PACKAGES = "slurm-wlm munge"
CPUS = 2
KILL_WAIT_S = 30
SLURMD_TIMEOUT_S = 10
"""A node whose slurmd does not answer this long is DOWN (a real cluster's is often 300 s)."""
START_TIMEOUT_S = 60.0
POLL_S = 0.5
CLUSTER = "asyncrltest"


class SlurmError(RuntimeError):
    """A daemon did not start, a command failed, or a job did not reach a state in time."""


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """``None`` if a Slurm cluster can be built here, else the reason (for a skip)."""
    reason = available()
    if reason is not None:
        return f"network namespaces unavailable: {reason}"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH (apt-get install -y {PACKAGES})"
    if shutil.which("unshare") is None:
        return "no `unshare` on PATH (util-linux)"
    return None


def install_packages() -> None:
    """``apt-get install`` Debian's Slurm and munge when missing and we are root (as setup
    installs redis-server); does nothing otherwise (``unavailable`` then names what lacks)."""
    if os.geteuid() != 0 or all(shutil.which(d) for d in DAEMONS):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-qq", *PACKAGES.split()]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:  # a fresh machine's package lists may be empty
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600)
        subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    unavailable.cache_clear()


def _remove_stale_hosts_files() -> None:
    """Remove the ``/etc/netns/arl*`` directories of namespaces that no longer exist (left by a
    run killed before ``close``)."""
    live = set(namespaces())
    for d in Path("/etc/netns").glob("arl*"):
        if d.name not in live:
            shutil.rmtree(d, ignore_errors=True)


class SlurmCluster:
    """``slurmctld`` on host ``ctl`` and ``slurmd`` on ``n1..n<nodes>``; see the module
    docstring. A context manager: ``close`` kills every daemon and job process (they all live in
    the hosts' namespaces) and removes the hosts files."""

    def __init__(self, root: Path, nodes: int = 4) -> None:
        self.root = root
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.hosts = Hosts(["ctl", *self.nodes])
        self._etc: list[Path] = []
        _remove_stale_hosts_files()
        try:
            self._write_hosts_files()
            self.conf = self._write_conf()
            self.env = {"SLURM_CONF": str(self.conf)}
            self._start_munge()
            self._daemon("ctl", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self.wait_for(self._controller_up, "slurmctld to answer `scontrol ping`")
            for node in self.nodes:
                self._daemon(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
            self.wait_for(self._nodes_idle, f"nodes {', '.join(self.nodes)} to be idle")
        except BaseException:
            self.close()
            raise

    # -- building -------------------------------------------------------------------------------

    def _write_hosts_files(self) -> None:
        """``/etc/netns/<ns>/hosts`` for every host: loopback plus every host's name."""
        lines = ["127.0.0.1 localhost"]
        lines += [f"{self.hosts.addr(h)} {h}" for h in self.hosts.names]
        for h in self.hosts.names:
            d = Path("/etc/netns") / self.hosts.ns(h)
            d.mkdir(parents=True, exist_ok=True)
            self._etc.append(d)
            (d / "hosts").write_text("\n".join(lines) + "\n")

    def _write_conf(self) -> Path:
        r = self.root
        for sub in ("state", "spool", "log", "munge"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        node_lines = [
            f"NodeName={n} NodeAddr={self.hosts.addr(n)} CPUs={CPUS} RealMemory=2000 State=UNKNOWN"
            for n in self.nodes
        ]
        for node in self.nodes:
            (r / "spool" / node).mkdir(exist_ok=True)
        # slurmd sets up a cgroup plugin even with proctrack/linuxproc; 22.05's autodetection
        # fails on a hybrid v1/v2 mount (containers), so name v1 (it only initializes it)
        (r / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")
        conf = r / "slurm.conf"
        conf.write_text(
            "\n".join(
                [
                    f"ClusterName={CLUSTER}",
                    f"SlurmctldHost=ctl({self.hosts.addr('ctl')})",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={r / 'munge' / 'munge.socket'}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}/%n",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'spool'}/slurmd-%n.pid",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    f"KillWait={KILL_WAIT_S}",
                    f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
                    "MinJobAge=600",
                    *node_lines,
                    f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES "
                    "MaxTime=INFINITE State=UP",
                ]
            )
            + "\n"
        )
        return conf

    def _start_munge(self) -> None:
        """A private ``munged`` on host ``ctl`` with a fresh key; its socket is a path, which
        every namespace reaches."""
        m = self.root / "munge"
        key = m / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        m.chmod(0o755)
        argv = ["munged", "-F", "-f", f"--socket={m / 'munge.socket'}", f"--key-file={key}",
                f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}"]  # fmt: skip
        self._daemon("ctl", argv, uts=False)
        self.wait_for(lambda: (m / "munge.socket").exists(), "munged's socket")

    def _daemon(self, host: str, argv: Sequence[str], uts: bool = True) -> subprocess.Popen:
        """Start ``argv`` in ``host`` (with its own host name unless ``uts`` is False); its
        output goes to ``log/<host>-<program>.out``."""
        name = Path(argv[0]).name
        out = open(self.root / "log" / f"{host}-{name}.out", "ab")  # noqa: SIM115 (child's)
        if uts:
            argv = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *argv]
        try:
            return self.hosts.popen(host, argv, env=self.env if hasattr(self, "env") else None,
                                    stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        finally:
            out.close()

    def kill_node(self, node: str) -> None:
        """The node dies: SIGKILL every process on it, its slurmd and the job's included."""
        self.hosts.kill_all(node)

    def restart_node(self, node: str) -> None:
        """The node is back: its slurmd starts again (``ReturnToService=2`` makes it usable as
        soon as it registers)."""
        self._daemon(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)])

    # -- commands -------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: float = 30.0, env: dict | None = None,
            host: str = "ctl") -> subprocess.CompletedProcess:  # fmt: skip
        """A Slurm command on ``host`` (``ctl``: the submit host), with ``SLURM_CONF``."""
        return self.hosts.run(host, argv, timeout=timeout, env={**self.env, **(env or {})})

    def check(self, argv: Sequence[str], **kw) -> str:
        """``run`` that raises ``SlurmError`` with the output on a non-zero exit."""
        r = self.run(argv, **kw)
        if r.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stdout}{r.stderr}")
        return r.stdout

    def sbatch(self, args: Sequence[str], env: dict | None = None, cwd: Path | None = None) -> int:
        """Submit; the job id. ``env`` is added to the submitting environment (which the job
        inherits: ``--export=ALL``)."""
        argv = ["sbatch", "--parsable", *(["--chdir", str(cwd)] if cwd else []), *args]
        return int(self.check(argv, env=env).strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``Restarts``, ``NodeList``...)."""
        out = self.check(["scontrol", "show", "job", "-o", str(job_id)])
        fields: dict[str, str] = {}
        for token in out.split():
            key, sep, value = token.partition("=")
            if sep:
                fields[key] = value
        return fields

    def state(self, job_id: int) -> str:
        return self.job(job_id)["JobState"]

    def wait_state(self, job_id: int, states: set[str], timeout_s: float) -> str:
        """Wait until the job's state is one of ``states``; the state."""
        found = ""

        def reached() -> bool:
            nonlocal found
            found = self.state(job_id)
            return found in states

        self.wait_for(reached, f"job {job_id} to be {'/'.join(sorted(states))}", timeout_s,
                      lambda: f"it is {found}")  # fmt: skip
        return found

    def scancel(self, job_id: int) -> None:
        self.check(["scancel", str(job_id)])

    def node_state(self, node: str) -> str:
        out = self.check(["sinfo", "-h", "-N", "-n", node, "-o", "%T"])
        return out.strip().splitlines()[0] if out.strip() else ""

    def _controller_up(self) -> bool:
        return self.run(["scontrol", "ping"], timeout=10).returncode == 0

    def _nodes_idle(self) -> bool:
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return r.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    def wait_for(self, cond, what: str, timeout_s: float = START_TIMEOUT_S, detail=None) -> None:
        """Poll ``cond`` until true; ``SlurmError`` naming ``what`` (and the daemons' log tails)
        after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                extra = f" ({detail()})" if detail else ""
                raise SlurmError(f"waited {timeout_s:.0f}s for {what}{extra}\n{self.log_tails()}")
            time.sleep(POLL_S)

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process of every host (daemons and jobs), delete the namespaces and the
        hosts files. Idempotent."""
        try:
            self.hosts.close()
        finally:
            for d in self._etc:
                shutil.rmtree(d, ignore_errors=True)
            self._etc = []

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
