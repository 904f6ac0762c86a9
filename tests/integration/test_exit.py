"""A script that uses meshes exits cleanly: no abort at interpreter exit, whatever its
threads are doing (PY-2), also when run many times on a loaded machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest

from monarch_kernel import MeshNotFoundError, attach

#: A named mesh that outlives the script, one call, and (with an argument) a daemon
#: thread still waiting on a long call when the interpreter exits.
SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    from monarch_kernel import Actor, endpoint, this_host

    class Sleeper(Actor):
        @endpoint
        def sleep(self, seconds):
            time.sleep(seconds)
            return seconds

    procs = this_host().spawn_procs(per_host={"procs": 2}, name=sys.argv[1])
    sleeper = procs.spawn("sleeper", Sleeper)
    print(sleeper.sleep.call(0).get(timeout=60).values(), flush=True)
    if sys.argv[2:] == ["--waiting-thread"]:
        threading.Thread(target=lambda: sleeper.sleep.call(30).get(), daemon=True).start()
        time.sleep(0.3)
    """
)


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Mesh names a test's scripts create; every one is stopped afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        try:
            attach(name).stop()
        except MeshNotFoundError:
            pass


def _start(name: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, name, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _check(p: subprocess.Popen[str]) -> None:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, f"exit status {p.returncode}; stderr:\n{err}"
    assert "[0, 0]" in out
    assert "FATAL" not in err, err


def test_a_script_exits_cleanly_while_a_daemon_thread_waits_on_a_call(names):
    for _ in range(3):  # this aborted every time: the thread woke during finalisation
        names.append(f"exit-{uuid.uuid4().hex[:8]}")
        _check(_start(names[-1], "--waiting-thread"))


@pytest.mark.slow
def test_scripts_that_create_a_named_mesh_exit_cleanly_many_times_under_load(names):
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        for _ in range(8):  # two at a time, with every core busy
            pair = []
            for flag in ((), ("--waiting-thread",)):
                names.append(f"exit-{uuid.uuid4().hex[:8]}")
                pair.append(_start(names[-1], *flag))
            for p in pair:
                _check(p)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
