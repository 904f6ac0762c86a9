"""Where meshes live: the allocators that start their host agents (``Allocator``:
``LocalHost``, ``SSHHosts``, ``SlurmHosts``; see ``_allocator``), their state files
(``_registry``), GPU placement (``_placement``), and administering a running mesh
through its agents without being its controller (``_admin``).

Names are imported on first use (PEP 562): a worker needs only ``_placement`` at
start, and its start-up time is every mesh's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch_kernel._lazy import lazy_getattr

if TYPE_CHECKING:
    from monarch_kernel.hosts._allocator import (
        AgentConfig,
        AgentProcess,
        Allocation,
        Allocator,
        end_reason,
        new_tls_identity,
        release,
    )
    from monarch_kernel.hosts._local import LocalHost, start_local_agent, state_dir
    from monarch_kernel.hosts._slurm import SlurmHosts
    from monarch_kernel.hosts._ssh import SSHHosts

_LAZY: dict[str, str] = {
    "AgentConfig": "monarch_kernel.hosts._allocator",
    "AgentProcess": "monarch_kernel.hosts._allocator",
    "Allocation": "monarch_kernel.hosts._allocator",
    "Allocator": "monarch_kernel.hosts._allocator",
    "end_reason": "monarch_kernel.hosts._allocator",
    "new_tls_identity": "monarch_kernel.hosts._allocator",
    "release": "monarch_kernel.hosts._allocator",
    "LocalHost": "monarch_kernel.hosts._local",
    "start_local_agent": "monarch_kernel.hosts._local",
    "state_dir": "monarch_kernel.hosts._local",
    "SlurmHosts": "monarch_kernel.hosts._slurm",
    "SSHHosts": "monarch_kernel.hosts._ssh",
}

__all__ = [
    "AgentConfig",
    "AgentProcess",
    "Allocation",
    "Allocator",
    "LocalHost",
    "SSHHosts",
    "SlurmHosts",
    "end_reason",
    "new_tls_identity",
    "release",
    "start_local_agent",
    "state_dir",
]

__getattr__ = lazy_getattr(__name__, _LAZY)
