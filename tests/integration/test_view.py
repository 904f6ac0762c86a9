"""The one picture of a running mesh (VIEW-1) that the Meshes panel and the
inspector show, its owner and idle clock as the agents keep them (OWNER-1, AGENT-2),
and ``monarch-kernel respawn``: on real workers and agents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import jupyter_servers
import pytest
from proc_helpers import sigstop
from view_schema import valid_view

from monarch_kernel import controller, this_host
from monarch_kernel.controller import _view as _view_module
from monarch_kernel.controller._admin import mesh_table
from monarch_kernel.hosts import _admin


def _view(name: str) -> dict | None:
    """The mesh's picture, checked against the panel's schema (VIEW-1)."""
    return valid_view(controller.view_of(name))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch_kernel", *args], capture_output=True, text=True, timeout=120
    )


def _until(what: str, check: object, timeout: float = 15.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        out = check()  # type: ignore[operator]
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(0.1)


@pytest.fixture
def held(state_home: Path) -> Iterator[str]:
    """A named mesh of 2 procs that this process holds (idle timeout 600 s)."""
    name = f"view-{uuid.uuid4().hex[:6]}"
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=name, idle_timeout=600)
    try:
        yield name
    finally:
        procs.stop()


@pytest.fixture
def script_mesh(state_home: Path, tmp_path: Path) -> Iterator[str]:
    """A named mesh of 2 procs started by a script that has exited: nobody holds it."""
    with jupyter_servers.script_mesh(tmp_path, prefix="view") as name:
        yield name


def test_the_agents_know_who_holds_a_mesh_and_when_an_idle_one_stops(held):
    # OWNER-1: the controller says who it is as it attaches; ls shows it.
    info = _admin.mesh_info(held)
    assert info is not None and info.attached
    assert info.owner is not None
    assert (info.owner["kind"], info.owner["pid"], info.owner["kernel_id"]) == ("script", os.getpid(), None)
    assert info.idle_left is None  # held: no idle clock runs
    assert any(held in line and f"pid {os.getpid()} on" in line for line in mesh_table())
    # Let go: the idle clock (AGENT-2) runs from the idle timeout down, and ls says so.
    session = controller.session(held)
    assert session is not None
    session.detach()
    info = _until("detached", lambda: (i := _admin.mesh_info(held)) and not i.attached and i)
    assert 590 < info.idle_left <= 600  # type: ignore[union-attr]
    line = next(line for line in mesh_table() if line.startswith(held))
    assert "(stops in 10m)" in line or "(stops in 9m)" in line, line
    controller.attach(held)  # (so that the fixture stops it)


@pytest.mark.parametrize("read_by", ["workers", "agents"])
def test_the_view_says_dead_with_the_signal_and_unresponsive_for_a_stopped_worker(held, read_by, monkeypatch):
    # VIEW-1: the same states the panel and the inspector show; VIEW-2: read by each
    # worker, or (beyond WORKERS_ASKED_UP_TO live workers) by their hosts' agents.
    if read_by == "agents":  # no worker is asked: its agent reads /proc and pings it
        monkeypatch.setattr(_view_module, "WORKERS_ASKED_UP_TO", 0)
        monkeypatch.setattr(_view_module, "ask_workers", lambda *a: pytest.fail("a worker was asked"))
    view = _view(held)
    assert view is not None
    assert [r["state"] for r in view["ranks"]] == ["alive", "alive"] and view["state"] == "alive"
    assert all(r["usage"]["rss"] > 0 for r in view["ranks"])
    pids = [r["pid"] for r in view["ranks"]]
    if read_by == "agents":  # from /proc: what the kernel counts for that very process
        statm = int(Path(f"/proc/{pids[0]}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        assert abs(view["ranks"][0]["usage"]["rss"] - statm) < 64 << 20
    sigstop(pids[0])  # alive, but it cannot answer
    try:
        view = _view(held)
        assert view is not None
        assert view["ranks"][0]["state"] == "unresponsive" and view["unresponsive"] == 1
        assert view["state"] == "degraded" and view["alive"] == 1
    finally:
        os.kill(pids[0], signal.SIGCONT)
    _until("alive again", lambda: _view(held)["ranks"][0]["state"] == "alive")  # type: ignore[index]
    os.kill(pids[1], signal.SIGKILL)
    view = _until("dead", lambda: (v := _view(held)) and v["ranks"][1]["state"] == "dead" and v)
    assert view["ranks"][1]["why"] == "SIGKILL" and view["state"] == "degraded"  # type: ignore[index]


def test_respawn_restarts_the_dead_ranks_of_a_mesh_nobody_holds(script_mesh):
    view = _view(script_mesh)
    assert view is not None and not view["attached"]
    os.kill(view["ranks"][1]["pid"], signal.SIGKILL)
    _until("dead", lambda: _view(script_mesh)["ranks"][1]["state"] == "dead")  # type: ignore[index]
    out = _cli("respawn", script_mesh)
    assert out.returncode == 0, out.stderr
    assert f"{script_mesh}: restarted rank(s) [1]" in out.stdout
    view = _view(script_mesh)
    assert view is not None and [r["state"] for r in view["ranks"]] == ["alive", "alive"]
    assert view["ranks"][1]["restarts"] == 1 and not view["attached"]  # let go again
    assert _cli("respawn", script_mesh).stdout.strip() == f"{script_mesh}: no rank is dead"


def test_respawn_of_a_mesh_another_controller_holds_is_refused_and_says_where(held):
    out = _cli("respawn", held)
    assert out.returncode == 1
    assert f"is held by pid {os.getpid()} on" in out.stderr
    assert f"procs.respawn() or %mesh respawn {held}" in out.stderr
    assert controller.session(held) is not None and not controller.session(held).fenced  # still ours
    out = _cli("respawn", "no-such-mesh")
    assert out.returncode == 1 and "no mesh named 'no-such-mesh' is running" in out.stderr
    # --json says what failed, and what kind of failure, for a program (the server)
    said = _cli("respawn", "--json", held)
    assert said.returncode == 1
    refused = json.loads(said.stdout)
    assert (refused["mesh"], refused["kind"]) == (held, "MeshOwnershipError")
    assert f"is held by pid {os.getpid()} on" in refused["error"]
    assert json.loads(_cli("respawn", "--json", "no-such-mesh").stdout)["kind"] == "MeshNotFoundError"
