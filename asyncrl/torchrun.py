"""PyTorch TCPStore servers that listen on one address instead of every interface.

``torch.distributed.TCPStore(host, port, is_master=True)`` binds ``port`` on all interfaces
(``::``): ``host`` only tells clients where to connect. An exposed store lets anyone on the
network write rendezvous keys (gloo peer addresses). ``listen_fd(host, port)`` binds and
listens on ``host`` only and hands the socket to TCPStore (``master_listen_fd``).

``python -m asyncrl.torchrun ARGS`` is ``torchrun ARGS`` whose static rendezvous store (the
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

    static.TCPStore = bound_store


def main() -> None:
    """``torchrun`` with the loopback-bound rendezvous store. A SIGTERM/SIGINT (the launcher
    stopping the job) ends it with one line instead of the agent's traceback; the agent has
    stopped the ranks by then."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    _patch_static_rendezvous()
    try:
        torchrun_main()
    except SignalException as e:
        name = signal.Signals(e.sigval).name
        print(f"[torchrun] stopped by {name}; its ranks were stopped", file=sys.stderr)
        sys.exit(128 + int(e.sigval))


if __name__ == "__main__":
    main()
