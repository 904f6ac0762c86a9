"""The local allocator: starts a host agent on this machine, detached from the caller
(its own session), so that Jupyter's interrupt and restart never reach it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from monarch_kernel.errors import SupervisionError

READY = "MONARCH_AGENT_READY"


def state_dir() -> Path:
    """``$XDG_STATE_HOME/monarch-kernel`` (default ``~/.local/state/monarch-kernel``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "monarch-kernel"


@dataclass
class AgentProcess:
    """A started agent: its process (ours to reap), address and log folder."""

    popen: subprocess.Popen[bytes]
    addr: str
    log_dir: Path

    def wait(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


def start_local_agent(
    name: str, token: str, idle_timeout: float, meta: str = "", state_file: str = "", timeout: float = 30.0
) -> AgentProcess:
    """Starts a host agent for mesh ``name`` and waits until it listens. ``meta`` is
    handed to every controller that attaches; ``state_file`` is removed when the agent
    stops, if it still names this mesh."""
    log_dir = state_dir() / "logs" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    cfg = {
        "name": name,
        "token": token,
        "log_dir": str(log_dir),
        "idle_timeout": idle_timeout,
        "meta": meta,
        "state_file": state_file,
    }
    with open(log_dir / "agent.log", "ab") as log_file:  # the child keeps its own copy
        popen = subprocess.Popen(
            [sys.executable, "-m", "monarch_kernel.hosts._agent_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,
            close_fds=True,
        )
    assert popen.stdin is not None and popen.stdout is not None
    popen.stdin.write(json.dumps(cfg).encode() + b"\n")
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
        raise SupervisionError(f"the host agent for mesh {name!r} did not start; its log:\n{log}", mesh=name)
    return AgentProcess(popen=popen, addr=line.decode().split()[1], log_dir=log_dir)
