"""Making and ending sessions: create a mesh (one path for every allocator), attach to
a running one (fencing the controller before), get-or-create by name and spec, stop;
at exit, ephemeral meshes stop and persistent ones are let go."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from monarch_kernel import _native
from monarch_kernel._caller import user_stacklevel
from monarch_kernel._shutdown import Stage, shutdown
from monarch_kernel.control import AgentGroup
from monarch_kernel.controller._frontend import progress as frontend_progress
from monarch_kernel.controller._session import Session, sessions, sessions_lock
from monarch_kernel.controller._singletons import ROOT_ENV, root_address
from monarch_kernel.errors import (
    MeshNotFoundError,
    MeshOwnershipError,
    MeshSpecError,
    MeshStateError,
    MonarchKernelError,
)
from monarch_kernel.hosts import (
    HOSTS_DIM,
    AgentConfig,
    AgentProcess,
    Allocator,
    LocalHost,
    MeshRecord,
    connect,
    group_of,
    host_id,
    new_tls_identity,
    registry,
    release,
    stop_unowned,
)
from monarch_kernel.mesh import ProcRef

#: Default idle timeout of a named mesh: how long it waits for a controller.
DEFAULT_IDLE_TIMEOUT = 24 * 3600.0
#: How long the hosts of a mesh across hosts wait for their controller (an ephemeral
#: mesh's included): a network partition must not end a mesh that outlives it.
REMOTE_LEASE_GRACE_S = 120.0
#: How long attach and get-or-create wait for a corrupt state file to be put back by
#: its running agent (REGISTRY-2) before taking the mesh for gone.
RESTORE_WAIT_S = 2.0


def session_for(ref: ProcRef) -> Session | None:
    s = sessions.get(ref.name)
    return s if s is not None and s.token == ref.token and not s.closed else None


def _runs_cells() -> bool:
    """Whether this controller is an IPython shell (a notebook's kernel), whose user
    can run ``%%mesh`` cells on the workers; a script's cannot."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def _worker_env(env: Mapping[str, str] | None) -> dict[str, str]:
    return {
        "MONARCH_SYS_PATH": json.dumps([p for p in sys.path if p and os.path.isdir(p)]),
        # FORK-1: the template makes the workers' IPython shell for a controller that
        # runs cells (0.1 s of CPU a host; the 64 hosts of a script's mesh skip it).
        "MONARCH_WORKER_SHELL": "1" if _runs_cells() else "0",
        ROOT_ENV: root_address(),  # SINGLE-1: where get_or_spawn_controller's singletons live
        "PYTHONUNBUFFERED": "1",
        # A native abort's Rust backtrace would fill the log tail that a SupervisionError
        # shows in place of its message; spawn_procs(env={"RUST_BACKTRACE": "1"}) keeps it.
        "RUST_BACKTRACE": "0",
        **(env or {}),
    }


def attach_record(rec: MeshRecord) -> Session:
    """Attaches to the mesh ``rec`` describes (bumping its epoch); a stale record is
    removed and raises MeshNotFoundError."""
    with sessions_lock:
        if rec.ca:  # TLS-1: this mesh's connections verify its CA
            _native.set_mesh_ca(rec.token, rec.ca)
        client = connect(rec)
        if client is None:
            registry.remove_if_ours(rec.name, rec.token)
            raise MeshNotFoundError(
                f"mesh {rec.name!r} is not running: its host agent (pid {rec.agent_pid}, {rec.agent_addr}) is "
                "gone, and its state file was removed. Start it again with "
                f"this_host().spawn_procs(..., name={rec.name!r})."
            )
        # Transactional: the state file must be writable before the previous controller is
        # fenced, or nobody would be left in control (the write after can still fail on a
        # disk that fills meanwhile: then the attach stands, and the file keeps the old epoch).
        try:
            registry.write(rec)
        except MeshStateError:
            client.close()
            raise
        replies = client.attach()
        workers = [w for reply in replies for w in reply.workers]
        # The new lease opens before the old one (if this process had one) closes: an
        # ephemeral mesh must never see no controller in between.
        session = Session(rec, client, replies[0].epoch, workers, list(replies[0].actors), agent=None)
        old = sessions.get(rec.name)
        if old is not None and old.token == rec.token and not old.closed:
            session.callbacks.extend(old.callbacks)
            session.agent = old.agent
            old.detach()
        rec.epoch = session.epoch
        try:
            registry.write(rec)
        except MeshStateError as e:
            warnings.warn(
                f"{e} (this controller owns the mesh all the same)",
                registry.MeshStateWarning,
                stacklevel=user_stacklevel(),
            )
        sessions[rec.name] = session
        session.tell_root(root_address())  # SINGLE-1: this process is the root now
        return session


def _spec(allocator: Allocator, sizes: dict[str, int], env: Mapping[str, str] | None) -> dict[str, Any]:
    """What a mesh's state file says it was made with: get-or-create compares it."""
    spec: dict[str, Any] = {"per_host": sizes, "env": dict(env or {})}
    if allocator.nhosts is not None:
        spec["hosts"] = allocator.nhosts
    elif isinstance(allocator, LocalHost) and allocator.python_exe is not None:
        spec["python"] = allocator.python_exe
    return spec


def create(
    name: str | None,
    allocator: Allocator,
    per_host: dict[str, int],
    env: Mapping[str, str] | None,
    ephemeral: bool,
    idle_timeout: float,
) -> Session:
    """Starts a new mesh, the one way for every allocator: an agent per host
    (``allocator.allocate``), the mesh listed in its state file, then each agent's
    workers (run by ``allocator.python``)."""
    mesh_name = name or f"anon-{uuid.uuid4().hex[:8]}"
    worker_env = allocator.worker_env(per_host)  # (checked before anything starts)
    remote, nhosts = allocator.remote, allocator.nhosts
    if remote and ephemeral:
        # A partition ends the lease like a controller's exit does: an ephemeral mesh's
        # hosts wait this long for it to come back before they stop.
        idle_timeout = max(idle_timeout, REMOTE_LEASE_GRACE_S)
    sizes = {HOSTS_DIM: nhosts, **per_host} if nhosts is not None else dict(per_host)
    token = _new_token()
    spec = _spec(allocator, per_host, env)
    meta = json.dumps({"spec": spec, "ephemeral": ephemeral, "idle_timeout": idle_timeout})
    tls = new_tls_identity() if remote else None  # TLS-1: across hosts the control plane is TLS
    if tls is not None:
        _native.set_mesh_ca(token, tls["ca"])  # before any connection to the mesh opens
    first = MeshRecord(
        name=mesh_name,
        token=token,
        agent_addr="",
        agent_pid=0,
        host=os.uname().nodename,
        spec=spec,
        idle_timeout=idle_timeout,
        ephemeral=ephemeral,
        ca=tls["ca"] if tls else "",
        host_id=host_id(),
        started_from=host_id(),
    )
    cfg = AgentConfig(
        name=mesh_name,
        token=token,
        idle_timeout=idle_timeout,
        meta=meta,
        bind_host="auto" if remote else "127.0.0.1",
        tls=tls,
        # (a shared home: the controller's state folder on every host; a pod has its own)
        state_home=os.environ.get("XDG_STATE_HOME", "") if remote and allocator.shares_files else "",
        # REGISTRY-2: an agent of this host lists the mesh itself as soon as it listens,
        # so no error or interrupt after it starts leaves it unlisted.
        state_file="" if remote else str(registry.path_of(mesh_name)),
        record=None if remote else dataclasses.asdict(first),
    )
    allocation = allocator.allocate(cfg)
    if allocation.token:  # standing agents (a pool of pods): their credentials are the mesh's
        token = allocation.token
        _native.set_mesh_ca(token, allocation.ca or None)
        first = dataclasses.replace(first, token=token, ca=allocation.ca)
    agents = allocation.agents
    if remote:
        _transfer_host_facing(agents[0].addr)  # (before this process's servers start: they face the hosts)
    per = math.prod(per_host.values())
    rec = dataclasses.replace(
        first,
        agent_addr=agents[0].addr,
        agent_pid=agents[0].pid,
        host=agents[0].host,
        host_id=agents[0].host_id,
        job=allocation.job,
        hosts=[
            {
                "host": a.host,
                "agent_addr": a.addr,
                "agent_pid": a.pid,
                "first_rank": i * per,
                "procs": per,
                "host_id": a.host_id,
            }
            for i, a in enumerate(agents)
        ]
        if remote
        else [],
    )

    def undo() -> None:
        release(allocation.job)
        if allocation.process is not None:
            allocation.process.wait(10)
        registry.remove_if_ours(mesh_name, token)

    where = f" on {nhosts} hosts" if nhosts is not None else ""
    return _bring_up(
        group_of(rec),
        rec,
        allocator.python,
        {"MONARCH_SHAPE": json.dumps([list(sizes), list(sizes.values())]), **_worker_env(env), **worker_env},
        f"starting mesh {mesh_name!r}{where}, procs started",
        allocation.process,
        undo=undo,
        cwd=os.getcwd() if allocator.shares_files else "",
    )


def _bring_up(
    client: AgentGroup,
    rec: MeshRecord,
    python: str,
    worker_env: dict[str, str],
    what: str,
    agent: AgentProcess | None,
    undo: Callable[[], None],
    cwd: str,
) -> Session:
    """Lists the mesh (its state file), becomes the controller of its new agents,
    starts their workers (showing progress) and writes the state file again with its
    epoch; on any failure, an interrupt too, stops the agents and runs ``undo``:
    nothing may be left running that no state file names."""
    try:
        registry.write(rec)  # listed from the first moment: nothing runs unlisted
        epoch = client.attach()[0].epoch
        nprocs = sum(link.nprocs for link in client.links)
        workers = _showing_progress(
            client,
            nprocs,
            what,
            lambda: client.spawn_workers_raw(
                python, ["-m", "monarch_kernel.worker"], worker_env, cwd, epoch=epoch
            ),
        )
        rec = dataclasses.replace(rec, epoch=epoch)
        session = Session(rec, client, epoch, workers, [], agent)
        registry.write(rec)
    except BaseException:
        try:
            client.shutdown()
        except Exception:
            pass  # the original error is the one to report
        finally:
            undo()
        raise
    with sessions_lock:
        sessions[rec.name] = session
    return session


def _transfer_host_facing(agent_addr: str) -> None:
    """This process's transfer engine must be reachable from other hosts: unless
    ``MONARCH_TRANSFER_HOST`` says where, it listens on the address that faces them
    (it starts on first use; one that started on loopback stays there)."""
    if os.environ.get("MONARCH_TRANSFER_HOST"):
        return
    import socket

    host = agent_addr.rsplit(":", 1)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent: this picks the route's source address
        os.environ["MONARCH_TRANSFER_HOST"] = str(s.getsockname()[0])


#: Seconds a start lasts before it shows progress.
PROGRESS_AFTER_S = 1.0


def _showing_progress(
    client: AgentGroup, nprocs: int, what: str, spawn: Callable[[], list[Any]]
) -> list[Any]:
    """Runs ``spawn()`` (the agent starting ``nprocs`` workers); if it lasts more than
    ``PROGRESS_AFTER_S``, shows how many have started (the front end's ``progress``).
    An interrupt here ends the wait at once; the caller stops the agent."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = spawn()
        except BaseException as e:  # handed to the waiting thread
            box["err"] = e

    t = threading.Thread(target=run, name="monarch-spawn", daemon=True)
    t.start()
    shown = None
    since = time.monotonic()
    try:
        while t.is_alive():
            t.join(0.25)
            if not t.is_alive() or time.monotonic() - since < PROGRESS_AFTER_S:
                continue
            try:
                started = len(client.list_workers_raw(timeout=1.0))
            except MonarchKernelError:
                continue
            if shown is None:
                shown = frontend_progress(nprocs, what)
                if shown is None:
                    break  # nowhere to show it: just wait
            shown.update(started)
    finally:
        if shown is not None:
            shown.close()
    t.join()
    if "err" in box:
        raise box["err"]
    return list(box["out"])


def _new_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


def get_or_create(
    name: str | None,
    sizes: dict[str, int],
    env: Mapping[str, str] | None,
    *,
    replace: bool,
    ephemeral: bool | None,
    idle_timeout: float | None,
    allocator: Allocator,
) -> Session:
    """``spawn_procs``: the running mesh ``name`` if its spec matches, else a new one
    on ``allocator``'s hosts."""
    if ephemeral is None:
        ephemeral = name is None
    if idle_timeout is None:
        idle_timeout = 0.0 if ephemeral else DEFAULT_IDLE_TIMEOUT
    elif not isinstance(idle_timeout, (int, float)) or idle_timeout < 0:
        raise MeshSpecError(f"idle_timeout must be a number of seconds >= 0, not {idle_timeout!r}")

    def new(name: str | None) -> Session:
        return create(name, allocator, sizes, env, ephemeral, float(idle_timeout))

    if name is None:
        return new(None)
    registry.check_name(name)
    spec = _spec(allocator, sizes, env)
    with registry.locked(name):
        rec = registry.read(name, wait_restore=RESTORE_WAIT_S)
        if rec is not None:
            mine = sessions.get(name)
            if rec.spec == spec:
                if mine is not None and mine.token == rec.token and mine.owns():
                    return mine
                try:
                    return attach_record(rec)
                except MeshNotFoundError:
                    pass  # stale: create it anew below
            elif not replace:
                if connect(rec) is None:
                    registry.remove_if_ours(rec.name, rec.token)
                else:
                    raise MeshSpecError(
                        f"mesh {name!r} is running with {_spec_text(rec.spec)}, not {_spec_text(spec)}. Pass "
                        f"replace=True to stop it and start a new one, or attach({name!r}) to use it as it is."
                    )
            else:
                stop_record(rec)
        return new(name)


def _spec_text(spec: dict[str, Any]) -> str:
    env = f", env={spec['env']}" if spec.get("env") else ""
    return f"per_host={spec['per_host']}{env}"


def stop_record(rec: MeshRecord) -> bool:
    """Stops the mesh ``rec`` describes as an administrator (never fenced); True if
    it was running."""
    s = sessions.get(rec.name)
    if s is not None and s.token == rec.token:
        try:
            s.stop()
            return True
        except MeshOwnershipError:
            s.detach()  # fenced: stop it as an administrator below
    return stop_unowned(rec)


def attach_session(name: str) -> Session:
    """Attaches to the running mesh ``name`` (see ``attach_record``)."""
    registry.check_name(name)
    with registry.locked(name):
        rec = registry.read(name, wait_restore=RESTORE_WAIT_S)
        if rec is None:
            running = ", ".join(repr(n) for n in registry.names()) or "none"
            raise MeshNotFoundError(
                f"no mesh named {name!r} is running (running: {running}). Create it with "
                f"this_host().spawn_procs(per_host={{'procs': N}}, name={name!r})."
            )
        return attach_record(rec)


def stop_all_ephemeral(timeout: float = 5.0) -> None:
    """At exit: ephemeral meshes of this process stop (each given ``timeout`` s);
    persistent ones are let go."""
    for s in list(sessions.values()):
        try:
            if s.rec.ephemeral:
                s.stop(timeout=timeout)
            else:
                s.detach()
        except Exception:
            pass


shutdown.at(Stage.MESHES, stop_all_ephemeral)


__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "attach_record",
    "attach_session",
    "create",
    "get_or_create",
    "session_for",
    "stop_all_ephemeral",
    "stop_record",
]
