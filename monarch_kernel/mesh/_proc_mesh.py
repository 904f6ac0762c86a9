"""``HostMesh``, ``ProcMesh``, ``this_host()`` and ``this_proc()``."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import sys
import threading
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

from monarch_kernel import _native
from monarch_kernel.actor import is_async_actor
from monarch_kernel.control import AgentClient
from monarch_kernel.errors import ActorError, MeshSpecError, MeshStoppedError
from monarch_kernel.hosts import AgentProcess, start_local_agent
from monarch_kernel.mesh import _proc_ref
from monarch_kernel.mesh._actor_mesh import ActorMesh, check_endpoint_names
from monarch_kernel.mesh._future import Future
from monarch_kernel.mesh._proc_ref import ProcRef
from monarch_kernel.mesh._serial import dumps, loads
from monarch_kernel.mesh._shape import Extent, MeshTrait, Point, Shape

T = TypeVar("T")

#: Seconds to wait for every worker to construct an actor.
SPAWN_TIMEOUT = 300.0


class _Owner:
    """What the controller that created a mesh holds: the agent process, the lease
    (an open Watch stream) and the worker exits it reported."""

    def __init__(self, agent: AgentProcess, client: AgentClient) -> None:
        self.agent = agent
        self.client = client
        self.exits: dict[int, Any] = {}
        self.lock = threading.Lock()
        self.stopped = False

    def on_event(self, ev: Any) -> None:
        if ev.HasField("worker_exited"):
            with self.lock:
                self.exits[ev.worker_exited.rank] = ev.worker_exited

    def on_end(self, err: BaseException | None) -> None:
        pass  # the agent went away: calls fail with SupervisionError through their connections

    def stop(self, timeout: float) -> None:
        """Asks the agent to stop the workers and itself, then reaps it. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        _owners.discard(self)
        try:
            self.client.shutdown(timeout=timeout)
        except Exception:  # the agent may already be gone; reaping below still runs
            pass
        self.client.close()
        self.agent.wait(timeout)


class ProcMesh(MeshTrait):
    """Processes, laid out over named dims, that actors are spawned on."""

    def __init__(self, proc: ProcRef, shape: Shape, owner: _Owner | None = None) -> None:
        self._proc = proc
        self._shape = shape
        self._owner = owner

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._proc, shape, self._owner)

    @property
    def name(self) -> str:
        return self._proc.name

    def spawn(self, name: str, cls: type[T], *args: Any, **kwargs: Any) -> Any:
        """Creates actor ``cls(*args, **kwargs)`` on every proc, under ``name``.

        Returns an ``ActorMesh`` once every constructor has returned; a constructor that
        raises gives ``ActorError`` naming the rank. A name already in use is replaced.
        """
        if not isinstance(name, str) or not name:
            raise MeshSpecError(f"spawn() needs a non-empty actor name, not {name!r}")
        is_async_actor(cls)
        check_endpoint_names(cls)
        payload, buffers = dumps((cls, args, kwargs), f"class and constructor arguments of actor {name!r}")
        ranks = list(self._shape.ranks)
        calls = [c.spawn_actor(name, payload, buffers) for c in self._proc.conns(ranks)]
        replies = _native.wait_all(calls, SPAWN_TIMEOUT)
        for r, base in zip(replies, ranks):
            if isinstance(r, BaseException):
                raise self._proc.explain(r, base, f"spawn of {name}")
            kind, data, bufs = r
            if kind == _native.REPLY_EXCEPTION:
                exc, formatted = loads(data, bufs)
                raise ActorError(
                    exc,
                    f"Actor {name} ({cls.__qualname__}) failed in __init__.",
                    formatted,
                    rank=self._proc.point(base),
                )
            if kind != _native.REPLY_RESULT:
                raise self._proc.rejected(bytes(data).decode(), base, f"spawn of {name}")
        return ActorMesh(name, cls, self._proc, self._shape)

    def stop(self) -> Future[None]:
        """Stops every worker and the host agent. Later calls raise MeshStoppedError."""
        _proc_ref._stopped.add(self._proc.name)
        if self._owner is not None:
            self._owner.stop(timeout=10)
        return Future._resolved(None)

    @property
    def initialized(self) -> Future[bool]:
        return Future._resolved(True)

    def logs(self, rank: int | None = None, tail: int = 100) -> list[str]:
        """The last ``tail`` lines the workers printed (one rank, or all)."""
        if self._owner is None:
            raise MeshSpecError("logs() is only available on the controller that owns the mesh")
        return self._owner.client.logs(rank=rank, tail=tail)

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

    def __reduce__(self) -> Any:
        return (ProcMesh, (self._proc, self._shape))


# Meshes this process created and must not leave behind (ephemeral).
_owners: set[_Owner] = set()


@atexit.register
def _stop_owned() -> None:
    # Best effort at exit: the agent also stops when our lease drops.
    for owner in list(_owners):
        owner.stop(timeout=5)
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
    ) -> ProcMesh:
        """Starts worker processes laid out as ``per_host`` (e.g. ``{"procs": 4}``).

        The processes belong to a host agent, never to this process; they stop when
        ``stop()`` is called or this controller exits.
        """
        if bootstrap is not None:
            raise NotImplementedError(
                "spawn_procs(bootstrap=...) is not supported yet; run setup in an actor's __init__"
            )
        sizes = _check_per_host(per_host)
        shape = Shape.of(sizes)
        mesh_name = name or f"anon-{uuid.uuid4().hex[:8]}"
        token = secrets.token_urlsafe(32)
        agent = start_local_agent(mesh_name, token, idle_timeout=0.0)
        client = AgentClient(agent.addr, token)
        owner = _Owner(agent, client)
        _owners.add(owner)
        client.watch_in_thread(owner.on_event, owner.on_end)
        worker_env = {
            "MONARCH_SHAPE": json.dumps([list(sizes), list(sizes.values())]),
            "MONARCH_SYS_PATH": json.dumps([p for p in sys.path if p and os.path.isdir(p)]),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        workers = client.spawn_workers(
            len(shape), sys.executable, ["-m", "monarch_kernel.worker"], worker_env, os.getcwd()
        )
        proc = ProcRef(mesh_name, token, tuple(w["addr"] for w in workers), agent.addr, shape.extent)
        _proc_ref._stopped.discard(mesh_name)
        return ProcMesh(proc, shape, owner)


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
            Dispatcher(server, point).start()
            _this_proc.append(ProcMesh(ProcRef("this_proc", token, (server.addr,)), Shape(Extent([], []))))
        return _this_proc[0]


__all__ = ["HostMesh", "MeshStoppedError", "ProcMesh", "set_this_proc", "this_host", "this_proc"]
