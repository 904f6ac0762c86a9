"""Fixtures of the Kubernetes tests: ``bed``, a real control plane (kube-apiserver,
etcd, kube-controller-manager, kube-scheduler, kwok) with 4 pod hosts (see tools/k8s),
for the module (it is removed before the tests that follow). Every test in this folder is marked ``k8s``; ``make test`` builds
the binaries first (``make k8s-bed``, cached outside the repository)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.k8s import KubeBed, missing
from tools.testcluster import Cluster, unavailable

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="module")
def bed() -> Iterator[KubeBed]:
    if reason := unavailable():
        pytest.skip(f"no k8s test bed: {reason}")
    if gone := missing():
        pytest.skip(f"the k8s test bed's binaries are not built ({', '.join(gone)}): make k8s-bed")
    Cluster.reap_stale()
    with KubeBed.up(pods=4) as made:
        yield made
