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
        Port,
        PortReceiver,
        as_endpoint,
        concurrent_endpoint,
        get_or_spawn_controller,
        returns_future,
        send,
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
    "Channel": "monarch_kernel._compat",
    "Context": "monarch_kernel.actor",
    "Endpoint": "monarch_kernel.mesh",
    "Extent": "monarch_kernel.mesh",
    "Future": "monarch_kernel.mesh",
    "HostMesh": "monarch_kernel.controller",
    "Instance": "monarch_kernel.actor",
    "MeshFailure": "monarch_kernel.controller",
    "MeshInfo": "monarch_kernel.hosts._admin",
    "MeshNotFoundError": "monarch_kernel.errors",
    "MeshOwnershipError": "monarch_kernel.errors",
    "MeshStoppedError": "monarch_kernel.errors",
    "MonarchKernelError": "monarch_kernel.errors",
    "Point": "monarch_kernel.mesh",
    "Port": "monarch_kernel._compat",
    "PortReceiver": "monarch_kernel._compat",
    "ProcMesh": "monarch_kernel.mesh",
    "RDMABuffer": "monarch_kernel.mesh._transfer_buffer:TransferBuffer",
    "Shape": "monarch_kernel.mesh",
    "SupervisionError": "monarch_kernel.errors",
    "TransferBuffer": "monarch_kernel.mesh._transfer_buffer",
    "ValueMesh": "monarch_kernel.mesh",
    "as_endpoint": "monarch_kernel._compat",
    "attach": "monarch_kernel.controller",
    "list_meshes": "monarch_kernel.controller",
    "concurrent_endpoint": "monarch_kernel._compat",
    "context": "monarch_kernel.actor",
    "current_actor_name": "monarch_kernel.actor",
    "current_rank": "monarch_kernel.actor",
    "current_size": "monarch_kernel.actor",
    "endpoint": "monarch_kernel.actor",
    "gather": "monarch_kernel.mesh._transfer_buffer",
    "get_or_spawn_controller": "monarch_kernel._compat",
    "returns_future": "monarch_kernel._compat",
    "scatter": "monarch_kernel.mesh._transfer_buffer",
    "send": "monarch_kernel._compat",
    "this_host": "monarch_kernel.controller",
    "this_proc": "monarch_kernel.controller",
    "unhandled_fault_hook": "monarch_kernel._compat",
}

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
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
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "gather",
    "get_or_spawn_controller",
    "list_meshes",
    "returns_future",
    "scatter",
    "send",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]


__getattr__ = lazy_getattr(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
