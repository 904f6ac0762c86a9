"""How the mesh API reaches this process's controller of a mesh, if it has one.

The mesh API runs in every process (controllers, workers, plain scripts). A few of
``ProcMesh``'s operations (``on_failure``, ``respawn``, ``logs``, recording an actor
mesh for a later ``attach``) need the *session* that the controller holds on the
mesh. CONTROL-1: the mesh layer never imports the controller; the controller
installs itself in this process's role (``mesh._role.here``) when it is imported, and
a process that imported no controller controls no mesh (``session_for`` answers None).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from monarch_kernel.errors import SupervisionError
from monarch_kernel.mesh._role import here

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
        ranks with it; the other hosts go on). Host events name the host in ``host``.
    "actor_failed": an actor failed (a broadcast it got raised, with nobody waiting
    for the answer; or a mesh it owns had a failure it did not handle)."""

    mesh: str
    kind: str
    message: str
    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    log_tail: list[str] = field(default_factory=list)

    @property
    def mesh_name(self) -> str:
        """The name of the mesh that failed (``mesh``)."""
        return self.mesh

    def __str__(self) -> str:
        rank = "" if self.rank is None else f", rank={self.rank}"
        return f"MeshFailure(mesh={self.mesh!r}{rank}, kind={self.kind!r}): {self.message}"

    def report(self) -> str:
        """The failure in words (Monarch's ``MeshFailure.report()``)."""
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
    def logs(self, rank: int | None, tail: int, labelled: bool = False) -> list[str]: ...
    def stream_logs(self, rank: int | None = None) -> Iterator[str]: ...
    def stop(self, timeout: float = 15.0) -> None: ...
    def detach(self) -> None: ...
    def workers(self) -> dict[int, dict[str, Any]]: ...
    def record_actor(
        self, name: str, payload: bytes, buffers: list[Any], shape_blob: bytes, supervised: bool | None = None
    ) -> None: ...
    def forget_actor(self, name: str, ranks: list[int]) -> None: ...
    def setup_torch_distributed(self, procs: Any, backend: str, timeout: float) -> dict[str, Any]: ...
    def activate(self, procs: Any) -> Any: ...
    def rank_tensor(self, procs: Any, dims: Any) -> Any: ...
    def logging_option(
        self, stream_to_client: bool, level: int, window: float | None = None, timeout: float = 10.0
    ) -> None: ...
    def report(self, failure: MeshFailure) -> None: ...
    def sync_workspace(
        self, ranks: list[int], workspace: Any, auto_reload: bool, timeout: float = 600.0
    ) -> Any: ...


def session_for(ref: ProcRef) -> MeshControl | None:
    """This process's session of the mesh ``ref`` names, if it controls it."""
    controller = here.controller
    return None if controller is None else controller.session_for(ref)


# -- the supervision tree (OWN-1) -------------------------------------------------------
#
# OWN-1: an unnamed (ephemeral) mesh created while an actor runs (in its __init__ or
# an endpoint) belongs to that actor, as do the actors it spawns on any proc mesh:
# they stop when the actor stops (after its __cleanup__; recursively, as their own
# actors stop) or, for meshes, when its process ends. A failure in them that no
# on_failure callback handled goes to the owner's __supervise__ (True: handled); one
# still unhandled fails the owner (DISPATCH-4) and goes up, to the controller of the
# owner's mesh as an "actor_failed" failure of the owner, and so on up to the root
# controller's on_failure callbacks and unhandled_fault_hook. The failures of actors
# an actor spawned come to its process on its failures port.

#: Meshes owned by each actor of this process: (mesh name, stop()).
_owned: dict[str, list[tuple[str, Callable[[], Any]]]] = {}
#: By mesh name: the owner's ``__supervise__`` (returns whether it handled it).
_owners: dict[str, tuple[str, Callable[[MeshFailure], bool]]] = {}


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called with a failure nobody handled (no ``on_failure`` callback, no
    ``__supervise__`` that returned True), in the controller. Reassign it
    (``monarch_kernel.unhandled_fault_hook = fn``) to change what happens: returning
    handles the failure; raising leaves it unhandled. Unlike Monarch's, this default
    does not exit the process: the failure is shown (in the notebook, or on stderr)."""
    raise RuntimeError(f"unhandled: {failure}")


def user_fault_hook(failure: MeshFailure) -> bool:
    """The root controller's ``unhandled_fault_hook`` if the user set one
    (``monarch_kernel.unhandled_fault_hook = fn``); whether it handled ``failure``."""
    pkg = sys.modules.get("monarch_kernel")
    hook = getattr(pkg, "__dict__", {}).get("unhandled_fault_hook")
    if hook is None or hook is unhandled_fault_hook:
        return False
    try:
        hook(failure)
    except BaseException as e:
        print(f"monarch: unhandled_fault_hook raised {type(e).__name__}: {e}", file=sys.stderr)
        return False
    return True


def adopt(mesh: str, stop: Callable[[], Any], supervise: bool = True) -> None:
    """OWN-1: ``mesh`` (a proc mesh, or actors spawned on any proc mesh), just made
    here, belongs to the running actor, if any; with ``supervise``, its failures go to
    the actor."""
    from monarch_kernel.actor import _current

    owner = _current.get().actor_instance.name
    actors = here.actors
    if owner == "root" or actors is None:
        return
    _owned.setdefault(owner, []).append((mesh, stop))
    if supervise:
        _owners[mesh] = (owner, lambda failure: actors.supervise_owner(owner, failure))


#: This process's channel for failures of actors its actors spawned: its port.
_hearing: list[Any] = []
_hearing_lock = threading.Lock()


def failures_port() -> Any:
    """OWN-1: the port on which this process hears of failures of the actors its
    actors spawned (on any proc mesh), as ``(owner actor, MeshFailure)``; started on
    first use, with one thread that hands each to the owner (see ``_heard``)."""
    from monarch_kernel.mesh._port import Channel

    with _hearing_lock:
        if not _hearing:
            port: Any
            receiver: Any
            port, receiver = Channel.open()

            def serve() -> None:
                while True:
                    try:
                        owner, failure = receiver.recv().get()
                    except Exception as e:  # (a message that did not unpickle)
                        print(f"monarch: a failure report could not be read: {e}", file=sys.stderr)
                        continue
                    _heard(owner, failure)

            threading.Thread(target=serve, name="monarch-failures", daemon=True).start()
            _hearing.append(port)
        return _hearing[0]


def _heard(owner: str, failure: MeshFailure) -> None:
    """A failure of actors ``owner`` spawned: its ``__supervise__``, else up (as a
    failure of the owner), else (the root) the user's hook, else stderr."""
    if here.actors is not None and here.actors.supervise_owner(owner, failure):
        return
    if here.up is not None:
        here.up(owner, f"actors it spawned ({failure.mesh})", failure)
        return
    if not user_fault_hook(failure):
        print(f"monarch: {failure.message}", file=sys.stderr, flush=True)


def stop_owned(actor: str) -> None:
    """OWN-1: stops what ``actor`` owns (it is stopping), the newest first: the actors
    it spawned before the procs they run on."""
    for mesh, stop in reversed(_owned.pop(actor, [])):
        _owners.pop(mesh, None)
        try:
            stop()
        except SupervisionError:
            pass  # gone already (its worker died, its mesh stopped): nothing left to stop
        except Exception as e:
            print(f"monarch: stopping {mesh} of actor {actor!r} failed: {e}", file=sys.stderr)


def has_dispatcher() -> bool:
    """Whether actors run in this process (a worker, or a controller's ``this_proc``)."""
    return here.actors is not None


def owns(actor: str) -> bool:
    return bool(_owned.get(actor))


def escalates() -> bool:
    """Whether failures here go up to a controller (this process is a worker)."""
    return here.up is not None


def owner_handles(mesh: str, failure: MeshFailure) -> bool:
    """Gives ``failure`` of ``mesh`` to its owner's ``__supervise__``; whether it handled it."""
    owner = _owners.get(mesh)
    return owner is not None and owner[1](failure)


def escalate(mesh: str, failure: MeshFailure) -> bool:
    """Sends an unhandled ``failure`` of ``mesh`` up, as a failure of its owner
    (OWN-1); False where there is no owner to fail (the root controller's meshes)."""
    owner = _owners.get(mesh)
    if here.up is None or owner is None:
        return False
    here.up(owner[0], mesh, failure)
    return True


__all__ = [
    "MeshControl",
    "MeshFailure",
    "adopt",
    "escalate",
    "escalates",
    "failures_port",
    "has_dispatcher",
    "owns",
    "owner_handles",
    "session_for",
    "stop_owned",
    "unhandled_fault_hook",
    "user_fault_hook",
]
