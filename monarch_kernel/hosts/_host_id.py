"""Which host this process runs on, as far as a host agent's pid and address go.

A process may judge a mesh's agent by its pid (no such process: the agent is gone)
or by its loopback address refusing a connection only where it runs on the agent's
host: the same machine (boot id), the same network namespace (an address names the
same sockets) and the same pid namespace (a pid names the same process), under the
same hostname. Another login node that shares the home, a container, a network
namespace of a test cluster or of ``unshare --net`` is another host, even with the
agent's pid alive or absent there (REGISTRY-3). ``host_id()`` names this process's
host; a state file records its agents' (``MeshRecord.host_id``, each host entry's
``"host_id"``) and the host the mesh was started from (``started_from``).
"""

from __future__ import annotations

import os
from pathlib import Path


def host_id() -> str:
    """This process's host: ``HOSTNAME/BOOT_ID/net:INODE/pid:INODE`` (no spaces), or
    "" where it cannot be told (then nothing is judged by pid or address here)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        net = os.stat("/proc/self/ns/net").st_ino
        pid = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{os.uname().nodename}/{boot}/net:{net}/pid:{pid}"


def is_here(hid: str | None) -> bool:
    """Whether ``hid`` (a ``host_id()``, "" or None when unknown) is this process's host."""
    return bool(hid) and hid == host_id()


__all__ = ["host_id", "is_here"]
