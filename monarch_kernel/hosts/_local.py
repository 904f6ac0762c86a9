"""The local allocator (``LocalHost``): starts a host agent on this machine, detached
from the caller (its own session), so that Jupyter's interrupt and restart never
reach it; and this host's state folder, logs and room for workers."""

from __future__ import annotations

import math
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from monarch_kernel.errors import MeshSpecError, MeshStartError, MeshStateError
from monarch_kernel.hosts._allocator import READY, AgentConfig, AgentInfo, AgentProcess, Allocation


def state_dir() -> Path:
    """``$XDG_STATE_HOME/monarch-kernel`` (default ``~/.local/state/monarch-kernel``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "monarch-kernel"


#: Logs of a named mesh that no longer runs are removed this long after it started.
KEEP_LOGS_S = 7 * 24 * 3600.0


def not_writable(path: Path, e: OSError) -> MeshStateError:
    """What to say when ``path``, in the state folder, cannot be made or written."""
    return MeshStateError(
        f"cannot write in the state folder {path} ({e.strerror or e}): make it writable (or free "
        f"space there), or set XDG_STATE_HOME to a folder you can write (now {state_dir().parent})"
    )


def private_dir(path: Path) -> Path:
    """``path`` (and its parents under the state folder) as folders only their owner
    can read: logs hold what the workers printed. One that cannot be made is a
    ``MeshStateError`` naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
    except OSError as e:
        raise not_writable(path, e) from e
    return path


def fresh_log_dir(name: str) -> Path:
    """The log folder of a new mesh ``name`` (mode 0700; the logs of an earlier mesh
    of that name are removed first), after removing the logs of meshes that stopped
    more than ``KEEP_LOGS_S`` ago, and of unnamed meshes that stopped (nobody can
    attach to them again). A mesh that runs keeps its logs: its state file names it."""
    logs = private_dir(state_dir() / "logs")
    private_dir(state_dir())
    meshes = state_dir() / "meshes"
    now = time.time()
    for d in logs.iterdir():
        if (meshes / f"{d.name.split('@')[0]}.json").exists():
            continue  # running (NAME@HOST: a host's logs of a mesh across hosts)
        try:  # (a folder's time changes when a log is created: its mesh's last start)
            stale = now - d.stat().st_mtime > KEEP_LOGS_S
        except OSError:
            continue
        if d.name == name or d.name.startswith("anon-") or stale:
            shutil.rmtree(d, ignore_errors=True)
    return private_dir(logs / name)


#: What one worker is reckoned to need when the host's room is checked: memory (an
#: idle worker, before user code imports torch, uses about 60 MiB) and threads.
WORKER_MEMORY = 128 << 20
WORKER_THREADS = 16
#: Allows more procs than the host's room seems to allow (the check is a guard against
#: a typo, not a scheduler).
MAX_PROCS_ENV = "MONARCH_MAX_PROCS"


def host_room() -> tuple[int, str]:
    """How many workers this host can hold (at most), and what limits it, in words."""
    available = _available_memory()
    limits = [(available // WORKER_MEMORY, f"{available >> 20} MiB of memory available")]
    try:
        with open("/proc/sys/kernel/threads-max") as f:
            threads_max = int(f.read())
        with open("/proc/loadavg") as f:
            in_use = int(f.read().split()[3].split("/")[1])
        limits.append(
            ((threads_max - in_use) // WORKER_THREADS, f"{threads_max - in_use} more threads allowed")
        )
    except (OSError, ValueError, IndexError):
        pass
    soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft // WORKER_THREADS, f"ulimit -u {soft}"))
    room, why = min(limits)
    return max(room, 1), why


def _available_memory() -> int:
    """Bytes of memory available to new processes (``MemAvailable``; read directly,
    as importing psutil would cost a mesh's start some milliseconds)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    return int(psutil.virtual_memory().available)


def check_room(nprocs: int) -> None:
    """Refuses a mesh of ``nprocs`` workers that this host cannot hold, naming the
    limit and the override (``MONARCH_MAX_PROCS``)."""
    override = os.environ.get(MAX_PROCS_ENV)
    if override:
        try:
            allowed = int(override)
        except ValueError:
            raise MeshSpecError(f"{MAX_PROCS_ENV}={override!r} is not a number of procs") from None
        if nprocs > allowed:
            raise MeshSpecError(f"{nprocs} procs is more than {MAX_PROCS_ENV}={allowed} allows")
        return
    room, why = host_room()
    if nprocs > room:
        raise MeshSpecError(
            f"{nprocs} procs is more than this host can hold: about {room} ({why}, reckoning "
            f"{WORKER_MEMORY >> 20} MiB and {WORKER_THREADS} threads per worker). Ask for fewer, or set "
            f"{MAX_PROCS_ENV}=N in the environment to allow up to N."
        )


def start_local_agent(cfg: AgentConfig, timeout: float = 30.0) -> AgentProcess:
    """Starts a host agent on this machine with ``cfg`` (its log folder made fresh
    here) and waits until it listens. With ``cfg.state_file`` and ``cfg.record`` the
    agent writes the mesh's state file itself as it listens (REGISTRY-2)."""
    log_dir = fresh_log_dir(cfg.name)
    cfg = replace(cfg, log_dir=str(log_dir))
    fd = os.open(log_dir / "agent.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log_file:  # the child keeps its own copy
        popen = subprocess.Popen(
            [sys.executable, "-m", "monarch_kernel.hosts._agent_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,
            close_fds=True,
        )
    assert popen.stdin is not None and popen.stdout is not None
    popen.stdin.write(cfg.to_line())  # on the agent's stdin only (TLS-3)
    popen.stdin.close()
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline:
        line = popen.stdout.readline()
        if line.startswith(READY.encode()) or not line:
            break
    popen.stdout.close()
    if not line.startswith(READY.encode()):
        popen.kill()
        popen.wait(5)
        log = (log_dir / "agent.log").read_text(errors="replace")[-2000:]
        raise MeshStartError(
            f"the host agent for mesh {cfg.name!r} did not start; its log:\n{log}", mesh=cfg.name
        )
    return AgentProcess(popen=popen, addr=line.decode().split()[1], log_dir=log_dir)


@dataclass(frozen=True)
class LocalHost:
    """This machine (``this_host()``): its agent is a child of this process, and
    writes the mesh's state file itself as it listens (REGISTRY-2). ``python`` runs
    the workers (None: this process's interpreter)."""

    python_exe: str | None = None

    kind = "local"
    remote = False
    shares_files = True

    @property
    def nhosts(self) -> None:
        return None

    @property
    def python(self) -> str:
        return self.python_exe or sys.executable

    def worker_env(self, per_host: dict[str, int]) -> dict[str, str]:
        from monarch_kernel.hosts._placement import placement_env

        env = placement_env(per_host)  # PLACE-1: checked before anything starts
        check_room(math.prod(per_host.values()))  # and whether the host can hold them
        return env

    def allocate(self, cfg: AgentConfig) -> Allocation:
        from monarch_kernel.hosts._host_id import host_id

        agent = start_local_agent(cfg)
        pid = agent.popen.pid
        info = AgentInfo(addr=agent.addr, pid=pid, host=os.uname().nodename, host_id=host_id())
        return Allocation([info], {}, process=agent)

    def picked(self, indices: Sequence[int]) -> LocalHost:
        return self

    def with_python(self, python: str) -> LocalHost:
        if not os.access(python, os.X_OK):
            raise MeshSpecError(
                f"with_python_executable({python!r}): no executable there; give the path of a Python "
                "interpreter that has monarch-kernel installed"
            )
        return LocalHost(python)

    def describe(self) -> str:
        return "this host"
