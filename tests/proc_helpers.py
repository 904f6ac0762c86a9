"""Helpers for tests that watch processes come and go (importable from every test
module: pytest puts this folder on sys.path for the root conftest)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# How long processes get to go away; generous for a busy 2-core machine.
GONE_WITHIN = 8.0
# How long to wait for something that should happen within about a second or three
# (never asserted as a duration).
WITHIN = 10.0


def wait_for(predicate: Callable[[], Any], within: float = WITHIN, every: float = 0.05) -> Any:
    """Polls ``predicate`` until it returns something true (returned) or ``within``
    seconds pass (its last value is returned)."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)


def logged(procs: Any, marker: str, count: int, tail: int = 200, within: float = WITHIN) -> list[str]:
    """The lines of ``procs.logs()`` that contain ``marker``, sorted, once there are
    ``count`` of them (or ``within`` seconds pass): each rank's line reaches its agent
    in its own time, so the first one listed says nothing of the others."""
    deadline = time.monotonic() + within
    while True:
        got = sorted(ln for ln in procs.logs(tail=tail) if marker in ln)
        if len(got) >= count or time.monotonic() >= deadline:
            return got
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _stopped(pid: int) -> bool:
    """True once every thread of ``pid`` is stopped (state T), or the process is gone."""
    try:
        tids = [t.name for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return True
    for tid in tids:
        try:
            state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # a thread that just ended
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def sigstop(pid: int) -> None:
    """Stops ``pid`` with SIGSTOP and returns once all its threads are stopped. kill()
    returns before that: one thread takes the stop and tells the others, and on a busy
    machine the rest can run (answer a call) for milliseconds after."""
    os.kill(pid, signal.SIGSTOP)
    if not wait_for(lambda: _stopped(pid)):
        raise AssertionError(f"pid {pid} did not stop within {WITHIN} s of SIGSTOP")


def parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def still_alive(pids: Iterable[int], within: float = GONE_WITHIN) -> list[int]:
    """The pids that are still alive after waiting up to ``within`` seconds."""
    deadline = time.monotonic() + within
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


class Failures:
    """An ``on_failure`` callback (or a front end's ``on_failure``) that keeps the
    failures it is given, for a test to wait on."""

    def __init__(self) -> None:
        import threading

        self.got: list[Any] = []
        self.changed = threading.Condition()

    def __call__(self, failure: Any) -> None:
        with self.changed:
            self.got.append(failure)
            self.changed.notify_all()

    def wait(self, pred: Callable[[list[Any]], bool], within: float = WITHIN) -> bool:
        """True once ``pred(failures so far)`` holds, waiting up to ``within`` seconds."""
        with self.changed:
            return self.changed.wait_for(lambda: pred(self.got), timeout=within)

    def wait_for(self, kind: str, within: float = WITHIN) -> Any:
        """The first failure of ``kind``, waiting up to ``within`` seconds for it."""
        self.wait(lambda got: any(f.kind == kind for f in got), within)
        with self.changed:
            return next((f for f in self.got if f.kind == kind), None)

    def kinds(self) -> list[str]:
        with self.changed:
            return [f.kind for f in self.got]


#: The ``host_id`` of a host that is not this one (``hosts/_host_id.py``).
ANOTHER_HOST = "login/00000000-0000-0000-0000-000000000000/net:1/pid:1"


@contextmanager
def mesh_of_another_host(procs: int = 2) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The state file of a named mesh started on host "login" (another host: another
    network namespace and hostname), as (name, sleeper): its agent's address refuses
    here, and its pid is a live process here (``sleeper``, a sleep): neither says
    anything of that agent. The file is removed at the end."""
    from monarch_kernel.hosts import _registry

    name = f"far-{uuid.uuid4().hex[:6]}"
    sleeper = subprocess.Popen(["sleep", "300"])
    _registry.write(
        _registry.MeshRecord(
            name=name,
            token="x" * 43,
            agent_addr="127.0.0.1:1",  # refused here: this loopback is not login's
            agent_pid=sleeper.pid,
            host="login",
            spec={"per_host": {"procs": procs}, "env": {}},
            idle_timeout=60.0,
            ephemeral=False,
            host_id=ANOTHER_HOST,
            started_from=ANOTHER_HOST,
        )
    )
    try:
        yield name, sleeper
    finally:
        _registry.discard(name)
        sleeper.kill()
        sleeper.wait()


class Terminal:
    """A program in a terminal of its own (a pty of ``rows`` x ``cols``), whose screen
    is read and typed to with pexpect (``screen``).

    The program is started by ``subprocess`` (vfork and exec), not ``pexpect.spawn``:
    a plain fork of a process that uses grpc runs grpc's fork handlers, whose poller
    thread in the child can abort it before its exec (the child's closing of its
    descriptors takes the poller's epoll away: grpc/grpc#43055)."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        rows: int = 24,
        cols: int = 80,
    ) -> None:
        import fcntl
        import pty
        import struct
        import termios

        from pexpect.fdpexpect import fdspawn

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        try:
            self.proc = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
            )
        finally:
            os.close(slave)
        self.master = master
        self.screen = fdspawn(master, timeout=timeout, encoding="utf-8")

    def close(self, sig: int = signal.SIGTERM, within: float = 60.0) -> int | None:
        """Ends the program if it still runs (``sig``, then SIGKILL), and the terminal;
        its exit status."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(within)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(within)
        finally:
            os.close(self.master)
        return self.proc.returncode
