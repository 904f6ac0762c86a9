"""What every test on the test cluster checks at its end: every mesh of its state
folder stopped, and no process of ours left on any host (used by tests/multihost and
tests/monarch_examples)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from proc_helpers import wait_for

from tools.testcluster import Cluster


def down_all(cluster: Cluster, state_home: Path) -> None:
    """Stops every mesh of ``state_home`` from the login host; fails the test if a
    process of ours is then left on any host (killing it first)."""
    cluster.run_in_login(
        [sys.executable, "-m", "monarch_kernel", "down", "--all", "--yes", "--force"],
        env={**os.environ, **cluster.env(), "XDG_STATE_HOME": str(state_home)},
        capture_output=True,
        timeout=120,
    )
    if wait_for(lambda: not ours_on_hosts(cluster), within=20.0, every=0.2):
        return
    left = ours_on_hosts(cluster)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"left running on the hosts: {left}"


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
