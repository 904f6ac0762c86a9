"""State files of named meshes: ``$XDG_STATE_HOME/monarch-kernel/meshes/NAME.json``.

A state file says how to reach a running mesh's host agent (address, pid, token) and
what the mesh was created with (spec, options, epoch), and on which host each agent
runs (``host_id``: a pid and a loopback address mean something only there). It holds
the mesh's secret token, so it is written with mode 0600 in a folder of mode 0700,
atomically (written aside, then renamed). REGISTRY-1: a corrupt file, or one whose
agent is known to be gone (``_admin.connect``, REGISTRY-3), is reported with a
warning and removed; reading the registry never raises because of what is on disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from monarch_kernel._caller import user_stacklevel
from monarch_kernel.errors import MeshSpecError, MeshStateError
from monarch_kernel.hosts import state_dir
from monarch_kernel.hosts._local import not_writable

VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class MeshStateWarning(UserWarning):
    """A mesh's state file was corrupt or stale and has been removed."""


@dataclass
class MeshRecord:
    """What a state file holds."""

    name: str
    token: str = field(repr=False)
    agent_addr: str
    agent_pid: int
    host: str
    #: ``{"per_host": {"procs": 4}, "env": {...}}``: what get-or-create compares.
    spec: dict[str, Any]
    idle_timeout: float
    ephemeral: bool
    created: float = field(default_factory=time.time)
    epoch: int = 0
    version: int = VERSION
    #: A mesh across hosts: every host's agent, in rank order, as
    #: ``{"host", "agent_addr", "agent_pid", "first_rank", "procs", "host_id"}`` (the
    #: first is also ``host``/``agent_addr``/``agent_pid`` above). Empty for a mesh on
    #: one host.
    hosts: list[dict[str, Any]] = field(default_factory=list)
    #: How its hosts were had: ``{"kind": "ssh", "targets": [...], "ssh_args": [...]}`` or
    #: ``{"kind": "slurm", "job_id": "...", "launcher_pid": N, "own_allocation": bool}``.
    job: dict[str, Any] = field(default_factory=dict)
    #: The mesh's TLS CA certificate (PEM) when its control plane runs TLS (a mesh
    #: across hosts, TLS-1); never its key.
    ca: str = ""
    #: The host its (first) agent runs on, as ``_host_id.host_id()`` names it there
    #: ("" when unknown: an older file); only there may its pid be judged.
    host_id: str = ""
    #: The host the mesh was started from (its first controller's ``host_id()``):
    #: from there, an agent's address refusing a connection means the agent is gone.
    started_from: str = ""

    def host_entries(self, nprocs: int) -> list[dict[str, Any]]:
        """Every host's agent (one entry for a mesh on this host)."""
        if self.hosts:
            return self.hosts
        return [
            {
                "host": self.host,
                "agent_addr": self.agent_addr,
                "agent_pid": self.agent_pid,
                "first_rank": 0,
                "procs": nprocs,
                "host_id": self.host_id,
            }
        ]

    @classmethod
    def from_json(cls, data: Any) -> MeshRecord:
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        if data.get("version") != VERSION:
            raise ValueError(f"unknown state file version {data.get('version')!r}")
        known = {f.name for f in fields(cls)}  # (a newer version's fields are not corruption)
        rec = cls(**{k: v for k, v in data.items() if k in known})
        if not isinstance(rec.token, str) or not rec.token or not isinstance(rec.agent_addr, str):
            raise ValueError("missing token or agent address")
        if not isinstance(rec.spec, dict) or not isinstance(rec.spec.get("per_host"), dict):
            raise ValueError("missing spec")
        return rec


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise MeshSpecError(
            f"mesh name {name!r} is not valid: use 1 to 64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit (e.g. 'train')"
        )
    return name


def meshes_dir() -> Path:
    """The folder of state files, made if need be (a ``MeshStateError`` naming it
    when it cannot be)."""
    d = state_dir() / "meshes"
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise not_writable(d, e) from e
    return d


def path_of(name: str) -> Path:
    return meshes_dir() / f"{name}.json"


def write(rec: MeshRecord) -> None:
    """Writes ``rec`` atomically, readable by its owner only; a folder that cannot be
    written (read-only, full) is a MeshStateError naming it."""
    final = path_of(rec.name)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(rec), f, indent=1)
        os.replace(tmp, final)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise MeshStateError(
            f"mesh {rec.name!r}: cannot write its state file in {final.parent} ({e.strerror or e}); "
            f"make the folder writable (or free space there), or set XDG_STATE_HOME to another folder"
        ) from e


def discard(name: str, reason: str | None = None) -> None:
    """Removes the state file of ``name``; with ``reason``, says so in a warning."""
    try:
        path_of(name).unlink()
    except FileNotFoundError:
        return
    if reason:
        warnings.warn(
            f"mesh {name!r}: {reason}; its state file was removed",
            MeshStateWarning,
            stacklevel=user_stacklevel(),
        )


def remove_if_ours(name: str, token: str) -> None:
    """Removes the state file of ``name`` if it still describes the mesh with ``token``
    (a mesh created again under the same name keeps its new file)."""
    try:
        data = json.loads(path_of(name).read_text())
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and data.get("token") == token:
        discard(name)


def read(name: str, wait_restore: float = 0.0) -> MeshRecord | None:
    """The record of ``name``, or None; a corrupt file is reported and removed. With
    ``wait_restore``, a corrupt file's agent, if it runs, gets that long to put the
    file back (REGISTRY-2: it does within a second), so a mesh being restored is not
    taken for one that is gone."""
    rec = _read(name)
    if rec is _CORRUPT and wait_restore > 0:
        deadline = time.monotonic() + wait_restore
        while rec is _CORRUPT or (rec is None and time.monotonic() < deadline):
            time.sleep(0.05)
            rec = _read(name)
            if time.monotonic() >= deadline:
                break
    return rec if isinstance(rec, MeshRecord) else None


#: What ``_read`` says of a file it found corrupt (and removed).
_CORRUPT: Any = object()


def _read(name: str) -> Any:
    path = path_of(name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.warn(
            f"mesh {name!r}: cannot read {path}: {e}", MeshStateWarning, stacklevel=user_stacklevel()
        )
        return None
    try:
        return MeshRecord.from_json(json.loads(text))
    except (ValueError, TypeError) as e:
        discard(name, f"state file {path} is corrupt ({e})")
        return _CORRUPT


def names() -> list[str]:
    """The names of the meshes that have a state file (a look: nothing is made)."""
    d = state_dir() / "meshes"
    return sorted(p.stem for p in d.glob("*.json") if not p.name.startswith(".")) if d.is_dir() else []


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """Holds the lock of mesh ``name``: one process at a time creates or replaces it.
    A lock file that cannot be made is a ``MeshStateError`` naming the folder."""
    path = meshes_dir() / f".{name}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise not_writable(path.parent, e) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


__all__ = [
    "MeshRecord",
    "MeshStateWarning",
    "check_name",
    "discard",
    "locked",
    "meshes_dir",
    "names",
    "path_of",
    "read",
    "remove_if_ours",
    "write",
]
