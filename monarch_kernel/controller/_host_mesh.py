"""Where proc meshes come from: ``this_host()`` and its ``spawn_procs``, ``attach``,
``list_meshes`` and ``this_proc()``."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from monarch_kernel.actor import CREATOR_ENV, Actor, endpoint
from monarch_kernel.controller._lifecycle import attach_session, get_or_create
from monarch_kernel.controller._this_proc import this_proc
from monarch_kernel.errors import MeshSpecError
from monarch_kernel.hosts import HOSTS_DIM, Allocator, LocalHost, MeshInfo
from monarch_kernel.hosts import list_meshes as _mesh_infos
from monarch_kernel.mesh import (
    Done,
    Extent,
    Future,
    MeshTrait,
    ProcMesh,
    Shape,
    actor_context,
    adopt,
    root_context,
)


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
    """Hosts that procs are spawned on. ``this_host()`` is the local machine; a job
    (``monarch_kernel.job``) gives meshes of other hosts, with a ``hosts`` dimension
    (``slice(hosts=...)`` picks some of them)."""

    def __init__(self, allocator: Allocator | None = None) -> None:
        #: Where its hosts' agents come from (``LocalHost()``: this machine).
        self._allocator: Allocator = allocator or LocalHost()
        #: The proc meshes spawned from it in this process (``stop()``).
        self._spawned: list[ProcMesh] = []
        n = self._allocator.nhosts
        self._shape = Shape(Extent([], [])) if n is None else Shape.of({HOSTS_DIM: n})

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        if self._allocator.nhosts is None:
            return self
        return HostMesh(self._allocator.picked(list(shape.ranks)))

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """These hosts, whose procs run with interpreter ``python_executable`` (which
        must have monarch-kernel installed). On a job's hosts it runs their agents too."""
        if not isinstance(python_executable, str) or not python_executable:
            raise MeshSpecError(
                f"with_python_executable needs the path of a Python interpreter, not {python_executable!r}"
            )
        return HostMesh(self._allocator.with_python(python_executable))

    def __repr__(self) -> str:
        return f"<HostMesh: {self._allocator.describe()}>"

    @property
    def initialized(self) -> Future[bool]:
        """Done: a host mesh here is a description, its hosts are reached on spawn."""
        return Future._resolved(True)

    def sync_workspace(
        self, workspace: Any = None, conda: bool = False, auto_reload: bool = False
    ) -> Future[Any]:
        """``ProcMesh.sync_workspace`` of every running proc mesh spawned from this host
        mesh by this process (Monarch syncs a host mesh's hosts); the results, in
        spawn order."""
        live = [p for p in self._spawned if not (p._proc.state().stopped or p._proc.state().fenced)]
        if not live:
            raise MeshSpecError(
                "sync_workspace: no proc mesh of this host mesh runs here; spawn_procs first, then sync"
            )
        return Done([p.sync_workspace(workspace, conda, auto_reload).get() for p in live])

    def stop(self) -> Future[None]:
        """Stops every proc mesh spawned from this host mesh by this process (the
        hosts' agents go with them); Monarch's ``HostMesh.shutdown``."""
        for procs in self._spawned:
            st = procs._proc.state()
            if not (st.stopped or st.fenced):
                procs.stop("its host mesh was stopped")
        self._spawned.clear()
        return Future._resolved(None)

    shutdown = stop

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        bootstrap: Any = None,
        name: str | None = None,
        proc_bind: Any = None,
        bootstrap_command: Any = None,
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

        Monarch's ``proc_bind`` (CPU and NUMA binding per proc) and
        ``bootstrap_command`` (a command that starts each proc) are refused with what
        to do instead: the host agent starts every proc (docs/monarch-compat.md).
        """
        _refuse_proc_options(proc_bind, bootstrap_command)
        if bootstrap is not None and not callable(bootstrap):
            raise MeshSpecError(
                f"bootstrap must be a function (sync or async) to run on each proc, not {bootstrap!r}"
            )
        sizes = _check_per_host(per_host)
        owner = actor_context.get().actor_instance
        if owner.name != "root" and (name is None or ephemeral):  # OWN-1: the mesh of an actor
            env = {CREATOR_ENV: str(owner), **(env or {})}
        if self._allocator.nhosts is not None and HOSTS_DIM in sizes:
            raise MeshSpecError(f"per_host cannot have a {HOSTS_DIM!r} dimension: the host mesh gives it")
        session = get_or_create(
            name,
            sizes,
            env,
            replace=replace,
            ephemeral=ephemeral,
            idle_timeout=idle_timeout,
            allocator=self._allocator,
        )
        if session.rec.ephemeral:  # OWN-1: made by an actor, it is that actor's
            adopt(session.name, lambda: session.stop(timeout=10))
        procs = ProcMesh(session.ref, Shape.of(session.sizes))
        procs._host_mesh = self
        self._spawned.append(procs)
        if bootstrap is not None:
            try:
                _bootstrap(procs, bootstrap)
            except BaseException:
                procs.stop()  # a mesh whose set-up failed is not left running
                raise
        return procs


def _refuse_proc_options(proc_bind: Any, bootstrap_command: Any) -> None:
    if proc_bind is not None:
        raise MeshSpecError(
            "spawn_procs(proc_bind=...): procs are not bound to CPUs here; bind each one from "
            "spawn_procs(bootstrap=fn), e.g. os.sched_setaffinity(0, cpus) by current_rank()"
        )
    if bootstrap_command is not None:
        raise MeshSpecError(
            "spawn_procs(bootstrap_command=...): the host agent starts every proc with the mesh's "
            "Python; choose it with HostMesh.with_python_executable(path), set its environment "
            "with env=, and run code first with bootstrap=fn"
        )


class _Bootstrap(Actor):
    """Runs ``spawn_procs(bootstrap=fn)``'s ``fn`` on its proc, as the proc's own
    code (what it spawns belongs to no actor), then is stopped."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        reset = actor_context.set(root_context)
        try:
            result = fn()
            if inspect.iscoroutine(result):
                asyncio.run(result)
        finally:
            actor_context.reset(reset)

    @endpoint
    def done(self) -> None:
        pass


def _bootstrap(procs: ProcMesh, fn: Callable[[], Any]) -> None:
    """Runs ``fn`` on every proc of ``procs``; one that raises fails ``spawn_procs``."""
    runner = procs.spawn("__monarch_bootstrap__", _Bootstrap, fn)
    if runner._init_errors:
        raise next(iter(runner._init_errors.values()))
    runner.stop().get(timeout=60)


def attach(addr: str) -> ProcMesh:
    """Becomes the controller of a running mesh (created by this or any other
    process): procs, actor meshes (``procs.actors``), module and actor state are as
    they were. The controller that held it before is fenced: its next command raises
    MeshOwnershipError.

    ``addr`` is the mesh's name (``attach("train")``) or, in Monarch's form, the
    address of one of its host agents (``attach("tcp://10.0.0.5:40123")``, the
    scheme optional; ``list_meshes()`` gives each mesh's hosts with their ``addr``).
    A name cannot hold a ``:``, so the form tells the two apart."""
    session = attach_session(_mesh_at(addr) if ":" in addr else addr)
    return ProcMesh(session.ref, Shape.of(session.sizes))


def _mesh_at(addr: str) -> str:
    """The name of the listed mesh that has a host agent at ``addr``
    (``[scheme://]host:port``)."""
    import socket

    from monarch_kernel.errors import MeshNotFoundError
    from monarch_kernel.hosts import registry

    where = addr.split("://", 1)[-1].rstrip("/")
    host, _, port = where.rpartition(":")
    try:
        wanted = {where, f"{socket.gethostbyname(host.strip('[]'))}:{port}"}
    except OSError:
        wanted = {where}
    for name in registry.names():
        rec = registry.read(name)
        if rec is None:
            continue
        if wanted & {rec.agent_addr, *(str(h.get("agent_addr", "")) for h in rec.hosts)}:
            return rec.name
    raise MeshNotFoundError(
        f"attach({addr!r}): no running mesh of this user has a host agent at {where} "
        "(list_meshes() gives each mesh's hosts with their agents' addresses); attach also takes a mesh's name"
    )


def this_host() -> HostMesh:
    """The host this code runs on."""
    return HostMesh()


def list_meshes() -> list[MeshInfo]:
    """The running meshes this user can attach to, as ``MeshInfo`` records (name,
    procs, alive, owner_epoch, attached, ...). State files of meshes that are gone are
    removed, with a warning."""
    return _mesh_infos()


__all__ = ["HostMesh", "attach", "list_meshes", "this_host", "this_proc"]
