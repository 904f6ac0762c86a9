"""Fixtures of the multi-host tests: ``cluster``, two hosts in network namespaces with
sshd and SLURM (see tools/testcluster). Every test in this folder is marked ``multihost``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.testcluster import Cluster, unavailable

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.multihost)


@pytest.fixture(scope="session")
def can_make_clusters() -> None:
    """Skips the test where this machine cannot make a cluster, saying why; removes
    the clusters of earlier runs that crashed."""
    if reason := unavailable():
        pytest.skip(f"no test cluster: {reason}")
    Cluster.reap_stale()


@pytest.fixture(scope="session")
def cluster(can_make_clusters: None) -> Iterator[Cluster]:
    """Hosts h1 and h2 with sshd and SLURM, and the login host, for the session."""
    with Cluster.up(hosts=2) as made:
        yield made
