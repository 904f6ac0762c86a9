"""What ``monarch-kernel ls``/``down`` and ``%mesh ls``/``down`` show and do, in one
place: the table of running meshes, and stopping meshes by name as an administrator
(through this process's session where it has one)."""

from __future__ import annotations

import time
from typing import Any

from monarch_kernel import _native
from monarch_kernel._wire import BUILTIN
from monarch_kernel.controller._lifecycle import attach_session, stop_record
from monarch_kernel.controller._session import sessions
from monarch_kernel.errors import MeshNotFoundError, MeshOwnershipError
from monarch_kernel.hosts import _registry
from monarch_kernel.hosts._admin import MeshInfo, group_of, list_meshes, mesh_info
from monarch_kernel.hosts._registry import MeshRecord
from monarch_kernel.mesh._proc_mesh import SPAWN_TIMEOUT
from monarch_kernel.mesh._serial import loads

_COLUMNS = ("NAME", "PROCS", "ALIVE", "CONTROLLER", "EPOCH", "IDLE TIMEOUT", "AGE", "AGENT PID", "HOSTS")


def _hosts_text(m: MeshInfo) -> str:
    """Each host: its name, live procs of its procs, its state if not alive, and the
    GPU use of its procs where its workers report one (NVML on that host)."""
    gpus = _gpu_by_host(m.name)
    return ", ".join(
        f"{h['host']} {h['alive']}/{h['procs']}{'' if h['state'] == 'alive' else ' ' + h['state']}"
        + (f" ({gpus[h['host']]})" if h["host"] in gpus else "")
        for h in m.hosts
    )


def _answer(call: Any) -> Any:
    """A call's reply if it has one now; None otherwise (and the call is cancelled)."""
    try:
        if call.done():
            return call.wait(0)
    except Exception:
        return None
    call.cancel()
    return None


def ask_workers(rec: MeshRecord, workers: list[dict[str, Any]], method: str, timeout: float) -> list[Any]:
    """What the built-in actor of each of ``workers`` (running, as the agents list
    them) answers to ``method``, as an administrator (no controller needed); None for
    a worker that does not answer within ``timeout``."""
    if rec.ca:
        _native.set_mesh_ca(rec.token, rec.ca)
    if not workers:
        return []
    try:
        conns = [_native.WorkerConn(w["addr"], rec.token) for w in workers]
        calls = _native.call(_native.Endpoint(BUILTIN, method), conns, list(range(len(conns))), b"", [])
    except Exception:
        return [None] * len(workers)
    try:
        replies = _native.wait_all(calls, timeout)
    except Exception:  # some did not answer in time: those that did still count
        replies = [_answer(c) for c in calls]
    return [
        loads(r.payload, list(r.buffers))
        if isinstance(r, _native.Reply) and r.kind == _native.REPLY_RESULT
        else None
        for r in replies
    ]


def _gpu_by_host(name: str, timeout: float = 1.0) -> dict[str, str]:
    """``host -> "GPU 73%, 12,345 MiB"``: the mean use of the GPUs of the mesh's procs on
    each host and the memory they hold, as each worker measures it (its ``usage``)."""
    rec = _registry.read(name)
    if rec is None:
        return {}
    try:
        live = [w for w in group_of(rec).list_workers() if w["state"] == "running"]
    except Exception:
        return {}  # a listing never fails for want of GPU figures
    per_host: dict[str, list[dict[str, Any]]] = {}
    for w, u in zip(live, ask_workers(rec, live, "usage", timeout)):
        if isinstance(u, dict) and "gpu" in u:
            per_host.setdefault(w["host"], []).append(u)
    return {
        host: f"GPU {sum(u['gpu'] for u in us) / len(us):.0f}%, {sum(u['gpu_mem'] for u in us) / 2**20:,.0f} MiB"
        for host, us in per_host.items()
    }


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def owner_text(owner: dict[str, Any] | None) -> str:
    """The controller holding a mesh, as it described itself (OWNER-1), in a few words."""
    if not owner:
        return "attached"
    if owner.get("kind") == "kernel":
        return f"kernel {owner.get('notebook') or str(owner.get('kernel_id'))[:8]}"
    return f"pid {owner.get('pid')} on {owner.get('host')}"


def mesh_table(meshes: list[MeshInfo] | None = None) -> list[str]:
    """The running meshes (``list_meshes()`` unless given) as aligned text lines."""
    meshes = list_meshes() if meshes is None else meshes
    if not meshes:
        return ["no running meshes"]
    rows = [_COLUMNS]
    now = time.time()
    for m in meshes:
        rows.append(
            (
                m.name,
                str(m.procs),
                str(m.alive),
                owner_text(m.owner) if m.attached else "none",
                str(m.owner_epoch),
                "ephemeral"
                if m.ephemeral
                else _age(m.idle_timeout)
                + (f" (stops in {_age(m.idle_left)})" if m.idle_left is not None else ""),
                _age(now - m.created),
                str(m.agent_pid) if len(m.hosts) <= 1 else "(per host)",
                _hosts_text(m),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def down(names: list[str]) -> list[tuple[bool, str]]:
    """Stops the meshes ``names`` as an administrator; for each, (ok, what happened)."""
    out = []
    for name in names:
        rec = _registry.read(name)
        if rec is None:
            out.append((False, f"no mesh named {name!r} is running (see monarch-kernel ls)"))
        elif stop_record(rec):
            out.append((True, f"stopped {name}"))
        else:
            out.append((True, f"{name} was not running (its host agent was gone); removed its state file"))
    return out


def respawn(name: str) -> list[int]:
    """Restarts the dead ranks of the mesh ``name`` (and re-creates their actors); the
    ranks restarted. A mesh this process holds is respawned by its session; one nobody
    holds is attached for the while and let go after; one another controller holds
    is that controller's to respawn (MeshOwnershipError says which)."""
    session = sessions.get(name)
    if session is None or session.closed:
        info = mesh_info(name)
        if info is None:
            raise MeshNotFoundError(f"no mesh named {name!r} is running (see monarch-kernel ls)")
        if info.attached:
            raise MeshOwnershipError(
                f"mesh {name!r} is held by {owner_text(info.owner)} (epoch {info.owner_epoch}): respawn its "
                f"dead ranks there (procs.respawn() or %mesh respawn {name}); attaching here would take "
                "it from that controller"
            )
        session = attach_session(name)
        try:
            return session.respawn(SPAWN_TIMEOUT)
        finally:
            session.detach()
    return session.respawn(SPAWN_TIMEOUT)


def all_names() -> list[str]:
    """The names of every mesh with a state file."""
    return _registry.names()


def plan_down_all(force: bool) -> tuple[list[str], list[str]]:
    """What ``down --all`` stops and what it leaves running: a mesh another controller
    is attached to (a kernel in use) is left, unless ``force``; this process's own
    meshes and meshes nobody is attached to are stopped."""
    ours = {s.name for s in sessions.values() if not s.closed}
    stop: list[str] = []
    keep: list[str] = []
    for m in list_meshes():
        (keep if m.attached and m.name not in ours and not force else stop).append(m.name)
    return stop, keep


def left_running(names: list[str]) -> list[str]:
    """What ``down --all`` says of the meshes it left running."""
    return [f"left running: {n} (another controller is attached to it; --force stops it too)" for n in names]


__all__ = ["all_names", "down", "left_running", "mesh_table", "owner_text", "plan_down_all", "respawn"]
