"""What failure reports say, with real agents and workers: only what is true (who
stopped a mesh, whether other ranks still run), each thing once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from proc_helpers import Failures

from monarch_kernel import Actor, MeshStoppedError, controller, endpoint
from monarch_kernel.kernel._router import format_failure

TIMEOUT = 30


class Pinger(Actor):
    @endpoint
    def ping(self) -> int:
        return int(os.environ["MONARCH_RANK"])


@pytest.fixture
def named2(named_mesh):
    return named_mesh(2, "rep")


def test_a_mesh_stopped_by_another_controllers_down_is_reported_once_as_stopped(named2):
    name, procs = named2
    assert procs.spawn("p", Pinger).ping.call().get(timeout=TIMEOUT).values() == [0, 1]
    seen = Failures()
    procs.on_failure(seen)
    out = subprocess.run(
        [sys.executable, "-m", "monarch_kernel", "down", name], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert seen.wait(lambda got: any(f.kind == "stopped" for f in got)), [str(f) for f in seen.got]
    stopped = next(f for f in seen.got if f.kind == "stopped")
    assert "stopped by an administrator" in stopped.message
    assert "monarch-kernel down" in stopped.message
    assert not seen.wait(lambda got: any(f.kind != "stopped" for f in got), within=1.0), [
        str(f) for f in seen.got
    ]  # not "killed by signal 15", not "lost"
    assert procs.status() == ["stopped", "stopped"]
    with pytest.raises(MeshStoppedError):
        procs.spawn("q", Pinger)


def test_when_every_rank_dies_the_last_report_does_not_say_the_others_keep_running(named2):
    _name, procs = named2
    seen = Failures()
    procs.on_failure(seen)
    pids = [w["pid"] for w in procs._session("test").client.list_workers()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert seen.wait(lambda got: sum(f.kind == "dead" for f in got) == 2), [str(f) for f in seen.got]
    last = [f for f in seen.got if f.kind == "dead"][-1]
    assert "keep running" not in last.message
    assert "No rank of the mesh is left running" in last.message


def test_one_dead_rank_of_two_says_the_other_keeps_running(named2):
    _name, procs = named2
    seen = Failures()
    procs.on_failure(seen)
    pid = next(w["pid"] for w in procs._session("test").client.list_workers() if w["rank"] == 1)
    os.kill(pid, signal.SIGKILL)
    assert seen.wait(lambda got: any(f.kind == "dead" for f in got))
    assert "The other ranks keep running" in seen.got[0].message


def test_the_fencing_notice_names_the_mesh_once(named2):
    name, procs = named2
    shown = Failures()
    before = controller.frontend()
    controller.set_frontend(controller.Frontend(on_failure=shown))
    try:
        out = subprocess.run(
            [sys.executable, "-c", f"from monarch_kernel import attach; attach({name!r})"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert shown.wait(lambda got: any(f.kind == "fenced" for f in got))
    finally:
        controller.set_frontend(before)
    text = format_failure(next(f for f in shown.got if f.kind == "fenced"))
    assert text.count(f"mesh {name!r}") == 1, text  # (was "mesh 'x': mesh 'x': ...")
    assert text.startswith(f"monarch: mesh {name!r}: another controller attached")
