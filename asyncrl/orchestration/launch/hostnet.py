"""This host's network interfaces, checked against ``network.bind`` before anything listens.

A wrong address fails at launch with this host's addresses listed, instead of as a bind error
deep inside Redis, ZeroMQ, torchrun or gloo.
"""

from __future__ import annotations

import socket

from asyncrl.core.config.network import NetworkConfig, is_loopback


def host_addresses() -> dict[str, str]:
    """IPv4/IPv6 address -> interface name, for every interface of this host."""
    import psutil

    out = {}
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                out[a.address.split("%")[0]] = name
    return out


def interface_name(address: str) -> str:
    """The interface that holds ``address`` (``lo`` for loopback). Raises ``ValueError``
    listing this host's addresses when none does."""
    if is_loopback(address):
        return "lo"
    addrs = host_addresses()
    if address not in addrs:
        listed = ", ".join(f"{a} ({n})" for a, n in sorted(addrs.items()) if ":" not in a)
        raise ValueError(
            f"{address} is not an address of this host; its addresses: {listed}. Set "
            "network.bind (and learner.rdzv_endpoint on learner node 0) to one of them"
        )
    return addrs[address]


def resolve(host: str) -> str:
    """``host``'s IPv4 address (itself if it is one). Raises ``ValueError`` naming it."""
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise ValueError(f"cannot resolve host name {host!r}: {e}") from None


def check(network: NetworkConfig) -> None:
    """Raise ``ValueError`` (listing this host's addresses) unless this host holds the
    address its sockets bind (``network.interface``: ``bind``, or ``advertise`` for 0.0.0.0)."""
    interface_name(network.interface)


def socket_env(network: NetworkConfig) -> dict[str, str]:
    """Environment that keeps gloo's and NCCL's sockets on ``network.interface`` (they pick
    an interface from the host name otherwise, which may not be the cluster network)."""
    if network.local:
        return {}
    name = interface_name(network.interface)
    return {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}


def nccl_env(network: NetworkConfig) -> dict[str, str]:
    """NCCL's bootstrap sockets on ``network.interface`` (``lo`` by default): they listen on an
    interface NCCL picks otherwise, beyond loopback even in a default job. This covers the
    nccl weight transport (asyncrl/core/weights/nccl.py), FSDP2 and vLLM's tensor parallel."""
    return {"NCCL_SOCKET_IFNAME": interface_name(network.interface)}
