"""How the mesh API reaches this process's controller of a mesh, if it has one.

The mesh API runs in every process (controllers, workers, plain scripts). A few of
``ProcMesh``'s operations (``on_failure``, ``respawn``, ``logs``, recording an actor
mesh for a later ``attach``) need the *session* that the controller holds on the
mesh. CONTROL-1: the mesh layer never imports the controller; the controller
registers, when it is imported, a lookup that gives its session of a mesh, and a
process that imported no controller controls no mesh (the lookup answers None).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from monarch_kernel.errors import SupervisionError

if TYPE_CHECKING:
    from monarch_kernel.mesh._proc_ref import ProcRef


@dataclass
class MeshFailure:
    """What went wrong with a mesh, as given to ``on_failure`` callbacks and actors'
    ``__supervise__``. ``kind`` is "dead" (a worker exited), "unresponsive" (alive but
    not answering heartbeats), "recovered" (answering again), "lost" (the host agent
    is gone, so is every worker), "fenced" (another controller attached), "stopped"
    (stopped by someone else: an administrator, the idle timeout), and across hosts
    "unreachable" (a host does not answer: a partition, its agent stopped; its ranks
    wait), "host_back" (it answers again) or "host_lost" (its agent is gone, and its
    ranks with it; the other hosts go on). Host events name the host in ``host``."""

    mesh: str
    kind: str
    message: str
    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    log_tail: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message

    @classmethod
    def of(cls, err: SupervisionError, kind: str) -> MeshFailure:
        return cls(
            mesh=err.mesh or "",
            kind=kind,
            message=str(err),
            rank=err.rank,
            pid=err.pid,
            host=err.host,
            exit_code=err.exit_code,
            signal=err.signal,
            log_tail=list(err.log_tail),
        )


class MeshControl(Protocol):
    """What the mesh API asks of the session that controls a mesh."""

    name: str
    sizes: dict[str, int]
    #: Actor meshes by name: (payload, buffers, pickled shape).
    records: dict[str, tuple[bytes, list[bytes], bytes]]
    #: ``on_failure`` callbacks.
    callbacks: list[Callable[[MeshFailure], Any]]

    def respawn(self, timeout: float) -> list[int]: ...
    def logs(self, rank: int | None, tail: int) -> list[str]: ...
    def stream_logs(self, rank: int | None = None) -> Iterator[str]: ...
    def stop(self, timeout: float = 15.0) -> None: ...
    def detach(self) -> None: ...
    def workers(self) -> dict[int, dict[str, Any]]: ...
    def record_actor(
        self, name: str, payload: bytes, buffers: list[Any], shape_blob: bytes, supervised: bool | None = None
    ) -> None: ...
    def forget_actor(self, name: str, ranks: list[int]) -> None: ...
    def setup_torch_distributed(self, procs: Any, backend: str, timeout: float) -> dict[str, Any]: ...


_lookup: list[Callable[[ProcRef], MeshControl | None]] = []


def register(lookup: Callable[[ProcRef], MeshControl | None]) -> None:
    """Called once by the controller package when it is imported (CONTROL-1)."""
    _lookup[:] = [lookup]


def session_for(ref: ProcRef) -> MeshControl | None:
    """This process's session of the mesh ``ref`` names, if it controls it."""
    return _lookup[0](ref) if _lookup else None


__all__ = ["MeshControl", "MeshFailure", "register", "session_for"]
