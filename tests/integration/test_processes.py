"""Process lifetimes: workers belong to the host agent, in their own session, and
nothing outlives a stopped mesh, a killed controller or a killed agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from proc_helpers import alive, parent, still_alive

from monarch_kernel import this_host


def _worker_pids(procs) -> list[int]:
    return [w["pid"] for w in procs._session("test").client.list_workers()]


@pytest.fixture
def own_procs2(state_home):
    """Two procs that a test may stop or break."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    yield procs
    procs.stop()


def test_workers_run_in_their_own_session_as_children_of_the_agent(procs2):
    agent_pid = procs2._session("test").agent.popen.pid
    workers = _worker_pids(procs2)
    assert len(workers) == 2
    assert os.getsid(agent_pid) != os.getsid(0)
    for pid in workers:
        assert alive(pid)
        assert os.getsid(pid) != os.getsid(0)
        assert parent(pid) == agent_pid
        assert parent(pid) != os.getpid()


def test_the_agent_lists_every_worker_as_running(procs2):
    workers = procs2._session("test").client.list_workers()
    assert [w["rank"] for w in workers] == [0, 1]
    assert all(w["state"] == "running" for w in workers)
    assert [w["addr"] for w in workers] == list(procs2._proc.addrs)


def test_stop_leaves_no_worker_or_agent_behind(own_procs2):
    pids = _worker_pids(own_procs2) + [own_procs2._session("test").agent.popen.pid]
    own_procs2.stop()
    assert still_alive(pids) == []


def test_stopping_twice_is_harmless(own_procs2):
    own_procs2.stop()
    own_procs2.stop()


def test_a_killed_controller_leaves_no_worker_or_agent_behind(state_home):
    script = textwrap.dedent(
        """
        import os, sys, time
        from monarch_kernel import this_host

        procs = this_host().spawn_procs(per_host={"procs": 2})
        pids = [w["pid"] for w in procs._session("test").client.list_workers()]
        pids.append(procs._session("test").agent.popen.pid)
        print(" ".join(map(str, pids)), flush=True)
        time.sleep(300)
        """
    )
    controller = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        assert controller.stdout is not None
        line = controller.stdout.readline()
        assert line, (
            f"the controller printed nothing; stderr:\n{controller.stderr.read() if controller.stderr else ''}"
        )
        pids = [int(p) for p in line.split()]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        controller.send_signal(signal.SIGKILL)
        controller.wait(30)
        assert still_alive(pids) == []
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(30)
        for pid in pids:  # leave nothing behind even when the test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_killing_the_agent_makes_its_workers_exit(own_procs2):
    workers = _worker_pids(own_procs2)
    agent = own_procs2._session("test").agent.popen
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(30)
    assert still_alive(workers) == []
