"""The mesh API: shapes, value meshes, futures, proc meshes and actor meshes: what
runs in every process (controllers, workers, plain scripts); never imports Jupyter,
the worker or the controller (where proc meshes come from: ``monarch_kernel.controller``).

Names are imported on first use (PEP 562), so ``monarch_kernel.actor`` can use the
shape types without importing the whole mesh API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch_kernel._lazy import lazy_getattr

if TYPE_CHECKING:
    from monarch_kernel.mesh._actor_mesh import ActorMesh, Endpoint
    from monarch_kernel.mesh._future import Future
    from monarch_kernel.mesh._proc_mesh import ProcMesh
    from monarch_kernel.mesh._shape import Extent, Point, Shape
    from monarch_kernel.mesh._value_mesh import ValueMesh

_LAZY: dict[str, str] = {
    "ActorMesh": "monarch_kernel.mesh._actor_mesh",
    "Endpoint": "monarch_kernel.mesh._actor_mesh",
    "Extent": "monarch_kernel.mesh._shape",
    "Future": "monarch_kernel.mesh._future",
    "Point": "monarch_kernel.mesh._shape",
    "ProcMesh": "monarch_kernel.mesh._proc_mesh",
    "Shape": "monarch_kernel.mesh._shape",
    "ValueMesh": "monarch_kernel.mesh._value_mesh",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
