"""Helpers of the tests that run Monarch's SLURM notebooks on the test cluster
(tools/testcluster): stopping every mesh and checking that nothing of ours is left
on the hosts (tests/multihost's checks), and SLURM's queue."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tools.testcluster import Cluster

#: This folder: the controller imports the notebooks' code from here, and the
#: workers its actors (a worker gets the controller's sys.path).
HERE = Path(__file__).parent


def slurm_jobs(cluster: Cluster) -> list[str]:
    """The SLURM jobs still queued or running (or completing), as squeue lists them."""
    out = cluster.run_in_login(
        ["squeue", "-h", "-o", "%i %j %T"],
        env={**os.environ, **cluster.env()},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return out.splitlines()


def wait_no_slurm_jobs(cluster: Cluster, within: float = 60.0) -> list[str]:
    """The jobs left after waiting up to ``within`` s for none to be left."""
    deadline = time.monotonic() + within
    jobs = slurm_jobs(cluster)
    while jobs and time.monotonic() < deadline:
        time.sleep(0.5)
        jobs = slurm_jobs(cluster)
    return jobs
