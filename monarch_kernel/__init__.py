"""monarch-kernel: drive a persistent mesh of worker processes from one controller.

The names here keep PyTorch Monarch's public actor API, so Monarch code ports by
changing ``from monarch.actor import ...`` to ``from monarch_kernel import ...``.
"""

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
from monarch_kernel.errors import (
    ActorError,
    MeshStoppedError,
    MonarchKernelError,
    SupervisionError,
)
from monarch_kernel.mesh import (
    ActorMesh,
    Endpoint,
    Extent,
    Future,
    HostMesh,
    Point,
    ProcMesh,
    Shape,
    ValueMesh,
    this_host,
    this_proc,
)

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
    "MeshStoppedError",
    "MonarchKernelError",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "Shape",
    "SupervisionError",
    "ValueMesh",
    "as_endpoint",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "get_or_spawn_controller",
    "returns_future",
    "send",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]
