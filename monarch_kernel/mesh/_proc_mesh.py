"""``HostMesh``, ``ProcMesh``, ``this_host()`` and ``this_proc()``."""

from __future__ import annotations

import atexit
import pickle
import secrets
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from monarch_kernel import _native, _origin
from monarch_kernel.actor import is_async_actor
from monarch_kernel.errors import (
    ActorError,
    MeshOwnershipError,
    MeshSpecError,
    MeshStoppedError,
    SerializationError,
)
from monarch_kernel.mesh._actor_mesh import ActorMesh, check_endpoint_names
from monarch_kernel.mesh._buffers import HEADER, drop_now, drop_when_done
from monarch_kernel.mesh._future import Future, wait_calls
from monarch_kernel.mesh._proc_ref import ProcRef
from monarch_kernel.mesh._serial import dumps, loads, loads_exception
from monarch_kernel.mesh._shape import Extent, MeshTrait, Point, Shape

if TYPE_CHECKING:
    from monarch_kernel.mesh._session import MeshFailure, Session

T = TypeVar("T")


def session_for(ref: ProcRef) -> Session | None:
    """This process's session of the mesh ``ref`` names, if it controls it. (Workers
    never import the session machinery unless they control a mesh themselves.)"""
    mod = sys.modules.get("monarch_kernel.mesh._session")
    return mod.session_for(ref) if mod is not None else None


#: Seconds to wait for every worker to construct an actor.
SPAWN_TIMEOUT = 300.0


class ProcMesh(MeshTrait):
    """Processes, laid out over named dims, that actors are spawned on."""

    def __init__(self, proc: ProcRef, shape: Shape) -> None:
        self._proc = proc
        self._shape = shape

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._proc, shape)

    @property
    def name(self) -> str:
        return self._proc.name

    def _session(self, what: str) -> Session:
        s = session_for(self._proc)
        if s is None:
            raise MeshSpecError(
                f"{what} needs this process to control mesh {self.name!r}: call attach({self.name!r}) first"
            )
        return s

    @property
    def actors(self) -> Mapping[str, ActorMesh[Any]]:
        """The actor meshes on these procs, by name: those spawned here and, after
        ``attach``, those a previous controller spawned."""
        return _Actors(self)

    def on_failure(self, callback: Callable[[MeshFailure], Any]) -> Callable[[MeshFailure], Any]:
        """Calls ``callback(failure)`` (on a background thread) whenever a worker dies,
        stops answering, answers again, or the whole mesh is lost; also works as a
        decorator. Registered callbacks replace the default line on stderr."""
        self._session("on_failure").callbacks.append(callback)
        return callback

    def status(self) -> list[str]:
        """Each proc's state, by proc rank: "alive", "unresponsive", "dead"; all
        "stopped" or "lost" when the whole mesh is."""
        st = self._proc.state()
        n = len(st.ref.addrs)
        if st.stopped or st.lost is not None:
            return ["stopped" if st.stopped else "lost"] * n
        return [
            "dead" if r in st.dead else "unresponsive" if r in st.unresponsive else "alive" for r in range(n)
        ]

    @property
    def degraded(self) -> bool:
        """True while some procs are dead and others alive."""
        return any(s != "alive" for s in self.status())

    def respawn(self, timeout: float = SPAWN_TIMEOUT) -> list[int]:
        """Restarts dead procs (same ranks) and re-creates their actors with their
        original constructor arguments; returns the restarted ranks. Module state and
        actor state of those procs start afresh; other procs are untouched."""
        return self._session("respawn()").respawn(timeout)

    def spawn(self, name: str, cls: type[T], *args: Any, **kwargs: Any) -> Any:
        """Creates actor ``cls(*args, **kwargs)`` on every proc, under ``name``.

        Returns an ``ActorMesh`` once every constructor has returned; a constructor that
        raises gives ``ActorError`` naming the rank. A name already in use is replaced.
        """
        if not isinstance(name, str) or not name:
            raise MeshSpecError(f"spawn() needs a non-empty actor name, not {name!r}")
        is_async_actor(cls)
        check_endpoint_names(cls)
        what = f"class and constructor arguments of actor {name!r}"
        ranks = list(self._shape.ranks)
        conns = self._proc.conns(ranks)  # first: a dead rank fails before anything is registered
        regs: list[int] = []
        payload, buffers = dumps((cls, args, kwargs), what, self._proc.token, len(ranks), regs)
        origin = _origin.current()
        if origin:
            _origin.touched.add(self._proc.name)
        try:
            calls = [c.spawn_actor(name, payload, buffers, origin) for c in conns]
        except BaseException:
            drop_now(regs)  # (some may have gone; their readers release what they read)
            raise
        drop_when_done(calls, regs)
        replies = wait_calls(calls, SPAWN_TIMEOUT, f"spawn of {name} on {len(calls)} procs")
        for r, base in zip(replies, ranks):
            if isinstance(r, BaseException):
                raise self._proc.explain(r, base, f"spawn of {name}")
            kind, data, bufs = r
            if kind == _native.REPLY_FENCED:
                raise self._proc.fenced(bytes(data).decode(), base, f"spawn of {name}")
            if kind == _native.REPLY_EXCEPTION:
                exc, formatted = loads_exception(data, bufs, self._proc.token)
                raise ActorError(
                    exc,
                    f"Actor {name} ({cls.__qualname__}) failed in __init__.",
                    formatted,
                    rank=self._proc.point(base),
                )
            if kind != _native.REPLY_RESULT:
                raise self._proc.rejected(bytes(data).decode(), base, f"spawn of {name}")
        session = session_for(self._proc)
        if session is not None:  # so that attach() and respawn() find it
            if payload[:4] == HEADER:  # the record keeps its own copy, for later controllers
                payload, buffers = dumps((cls, args, kwargs), what)
            session.record_actor(
                name, payload, buffers, pickle.dumps(self._shape), hasattr(cls, "__supervise__")
            )
        return ActorMesh(name, cls, self._proc, self._shape)

    def setup_torch_distributed(self, backend: str = "auto", timeout: float = 60.0) -> dict[str, Any]:
        """Sets up torch.distributed on these procs: ``MASTER_ADDR``, ``MASTER_PORT`` (a
        free port), ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in each proc's
        environment, then ``init_process_group`` on every rank. ``backend`` is
        "gloo", "nccl" or "auto" (nccl where the procs have GPUs, else gloo). Calling it
        again is a no-op. A rank that does not join within ``timeout`` seconds, or
        fails, is named in the ``DistributedSetupError``. Returns the backend, world
        size, master address and whether a group was created now."""
        from monarch_kernel.mesh._distributed import setup

        return setup(self, backend, timeout)

    def stop(self) -> Future[None]:
        """Stops every worker and the host agent, and forgets the mesh's name. Later
        calls raise MeshStoppedError."""
        st = self._proc.state()
        session = session_for(self._proc)
        if session is not None:
            session.stop(timeout=10)
        elif st.fenced:
            raise MeshOwnershipError(
                f"mesh {self.name!r} is controlled by another controller now; attach({self.name!r}) first "
                "to stop it from here (or: monarch-kernel down NAME)",
                mesh=self.name,
            )
        elif not st.stopped and self._proc.agent_addr is not None:
            from monarch_kernel.mesh import _registry

            rec = _registry.read(self.name)
            if rec is not None and rec.token == self._proc.token:
                from monarch_kernel.mesh._session import stop_record

                stop_record(rec)
        st.stopped = True
        st.changed()
        return Future._resolved(None)

    @property
    def initialized(self) -> Future[bool]:
        return Future._resolved(True)

    def logs(self, rank: int | None = None, tail: int = 100) -> list[str]:
        """The last ``tail`` lines the workers printed (one rank, or all), oldest first."""
        return self._session("logs()").logs(rank, tail)

    def stream_logs(self, rank: int | None = None) -> Iterator[str]:
        """Output lines as the workers print them, ``[mesh rank] text``; runs until
        the iterator is closed (``break`` out of the loop)."""
        return self._session("stream_logs()").stream_logs(rank)

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ProcMesh(name={self._proc.name!r}, shape={self._shape.extent})"

    def _workers(self) -> dict[int, dict[str, Any]]:
        """What the agent says of each worker, by rank; empty where this process does
        not control the mesh or the agent does not answer (for views that show what
        they can)."""
        session = session_for(self._proc)
        if session is None:
            return {}
        try:
            return {w["rank"]: w for w in session.client.list_workers()}
        except Exception:
            return {}

    def _rows(self) -> list[tuple[str, str, str, str]]:
        """(rank, state, pid, restarts) of each proc of this (sliced) mesh."""
        workers = self._workers()
        states = self.status()
        rows = []
        for r in self._shape.ranks:
            w = workers.get(r, {})
            state = states[r] if r < len(states) else "?"
            rows.append((str(r), state, str(w.get("pid", "")), str(w.get("restarts", ""))))
        return rows

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        lines = [repr(self)] + [f"  rank {r}: {s:<12} pid {pid}" for r, s, pid, _ in self._rows()]
        p.text("\n".join(lines))

    def _repr_html_(self) -> str:
        """A static table (what nbconvert and GitHub show of a mesh)."""
        import html

        colors = {"alive": "#2a7", "unresponsive": "#c80", "dead": "#c33", "lost": "#c33", "stopped": "#888"}
        cells = "".join(
            f"<tr><td>{r}</td><td style='color:{colors.get(s, '#000')}'>{html.escape(s)}</td>"
            f"<td>{pid}</td><td>{restarts}</td></tr>"
            for r, s, pid, restarts in self._rows()
        )
        return (
            f"<b>ProcMesh {html.escape(self.name)}</b> {html.escape(str(self._shape.extent))}"
            f"<table><tr><th>rank</th><th>state</th><th>pid</th><th>restarts</th></tr>{cells}</table>"
        )

    def __reduce__(self) -> Any:
        return (ProcMesh, (self._proc, self._shape))


class _Actors(Mapping[str, "ActorMesh[Any]"]):
    """``ProcMesh.actors``: actor meshes by name, unpickled on access."""

    def __init__(self, procs: ProcMesh) -> None:
        self._procs = procs
        s = session_for(procs._proc)
        self._records = dict(s.records) if s is not None else {}

    def __getitem__(self, name: str) -> ActorMesh[Any]:
        rec = self._records.get(name)
        if rec is None:
            known = ", ".join(map(repr, self._records)) or "none"
            raise KeyError(f"no actor mesh named {name!r} on mesh {self._procs.name!r} (known: {known})")
        payload, buffers, shape_blob = rec
        try:
            cls = loads(payload, buffers)[0]
        except Exception as e:
            raise SerializationError(
                f"actor mesh {name!r}: its class cannot be unpickled here ({type(e).__name__}: {e}); "
                "import or define the class in this process first"
            ) from e
        return ActorMesh(name, cls, self._procs._proc, loads(shape_blob))

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"<actors of mesh {self._procs.name!r}: {', '.join(self._records) or 'none'}>"


@atexit.register
def _at_exit() -> None:
    # Ephemeral meshes stop with their controller; persistent ones are let go (their
    # agents start their idle clocks when the lease drops).
    mod = sys.modules.get("monarch_kernel.mesh._session")
    if mod is not None:
        mod.stop_all_ephemeral()
    _native.shutdown_runtime()


def _check_per_host(per_host: Mapping[str, int] | None) -> dict[str, int]:
    if per_host is None:
        return {"procs": 1}
    if not isinstance(per_host, Mapping) or not per_host:
        raise MeshSpecError(f"per_host must be a dict like {{'procs': 4}}, not {per_host!r}")
    out: dict[str, int] = {}
    for k, v in per_host.items():
        if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise MeshSpecError(f"per_host[{k!r}] must be a positive int, not {v!r} (e.g. {{'procs': 4}})")
        out[k] = v
    return out


class HostMesh(MeshTrait):
    """Hosts that procs are spawned on. ``this_host()`` is the local machine."""

    def __init__(self) -> None:
        self._shape = Shape(Extent([], []))

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return self

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        bootstrap: Any = None,
        name: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        replace: bool = False,
        ephemeral: bool | None = None,
        idle_timeout: float | None = None,
    ) -> ProcMesh:
        """Starts worker processes laid out as ``per_host`` (e.g. ``{"procs": 4}``),
        or returns the running mesh ``name``.

        The processes belong to a host agent, never to this process. A named mesh is
        persistent: it outlives this process, and ``spawn_procs`` with the same name and
        spec (or ``attach(name)``) picks it up again, from here or another process. It
        stops on ``stop()``, ``monarch-kernel down NAME``, or after ``idle_timeout``
        seconds (default 24 h) with no controller attached. A different spec under a
        running name is an error unless ``replace=True``. Unnamed meshes, and those
        with ``ephemeral=True``, stop when this process exits.
        """
        if bootstrap is not None:
            raise NotImplementedError(
                "spawn_procs(bootstrap=...) is not supported yet; run setup in an actor's __init__"
            )
        from monarch_kernel.mesh._session import get_or_create

        sizes = _check_per_host(per_host)
        session = get_or_create(
            name, sizes, env, replace=replace, ephemeral=ephemeral, idle_timeout=idle_timeout
        )
        return ProcMesh(session.ref, Shape.of(sizes))


def attach(name: str) -> ProcMesh:
    """Becomes the controller of the running mesh ``name`` (created by this or any
    other process): procs, actor meshes (``procs.actors``), module and actor state are
    as they were. The controller that held it before is fenced: its next command
    raises MeshOwnershipError."""
    from monarch_kernel.mesh._session import attach as _attach

    session = _attach(name)
    return ProcMesh(session.ref, Shape.of(session.sizes))


def this_host() -> HostMesh:
    """The host this code runs on."""
    return HostMesh()


_this_proc: list[ProcMesh] = []
_this_proc_lock = threading.Lock()


def set_this_proc(mesh: ProcMesh) -> None:
    """Called by a worker at start-up: ``this_proc()`` there is the worker itself."""
    _this_proc[:] = [mesh]


def this_proc() -> ProcMesh:
    """The process this code runs in, as a one-proc mesh. In the controller, actors
    spawned on it run in this process (on background threads)."""
    with _this_proc_lock:
        if not _this_proc:
            from monarch_kernel.worker import Dispatcher

            token = secrets.token_urlsafe(32)
            server = _native.WorkerServer(token)
            point = Point(0, Extent([], []))
            Dispatcher(server, point, token).start()
            _this_proc.append(ProcMesh(ProcRef("this_proc", token, (server.addr,)), Shape(Extent([], []))))
        return _this_proc[0]


def list_meshes() -> list[Any]:
    """The running meshes this user can attach to, as ``MeshInfo`` records (name,
    procs, alive, owner_epoch, attached, ...). State files of meshes that are gone are
    removed, with a warning."""
    from monarch_kernel.mesh._session import list_meshes as _list

    return _list()


__all__ = [
    "HostMesh",
    "MeshStoppedError",
    "ProcMesh",
    "attach",
    "list_meshes",
    "set_this_proc",
    "this_host",
    "this_proc",
]
