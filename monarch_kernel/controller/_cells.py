"""``%%mesh`` cells on a mesh's workers: the SPMD actor every mesh gets on first use
(``worker._spmd.MeshCells``), and a cell sent to many ranks as one native call."""

from __future__ import annotations

from typing import Any

from monarch_kernel.controller._mesh_session import MeshSession
from monarch_kernel.mesh import ActorMesh, Future
from monarch_kernel.worker import MeshCells

#: The name of the SPMD actor mesh (``%%mesh``, ``%mesh push``/``pull``).
CELLS_ACTOR = "__mesh_cells__"


def spmd_actors(session: MeshSession) -> ActorMesh[Any]:
    """The ``MeshCells`` actors on every proc of ``session``'s mesh, spawned on first use."""
    procs = session.procs()
    if CELLS_ACTOR in session.records:
        return procs.actors[CELLS_ACTOR]
    actors: ActorMesh[Any] = procs.spawn(CELLS_ACTOR, MeshCells)
    return actors


def run_cell(session: MeshSession, ranks: list[int], source: str, filename: str) -> list[Future[Any]]:
    """Runs ``source`` (named ``filename`` in tracebacks) on procs ``ranks`` of the
    mesh, in one native call; one Future per rank (the repr of the cell's value, or
    None)."""
    ep = spmd_actors(session).run
    return ep._each(list(ranks), (source, filename), {})  # type: ignore[no-any-return]


__all__ = ["CELLS_ACTOR", "run_cell", "spmd_actors"]
