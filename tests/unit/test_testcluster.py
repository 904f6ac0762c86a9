"""The test cluster's package (``tools/testcluster``), as the tests, the demo and the
bench import it: what it exports is pinned, and its command line runs as a module from
the repository's root. Making clusters: ``tests/multihost/test_cluster.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tools.testcluster

ROOT = Path(__file__).resolve().parents[2]

EXPORTS = ["REGISTRY", "Cluster", "ClusterError", "Host", "unavailable"]


def test_the_package_exports_exactly_the_pinned_names():
    assert tools.testcluster.__all__ == EXPORTS
    assert all(hasattr(tools.testcluster, name) for name in EXPORTS)


def test_the_command_line_runs_as_a_module_from_the_repository_root():
    done = subprocess.run(
        [sys.executable, "-m", "tools.testcluster", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "{up,run,down,status}" in done.stdout, done.stdout
