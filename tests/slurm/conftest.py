"""``slurm``: one real Slurm cluster (tests/slurm/cluster.py) for the whole test module, and
the demo model built once before any job needs it."""

from __future__ import annotations

import pytest

from tests.slurm.cluster import SlurmCluster, install_packages, unavailable


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running cluster of ``ctl`` and four nodes; closed (every process killed) at the end.

    Installs Debian's Slurm and munge first when missing and we are root, as setup installs
    redis-server; skips, saying why, where a cluster cannot be built (not root, no namespaces).
    """
    install_packages()
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no Slurm cluster here: {reason}")
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
