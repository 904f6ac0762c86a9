"""Distributed tensors: tensors that live on the procs of a mesh, handled from the
controller as if they were local (Monarch's tensor engine, ``import monarch``).

```python
with procs.activate():
    w = torch.rand(1024, 1024)             # one tensor per proc, made there
    s = (w @ w.T).reduce("gpus", "sum")     # ops and collectives, no round trip
inspect(s, gpus=0)                          # rank 0's value, here
```

See ``docs/architecture.md`` ("Distributed tensors") for how it works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from monarch_kernel._lazy import lazy_getattr
from monarch_kernel.mesh import set_rref

if TYPE_CHECKING:
    from monarch_kernel.errors import MeshTensorError, RemoteException
    from monarch_kernel.tensor._activate import activate, get_active_mesh, no_mesh
    from monarch_kernel.tensor._ops import (
        coalescing,
        fetch_shard,
        grad_generator,
        inspect,
        rank_tensor,
        reduce,
        reduce_,
        remote,
        show,
        slice_mesh,
        to_mesh,
    )
    from monarch_kernel.tensor._stream import Stream, get_active_stream
    from monarch_kernel.tensor._tensor import Tensor

_LAZY: dict[str, str] = {
    "activate": "monarch_kernel.tensor._activate",
    "coalescing": "monarch_kernel.tensor._ops",
    "fetch_shard": "monarch_kernel.tensor._ops",
    "get_active_mesh": "monarch_kernel.tensor._activate",
    "get_active_stream": "monarch_kernel.tensor._stream",
    "grad_generator": "monarch_kernel.tensor._ops",
    "inspect": "monarch_kernel.tensor._ops",
    "MeshTensorError": "monarch_kernel.errors",
    "no_mesh": "monarch_kernel.tensor._activate",
    "rank_tensor": "monarch_kernel.tensor._ops",
    "reduce": "monarch_kernel.tensor._ops",
    "reduce_": "monarch_kernel.tensor._ops",
    "remote": "monarch_kernel.tensor._ops",
    "RemoteException": "monarch_kernel.errors",
    "show": "monarch_kernel.tensor._ops",
    "slice_mesh": "monarch_kernel.tensor._ops",
    "Stream": "monarch_kernel.tensor._stream",
    "Tensor": "monarch_kernel.tensor._tensor",
    "to_mesh": "monarch_kernel.tensor._ops",
}

__all__ = [
    "activate",
    "coalescing",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_generator",
    "inspect",
    "MeshTensorError",
    "no_mesh",
    "rank_tensor",
    "reduce",
    "reduce_",
    "remote",
    "RemoteException",
    "show",
    "slice_mesh",
    "Stream",
    "Tensor",
    "to_mesh",
]

__getattr__ = lazy_getattr(__name__, _LAZY)


def _rref(endpoint: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from monarch_kernel.tensor._ops import rref

    return rref(endpoint, args, kwargs)


set_rref(_rref)  # Endpoint.rref: the mesh layer's hook (it cannot import this package)
