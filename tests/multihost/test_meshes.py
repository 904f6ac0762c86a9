"""Meshes across hosts on the test cluster: the same scenarios through SSHJob and
SlurmJob, the controller on the login host, two hosts of two procs each.

What is checked: actors on both hosts, a named mesh reattached by a new controller
(fencing the old one), a killed agent (its host lost, the other goes on, respawn on
the survivor), a network partition (unreachable, then back with nothing lost), a
SLURM job cancelled from outside (reported with its reason), 256 MiB between hosts,
and, after each test, no process of ours left on any host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_checks import down_all as _down_all
from cluster_checks import ours_on_hosts as _ours_on_hosts
from controller import Controller, ControllerError
from proc_helpers import Terminal

from tools.testcluster import Cluster

WITHIN = 30.0

SETUP = """
import os, socket, time
import numpy as np
from monarch_kernel import Actor, endpoint, current_rank, attach
from monarch_kernel.job import SSHJob, SlurmJob

class Counter(Actor):
    def __init__(self):
        self.n = 0
    @endpoint
    def incr(self):
        self.n += 1
        return self.n
    @endpoint
    def where(self):
        return [socket.gethostname(), os.getpid()]
    @endpoint
    def total(self, a):
        return float(a.sum())
    @endpoint
    def make(self, nbytes):
        return np.full(nbytes // 8, 1.0)
    @endpoint
    def hold(self, nbytes):
        self.held = np.ones(nbytes // 8)
        return nbytes
    @endpoint
    def nap(self, seconds):
        end = time.time() + seconds
        while time.time() < end:  # Python code: a stop interrupts it
            time.sleep(0.01)
        return "woke"
    @endpoint
    def block(self, seconds):
        time.sleep(seconds)  # one C call: an interrupt waits for it to return
        return "woke"

failures = []
def record(f):
    failures.append([f.kind, f.host, str(f)])
"""


@pytest.fixture(params=["ssh", "slurm"])
def hosts_code(request: pytest.FixtureRequest, cluster: Cluster) -> str:
    """The expression that gives the cluster's two hosts as a HostMesh."""
    if request.param == "ssh":
        return f"SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}]).state(cached_path=None).hosts"
    return f"SlurmJob(meshes={{'hosts': 2}}, partition={cluster.partition!r}).state(cached_path=None).hosts"


@pytest.fixture
def controllers(cluster: Cluster, state_home: Path) -> Iterator[list[Controller]]:
    """Controllers made with ``new()``; at the end every mesh is stopped and no
    process of ours may be left on any host."""
    made: list[Controller] = []
    yield made
    for c in made:
        c.close()
    _down_all(cluster, state_home)


def _venv_cli() -> list[str]:
    return [sys.executable, "-m", "monarch_kernel"]


def _new(controllers: list[Controller], cluster: Cluster, state_home: Path) -> Controller:
    c = Controller(cluster, str(state_home))
    c.run(SETUP)
    controllers.append(c)
    return c


def _counting(c: Controller, hosts_code: str) -> Controller:
    """``c`` with ``procs`` (2 hosts x 2 procs) that records its failures, and
    ``counter`` on them, counted once."""
    c.run(f"procs = {hosts_code}.spawn_procs(per_host={{'procs': 2}})")
    c.run("procs.on_failure(record)")
    c.run("counter = procs.spawn('counter', Counter)")
    assert c.eval("counter.incr.call().get(timeout=30).values()") == [1, 1, 1, 1]
    return c


def _wait_failure(c: Controller, kind: str, within: float = WITHIN) -> list[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = [f for f in c.eval("failures") if f[0] == kind]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {kind!r} failure within {within} s; failures: {c.eval('failures')}")


def test_a_mesh_across_two_hosts_runs_actors_on_both(hosts_code, controllers, cluster, state_home):
    c = _new(controllers, cluster, state_home)
    c.run(f"procs = {hosts_code}.spawn_procs(per_host={{'procs': 2}})")
    assert c.eval("procs.sizes") == {"hosts": 2, "procs": 2}
    c.run("counter = procs.spawn('counter', Counter)")
    where = c.eval("counter.where.call().get(timeout=30).values()")
    assert [w[0] for w in where] == ["h1", "h1", "h2", "h2"]
    assert len({w[1] for w in where}) == 4
    assert [w[0] for w in c.eval("counter.slice(hosts=1).where.call().get(timeout=30).values()")] == [
        "h2",
        "h2",
    ]
    assert c.eval("counter.slice(hosts=1, procs=0).incr.call_one().get(timeout=30)") == 1
    assert c.eval("counter.incr.call().get(timeout=30).values()") == [1, 1, 2, 1]
    assert c.eval("procs.status()") == ["alive"] * 4
    os.kill(where[3][1], signal.SIGKILL)  # a worker on h2: its own agent says how it died
    with pytest.raises(ControllerError) as died:
        c.eval("counter.slice(hosts=1, procs=1).incr.call_one().get(timeout=30)")
    assert died.value.kind == "SupervisionError"
    assert (
        "rank 3" in died.value.message and "on h2" in died.value.message and "SIGKILL" in died.value.message
    )
    assert c.eval("procs.respawn()") == [3]
    assert c.eval("counter.slice(hosts=1, procs=1).incr.call_one().get(timeout=30)") == 1
    c.run("procs.stop()")
    assert c.eval("procs.status()") == ["stopped"] * 4
    assert _wait_gone(cluster), _ours_on_hosts(cluster)


def _wait_gone(cluster: Cluster, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while _ours_on_hosts(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _ours_on_hosts(cluster)


def test_a_named_mesh_outlives_its_controller_and_a_new_one_reattaches(
    hosts_code, controllers, cluster, state_home
):
    first = _new(controllers, cluster, state_home)
    first.run(f"procs = {hosts_code}.spawn_procs(per_host={{'procs': 2}}, name='train')")
    first.run("counter = procs.spawn('counter', Counter)")
    assert first.eval("counter.incr.call().get(timeout=30).values()") == [1, 1, 1, 1]
    first.close()  # a named mesh stays
    second = _new(controllers, cluster, state_home)
    second.run("procs = attach('train')")
    assert second.eval("procs.sizes") == {"hosts": 2, "procs": 2}
    assert second.eval("procs.actors['counter'].incr.call().get(timeout=30).values()") == [2, 2, 2, 2]
    third = _new(controllers, cluster, state_home)
    third.run("procs = attach('train')")  # fences the second controller on every host
    with pytest.raises(ControllerError) as fenced:
        second.eval("procs.actors['counter'].incr.call().get(timeout=30).values()")
    assert fenced.value.kind == "MeshOwnershipError"
    assert third.eval("procs.actors['counter'].incr.call().get(timeout=30).values()") == [3, 3, 3, 3]
    env = {**os.environ, **cluster.env(), "XDG_STATE_HOME": str(state_home)}
    ls = cluster.run_in_login([*_venv_cli(), "ls"], env=env, capture_output=True, text=True, timeout=60)
    assert "train" in ls.stdout and "h1 2/2" in ls.stdout and "h2 2/2" in ls.stdout, ls.stdout + ls.stderr
    down = cluster.run_in_login(
        [*_venv_cli(), "down", "train"], env=env, capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 0, down.stderr
    assert _wait_gone(cluster), _ours_on_hosts(cluster)
    deadline = time.monotonic() + WITHIN  # (a cancelled job is listed while it completes)
    while _slurm_jobs(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _slurm_jobs(cluster)


def _slurm_jobs(cluster: Cluster) -> list[str]:
    out = cluster.run_in_login(
        ["squeue", "-h", "-o", "%i %j"],
        env={**os.environ, **cluster.env()},
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return [ln for ln in out.splitlines() if "monarch-" in ln]


def test_a_host_whose_agent_is_killed_is_lost_and_the_other_host_goes_on(
    hosts_code, controllers, cluster, state_home
):
    c = _counting(_new(controllers, cluster, state_home), hosts_code)
    agent = c.eval("procs._session('t').rec.hosts[1]['agent_pid']")
    os.kill(agent, signal.SIGKILL)
    kind, host, message = _wait_failure(c, "host_lost")
    assert host == "h2" and "ranks 2-3" in message, message
    assert c.eval("procs.status()") == ["alive", "alive", "dead", "dead"]
    assert c.eval("counter.slice(hosts=0).incr.call().get(timeout=30).values()") == [2, 2]
    with pytest.raises(ControllerError) as err:
        c.eval("counter.incr.call().get(timeout=30)")
    assert err.value.kind == "SupervisionError" and "h2" in err.value.message
    worker = c.eval("counter.slice(hosts=0, procs=1).where.call_one().get(timeout=30)[1]")
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + WITHIN
    while c.eval("procs.status()")[1] != "dead" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert c.eval("procs.respawn()") == [1]  # on the surviving host; h2's ranks have no agent
    assert c.eval("counter.slice(hosts=0).incr.call().get(timeout=30).values()") == [3, 1]


def test_a_partitioned_host_is_unreachable_then_back_with_nothing_lost(
    hosts_code, controllers, cluster, state_home
):
    c = _counting(_new(controllers, cluster, state_home), hosts_code)
    bridge = cluster.record["namespaces"][0]
    subprocess.run(["ip", "-n", bridge, "link", "set", "h2", "down"], check=True)
    try:
        t = time.monotonic()
        kind, host, message = _wait_failure(c, "unreachable")
        took = time.monotonic() - t
        assert host == "h2" and "does not answer" in message
        assert c.eval("counter.slice(hosts=0).incr.call().get(timeout=30).values()") == [2, 2]
    finally:
        subprocess.run(["ip", "-n", bridge, "link", "set", "h2", "up"], check=True)
    _wait_failure(c, "host_back")
    assert c.eval("counter.slice(hosts=1).incr.call().get(timeout=30).values()") == [2, 2]
    deadline = time.monotonic() + WITHIN  # each rank is alive again at its next heartbeat
    while c.eval("procs.status()") != ["alive"] * 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert c.eval("procs.status()") == ["alive"] * 4
    print(f"unreachable reported {took:.1f} s after the partition")


def test_a_host_whose_agent_is_stopped_is_unreachable_only_once_it_stays_mute(
    hosts_code, controllers, cluster, state_home
):
    # SUPERVISE-4: its port still takes connections (a busy host's does too): the host
    # is unreachable only after MUTE_S of it, then back, with nothing lost.
    from monarch_kernel.controller._supervision import MUTE_S

    c = _counting(_new(controllers, cluster, state_home), hosts_code)
    pid = c.eval("procs._session('t').client.links[1].agent_pid")
    assert pid > 0
    os.kill(pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        kind, host, message = _wait_failure(c, "unreachable", within=MUTE_S + WITHIN)
        took = time.monotonic() - t
        assert host == "h2" and "does not answer" in message, message
        assert took >= MUTE_S - 1.0, f"unreachable after {took:.1f} s: a few seconds' silence is a busy host"
        assert c.eval("counter.slice(hosts=0).incr.call().get(timeout=30).values()") == [2, 2]
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait_failure(c, "host_back")
    assert c.eval("counter.slice(hosts=1).incr.call().get(timeout=30).values()") == [2, 2]
    assert not [f for f in c.eval("failures") if f[0] in ("host_lost", "lost", "dead")], c.eval("failures")


def test_a_slurm_job_cancelled_from_outside_is_reported_with_its_reason(controllers, cluster, state_home):
    c = _new(controllers, cluster, state_home)
    c.run(
        f"procs = SlurmJob(meshes={{'hosts': 2}}, partition={cluster.partition!r}).state(cached_path=None).hosts"
        ".spawn_procs(per_host={'procs': 2})"
    )
    c.run("procs.on_failure(record)")
    job_id = c.eval("procs._session('t').rec.job['job_id']")
    assert job_id
    subprocess.run(
        cluster.login_cmd(["scancel", job_id]), env={**os.environ, **cluster.env()}, check=True, timeout=30
    )
    kind, _host, message = _wait_failure(c, "lost")
    assert "cancelled" in message, message
    assert _wait_gone(cluster), _ours_on_hosts(cluster)


def test_256_mib_travel_between_hosts(hosts_code, controllers, cluster, state_home):
    c = _new(controllers, cluster, state_home)
    c.run(f"procs = {hosts_code}.spawn_procs(per_host={{'procs': 1}})")
    c.run("counter = procs.spawn('counter', Counter)")
    c.run("big = np.full((256 << 20) // 8, 2.0)")
    assert c.eval("counter.slice(hosts=1).total.call_one(big).get(timeout=60)") == 2.0 * ((256 << 20) // 8)
    c.run("got = counter.slice(hosts=0).make.call_one(256 << 20).get(timeout=60)")
    assert c.eval("[got.nbytes, float(got.sum())]") == [256 << 20, float((256 << 20) // 8)]


def test_the_multihost_notebook_runs_on_the_cluster_through_slurm(cluster, state_home, jupyter_path):
    env = {
        **os.environ,
        **cluster.env(),
        "XDG_STATE_HOME": str(state_home),
        "MONARCH_DEMO_PARTITION": cluster.partition,
    }
    root = Path(__file__).resolve().parents[2]
    out = Path(state_home) / "multihost-out.ipynb"
    argv = [
        sys.executable,
        str(root / "demo" / "run_notebook.py"),
        "notebooks/multihost.ipynb",
        "--save",
        str(out),
    ]
    done = cluster.run_in_login(argv, env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = done.stdout
    assert "h1 rank 0" in text and "h2 rank 3" in text  # DDP on both hosts
    assert "Out: True" in text  # the same model on every rank
    assert "host 'h2' of mesh 'ddp-demo' is lost" in text
    assert "does not answer" not in text  # a dead agent is lost, not unreachable
    assert "['alive', 'alive', 'dead', 'dead']" in text
    assert "stopped ddp-demo" in text
    assert not _ours_on_hosts(cluster)


def test_a_call_to_many_procs_goes_as_one_message_per_host(hosts_code, controllers, cluster, state_home):
    c = _new(controllers, cluster, state_home)
    c.run(f"procs = {hosts_code}.spawn_procs(per_host={{'procs': 2}})")
    c.run("counter = procs.spawn('counter', Counter)")
    c.run("from monarch_kernel import _native")
    assert c.eval("counter.incr.call().get(timeout=30).values()") == [1, 1, 1, 1]
    before = c.eval("_native.calls_sent()")
    assert c.eval("counter.incr.call().get(timeout=30).values()") == [2, 2, 2, 2]
    assert c.eval("_native.calls_sent()") - before == 2  # one per host: the agents fan out (RELAY-1)
    c.run("counter.incr.broadcast()")
    assert c.eval("_native.calls_sent()") - before == 4
    assert c.eval("counter.slice(procs=0).incr.call().get(timeout=30).values()") == [
        4,
        4,
    ]  # after the broadcast
    where = c.eval("counter.where.call().get(timeout=30).values()")
    os.kill(where[3][1], signal.SIGKILL)  # a worker lost behind the relay fails as a direct call would
    with pytest.raises(ControllerError) as died:
        c.eval("counter.slice(hosts=1).where.call().get(timeout=30)")
    assert died.value.kind == "SupervisionError" and "rank 3" in died.value.message, died.value.message
    assert "SIGKILL" in died.value.message
    assert [w[0] for w in c.eval("counter.slice(hosts=0).where.call().get(timeout=30).values()")] == [
        "h1",
        "h1",
    ]
    # A stop reaches the workers through their agent: the calls end, not after 60 s.
    c.run("nap = counter.slice(hosts=0).nap.call(60)")
    time.sleep(1.0)
    c.run("from monarch_kernel.mesh._future import cancel_calls\ncancel_calls(nap._calls)")
    t = time.monotonic()
    with pytest.raises(ControllerError) as stopped:
        c.eval("nap.get(timeout=30)")
    assert time.monotonic() - t < 20, "the stop did not reach the workers"
    assert "KeyboardInterrupt" in stopped.value.message or "KeyboardInterrupt" in stopped.value.kind
    assert c.eval("counter.slice(hosts=0).incr.call().get(timeout=30).values()") == [5, 4]
    # INTERRUPT-2 through the agents: a fan-out's calls are made as they are read (one
    # object for all of them), and a second interrupt of the same calls still finds
    # them, by key, and ends the workers still in a C call.
    c.run("held = counter.slice(hosts=0).block.call(60)")
    time.sleep(1.0)
    assert c.eval("cancel_calls(held._calls)") == 0  # the first asks, and never kills
    # They are a sequence (sliced, indexed from the end), and each can stand alone:
    # what the interrupt kept of them (not its fan-out's other replies).
    c.run("import collections.abc\ncalls = held._calls")
    assert c.eval("isinstance(calls, collections.abc.Sequence) and len(calls) == 2")
    assert c.eval("[x.key for x in calls[::-1]] == [calls[-1].key, calls[0].key] != [calls[0].key] * 2")
    assert c.eval("(calls[1].detached().key, calls[1].detached().addr) == (calls[1].key, calls[1].addr)")
    time.sleep(1.0)
    assert c.eval("cancel_calls(held._calls)") == 2  # the second escalates both
    with pytest.raises(ControllerError) as ended:
        c.eval("held.get(timeout=30)")
    assert ended.value.kind == "SupervisionError", ended.value.message


def _peers_of(cluster: Cluster, pid: int) -> set[str]:
    """The addresses process ``pid`` of the login host has TCP connections to."""
    out = cluster.run_in_login(["ss", "-tnpH"], capture_output=True, text=True, timeout=30, check=True).stdout
    return {ln.split()[4] for ln in out.splitlines() if f"pid={pid}," in ln}


def test_a_controller_reaches_workers_across_hosts_only_through_their_agents(
    controllers, cluster, state_home
):
    # START-1: across hosts a controller's calls go through the relays, and so do the
    # ping that raises the workers' epoch as a session starts (FENCE-1), the calls to
    # the built-in actor (an attach's new root, a cell's flush, the log level, the
    # inspector's calls in flight, an administrator's stacks) and a death's
    # __supervise__ calls: no connection to any worker (a call to a host's only proc
    # would go direct, ORDER-1's one hop; none here). At 64 x 16 they opened 1,024.
    ssh = f"SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}]).state(cached_path=None).hosts"
    first = _new(controllers, cluster, state_home)
    first.run(f"import os\nprocs = {ssh}.spawn_procs(per_host={{'procs': 2}}, name='fenced')")
    first.run("counter = procs.spawn('counter', Counter)")
    assert first.eval("counter.incr.call().get(timeout=30).values()") == [1, 1, 1, 1]
    second = _new(controllers, cluster, state_home)
    second.run("import os\nprocs = attach('fenced')\nsession = procs._session('t')")
    epoch = second.eval("session.epoch")
    assert epoch > first.eval("procs._session('t').epoch")
    # Every worker has the new epoch before any call of the new controller...
    pings = second.eval("[list(p) for p in session.client.ping_workers(0, 5.0).values()]")
    assert [p[1] for p in pings] == [epoch] * 4, pings
    # ...so the first controller's next call is refused at once.
    with pytest.raises(ControllerError) as fenced:
        first.eval("counter.incr.call().get(timeout=30).values()")
    assert fenced.value.kind == "MeshOwnershipError"
    assert second.eval("procs.actors['counter'].incr.call().get(timeout=30).values()") == [2, 2, 2, 2]
    assert second.eval("session.flush('cell-1')") == [0, 1, 2, 3]
    # The inspector's calls in flight: a call napping on host 1's procs counts there.
    second.run("napping = procs.actors['counter'].slice(hosts=1).nap.call(5)")
    deadline = time.monotonic() + WITHIN
    while (busy := second.eval("session.calls_in_flight([0, 1, 2, 3])")) != {"0": 0, "1": 0, "2": 1, "3": 1}:
        assert time.monotonic() < deadline, busy
        time.sleep(0.1)
    assert second.eval("napping.get(timeout=30).values()") == ["woke", "woke"]
    second.run("procs.logging_option(stream_to_client=True, level=20)")
    # An administrator's look (the panel's stacks, `monarch-kernel debug`) from a
    # process with no session goes through the relays too.
    third = _new(controllers, cluster, state_home)
    third.run(
        "import os\nfrom monarch_kernel.controller import ask_workers\n"
        "from monarch_kernel.hosts import registry\nfrom monarch_kernel.hosts._admin import group_of\n"
        "rec = registry.read('fenced')\nlive = group_of(rec).list_workers()"
    )
    assert (
        third.eval("['Thread ' in (s or '') for s in ask_workers(rec, live, 'stacks', 10.0)]") == [True] * 4
    )
    # A rank's death reaches the other ranks' __supervise__ through the relays too.
    second.run(
        "class Watcher(Actor):\n"
        "    def __init__(self):\n        self.seen = []\n"
        "    def __supervise__(self, failure):\n        self.seen.append([failure.kind, failure.rank])\n"
        "    @endpoint\n    def events(self):\n        return self.seen\n"
        "watchers = procs.spawn('watchers', Watcher)"
    )
    pid = second.eval("[w['pid'] for w in session.client.list_workers() if w['rank'] == 3][0]")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WITHIN
    while (seen := second.eval("watchers.slice(hosts=0).events.call().get(timeout=30).values()")) != [
        [["dead", 3]],
        [["dead", 3]],
    ]:
        assert time.monotonic() < deadline, seen
        time.sleep(0.1)
    workers = set(second.eval("list(session.ref.addrs)"))
    assert len(workers) == 4
    for c in (first, second, third):
        peers = _peers_of(cluster, c.eval("os.getpid()"))
        assert peers and not peers & workers, ([first, second, third].index(c), peers, workers)
    second.run("procs.stop()")


def test_the_control_plane_across_hosts_is_tls(controllers, cluster, state_home):
    c = _new(controllers, cluster, state_home)
    c.run(
        f"procs = SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}])"
        ".state(cached_path=None).hosts.spawn_procs(per_host={'procs': 1})"
    )
    rec = c.eval("[procs._session('t').rec.ca, procs._proc.token, procs._proc.addrs[1]]")
    ca, token, addr = rec
    assert ca.startswith("-----BEGIN CERTIFICATE-----")
    # A client that has the token but not the mesh's CA (plaintext) is refused, saying TLS.
    probe = (
        "import sys\nfrom monarch_kernel import _native\n"
        f"conn = _native.WorkerConn({addr!r}, {token!r})\n"
        "try:\n    conn.ping(5.0)\nexcept Exception as e:\n    print(type(e).__name__, e)\n    sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    done = cluster.run_in_login([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TLS" in done.stdout, done.stdout


def test_every_worker_reports_its_own_usage_on_its_host(controllers, cluster, state_home):
    c = _new(controllers, cluster, state_home)
    c.run(
        f"procs = SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}])"
        ".state(cached_path=None).hosts.spawn_procs(per_host={'procs': 1})"
    )
    c.run(
        "counter = procs.spawn('counter', Counter)\ncounter.slice(hosts=1).hold.call_one(256 << 20).get(timeout=60)"
    )
    small, big = c.eval("procs._session('t').usage([0, 1])")
    assert big["rss"] - small["rss"] > 200 << 20, (small, big)  # each measured itself, on its host
    rows = c.eval("[(p.rank, p.host, p.state) for p in procs.proc_rows()]")
    assert [r[1] for r in rows] == ["h1", "h2"]


def test_killing_a_job_and_an_idle_timeout_leave_nothing_on_any_host(
    hosts_code, controllers, cluster, state_home
):
    c = _new(controllers, cluster, state_home)
    c.run(f"hosts = {hosts_code}\njob_hosts = hosts")
    c.run("procs = hosts.spawn_procs(per_host={'procs': 1}, name='idle', idle_timeout=2)")
    assert c.eval("procs.status()") == ["alive", "alive"]
    c.close()  # no controller: the hosts' agents stop after 2 s
    assert _wait_gone(cluster, within=WITHIN), _ours_on_hosts(cluster)
    deadline = time.monotonic() + WITHIN
    while _slurm_jobs(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _slurm_jobs(cluster)
    # job.kill() stops what was spawned from the job, from any process.
    c = _new(controllers, cluster, state_home)
    job = hosts_code.rsplit(".state(", 1)[0]
    c.run(
        f"job = {job}\nprocs = job.state(cached_path=None).hosts.spawn_procs(per_host={{'procs': 1}}, name='killed')"
    )
    assert c.eval("procs.status()") == ["alive", "alive"]
    c.run("job.kill()")
    assert c.eval("job.active") is False
    assert _wait_gone(cluster), _ours_on_hosts(cluster)


def test_a_look_from_outside_the_cluster_keeps_its_meshes_and_says_where_they_run(
    controllers, cluster, state_home
):
    # REGISTRY-3: this machine's root namespace shares the cluster's home (the state
    # folder) but reaches none of its addresses: ls and attach run there must keep
    # the state files of a mesh on h1 and of a mesh on the login host (whose agent's
    # pid is visible here, in another network namespace), and say where they run.
    c = _new(controllers, cluster, state_home)
    c.run(
        f"far = SSHJob(hosts=['h1'], ssh_args=['-F', {str(cluster.ssh_config)!r}]).state(cached_path=None)"
        ".hosts.spawn_procs(per_host={'procs': 1}, name='far')"
    )
    c.run(
        "from monarch_kernel import this_host\nnear = this_host().spawn_procs(per_host={'procs': 1}, name='near')"
    )
    files = {n: Path(state_home) / "monarch-kernel" / "meshes" / f"{n}.json" for n in ("far", "near")}
    before = {n: f.stat().st_ino for n, f in files.items()}
    outside = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    for _ in range(2):  # (a second look: the first one removed nothing)
        ls = subprocess.run([*_venv_cli(), "ls"], env=outside, capture_output=True, text=True, timeout=60)
        assert ls.returncode == 0 and "is gone" not in ls.stderr, ls.stderr
        assert {n: f.stat().st_ino for n, f in files.items()} == before
    rows = {ln.split()[0]: ln for ln in ls.stdout.splitlines()[1:]}
    assert "h1 unreachable from here" in rows["far"], ls.stdout
    assert "login unreachable from here" in rows["near"], ls.stdout
    probe = (
        "from monarch_kernel import attach\nfor n in ('far', 'near'):\n"
        "    try:\n        attach(n)\n    except Exception as e:\n        print(n, type(e).__name__, e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=outside, capture_output=True, text=True, timeout=60
    )
    said = {ln.split()[0]: ln for ln in done.stdout.splitlines()}
    assert "MeshUnreachableError" in said["far"] and "h1" in said["far"], done.stdout + done.stderr
    assert "MeshUnreachableError" in said["near"] and "login" in said["near"], done.stdout + done.stderr
    assert {n: f.stat().st_ino for n, f in files.items()} == before
    # Inside the cluster both are as they were.
    env = {**os.environ, **cluster.env(), "XDG_STATE_HOME": str(state_home)}
    ls = cluster.run_in_login([*_venv_cli(), "ls"], env=env, capture_output=True, text=True, timeout=60)
    rows = {ln.split()[0]: ln for ln in ls.stdout.splitlines()[1:]}
    assert "h1 1/1" in rows["far"] and "login 1/1" in rows["near"], ls.stdout + ls.stderr
    c.run("far.stop()\nnear.stop()")


def test_mesh_up_on_ssh_hosts_from_a_notebook(cluster, state_home, jupyter_path, tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "monarch", "display_name": "monarch", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell(f"cfg = {str(cluster.ssh_config)!r}"),
        nbformat.v4.new_code_cell('procs = %mesh up mh --hosts h1,h2 --procs 2 --ssh-args "-F {cfg}"'),
        nbformat.v4.new_code_cell("%mesh ls"),
        nbformat.v4.new_code_cell("%%mesh\nimport socket\nsocket.gethostname()"),
        nbformat.v4.new_code_cell("%mesh down mh"),
        nbformat.v4.new_code_cell(f"part = {cluster.partition!r}"),
        nbformat.v4.new_code_cell("slurm = %mesh up ms --slurm nodes=2,partition={part} --procs 1"),
        nbformat.v4.new_code_cell("print(slurm._session('t').rec.job['kind'], slurm.sizes)"),
        nbformat.v4.new_code_cell("%mesh down ms"),
    ]
    path = tmp_path / "mh.ipynb"
    nbformat.write(nb, str(path))
    env = {**os.environ, **cluster.env(), "XDG_STATE_HOME": str(state_home)}
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, str(root / "demo" / "run_notebook.py"), str(path)]
    done = cluster.run_in_login(argv, env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "mesh 'mh' up: 4 procs" in out, out
    assert "h1 2/2, h2 2/2" in out, out
    assert out.count("Out: 'h1'") == 2 and out.count("Out: 'h2'") == 2, out
    assert "stopped mh" in out
    assert "slurm {'hosts': 2, 'procs': 1}" in out, out
    assert "stopped ms" in out
    assert _wait_gone(cluster), _ours_on_hosts(cluster)


def test_calls_to_a_worker_keep_their_order_whichever_path_each_takes(
    hosts_code, controllers, cluster, state_home
):
    c = _new(controllers, cluster, state_home)
    c.run(f"procs = {hosts_code}.spawn_procs(per_host={{'procs': 2}})")
    c.run("counter = procs.spawn('counter', Counter)\none = counter.slice(hosts=1, procs=0)")
    # broadcasts (through the agents) and calls to one proc (direct when ORDER-1 allows),
    # all without waiting: each worker must run them in the order they were sent.
    c.run(
        "futures = []\n"
        "for _ in range(20):\n"
        "    counter.incr.broadcast()\n"
        "    futures.append(one.incr.call_one())\n"
        "    futures.append(counter.incr.call())\n"
        "    futures.append(one.incr.call_one())\n"
    )
    c.run("got = [f.get(timeout=60) for f in futures]")
    seen = c.eval("[g.values()[2] if hasattr(g, 'values') else g for g in got]")  # proc 2's
    # Each round: the broadcast (+1), the call_one (+1), the call() (+1), the call_one (+1).
    assert seen == [v for k in range(20) for v in (4 * k + 2, 4 * k + 3, 4 * k + 4)], seen
    assert c.eval("one.incr.call_one().get(timeout=30)") == 81  # and, all answered, direct again


def test_a_slurm_job_that_reaches_its_time_limit_is_reported_with_its_reason(
    controllers, cluster, state_home
):
    c = _new(controllers, cluster, state_home)
    c.run(
        f"procs = SlurmJob(meshes={{'hosts': 2}}, partition={cluster.partition!r}, time_limit='1')"
        ".state(cached_path=None).hosts.spawn_procs(per_host={'procs': 1})"
    )
    c.run("procs.on_failure(record)")
    assert c.eval("procs.status()") == ["alive", "alive"]
    kind, _host, message = _wait_failure(c, "lost", within=180.0)  # SLURM's shortest limit: a minute
    assert "time limit" in message, message
    assert _wait_gone(cluster), _ours_on_hosts(cluster)


PORTS_SETUP = """
import threading
from monarch_kernel import Channel, Port

class Relay(Actor):
    @endpoint
    def send(self, port, value):
        port.send((socket.gethostname(), value))

    @endpoint
    def forward(self, other, port, value):
        other.send.call_one(port, value).get(timeout=30)

    @endpoint(explicit_response_port=True)
    def later(self, port, x):
        threading.Timer(0.1, lambda: port.send((socket.gethostname(), x * 2))).start()
"""


def test_ports_work_between_hosts_and_the_controller(controllers, cluster, state_home):
    # Ports across hosts: the controller's port gets messages from workers on both
    # hosts (its port server faces the hosts), a port goes from a worker on h1 to one
    # on h2 (TLS, with the CA the port carries), and an explicit-response endpoint on
    # h2 answers the controller later from another thread.
    ssh = f"SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}]).state(cached_path=None).hosts"
    c = _new(controllers, cluster, state_home)
    c.run(PORTS_SETUP)
    c.run(f"procs = {ssh}.spawn_procs(per_host={{'procs': 1}})")
    c.run("relay = procs.spawn('relay', Relay)")
    c.run("port, receiver = Channel.open()")
    c.run("relay.send.call(port, 1).get(timeout=30)")
    got = sorted([c.eval("receiver.recv().get(timeout=30)"), c.eval("receiver.recv().get(timeout=30)")])
    assert got == [["h1", 1], ["h2", 1]]
    c.run("relay.slice(hosts=0).forward.call_one(relay.slice(hosts=1), port, 2).get(timeout=30)")
    assert c.eval("receiver.recv().get(timeout=30)") == ["h2", 2]
    assert c.eval("relay.slice(hosts=1).later.call_one(21).get(timeout=30)") == ["h2", 42]
    c.run("procs.stop()")


def test_distributed_tensors_reduce_and_move_across_hosts(controllers, cluster, state_home):
    c = _new(controllers, cluster, state_home)
    code = f"SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}]).state(cached_path=None).hosts"
    c.run(f"procs = {code}.spawn_procs(per_host={{'procs': 2}})")
    c.run("import torch, monarch_kernel as mk")
    c.run(
        "with procs.activate():\n"
        "    x = torch.ones(4) * (procs.rank_tensor(('hosts', 'procs')) + 1)\n"
        "    across = x.reduce('hosts', 'sum')\n"  # gloo between the two hosts
        "    everywhere = x.reduce(('hosts', 'procs'), 'sum')\n"
    )
    assert c.eval("mk.inspect(across, hosts=1, procs=1).tolist()") == [6.0] * 4  # 2 + 4
    assert c.eval("mk.inspect(everywhere, hosts=0).tolist()") == [10.0] * 4
    c.run("moved = x.slice_mesh(hosts=0).to_mesh(procs.slice(hosts=1))")  # h1 -> h2, proc to proc
    assert c.eval("[mk.inspect(moved, procs=p).tolist()[0] for p in (0, 1)]") == [1.0, 2.0]


def test_monarchs_slurm_job_arguments_reach_slurm(controllers, cluster, state_home, tmp_path):
    # SlurmJob as Monarch's examples write it: its name, log folder and CPUs per task
    # reach SLURM, and exclusive=True (--exclusive=user) still lets two meshes of this
    # user share the nodes (each mesh is a SLURM job of its own). (The test partition
    # oversubscribes by force, so SLURM shows no exclusivity; its nodes declare no
    # memory, so mem= would be refused, as on a cluster without it.)
    c = _new(controllers, cluster, state_home)
    c.run(
        f"job = SlurmJob({{'hosts': 2}}, job_name='mk-train', partition={cluster.partition!r}, "
        f"log_dir={str(tmp_path)!r}, exclusive=True, cpus_per_task=2, job_start_timeout=120)"
    )
    c.run("first = job.state(cached_path=None).hosts.spawn_procs(per_host={'procs': 1})")
    c.run("second = job.state(cached_path=None).hosts.spawn_procs(per_host={'procs': 1})")
    c.run("counter = second.spawn('counter', Counter)")
    assert c.eval("counter.incr.call().get(timeout=30).values()") == [1, 1]
    ids = [c.eval(f"{m}._session('test').rec.job['job_id']") for m in ("first", "second")]
    for job_id in ids:
        shown = subprocess.run(
            cluster.login_cmd(["scontrol", "show", "job", "-o", job_id]),
            env={**os.environ, **cluster.env()},
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        fields = dict(kv.split("=", 1) for kv in shown.split() if "=" in kv)
        assert (fields["JobName"], fields["CPUs/Task"], fields["NumTasks"]) == ("mk-train", "2", "2")
    kept = sorted(tmp_path.glob("*.out"))
    assert len(kept) == 2, kept
    assert all(p.read_text().count("MONARCH_AGENT_READY") == 2 for p in kept), [p.read_text() for p in kept]
    c.run("job.kill()")
    assert _wait_gone(cluster), _ours_on_hosts(cluster)


JOB_TOOLS_SETUP = """
import http.server, os, sys, threading, urllib.request
from monarch_kernel import this_proc
from monarch_kernel.job import PortForwarder, exec_command, hosts_from_config, set_current_job

class Site(Actor):
    @endpoint
    def serve(self):
        page = f"hello from {socket.gethostname()}".encode()

        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Page)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]
"""


def test_monarchs_job_tools_work_across_the_clusters_hosts(controllers, cluster, state_home, tmp_path):
    # Monarch's monarch.job as its getting-started uses it: the project's current job
    # gives hosts_from_config's host mesh; exec_command runs on every host (or one);
    # PortForwarder brings a web server on h2's loopback to the controller's.
    (tmp_path / "jobs.py").write_text(
        "from monarch_kernel.job import SSHJob\n"
        f"job = SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}])\n"
    )
    c = _new(controllers, cluster, state_home)
    c.run(JOB_TOOLS_SETUP)
    c.run(f"os.chdir({str(tmp_path)!r}); sys.path.insert(0, {str(tmp_path)!r}); set_current_job('jobs.job')")
    c.run("hosts = hosts_from_config('hosts')")
    assert c.eval("hosts.sizes") == {"hosts": 2}
    exits_5_on_h2 = "['sh', '-c', 'test \"$(hostname)\" = h2 && exit 5; exit 0']"
    assert c.eval(f"exec_command(hosts, {exits_5_on_h2}).get(timeout=120)") == 5
    assert c.eval(f"exec_command(hosts, {exits_5_on_h2}, rank=0).get(timeout=120)") == 0
    c.run("procs = hosts.spawn_procs(per_host={'procs': 1})")
    c.run("port = procs.slice(hosts=1).spawn('site', Site).serve.call_one().get(timeout=30)")
    c.run("fwd = this_proc().spawn('fwd', PortForwarder)")
    c.run(
        "addrs = fwd.forward.call_one(procs.slice(hosts=1), port, this_proc(), '127.0.0.1:0').get(timeout=60)"
    )
    got = c.eval("urllib.request.urlopen('http://' + addrs[0], timeout=30).read().decode()")
    assert got == "hello from h2"
    c.run("fwd.stop(); procs.stop()")


SHELL_SCRIPT = """
import sys
from monarch_kernel.job import SSHJob, shell

hosts = SSHJob(hosts=["h2"], ssh_args=["-F", {ssh_config!r}]).state(cached_path=None).hosts
sys.exit(shell(hosts, env={{"SHELL": "/bin/sh", "PS1": "on-h2$ "}}))
"""


def test_shell_opens_a_shell_on_a_host_of_the_cluster(cluster, state_home, tmp_path):
    # monarch.job's shell from a terminal on the login host, to h2 over ssh: what is
    # typed runs there, and its exit status comes back.
    script = tmp_path / "shell_h2.py"
    script.write_text(SHELL_SCRIPT.format(ssh_config=str(cluster.ssh_config)))
    env = {**os.environ, **cluster.env(), "XDG_STATE_HOME": str(state_home), "MONARCH_FORWARD_OUTPUT": "0"}
    term = Terminal(cluster.login_cmd([sys.executable, str(script)]), env=env, timeout=120)
    try:
        term.screen.expect_exact("on-h2$ ")
        term.screen.sendline("hostname; exit 4")
        term.screen.expect("\r\nh2\r\n")
        assert term.proc.wait(120) == 4
    finally:
        term.close()
    assert _wait_gone(cluster), _ours_on_hosts(cluster)
