"""monarch-kernel: drive a persistent mesh of worker processes from one controller.

The names here keep PyTorch Monarch's public actor API, so Monarch code ports by
changing ``from monarch.actor import ...`` to ``from monarch_kernel import ...``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch_kernel._lazy import lazy_getattr

if TYPE_CHECKING:
    from monarch_kernel._compat import (
        Accumulator,
        Channel,
        ChannelTransport,
        Port,
        PortReceiver,
        as_endpoint,
        attach_to_workers,
        concurrent_endpoint,
        config,
        debug_controller,
        enable_transport,
        get_or_spawn_controller,
        gpu_direct_rdma_supported,
        hosts_from_config,
        local_proc_mesh,
        proc_mesh,
        returns_future,
        run_worker_loop_forever,
        send,
        shutdown_context,
        sim_proc_mesh,
        unhandled_fault_hook,
    )
    from monarch_kernel.actor import (
        Actor,
        Context,
        Instance,
        context,
        current_actor_name,
        current_rank,
        current_size,
        endpoint,
    )
    from monarch_kernel.controller import HostMesh, MeshFailure, attach, list_meshes, this_host, this_proc
    from monarch_kernel.errors import (
        ActorError,
        MeshNotFoundError,
        MeshOwnershipError,
        MeshStoppedError,
        MonarchKernelError,
        SupervisionError,
    )
    from monarch_kernel.hosts._admin import MeshInfo
    from monarch_kernel.mesh import ActorMesh, Endpoint, Extent, Future, Point, ProcMesh, Shape, ValueMesh
    from monarch_kernel.mesh._transfer_buffer import TransferBuffer, gather, scatter

    RDMABuffer = TransferBuffer

# Names are imported on first use (PEP 562), so processes that need only a part (the
# host agent needs only _native) start fast.
_LAZY: dict[str, str] = {
    "Accumulator": "monarch_kernel._compat",
    "Actor": "monarch_kernel.actor",
    "ActorError": "monarch_kernel.errors",
    "ActorMesh": "monarch_kernel.mesh",
    "as_endpoint": "monarch_kernel._compat",
    "attach": "monarch_kernel.controller",
    "attach_to_workers": "monarch_kernel._compat",
    "Channel": "monarch_kernel._compat",
    "ChannelTransport": "monarch_kernel._compat",
    "concurrent_endpoint": "monarch_kernel._compat",
    "config": "monarch_kernel._compat",
    "Context": "monarch_kernel.actor",
    "context": "monarch_kernel.actor",
    "current_actor_name": "monarch_kernel.actor",
    "current_rank": "monarch_kernel.actor",
    "current_size": "monarch_kernel.actor",
    "debug_controller": "monarch_kernel._compat",
    "enable_transport": "monarch_kernel._compat",
    "Endpoint": "monarch_kernel.mesh",
    "endpoint": "monarch_kernel.actor",
    "Extent": "monarch_kernel.mesh",
    "Future": "monarch_kernel.mesh",
    "gather": "monarch_kernel.mesh._transfer_buffer",
    "get_or_spawn_controller": "monarch_kernel._compat",
    "gpu_direct_rdma_supported": "monarch_kernel._compat",
    "HostMesh": "monarch_kernel.controller",
    "hosts_from_config": "monarch_kernel._compat",
    "Instance": "monarch_kernel.actor",
    "list_meshes": "monarch_kernel.controller",
    "local_proc_mesh": "monarch_kernel._compat",
    "MeshFailure": "monarch_kernel.controller",
    "MeshInfo": "monarch_kernel.hosts._admin",
    "MeshNotFoundError": "monarch_kernel.errors",
    "MeshOwnershipError": "monarch_kernel.errors",
    "MeshStoppedError": "monarch_kernel.errors",
    "MonarchKernelError": "monarch_kernel.errors",
    "Point": "monarch_kernel.mesh",
    "Port": "monarch_kernel._compat",
    "PortReceiver": "monarch_kernel._compat",
    "proc_mesh": "monarch_kernel._compat",
    "ProcMesh": "monarch_kernel.mesh",
    "RDMABuffer": "monarch_kernel.mesh._transfer_buffer:TransferBuffer",
    "returns_future": "monarch_kernel._compat",
    "run_worker_loop_forever": "monarch_kernel._compat",
    "scatter": "monarch_kernel.mesh._transfer_buffer",
    "send": "monarch_kernel._compat",
    "Shape": "monarch_kernel.mesh",
    "shutdown_context": "monarch_kernel._compat",
    "sim_proc_mesh": "monarch_kernel._compat",
    "SupervisionError": "monarch_kernel.errors",
    "this_host": "monarch_kernel.controller",
    "this_proc": "monarch_kernel.controller",
    "TransferBuffer": "monarch_kernel.mesh._transfer_buffer",
    "unhandled_fault_hook": "monarch_kernel._compat",
    "ValueMesh": "monarch_kernel.mesh",
}

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "MeshInfo",
    "MeshNotFoundError",
    "MeshOwnershipError",
    "MeshStoppedError",
    "MonarchKernelError",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "RDMABuffer",
    "Shape",
    "SupervisionError",
    "TransferBuffer",
    "ValueMesh",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "enable_transport",
    "endpoint",
    "gather",
    "get_or_spawn_controller",
    "gpu_direct_rdma_supported",
    "hosts_from_config",
    "list_meshes",
    "local_proc_mesh",
    "proc_mesh",
    "returns_future",
    "run_worker_loop_forever",
    "scatter",
    "send",
    "shutdown_context",
    "sim_proc_mesh",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]


__getattr__ = lazy_getattr(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
