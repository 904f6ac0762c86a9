"""Administering a mesh through its state file and its host agent, without being its
controller: is its agent alive, connect to it, stop it, list every running mesh.

This is what ``monarch-kernel ls``/``down``, ``%mesh ls``/``down`` and a process that
holds a ``ProcMesh`` it does not control use; a controller's own session
(``controller``) stops its mesh through its lease first.

REGISTRY-3: a state file is removed only when its agent is gone, never while the
agent runs (busy, stopped or hung).
"""

from __future__ import annotations

import os
import signal
import warnings
from dataclasses import dataclass
from typing import Any

from monarch_kernel.control import AgentClient
from monarch_kernel.errors import AgentUnresponsiveError, MeshAuthError, MonarchKernelError
from monarch_kernel.hosts import _registry
from monarch_kernel.hosts._registry import MeshRecord


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


def connect(rec: MeshRecord) -> AgentClient | None:
    """A client of ``rec``'s agent if it answers as that mesh; None if it is gone
    (REGISTRY-3: only then may its record be removed). An agent that runs but does
    not answer raises ``AgentUnresponsiveError``; one that refuses the state file's
    token, ``MeshAuthError`` (the file does not belong to that agent)."""
    client = AgentClient(rec.agent_addr, rec.token)
    try:
        if client.ping(timeout=3.0)["name"] == rec.name:
            return client
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
        os.kill(rec.agent_pid, signal.SIGKILL)
        _registry.remove_if_ours(rec.name, rec.token)
        return True
    _registry.remove_if_ours(rec.name, rec.token)
    if client is None:
        return False
    try:
        client.shutdown(epoch=0)
    except MonarchKernelError:
        pass
    finally:
        client.close()
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


def list_meshes() -> list[MeshInfo]:
    """The running meshes this user can attach to; stale state files are removed."""
    out = []
    for name in _registry.names():
        with _registry.locked(name):
            rec = _registry.read(name)
            if rec is None:
                continue
            try:
                client = connect(rec)
            except (AgentUnresponsiveError, MeshAuthError) as e:
                warnings.warn(str(e), _registry.MeshStateWarning, stacklevel=2)
                continue
            if client is None:
                _registry.remove_if_ours(name, rec.token)
                warnings.warn(
                    f"mesh {name!r}: its host agent (pid {rec.agent_pid}) is gone; its state file was removed",
                    _registry.MeshStateWarning,
                    stacklevel=2,
                )
                continue
        try:
            ping = client.ping()
            workers = client.list_workers()
        except MonarchKernelError:
            continue
        finally:
            client.close()
        out.append(
            MeshInfo(
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
            )
        )
    return out


__all__ = [
    "MeshInfo",
    "agent_alive",
    "connect",
    "list_meshes",
    "stop_unowned",
]
