"""``hosts_factory``: several "hosts" (network namespaces on one bridge) for multi-host tests;
see tests/multihost/netns.py."""

from __future__ import annotations

import pytest

from tests.multihost.cluster import HOSTS, Cluster
from tests.multihost.netns import Hosts, available


@pytest.fixture
def hosts_factory():
    """``make(names) -> Hosts``: hosts closed (processes killed, namespaces deleted) at teardown.

    Skips the test with the reason when namespaces cannot be made here (not root, no ``ip``...).
    """
    reason = available()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    made: list[Hosts] = []

    def make(names, **kw) -> Hosts:
        hosts = Hosts(names, **kw)
        made.append(hosts)
        return hosts

    yield make
    errors = []
    for hosts in reversed(made):
        try:
            hosts.close()
        except Exception as e:  # close the others anyway, then fail the teardown
            errors.append(f"{hosts!r}: {e}")
    if errors:
        pytest.fail("closing hosts failed:\n" + "\n".join(errors), pytrace=False)


@pytest.fixture
def cluster(hosts_factory, roles, tmp_path) -> Cluster:
    """A ``Cluster`` over the hosts of ``cluster.HOSTS``, its run directories in ``tmp_path``."""
    return Cluster(hosts_factory(HOSTS), roles, tmp_path)
