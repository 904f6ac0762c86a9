"""The mesh API: shapes, value meshes, futures, proc meshes and actor meshes. Works
in plain scripts and inside workers; never imports Jupyter."""

from monarch_kernel.mesh._actor_mesh import ActorMesh, Endpoint
from monarch_kernel.mesh._future import Future
from monarch_kernel.mesh._proc_mesh import HostMesh, ProcMesh, this_host, this_proc
from monarch_kernel.mesh._shape import Extent, Point, Shape
from monarch_kernel.mesh._value_mesh import ValueMesh

__all__ = [
    "ActorMesh",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Point",
    "ProcMesh",
    "Shape",
    "ValueMesh",
    "this_host",
    "this_proc",
]
