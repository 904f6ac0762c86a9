"""The daemons a cluster's creator started: each in the foreground in its host, so
that this process can see it exit (and reap it), its output in a log file."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools.testcluster._netns import Host, in_host
from tools.testcluster._programs import ClusterError, tail

UP_TIMEOUT = 30.0  # seconds for every daemon to answer


@dataclass(frozen=True)
class _Daemon:
    """A daemon this process started."""

    what: str
    proc: subprocess.Popen[bytes]
    log: Path


class Daemons:
    """The daemons this process started for one cluster."""

    def __init__(self) -> None:
        self._started: list[_Daemon] = []

    def start(
        self, what: str, host: Host, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        """Start a daemon (staying in the foreground) in ``host``; its output goes to ``log``."""
        with open(log, "ab") as out:
            argv = in_host(host, argv)
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True
            )
        self._started.append(_Daemon(what, proc, log))

    def wait(self, what: str, ready: Callable[[], bool], *logs: Path) -> None:
        """Until ``ready()``. A daemon that exits meanwhile, or UP_TIMEOUT, raises a
        ClusterError with the end of the logs (which the cluster's removal removes)."""
        deadline = time.monotonic() + UP_TIMEOUT
        while not ready():
            for d in self._started:
                if d.proc.poll() is not None:
                    raise ClusterError(f"{d.what} exited (status {d.proc.returncode}){tail(d.log)}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{what} did not come up within {UP_TIMEOUT:.0f} s{''.join(map(tail, logs))}"
                )
            time.sleep(0.05)

    def reap(self) -> None:
        """Kills and reaps them all (dead by now, once their namespaces are emptied,
        unless one never reached its namespace)."""
        for d in self._started:
            d.proc.kill()
            d.proc.wait()
        self._started.clear()


__all__ = ["UP_TIMEOUT", "Daemons"]
