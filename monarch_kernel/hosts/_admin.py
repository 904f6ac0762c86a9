"""Administering a mesh through its state file and its host agent, without being its
controller: is its agent alive, connect to it, stop it, list every running mesh.

This is what ``monarch-kernel ls``/``down``, ``%mesh ls``/``down`` and a process that
holds a ``ProcMesh`` it does not control use; a controller's own session
(``controller``) stops its mesh through its lease first.

REGISTRY-3: a state file is removed only when its agent is gone, never while the
agent runs (busy, stopped or hung).
"""

from __future__ import annotations

import math
import os
import signal
import warnings
from dataclasses import dataclass, field
from typing import Any

from monarch_kernel.control import AgentClient
from monarch_kernel.control._group import AgentGroup, HostLink
from monarch_kernel.errors import AgentUnresponsiveError, MeshAuthError, MonarchKernelError
from monarch_kernel.hosts import _registry
from monarch_kernel.hosts._registry import MeshRecord
from monarch_kernel.hosts._remote import end_job


def agent_alive(rec: MeshRecord) -> bool:
    """True if ``rec``'s agent process still runs on this host (whether or not it
    answers): a busy or stopped agent is not a stale record."""
    if rec.host != os.uname().nodename:
        return False
    try:
        with open(f"/proc/{rec.agent_pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{rec.agent_pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"monarch_kernel.hosts._agent_main" in cmd and state not in ("Z", "X")


def group_of(rec: MeshRecord) -> AgentGroup:
    """Clients of every host's agent of ``rec`` (one for a mesh on this host)."""
    nprocs = math.prod(rec.spec["per_host"].values()) * int(rec.spec.get("hosts") or 1)
    return AgentGroup(
        [
            HostLink(
                i,
                AgentClient(h["agent_addr"], rec.token, rec.ca or None),
                h["host"],
                h["first_rank"],
                h["procs"],
                h["agent_pid"],
            )
            for i, h in enumerate(rec.host_entries(nprocs))
        ]
    )


def connect(rec: MeshRecord) -> AgentGroup | None:
    """Clients of ``rec``'s agents if they answer as that mesh; None if it is gone
    (REGISTRY-3: only then may its record be removed). An agent that runs but does
    not answer raises ``AgentUnresponsiveError``; one that refuses the state file's
    token, ``MeshAuthError`` (the file does not belong to that agent). Across hosts,
    the mesh is there while any host's agent answers; it is gone when every host
    refuses the connection (its agents are not there)."""
    if rec.hosts:
        group = group_of(rec)
        states = [link.reach(timeout=3.0) for link in group.links]
        if "alive" in states:
            return group
        group.close()
        if "unreachable" in states:
            raise AgentUnresponsiveError(
                f"no host agent of mesh {rec.name!r} answers ({', '.join(h['host'] for h in rec.hosts)}): the hosts "
                f"are unreachable from here, or their agents are stopped. monarch-kernel down {rec.name} ends it.",
                mesh=rec.name,
            )
        return None
    group = group_of(rec)
    client = group.links[0].client
    try:
        if client.ping(timeout=3.0)["name"] == rec.name:
            return group
    except MeshAuthError:
        client.close()
        if not agent_alive(rec):
            return None
        raise MeshAuthError(
            f"mesh {rec.name!r}: its host agent (pid {rec.agent_pid}) refuses the token in the state "
            f"file {_registry.path_of(rec.name)}: the file was changed, or is another mesh's. "
            f"monarch-kernel down {rec.name} stops that agent; then start the mesh again."
        ) from None
    except MonarchKernelError as e:
        if agent_alive(rec):
            client.close()
            raise AgentUnresponsiveError(
                f"the host agent of mesh {rec.name!r} (pid {rec.agent_pid}) runs but does not answer: "
                f"{e}. If it is stopped (SIGSTOP), SIGCONT resumes it; monarch-kernel down "
                f"{rec.name} ends it.",
                mesh=rec.name,
                pid=rec.agent_pid,
            ) from None
    client.close()
    return None


def stop_unowned(rec: MeshRecord) -> bool:
    """Stops the mesh ``rec`` describes as an administrator (never fenced), through
    its agent; True if it was running."""
    try:
        client = connect(rec)
    except (
        AgentUnresponsiveError,
        MeshAuthError,
    ):  # hung, or not ours to talk to: its workers exit with it (AGENT-1)
        if not rec.hosts:
            os.kill(rec.agent_pid, signal.SIGKILL)
        end_job(rec.job)
        _registry.remove_if_ours(rec.name, rec.token)
        return True
    if client is None:
        _registry.remove_if_ours(rec.name, rec.token)
        end_job(rec.job)
        return False
    try:
        client.shutdown(epoch=0)
    except MonarchKernelError:
        pass  # a host that does not answer: its agent's idle timeout ends it
    finally:
        client.close()
    # After the shutdown, as Session.stop does: before it, the agent, not yet
    # stopping, could put the file back (REGISTRY-2) and leave it after "stopped".
    _registry.remove_if_ours(rec.name, rec.token)
    end_job(rec.job)
    return True


@dataclass
class MeshInfo:
    """One running mesh, as ``list_meshes()`` gives it."""

    name: str
    procs: int
    alive: int
    owner_epoch: int
    attached: bool
    agent_pid: int
    host: str
    spec: dict[str, Any]
    ephemeral: bool
    idle_timeout: float
    created: float
    #: Every host: ``{"host", "addr", "procs", "alive", "state"}``, state being "alive",
    #: "unreachable" or "gone" (its agent).
    hosts: list[dict[str, Any]] = field(default_factory=list)
    #: The controller that attached last, as it described itself (OWNER-1).
    owner: dict[str, Any] | None = None
    #: Seconds until the idle timeout stops it; None while a controller is attached.
    idle_left: float | None = None
    #: Every worker, as the agents list them.
    workers: list[dict[str, Any]] = field(default_factory=list)
    #: Its state file, as read for this listing (its token: not shown).
    record: MeshRecord | None = field(default=None, repr=False, compare=False)


def list_meshes() -> list[MeshInfo]:
    """The running meshes this user can attach to; stale state files are removed."""
    return [info for info in map(mesh_info, _registry.names()) if info is not None]


def mesh_info(name: str) -> MeshInfo | None:
    """The running mesh ``name`` as its agents describe it now, or None (not running;
    a stale state file is removed)."""
    with _registry.locked(name):
        rec = _registry.read(name)
        if rec is None:
            return None
        try:
            client = connect(rec)
        except (AgentUnresponsiveError, MeshAuthError) as e:
            warnings.warn(str(e), _registry.MeshStateWarning, stacklevel=3)
            return None
        if client is None:
            _registry.remove_if_ours(name, rec.token)
            warnings.warn(
                f"mesh {name!r}: its host agent (pid {rec.agent_pid}) is gone; its state file was removed",
                _registry.MeshStateWarning,
                stacklevel=3,
            )
            return None
    try:
        states = [link.reach(timeout=2.0) for link in client.links]
        first = next(link for link, st in zip(client.links, states) if st == "alive")
        ping = first.client.ping()
        workers = client.list_workers()
    except (MonarchKernelError, StopIteration):
        return None
    finally:
        client.close()
    hosts = [
        {
            "host": link.host or rec.host,
            "addr": link.addr,
            "procs": sum(w["rank"] in link.ranks for w in workers) if rec.hosts else len(workers),
            "alive": sum(w["rank"] in link.ranks and w["state"] == "running" for w in workers)
            if rec.hosts
            else sum(w["state"] == "running" for w in workers),
            "state": st,
            "ranks": sorted(link.ranks) if rec.hosts else [w["rank"] for w in workers],
        }
        for link, st in zip(client.links, states)
    ]
    return MeshInfo(
        name=name,
        procs=len(workers),
        alive=sum(w["state"] == "running" for w in workers),
        owner_epoch=ping["epoch"],
        attached=ping["watchers"] > 0,
        agent_pid=rec.agent_pid,
        host=rec.host,
        spec=rec.spec,
        ephemeral=rec.ephemeral,
        idle_timeout=rec.idle_timeout,
        created=rec.created,
        hosts=hosts,
        owner=ping["owner"],
        idle_left=ping["idle_left"],
        workers=workers,
        record=rec,
    )


__all__ = [
    "MeshInfo",
    "agent_alive",
    "connect",
    "list_meshes",
    "mesh_info",
    "stop_unowned",
]
