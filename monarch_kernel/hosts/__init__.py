"""Where meshes live: the allocators that start their host agents (``Allocator``:
``LocalHost``, ``SSHHosts``, ``SlurmHosts``, ``KubernetesPods``; see ``_allocator``), their state files
(``_registry``), GPU placement (``_placement``), and administering a running mesh
through its agents without being its controller (``_admin``).

Names are imported on first use (PEP 562): a worker needs only ``_placement`` at
start, and its start-up time is every mesh's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch_kernel._lazy import lazy_getattr

if TYPE_CHECKING:
    from monarch_kernel.hosts import _registry as registry
    from monarch_kernel.hosts._admin import (
        MeshInfo,
        agent_alive,
        connect,
        group_of,
        list_meshes,
        look_at,
        mesh_info,
        stop_unowned,
    )
    from monarch_kernel.hosts._allocator import (
        AgentConfig,
        AgentProcess,
        Allocation,
        Allocator,
        end_reason,
        follow,
        new_tls_identity,
        release,
    )
    from monarch_kernel.hosts._host_id import host_id
    from monarch_kernel.hosts._k8s import KubernetesPods, default_selector
    from monarch_kernel.hosts._k8s_pool import pool_manifests
    from monarch_kernel.hosts._local import LocalHost, start_local_agent, state_dir
    from monarch_kernel.hosts._placement import GPUS_ENV, HOSTS_DIM, apply_in_worker
    from monarch_kernel.hosts._registry import MeshRecord
    from monarch_kernel.hosts._slurm import SlurmHosts
    from monarch_kernel.hosts._ssh import SSHHosts

_LAZY: dict[str, str] = {
    "agent_alive": "monarch_kernel.hosts._admin",
    "AgentConfig": "monarch_kernel.hosts._allocator",
    "AgentProcess": "monarch_kernel.hosts._allocator",
    "Allocation": "monarch_kernel.hosts._allocator",
    "Allocator": "monarch_kernel.hosts._allocator",
    "apply_in_worker": "monarch_kernel.hosts._placement",
    "connect": "monarch_kernel.hosts._admin",
    "end_reason": "monarch_kernel.hosts._allocator",
    "follow": "monarch_kernel.hosts._allocator",
    "GPUS_ENV": "monarch_kernel.hosts._placement",
    "group_of": "monarch_kernel.hosts._admin",
    "host_id": "monarch_kernel.hosts._host_id",
    "HOSTS_DIM": "monarch_kernel.hosts._placement",
    "KubernetesPods": "monarch_kernel.hosts._k8s",
    "default_selector": "monarch_kernel.hosts._k8s",
    "pool_manifests": "monarch_kernel.hosts._k8s_pool",
    "list_meshes": "monarch_kernel.hosts._admin",
    "LocalHost": "monarch_kernel.hosts._local",
    "look_at": "monarch_kernel.hosts._admin",
    "mesh_info": "monarch_kernel.hosts._admin",
    "MeshInfo": "monarch_kernel.hosts._admin",
    "MeshRecord": "monarch_kernel.hosts._registry",
    "new_tls_identity": "monarch_kernel.hosts._allocator",
    "registry": "monarch_kernel.hosts._registry:*",
    "release": "monarch_kernel.hosts._allocator",
    "SlurmHosts": "monarch_kernel.hosts._slurm",
    "SSHHosts": "monarch_kernel.hosts._ssh",
    "start_local_agent": "monarch_kernel.hosts._local",
    "state_dir": "monarch_kernel.hosts._local",
    "stop_unowned": "monarch_kernel.hosts._admin",
}

__all__ = [
    "agent_alive",
    "AgentConfig",
    "AgentProcess",
    "Allocation",
    "Allocator",
    "apply_in_worker",
    "connect",
    "end_reason",
    "follow",
    "GPUS_ENV",
    "group_of",
    "host_id",
    "HOSTS_DIM",
    "KubernetesPods",
    "default_selector",
    "pool_manifests",
    "list_meshes",
    "LocalHost",
    "look_at",
    "mesh_info",
    "MeshInfo",
    "MeshRecord",
    "new_tls_identity",
    "registry",
    "release",
    "SlurmHosts",
    "SSHHosts",
    "start_local_agent",
    "state_dir",
    "stop_unowned",
]

__getattr__ = lazy_getattr(__name__, _LAZY)
