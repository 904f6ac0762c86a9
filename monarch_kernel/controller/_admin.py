"""What ``monarch-kernel ls``/``down`` and ``%mesh ls``/``down`` show and do, in one
place: the table of running meshes, and stopping meshes by name as an administrator
(through this process's session where it has one)."""

from __future__ import annotations

import time
from typing import Any

from monarch_kernel.controller._lifecycle import attach_session, stop_record
from monarch_kernel.controller._session import sessions
from monarch_kernel.controller._view import mesh_view
from monarch_kernel.errors import MeshNotFoundError, MeshOwnershipError, MeshUnreachableError
from monarch_kernel.hosts import MeshInfo, MeshRecord, list_meshes, look_at, mesh_info, registry
from monarch_kernel.mesh import SPAWN_TIMEOUT

_COLUMNS = ("NAME", "PROCS", "ALIVE", "CONTROLLER", "EPOCH", "IDLE TIMEOUT", "AGE", "AGENT PID", "HOSTS")


def _hosts_text(view: dict[str, Any]) -> str:
    """Each host: its name, live procs of its procs, its state if not alive, and the
    GPU use of its procs where its workers report one (NVML on that host)."""
    by_rank = {r["rank"]: r for r in view["ranks"]}
    out = []
    for h in view["hosts"]:
        ranks = [by_rank[r] for r in h["ranks"] if r in by_rank]
        alive = sum(r["state"] == "alive" for r in ranks)
        gpus = [r["usage"] for r in ranks if r["usage"] and "gpu" in r["usage"]]
        text = f"{h['host']} {alive}/{h['procs']}{'' if h['state'] == 'alive' else ' ' + h['state']}"
        if gpus:
            gpu = sum(u["gpu"] for u in gpus) / len(gpus)
            text += f" (GPU {gpu:.0f}%, {sum(u['gpu_mem'] for u in gpus) / 2**20:,.0f} MiB)"
        out.append(text)
    return ", ".join(out)


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


def running_meshes(within: float) -> tuple[list[MeshInfo], list[str]]:
    """The running meshes as ``list_meshes()`` gives them, as far as they were seen in
    ``within`` seconds, and the names of the meshes not seen by then (REGISTRY-4):
    what a kernel says as it starts, without waiting on agents that do not answer."""
    return look_at(registry.names(), within=within)


def mesh_table(meshes: list[MeshInfo] | None = None) -> list[str]:
    """The running meshes (``list_meshes()`` unless given) as aligned text lines: the
    picture the Meshes panel shows (VIEW-1). A mesh whose agents cannot be reached
    from here shows its hosts "unreachable from here" and "?" for what only they know."""
    meshes = list_meshes() if meshes is None else meshes
    if not meshes:
        return ["no running meshes"]
    rows = [_COLUMNS]
    now = time.time()
    for m in meshes:
        if m.unreachable is not None:
            rows.append(
                (
                    m.name,
                    str(m.procs),
                    "?",
                    "?",
                    str(m.owner_epoch),
                    "ephemeral" if m.ephemeral else _age(m.idle_timeout),
                    _age(now - m.created),
                    str(m.agent_pid) if len(m.hosts) <= 1 else "(per host)",
                    ", ".join(f"{h['host']} unreachable from here" for h in m.hosts),
                )
            )
            continue
        view = mesh_view(m)
        rows.append(
            (
                m.name,
                str(m.procs),
                str(view["alive"])
                + (f" ({view['unresponsive']} unresponsive)" if view["unresponsive"] else ""),
                owner_text(m.owner) if m.attached else "none",
                str(m.owner_epoch),
                "ephemeral"
                if m.ephemeral
                else _age(m.idle_timeout)
                + (f" (stops in {_age(m.idle_left)})" if m.idle_left is not None else ""),
                _age(now - m.created),
                str(m.agent_pid) if len(m.hosts) <= 1 else "(per host)",
                _hosts_text(view),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def running_record(name: str) -> MeshRecord:
    """The state file of the running mesh ``name``; ``MeshNotFoundError`` if none."""
    rec = registry.read(name)
    if rec is None:
        raise MeshNotFoundError(f"no mesh named {name!r} is running (see monarch-kernel ls)")
    return rec


def down_one(name: str) -> str:
    """Stops the mesh ``name`` as an administrator; what happened. Raises
    ``MeshNotFoundError`` when it does not run, and ``MeshUnreachableError`` when its
    agents cannot be reached from here (it is left running, with its state file)."""
    rec = running_record(name)
    if stop_record(rec):
        return f"stopped {name}"
    return f"{name} was not running (its host agent was gone); removed its state file"


def down(names: list[str]) -> list[tuple[bool, str]]:
    """Stops the meshes ``names`` as an administrator; for each, (ok, what happened)."""
    out = []
    for name in names:
        try:
            out.append((True, down_one(name)))
        except (MeshNotFoundError, MeshUnreachableError) as e:
            out.append((False, str(e)))
    return out


def respawn(name: str) -> list[int]:
    """Restarts the dead ranks of the mesh ``name`` (and re-creates their actors); the
    ranks restarted. A mesh this process holds is respawned by its session; one nobody
    holds is attached for the while and let go after; one another controller holds
    is that controller's to respawn (MeshOwnershipError says which)."""
    session = sessions.get(name)
    if session is not None and not session.closed:
        return session.respawn(SPAWN_TIMEOUT)
    info = mesh_info(name)
    if info is None:
        raise MeshNotFoundError(f"no mesh named {name!r} is running (see monarch-kernel ls)")
    if info.unreachable is not None:
        raise MeshUnreachableError(info.unreachable, mesh=name)
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


def all_names() -> list[str]:
    """The names of every mesh with a state file."""
    return registry.names()


def plan_down_all(force: bool) -> tuple[list[str], list[tuple[str, str]]]:
    """What ``down --all`` stops, and what it leaves running with why: a mesh another
    controller is attached to (a kernel in use) is left, unless ``force``, and so is
    one whose agents cannot be reached from here (only where they can is it
    stopped); this process's own meshes and meshes nobody is attached to are stopped."""
    ours = {s.name for s in sessions.values() if not s.closed}
    stop: list[str] = []
    keep: list[tuple[str, str]] = []
    for m in list_meshes():
        if m.unreachable is not None:
            keep.append(
                (m.name, "its agents cannot be reached from here; monarch-kernel ls says where it runs")
            )
        elif m.attached and m.name not in ours and not force:
            keep.append((m.name, "another controller is attached to it; --force stops it too"))
        else:
            stop.append(m.name)
    return stop, keep


def left_running(keep: list[tuple[str, str]]) -> list[str]:
    """What ``down --all`` says of the meshes it left running (``plan_down_all``)."""
    return [f"left running: {name} ({why})" for name, why in keep]


__all__ = [
    "all_names",
    "down",
    "down_one",
    "left_running",
    "mesh_table",
    "owner_text",
    "plan_down_all",
    "respawn",
    "running_meshes",
]
