"""Shared fixtures: an isolated state folder for the whole session, the check that
no worker or agent outlives the suite, and proc meshes shared per test module."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_kernel import ProcMesh, this_host

# The stop button's tests send this process SIGINT: they need Python's own handler,
# which a shell that starts the suite in the background (no job control) leaves out
# (its background commands ignore SIGINT, and Python then installs no handler).
signal.signal(signal.SIGINT, signal.default_int_handler)

# What the command line of a process the suite may leave behind contains.
_OUR_COMMANDS = (b"monarch_kernel.worker", b"monarch_kernel.hosts._agent_main")


def _leftover_processes(state_home: str) -> list[tuple[int, str]]:
    """Workers and agents started under ``state_home``: (pid, command line)."""
    marker = f"XDG_STATE_HOME={state_home}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()  # empty for a zombie
            if not any(c in cmdline for c in _OUR_COMMANDS):
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marker in environ.split(b"\0"):
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


@pytest.fixture(scope="session", autouse=True)
def state_home() -> Iterator[Path]:
    """A fresh ``XDG_STATE_HOME`` for the session (inherited by every agent and worker);
    at the end, no worker or agent started under it may still run."""
    path = tempfile.mkdtemp(prefix="monarch-kernel-tests-")
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = path
    try:
        yield Path(path)
    finally:
        deadline = time.monotonic() + 5.0
        left = _leftover_processes(path)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = _leftover_processes(path)
        for pid, _ in left:  # fail, but leave nothing behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if previous is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = previous
        shutil.rmtree(path, ignore_errors=True)
        assert not left, "workers or agents outlived the test session (killed now):\n" + "\n".join(
            f"  pid {pid}: {cmd}" for pid, cmd in left
        )


def _spawn(per_host: dict[str, int]) -> Iterator[ProcMesh]:
    procs = this_host().spawn_procs(per_host=per_host)
    try:
        yield procs
    finally:
        procs.stop()


@pytest.fixture(scope="module")
def procs4(state_home: Path) -> Iterator[ProcMesh]:
    """Four worker processes, ``{"procs": 4}``, shared by a test module."""
    yield from _spawn({"procs": 4})


@pytest.fixture(scope="module")
def procs2(state_home: Path) -> Iterator[ProcMesh]:
    """Two worker processes, ``{"procs": 2}``, shared by a test module."""
    yield from _spawn({"procs": 2})


@pytest.fixture(scope="module")
def jupyter_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The kernelspec ``monarch``, installed into a folder of the test's own and put
    on ``JUPYTER_PATH``, so kernel tests do not depend on what is installed where."""
    from monarch_kernel.kernel._install import install

    prefix = tmp_path_factory.mktemp("jupyter")
    install(prefix=str(prefix))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    yield
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old
