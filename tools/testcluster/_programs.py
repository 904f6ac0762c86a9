"""The programs a cluster runs: finding them (sshd wants absolute paths), running
them with their failures as ``ClusterError``, and whether this machine can make a
cluster at all (``unavailable``)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

TOOLS = "ip unshare setpriv ssh ssh-keygen sshd munged slurmctld slurmd srun sinfo".split()
PACKAGES = "slurmctld slurmd slurm-client munge openssh-server openssh-client iproute2"


class ClusterError(RuntimeError):
    """A cluster could not be made, or a command to make it failed."""


def unavailable() -> str | None:
    """Why this machine cannot make a cluster (not root, a program missing, no network
    namespaces), or None when it can."""
    if os.geteuid() != 0:
        return "making a cluster needs root"
    try:
        for name in TOOLS:
            tool(name)
    except ClusterError as e:
        return str(e)
    if not succeeds([tool("unshare"), "--net", "true"]):
        return "this machine cannot make network namespaces (`unshare --net true` failed)"
    return None


def tool(name: str) -> str:
    """The absolute path of a program (sshd insists on one), from PATH or /usr/sbin."""
    path = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if path is None:
        raise ClusterError(f"{name} is missing: `make .venv/.stamps/cluster`, or apt-get install {PACKAGES}")
    return path


def succeeds(argv: list[str]) -> bool:
    """Whether ``argv`` exits with status 0."""
    return subprocess.run(argv, capture_output=True).returncode == 0


def run(argv: list[str]) -> None:
    """Run ``argv``; a failure raises ClusterError with its output."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise ClusterError(
            f"{shlex.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}"
        )


def tail(log: Path, lines: int = 15) -> str:
    """The end of a log file, for an error message."""
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        text = ["(not written)"]
    return f"\n--- the end of {log}:\n" + "\n".join(text)


__all__ = ["PACKAGES", "TOOLS", "ClusterError", "run", "succeeds", "tail", "tool", "unavailable"]
