"""Administering a mesh through its state file and its host agent, without being its
controller: is its agent alive, connect to it, stop it, list every running mesh.

This is what ``monarch-kernel ls``/``down``, ``%mesh ls``/``down``, the Meshes panel
and a process that holds a ``ProcMesh`` it does not control use; a controller's own
session (``controller``) stops its mesh through its lease first.

REGISTRY-3: a state file is removed only when its mesh is known to be gone, never
because its agents cannot be reached from here, and never while they run (busy,
stopped or hung). Each host's agent is known gone when this process runs on that
host (``_host_id``: same hostname, machine, network and pid namespaces) and no agent
runs at its pid, or when this process runs where the mesh was started from and the
agent's (not loopback) address refuses the connection or is another mesh's; the
whole mesh is gone when every host's agent is, or when its SLURM job has ended.
Anything else (no answer, a refused connection in another network namespace, a pid
seen from another host) proves nothing: the mesh is listed as unreachable from here,
with its hosts, and ``connect`` raises ``MeshUnreachableError``, so attach and
get-or-create never make a second mesh of a name that may run.
"""

from __future__ import annotations

import ipaddress
import math
import os
import signal
import socket
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from monarch_kernel._caller import user_stacklevel
from monarch_kernel.control import AgentClient, AgentGroup, HostLink
from monarch_kernel.errors import (
    AgentUnresponsiveError,
    MeshAuthError,
    MeshUnreachableError,
    MonarchKernelError,
)
from monarch_kernel.hosts import _registry
from monarch_kernel.hosts._allocator import end_reason, release
from monarch_kernel.hosts._host_id import is_here
from monarch_kernel.hosts._registry import MeshRecord

#: How many meshes ``list_meshes`` looks at at once (REGISTRY-4).
LOOKS_AT_ONCE = 8
#: How long a look waits for each agent's answer.
LOOK_TIMEOUT_S = 3.0


def agent_running(pid: int) -> bool:
    """True if a host agent runs as ``pid`` here (whether or not it answers): only
    meaningful on the agent's own host (``_host_id.is_here``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"monarch_kernel.hosts._agent_main" in cmd and state not in ("Z", "X")


def agent_alive(rec: MeshRecord) -> bool:
    """True if ``rec``'s (first) agent runs, as seen on its own host; False also where
    this process runs on another host (it cannot tell from here)."""
    return is_here(rec.host_id) and agent_running(rec.agent_pid)


def group_of(rec: MeshRecord) -> AgentGroup:
    """Clients of every host's agent of ``rec`` (one for a mesh on this host)."""
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
            for i, h in enumerate(_entries(rec))
        ]
    )


def _entries(rec: MeshRecord) -> list[dict[str, Any]]:
    return rec.host_entries(math.prod(rec.spec["per_host"].values()) * int(rec.spec.get("hosts") or 1))


def _knock(link: HostLink, name: str, timeout: float) -> str:
    """What answers at a host agent's address, seen from here: "alive" (the agent of
    mesh ``name``), "refused" (the connection is refused: nothing listens there),
    "other" (something that is not that mesh's agent: it refuses the token, or is
    another mesh's) or "silent" (nothing answers in time: no route, a partition, a
    stopped agent)."""
    host, port = link.addr.rsplit(":", 1)
    try:  # a plain connection first: the gRPC channel's own state lags after a loss
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"
    try:
        return "alive" if link.client.ping(timeout=timeout)["name"] == name else "other"
    except MeshAuthError:
        return "other"
    except MonarchKernelError:
        return "silent"


def _loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _gone_at(rec: MeshRecord, entry: dict[str, Any], knock: str) -> bool:
    """Whether the agent of host ``entry`` is known to be gone, from here (REGISTRY-3)."""
    if is_here(entry.get("host_id")):  # its own host: its pid says
        return not agent_running(int(entry["agent_pid"]))
    # Where the mesh was started from, its agents' addresses are theirs: a host that
    # answers that nothing of this mesh listens there has no agent of it.
    return knock in ("refused", "other") and is_here(rec.started_from) and not _loopback(entry["agent_addr"])


def _host_name(hid: str) -> str:
    return hid.split("/", 1)[0]


def _unreachable(rec: MeshRecord, entries: list[dict[str, Any]], knocks: list[str]) -> MeshUnreachableError:
    """What to say of a mesh none of whose agents answers here, not known gone."""
    hosts = ", ".join(dict.fromkeys(str(e["host"]) for e in entries))
    what = (
        f"its host agent on {hosts} does not" if len(entries) == 1 else f"none of its host agents ({hosts})"
    )
    said = {
        "silent": "nothing answers at its address",
        "refused": "its address refuses here, which is not the agent's host",
        "other": "something else answers at its address here, which is not the agent's host",
    }
    detail = said[next((k for k in knocks if k != "silent"), "silent")]
    path = _registry.path_of(rec.name)
    started = _host_name(rec.started_from)
    if is_here(rec.started_from):  # a partition, or stopped agents
        then = f"use it once they answer again, or end it on {hosts} with `monarch-kernel down {rec.name}`"
    else:
        where = started if started and started not in hosts.split(", ") else hosts
        then = f"use it from {where}, or end it there with `monarch-kernel down {rec.name}`"
    return MeshUnreachableError(
        f"mesh {rec.name!r} cannot be reached from here ({os.uname().nodename}): {what} answer this "
        f"process ({detail}). It may still run, so its state file {path} stays: {then}; or pick another "
        "name. If its hosts are gone for good, remove that file.",
        mesh=rec.name,
        host=str(entries[0]["host"]),
        pid=int(entries[0]["agent_pid"]),
    )


def connect(rec: MeshRecord, timeout: float = LOOK_TIMEOUT_S) -> AgentGroup | None:
    """Clients of ``rec``'s agents if any answers as that mesh; None if the mesh is
    known to be gone (REGISTRY-3: only then may its record be removed). Otherwise it
    raises: on the agent's own host, ``AgentUnresponsiveError`` for an agent that runs
    but does not answer, ``MeshAuthError`` for one that refuses the state file's token
    (the file does not belong to that agent); anywhere else ``MeshUnreachableError``
    (the mesh may run: it cannot be told from here)."""
    group = group_of(rec)
    entries = _entries(rec)
    knocks = group.each(lambda link: _knock(link, rec.name, timeout))
    if "alive" in knocks:
        return group
    group.close()
    if all(_gone_at(rec, e, k) for e, k in zip(entries, knocks)) or end_reason(rec.job, 0.0):
        return None
    if not rec.hosts and is_here(rec.host_id):  # its own host, and its agent runs
        if knocks[0] == "other":
            raise MeshAuthError(
                f"mesh {rec.name!r}: its host agent (pid {rec.agent_pid}) refuses the token in the state "
                f"file {_registry.path_of(rec.name)}: the file was changed, or is another mesh's. "
                f"monarch-kernel down {rec.name} stops that agent; then start the mesh again."
            )
        raise AgentUnresponsiveError(
            f"the host agent of mesh {rec.name!r} (pid {rec.agent_pid}) runs but does not answer "
            f"at {rec.agent_addr}. If it is stopped (SIGSTOP), SIGCONT resumes it; monarch-kernel down "
            f"{rec.name} ends it.",
            mesh=rec.name,
            pid=rec.agent_pid,
        )
    raise _unreachable(rec, entries, knocks)


def stop_unowned(rec: MeshRecord) -> bool:
    """Stops the mesh ``rec`` describes as an administrator (never fenced), through
    its agent; True if it was running. A mesh whose agents cannot be reached from
    here is left running, with its state file (``MeshUnreachableError``), unless its
    SLURM job can be ended from here."""
    try:
        client = connect(rec)
    except MeshUnreachableError:
        if release(rec.job):  # scancel ends its agents, wherever they run
            _registry.remove_if_ours(rec.name, rec.token)
            return True
        raise
    except (AgentUnresponsiveError, MeshAuthError):
        # On its own host (connect says so only there): hung, or not ours to talk to;
        # its workers exit with it (AGENT-1).
        os.kill(rec.agent_pid, signal.SIGKILL)
        _registry.remove_if_ours(rec.name, rec.token)
        return True
    if client is None:
        _registry.remove_if_ours(rec.name, rec.token)
        release(rec.job)
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
    release(rec.job)
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
    #: By rank, what each running worker uses as its agent reads it (VIEW-2), when
    #: asked (``mesh_info(..., usage_wait=, usage_beyond=)``); None for a rank that
    #: did not answer.
    usage: dict[int, dict[str, Any] | None] | None = None
    #: Its state file, as read for this listing (its token: not shown).
    record: MeshRecord | None = field(default=None, repr=False, compare=False)
    #: None while its agents answer; else why they cannot be reached from here, on
    #: which hosts and what to do (REGISTRY-3): the mesh may run, nothing here can
    #: tell, and what its agents would say (procs alive, owner) is not known.
    unreachable: str | None = None


def list_meshes(usage_wait: float | None = None, usage_beyond: int = 0) -> list[MeshInfo]:
    """The running meshes of this user (those whose agents cannot be reached from here
    too, marked ``unreachable``); the state files of meshes known gone are removed.
    ``usage_wait``, ``usage_beyond``: as ``mesh_info``'s. The meshes are looked at
    concurrently (REGISTRY-4)."""
    return look_at(_registry.names(), usage_wait=usage_wait, usage_beyond=usage_beyond)[0]


def look_at(
    names: list[str],
    within: float | None = None,
    usage_wait: float | None = None,
    usage_beyond: int = 0,
) -> tuple[list[MeshInfo], list[str]]:
    """REGISTRY-4: ``mesh_info`` of each of ``names``, up to ``LOOKS_AT_ONCE`` at a time
    (a mesh whose agents do not answer, or whose allocator is slow to say its job
    ended, takes seconds: one after another, a few stale state files made a kernel
    start wait minutes). The running meshes in the order of ``names``, and the names
    not looked at in time: with ``within``, this returns after that many seconds and
    the looks still going finish in the background (their threads do not keep the
    process alive); an error of a look is raised once all are done."""
    todo = list(names)
    infos: dict[str, MeshInfo | None] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    all_done = threading.Event()

    def look() -> None:
        while True:
            with lock:
                if not todo:
                    if len(infos) + len(errors) == len(names):
                        all_done.set()
                    return
                name = todo.pop(0)
            try:
                info = mesh_info(name, usage_wait, usage_beyond)
            except BaseException as e:  # raised in the caller's thread, below
                with lock:
                    errors.append(e)
                continue
            with lock:
                infos[name] = info

    if not names:
        return [], []
    for _ in range(min(LOOKS_AT_ONCE, len(names))):
        threading.Thread(target=look, name="monarch-look", daemon=True).start()
    finished = all_done.wait(within)
    with lock:
        if finished and errors:
            raise errors[0]
        found = [info for n in names if (info := infos.get(n)) is not None]
        return found, [] if finished else [n for n in names if n not in infos]


def mesh_info(name: str, usage_wait: float | None = None, usage_beyond: int = 0) -> MeshInfo | None:
    """The running mesh ``name`` as its agents describe it now, or as its state file
    does when they cannot be reached from here (``unreachable``); None when it does
    not run (the state file of a mesh known gone is removed: REGISTRY-3).
    ``usage_wait``: with more than ``usage_beyond`` workers running, also what each
    uses, read by the agents (VIEW-2), each worker having that many seconds to answer
    its agent's ping."""
    with _registry.locked(name):
        rec = _registry.read(name)
        if rec is None:
            return None
        try:
            client = connect(rec)
        except AgentUnresponsiveError as e:  # (MeshUnreachableError too): it may run
            return _unreached_info(rec, str(e))
        except MeshAuthError as e:
            warnings.warn(str(e), _registry.MeshStateWarning, stacklevel=user_stacklevel())
            return None
        if client is None:
            _registry.remove_if_ours(name, rec.token)
            warnings.warn(
                f"mesh {name!r}: its host agent (pid {rec.agent_pid}) is gone; its state file was removed",
                _registry.MeshStateWarning,
                stacklevel=user_stacklevel(),
            )
            return None
    try:
        # (a picture of now: an agent that does not answer is unreachable, whatever the cause)
        states = [
            "unreachable" if st == "mute" else st for st in client.each(lambda link: link.reach(timeout=2.0))
        ]
        first = next(link for link, st in zip(client.links, states) if st == "alive")
        ping = first.client.ping()
        workers = client.list_workers()
        running = sum(w["state"] == "running" for w in workers)
        usage = client.usage(usage_wait) if usage_wait is not None and running > usage_beyond else None
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
    return _info(
        rec,
        procs=len(workers),
        alive=sum(w["state"] == "running" for w in workers),
        owner_epoch=ping["epoch"],
        attached=ping["watchers"] > 0,
        hosts=hosts,
        owner=ping["owner"],
        idle_left=ping["idle_left"],
        workers=workers,
        usage=usage,
    )


def _info(rec: MeshRecord, **seen: Any) -> MeshInfo:
    """A mesh's ``MeshInfo``: what its state file says, with what was ``seen`` of it."""
    return MeshInfo(
        name=rec.name,
        agent_pid=rec.agent_pid,
        host=rec.host,
        spec=rec.spec,
        ephemeral=rec.ephemeral,
        idle_timeout=rec.idle_timeout,
        created=rec.created,
        record=rec,
        **seen,
    )


def _unreached_info(rec: MeshRecord, why: str) -> MeshInfo:
    """A mesh whose agents do not answer here, as its state file describes it."""
    entries = _entries(rec)
    return _info(
        rec,
        procs=sum(int(e["procs"]) for e in entries),
        alive=0,
        owner_epoch=rec.epoch,
        attached=False,
        hosts=[
            {
                "host": e["host"],
                "addr": e["agent_addr"],
                "procs": int(e["procs"]),
                "alive": 0,
                "state": "unreachable",
                "ranks": list(range(int(e["first_rank"]), int(e["first_rank"]) + int(e["procs"]))),
            }
            for e in entries
        ],
        unreachable=why,
    )


__all__ = [
    "LOOK_TIMEOUT_S",
    "MeshInfo",
    "agent_alive",
    "agent_running",
    "connect",
    "list_meshes",
    "look_at",
    "mesh_info",
    "stop_unowned",
]
