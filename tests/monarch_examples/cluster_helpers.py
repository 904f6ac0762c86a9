"""Helpers of the tests that run Monarch's SLURM notebooks on the test cluster
(tools/testcluster): stopping every mesh and checking that nothing of ours is left
on the hosts (as tests/multihost does), and SLURM's queue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from proc_helpers import wait_for

from tools.testcluster import Cluster

#: This folder: the controller imports the notebooks' code from here, and the
#: workers its actors (a worker gets the controller's sys.path).
HERE = Path(__file__).parent


def down_all(cluster: Cluster, state_home: Path) -> None:
    """Stops every mesh of ``state_home`` from the login host; fails the test if a
    process of ours is then left on a host (killing it first)."""
    cluster.run_in_login(
        [sys.executable, "-m", "monarch_kernel", "down", "--all", "--yes", "--force"],
        env={**os.environ, **cluster.env(), "XDG_STATE_HOME": str(state_home)},
        capture_output=True,
        timeout=120,
    )
    if wait_for(lambda: not ours_on_hosts(cluster), within=20.0):
        return
    left = ours_on_hosts(cluster)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    raise AssertionError(f"left running on the hosts: {left}")


def ours_on_hosts(cluster: Cluster) -> list[int]:
    """Pids of monarch agents and workers in the hosts' namespaces."""
    pids = []
    for host in cluster.hosts:
        out = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True).stdout
        for pid in map(int, out.split()):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"monarch_kernel" in cmd:
                pids.append(pid)
    return pids


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
