"""PyTorch TCPStore servers that listen on one address instead of every interface.

``torch.distributed.TCPStore(host, port, is_master=True)`` binds ``port`` on all interfaces
(``::``): ``host`` only tells clients where to connect. An exposed store lets anyone on the
network write rendezvous keys (gloo peer addresses). ``listen_fd(host, port)`` binds and
listens on ``host`` only and hands the socket to TCPStore (``master_listen_fd``).

``python -m asyncrl.core.runtime.torchrun ARGS`` is ``torchrun ARGS`` whose static rendezvous store (the
agent's, at ``--master_addr``) is bound that way; the launcher starts the learner with it,
on one node or across ``learner.nnodes`` (``--nnodes --node_rank --master_addr``: node 0 hosts
the store at ``learner.rdzv_endpoint``, and its ranks 0..nproc-1 include rank 0, which runs
the hub; docs/multinode.md says why static rather than c10d).
"""

from __future__ import annotations

import socket
import sys


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (for torch.distributed rendezvous)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listen_fd(host: str, port: int, backlog: int = 1024) -> int:
    """A listening TCP socket bound to ``host:port`` only; returns its fd, owned by the caller
    from now on (TCPStore closes it when the store shuts down)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def _patch_static_rendezvous() -> None:
    """Make torchrun's static rendezvous create its master store on ``--master_addr`` only."""
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static

    original = static.TCPStore

    def bound_store(host, port, world_size=None, is_master=False, *args, **kwargs):
        if is_master and "master_listen_fd" not in kwargs:
            kwargs["master_listen_fd"] = listen_fd(host, port)
        return original(host, port, world_size, is_master, *args, **kwargs)

    # a monkeypatch: the rendezvous module calls TCPStore(...), a function does as well
    static.TCPStore = bound_store  # type: ignore[misc, assignment]


def main() -> None:
    """``torchrun`` with the loopback-bound rendezvous store (``run``)."""
    from torch.distributed.run import main as torchrun_main

    _patch_static_rendezvous()
    run(torchrun_main)


def run(torchrun_main) -> None:
    """``torchrun_main()``, its two ways of ending in an exception cut to one line each, the
    agent having stopped the ranks by then: a SIGTERM/SIGINT (the launcher stopping the job)
    exits ``128 + signal``; a failed rank (``ChildFailedError``: the rank printed its own
    traceback above) exits 1, as torchrun does, without the agent's traceback and report box
    (they reached the console on every learner failure)."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        torchrun_main()
    except SignalException as e:
        name = signal.Signals(e.sigval).name
        print(f"[torchrun] stopped by {name}; its ranks were stopped", file=sys.stderr)
        sys.exit(128 + int(e.sigval))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = failure.exitcode
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        print(
            f"[torchrun] learner rank {rank} failed ({how}); its error is above",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
