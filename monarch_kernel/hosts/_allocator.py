"""Allocators: where a mesh's host agents come from, behind one interface (Monarch's
``Allocator``/allocation family is the model).

An ``Allocator`` starts one host agent per host of a new mesh from one
``AgentConfig`` and returns an ``Allocation``: the agents (address, pid, host) and
the *job*, what it started beyond them, recorded in the mesh's state file so that
anyone who stops the mesh can end it (``release``) and tell why it ended
(``end_reason``). The controller's bring-up (``controller/_lifecycle.create``) is
one path for every allocator: configure, allocate, list the mesh in its state file,
attach, spawn the workers.

- ``LocalHost`` (``_local``): this machine; the agent is a child of this process.
- ``SSHHosts`` (``_ssh``): an agent per host over ``ssh``.
- ``SlurmHosts`` (``_slurm``): one ``srun`` makes the mesh's job, an agent per node.
- ``KubernetesPods`` (``_k8s``): one Kubernetes Job makes the mesh's pods, an agent
  in each.

A new allocator is one new module with a class that has the ``Allocator`` methods,
and a line in ``_KINDS`` if its job needs ending (``end(job)``, ``end_reason(job,
wait, host)``).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from monarch_kernel.errors import MeshStartError

#: The line an agent prints once it listens: ``READY <addr> <pid> <hostname> [<job>] id=<host id>``.
READY = "MONARCH_AGENT_READY"
#: How the agent module is run on a host.
AGENT_ARGS = ["-m", "monarch_kernel.hosts._agent_main"]


@dataclass(frozen=True)
class AgentConfig:
    """What a host agent is handed, as one JSON line on its stdin (never argv, the
    environment or a file: it holds the token and the TLS key, TLS-3). The one
    description of it: allocators write it (``to_line``), ``_agent_main`` reads it
    (``from_line``) and starts the native agent (``native/src/agent/mod.rs``'s
    ``AgentConfig``) with its fields."""

    name: str
    token: str
    #: Seconds the agent waits with no controller before it stops the mesh (AGENT-2).
    idle_timeout: float
    #: Opaque to the agent: the mesh's spec, handed to every controller that attaches.
    meta: str = ""
    #: The address the agent and its workers listen on; "auto": the address of its
    #: host that faces the controller (across hosts).
    bind_host: str = "127.0.0.1"
    #: Where its logs go; "": its host's own state folder.
    log_dir: str = ""
    #: REGISTRY-2: the state file the agent writes as it listens (from ``record``,
    #: with its own address and pid), keeps while it runs and removes as it stops.
    state_file: str = ""
    record: dict[str, Any] | None = None
    #: The mesh's TLS identity, ``{"ca", "cert", "key"}`` (TLS-1); None: plaintext.
    tls: dict[str, str] | None = None
    #: ``XDG_STATE_HOME`` for the agent (a shared home: the same folder on every host).
    state_home: str = ""

    def to_line(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode() + b"\n"

    @classmethod
    def from_line(cls, line: str | bytes) -> AgentConfig:
        data = json.loads(line)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:  # (an agent of another version than its controller)
            raise ValueError(
                f"the agent's configuration has fields this monarch-kernel does not know: {unknown}; "
                "the controller and its hosts must run the same monarch-kernel version"
            )
        return cls(**data)


@dataclass(frozen=True)
class AgentInfo:
    """An agent an allocator started: where it listens, its pid and host name there,
    the SLURM job it runs in (srun), and its host's ``host_id()``."""

    addr: str
    pid: int
    host: str
    job_id: str = ""
    host_id: str = ""

    @classmethod
    def parse_ready(cls, line: str) -> AgentInfo | None:
        """The agent a ``READY`` line describes; None for any other line."""
        parts = line.split()
        if len(parts) >= 4 and parts[0] == READY:
            rest = parts[4:]  # the job id (absent outside SLURM), then id=HOST_ID
            job = next((p for p in rest if not p.startswith("id=")), "")
            hid = next((p[3:] for p in rest if p.startswith("id=")), "")
            return cls(addr=parts[1], pid=int(parts[2]), host=parts[3], job_id=job, host_id=hid)
        return None


@dataclass
class AgentProcess:
    """An agent started as a child of this process (``LocalHost``): its process (ours
    to reap), address and log folder."""

    popen: subprocess.Popen[bytes]
    addr: str
    log_dir: Path

    def wait(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


@dataclass
class Allocation:
    """What an allocator started: an agent per host, in rank order, and the job
    record (``{"kind": ..., ...}``; ``{}``: nothing beyond the agents)."""

    agents: list[AgentInfo]
    job: dict[str, Any]
    #: The local agent, a child of this process (``LocalHost``); None across hosts.
    process: AgentProcess | None = None
    #: Agents that were started before, with credentials of their own (a pool of
    #: standing pods): the mesh's token and CA are theirs, not the configuration's.
    token: str = ""
    ca: str = ""


class Allocator(Protocol):
    """Where a mesh's host agents come from (see the module docstring)."""

    @property
    def kind(self) -> str:
        """Its kind, in words ("local", "ssh", "slurm")."""

    @property
    def python(self) -> str:
        """The interpreter that runs the agents and workers on its hosts."""

    @property
    def nhosts(self) -> int | None:
        """How many hosts it gives; None for this host alone (a mesh without a
        ``hosts`` dimension)."""

    @property
    def shares_files(self) -> bool:
        """Whether its hosts see this process's files (this host, a shared home): its
        workers then start in this process's working directory where their host has
        it. Pods do not: their workers start in the image's, and
        ``sync_workspace`` brings the notebook's files."""

    @property
    def remote(self) -> bool:
        """Whether its agents run on other hosts: their control plane is TLS
        (TLS-1), they bind the address facing this controller, and an ephemeral
        mesh's hosts wait out a partition (``REMOTE_LEASE_GRACE_S``)."""

    def worker_env(self, per_host: dict[str, int]) -> dict[str, str]:
        """Checks that its hosts can hold ``per_host`` procs each (raising
        ``MeshSpecError`` if not) and returns what the workers' environment needs
        for it (GPU placement: PLACE-1)."""

    def allocate(self, cfg: AgentConfig) -> Allocation:
        """Starts an agent per host with ``cfg``; on a partial failure, stops the
        agents that started (``stop_started``) and raises ``MeshStartError``."""

    def picked(self, indices: Sequence[int]) -> Allocator:
        """The same allocator for the hosts at ``indices`` (``HostMesh.slice``)."""

    def with_python(self, python: str) -> Allocator:
        """The same allocator, whose agents and workers run ``python``."""

    def describe(self) -> str:
        """In words, for ``repr(HostMesh)``."""


def stop_started(error: MeshStartError, started: list[AgentInfo], cfg: AgentConfig) -> MeshStartError:
    """Some hosts' agents started, others did not: stops those that did (nothing may
    run unlisted) and returns ``error`` to raise."""
    from monarch_kernel.control import AgentClient

    ca = (cfg.tls or {}).get("ca")
    for a in started:
        try:
            AgentClient(a.addr, cfg.token, ca).shutdown(epoch=0, timeout=5)
        except Exception:
            pass
    return error


#: The modules of allocators whose job needs ending beyond its agents, by job kind.
_KINDS = {"slurm": "monarch_kernel.hosts._slurm", "k8s": "monarch_kernel.hosts._k8s_ends"}


def _module_of(job: dict[str, Any]) -> Any:
    path = _KINDS.get(str(job.get("kind", "")))
    if path is None:
        return None
    import importlib

    return importlib.import_module(path)


def release(job: dict[str, Any]) -> bool:
    """Ends what the allocator started beyond the agents (a SLURM job). True if there
    was such a thing and it was ended (its agents end with it, wherever they run)."""
    module = _module_of(job)
    return bool(module is not None and module.end(job))


def follow(job: dict[str, Any]) -> None:
    """A session of the job's mesh starts: the allocator may follow its hosts from now
    on, to tell later how they ended (Kubernetes: a watch of the mesh's pods)."""
    module = _module_of(job)
    if module is not None and hasattr(module, "follow"):
        module.follow(job)


def end_reason(job: dict[str, Any], wait: float = 3.0, host: str | None = None) -> str | None:
    """Why a job's agents went away (or, with ``host``, that host's agent), in words,
    if the allocator can tell (a SLURM job that ended, a Kubernetes pod deleted or
    OOM-killed: given ``wait`` s to record it, as the agents can go first)."""
    module = _module_of(job)
    return None if module is None else module.end_reason(job, wait, host)


def new_tls_identity() -> dict[str, str]:
    """A new TLS identity for one mesh (TLS-1): ``{"ca", "cert", "key"}`` (PEM), the
    mesh's CA certificate, and the server certificate and key that every agent and
    worker of the mesh presents. Only ``"ca"`` may be kept (in the state file):
    the key goes to the agents in their configuration and nowhere else (TLS-3)."""
    from monarch_kernel import _native

    ca, cert, key = _native.tls_identity()
    return {"ca": ca, "cert": cert, "key": key}


__all__ = [
    "AGENT_ARGS",
    "READY",
    "AgentConfig",
    "AgentProcess",
    "AgentInfo",
    "Allocation",
    "Allocator",
    "end_reason",
    "follow",
    "new_tls_identity",
    "release",
    "stop_started",
]
