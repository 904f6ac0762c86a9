"""Process lifetimes: workers belong to the host agent, in their own session, and
nothing outlives a stopped mesh, a killed controller or a killed agent."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import time

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


def test_workers_run_in_their_own_session_forked_by_the_agents_template(procs2):
    """FORK-1: the agent's template process forks the workers; each leads a session
    of its own, apart from the template's and the controller's."""
    agent_pid = procs2._session("test").agent.popen.pid
    workers = _worker_pids(procs2)
    assert len(workers) == 2
    assert os.getsid(agent_pid) != os.getsid(0)
    template = parent(workers[0])
    assert parent(template) == agent_pid
    assert b"MONARCH_TEMPLATE_FD=" in open(f"/proc/{template}/environ", "rb").read()
    # A forked worker's command line is the one an exec'd worker has.
    assert open(f"/proc/{workers[0]}/cmdline", "rb").read().split(b"\0")[1:3] == [
        b"-m",
        b"monarch_kernel.worker",
    ]
    for pid in workers:
        assert alive(pid)
        assert os.getsid(pid) == pid
        assert os.getsid(pid) not in (os.getsid(0), os.getsid(template))
        assert parent(pid) == template


def _in_a_script(actor: str, call: str) -> list[object]:
    """What ``call`` on an actor mesh of the class ``actor`` (source) on 2 procs
    gives, run from a script of its own: its actor travels by value, and the script's
    controller is no IPython shell (as this test process may be)."""
    script = "\n".join(
        [
            "import sys",
            "from monarch_kernel import Actor, endpoint, this_host",
            textwrap.dedent(actor),
            "procs = this_host().spawn_procs(per_host={'procs': 2})",
            "try:",
            f"    print('got', repr(procs.spawn('probe', Probe).{call}.call().get(timeout=60).values()))",
            "finally:",
            "    procs.stop()",
        ]
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = next((x for x in done.stdout.splitlines() if x.startswith("got ")), None)
    assert line is not None, done.stdout + done.stderr
    return ast.literal_eval(line[4:])


def test_a_forked_worker_serves_actors_with_what_its_template_imported(state_home):
    """FORK-1: the template imports every module of this package that a worker uses
    to start and to spawn and serve an actor, so the workers share those pages: a
    forked worker imports none of its own (at 1,024 workers, importing them in each
    worker was about half of a worker's start)."""
    probe = """
        class Probe(Actor):
            @endpoint
            def ours(self):
                n = sys.modules["__main__"].MODULES_AT_FORK
                assert n is not None, "this worker was not forked from a template"
                return [m for m in list(sys.modules)[n:] if m.split(".")[0] == "monarch_kernel"]
        """
    assert _in_a_script(probe, "ours") == [[], []]


def test_a_scripts_workers_get_no_ipython_shell_from_the_template(state_home):
    """FORK-1: the template makes the shell of %%mesh cells only for a controller
    that runs cells (tests/kernel: test_a_kernels_workers_...); a script's workers
    have none."""
    probe = """
        class Probe(Actor):
            @endpoint
            def seen(self):
                shell = sys.modules.get("IPython.core.interactiveshell")
                return shell is not None and shell.InteractiveShell.initialized()
        """
    assert _in_a_script(probe, "seen") == [False, False]


def test_workers_asked_to_start_by_exec_are_children_of_the_agent(state_home):
    procs = this_host().spawn_procs(per_host={"procs": 2}, env={"MONARCH_WORKER_FORK": "0"})
    try:
        agent_pid = procs._session("test").agent.popen.pid
        for pid in _worker_pids(procs):
            assert parent(pid) == agent_pid
            assert os.getsid(pid) == pid
            assert _runtime_threads(pid) == 1  # NODE-2, as a forked worker
    finally:
        procs.stop()


def _runtime_threads(pid: int) -> int:
    """How many threads of process ``pid`` run its native runtime's tasks: the least
    of a few readings, as a thread that a runtime thread has just started carries its
    starter's name until it names itself (a blocking-pool thread, "monarch-block",
    seen once as a second "monarch-node": CI failed on it)."""
    counts = []
    for _ in range(5):
        names = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/comm") as f:
                    names.append(f.read().strip())
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
        counts.append(names.count("monarch-node"))
        time.sleep(0.02)
    return min(counts)


def test_workers_and_agents_run_their_native_runtime_on_one_thread_a_controller_on_two(procs2):
    """NODE-2: a worker's and an agent's runtime tasks are a few connections' I/O, on
    one thread; the controller keeps two; the count is fixed once the runtime runs."""
    from monarch_kernel import _native

    assert [_runtime_threads(pid) for pid in _worker_pids(procs2)] == [1, 1]
    assert _runtime_threads(procs2._session("test").agent.popen.pid) == 1
    assert _runtime_threads(os.getpid()) == 2
    assert _native.set_runtime_threads(1) is False
    assert _runtime_threads(os.getpid()) == 2


def test_a_killed_template_takes_its_workers_and_each_is_reported(own_procs2):
    """AGENT-1 through FORK-1: the workers die with their template, the agent lists
    each as exited (killed), and the next spawn forks from a new template."""
    session = own_procs2._session("test")
    workers = _worker_pids(own_procs2)
    os.kill(parent(workers[0]), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = session.client.list_workers()
        if all(w["state"] == "exited" for w in listed):
            break
        time.sleep(0.05)
    assert [(w["state"], w["signal"]) for w in listed] == [("exited", signal.SIGKILL)] * 2
    assert still_alive(workers) == []


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
        from monarch_kernel import Actor, endpoint, this_host

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


def test_a_spawn_sent_again_with_its_request_id_starts_nothing_more(own_procs2):
    """SpawnWorkers sent again after its connection broke (the same request id) gets
    the workers the first copy started, and starts none."""
    session = own_procs2._session("test")
    client = session.client.links[0].client
    pb = client._pb
    req = pb.SpawnWorkersRequest(
        count=1,
        executable=sys.executable,
        args=["-m", "monarch_kernel.worker"],
        env={"MONARCH_SHAPE": '[["procs"], [3]]'},
        cwd=os.getcwd(),
        epoch=session.epoch,
        first_rank=2,
        request_id="test-once",
    )
    first = client._stub.SpawnWorkers(req, metadata=client._md, timeout=60)
    again = client._stub.SpawnWorkers(req, metadata=client._md, timeout=60)
    assert [(w.rank, w.pid) for w in again.workers] == [(w.rank, w.pid) for w in first.workers]
    assert [w["rank"] for w in session.client.list_workers()] == [0, 1, 2]
