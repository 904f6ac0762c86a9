"""Calls across a network partition on the test cluster (RESUME-1): a host whose link
goes down for longer than the keepalive is unreachable, its ranks' calls wait (those
in flight, those made during the partition, direct and fanned out through its agent,
and a large transfer), and when the link comes back each completes with its one
result, run exactly once. Through SSHJob and SlurmJob, the controller on the login
host, two hosts of two procs each."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from proc_helpers import sigstop
from test_meshes import SETUP, _new, _wait_failure, controllers, hosts_code  # noqa: F401 (fixtures)

from tools.testcluster import Cluster

#: Longer than the keepalive that drops a silent connection (1 s, then 3 s).
PARTITION_S = 7.0

LEDGER = """
class Ledger(Actor):
    '''Counts how often each call ran on this rank.'''
    def __init__(self):
        self.runs = {}
    @endpoint
    def record(self, key, seconds=0.0, data=None):
        self.runs[key] = self.runs.get(key, 0) + 1
        end = time.time() + seconds
        while time.time() < end:
            time.sleep(0.01)
        return [self.runs[key], 0 if data is None else int(data.nbytes)]
    @endpoint
    def counts(self):
        return dict(self.runs)
    @endpoint
    def pid(self):
        return os.getpid()
"""


@contextmanager
def partitioned(cluster: Cluster, host: str) -> Iterator[None]:
    """``host``'s link to the cluster's bridge is down inside the block."""
    bridge = cluster.record["namespaces"][0]
    subprocess.run(["ip", "-n", bridge, "link", "set", host, "down"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", bridge, "link", "set", host, "up"], check=True)


def test_calls_across_a_partition_wait_and_complete_once_each(hosts_code, controllers, cluster, state_home):  # noqa: F811
    c = _new(controllers, cluster, state_home)
    c.run(f"procs = {hosts_code}.spawn_procs(per_host={{'procs': 2}})")
    c.run("procs.on_failure(record)")
    c.run(LEDGER)
    c.run("ledger = procs.spawn('ledger', Ledger)")
    assert c.eval("ledger.record.call('warm').get(timeout=60).values()") == [[1, 0]] * 4
    c.run("big = np.ones((64 << 20) // 8)")
    # In flight on both hosts (fanned out through each agent) when the link goes down.
    c.run("during = ledger.record.call('during', 2.0)")
    c.run("direct_during = ledger.slice(hosts=1, procs=0).record.call_one('direct_during', 2.0)")
    time.sleep(0.5)
    with partitioned(cluster, "h2"):
        t0 = time.monotonic()
        # Made while h2 cannot be reached: to its ranks, one direct, and 64 MiB.
        c.run("made = ledger.slice(hosts=1).record.call('made')")
        c.run("direct_made = ledger.slice(hosts=1, procs=1).record.call_one('direct_made')")
        # (a send waits until its receiver has pulled the buffers (XFER-2): in a thread)
        c.run(
            "import threading; pushed = []; threading.Thread(target=lambda: pushed.append("
            "ledger.slice(hosts=1, procs=0).record.call_one('pushed', 0.0, big).get(timeout=120)), "
            "daemon=True).start()"
        )
        # A spawn, which waits for every rank (in a thread: it blocks until it is done).
        c.run(
            "late = []; threading.Thread(target=lambda: late.append(procs.spawn('late', Ledger)), "
            "daemon=True).start()"
        )
        _wait_failure(c, "unreachable")
        unreachable_after = time.monotonic() - t0
        # h1's ranks go on meanwhile.
        assert c.eval("ledger.slice(hosts=0).record.call('h1').get(timeout=30).values()") == [[1, 0]] * 2
        time.sleep(max(0.0, PARTITION_S - (time.monotonic() - t0)))
        waiting = c.eval("[f.done() for f in (made, direct_made)] + [bool(pushed), bool(late)]")
        assert waiting == [False] * 4, "a call to the partitioned host ended during the partition"
    _wait_failure(c, "host_back")
    assert c.eval("during.get(timeout=60).values()") == [[1, 0]] * 4
    assert c.eval("direct_during.get(timeout=60)") == [1, 0]
    assert c.eval("made.get(timeout=60).values()") == [[1, 0]] * 2
    assert c.eval("direct_made.get(timeout=60)") == [1, 0]
    deadline = time.monotonic() + 60
    while not c.eval("pushed") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert c.eval("pushed") == [[1, 64 << 20]]
    while not c.eval("late") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert c.eval("late[0].record.call('after').get(timeout=60).values()") == [[1, 0]] * 4
    counts = c.eval("ledger.counts.call().get(timeout=30).values()")
    for rank, runs in enumerate(counts):
        assert all(n == 1 for n in runs.values()), f"rank {rank} ran a call twice: {runs}"
    assert {k for k in counts[2]} >= {"during", "made", "direct_during", "pushed"}
    failures = c.eval("failures")
    assert not [f for f in failures if f[0] in ("dead", "lost", "host_lost")], failures
    print(f"unreachable reported {unreachable_after:.1f} s after the partition")


def test_a_call_to_a_remote_worker_stopped_longer_than_the_keepalive_completes_once(
    hosts_code,  # noqa: F811
    controllers,  # noqa: F811
    cluster,
    state_home,
):
    c = _new(controllers, cluster, state_home)
    c.run(f"procs = {hosts_code}.spawn_procs(per_host={{'procs': 1}})")
    c.run(LEDGER)
    c.run("ledger = procs.spawn('ledger', Ledger)")
    c.run("far = ledger.slice(hosts=1)")
    assert c.eval("far.record.call_one('pid').get(timeout=60)") == [1, 0]
    pid = c.eval("procs._session('t').client.worker(1)['pid']")
    c.run("first = far.record.call_one('first', 1.0)")
    time.sleep(0.3)
    sigstop(pid)
    try:
        c.run("second = far.record.call_one('second')")
        time.sleep(PARTITION_S)
        assert c.eval("[first.done(), second.done()]") == [False, False]
    finally:
        os.kill(pid, signal.SIGCONT)
    assert c.eval("first.get(timeout=60)") == [1, 0]
    assert c.eval("second.get(timeout=60)") == [1, 0]
    (runs,) = c.eval("ledger.slice(hosts=1).counts.call().get(timeout=30).values()")
    assert runs == {"pid": 1, "first": 1, "second": 1}, runs


FORKER = """
class Forker(Actor):
    @endpoint
    def fork_sleeper(self):
        child = os.fork()
        if child == 0:  # keeps every descriptor it inherited, the listening socket too
            time.sleep(300)
            os._exit(0)
        return child
    @endpoint
    def nap(self, seconds):
        time.sleep(seconds)
        return os.getpid()
"""


def test_a_fanned_out_call_to_a_killed_worker_whose_child_holds_its_socket_fails_with_its_death(
    controllers,  # noqa: F811
    cluster,
    state_home,
):
    c = _new(controllers, cluster, state_home)
    c.run(
        f"procs = SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}])"
        ".state(cached_path=None).hosts.spawn_procs(per_host={'procs': 2})"
    )
    c.run(FORKER)
    c.run("f = procs.spawn('forker', Forker)")
    child = c.eval("f.slice(hosts=1, procs=1).fork_sleeper.call_one().get(timeout=60)")
    try:
        pid = c.eval("procs._session('t').client.worker(3)['pid']")
        c.run("both = f.slice(hosts=1).nap.call(3.0)")  # one message, through h2's agent
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        c.run(
            "def outcome():\n"
            "    try:\n"
            "        return ['ok', both.get(timeout=60)]\n"
            "    except Exception as e:\n"
            "        return [type(e).__name__, str(e)]"
        )
        kind, message = c.eval("outcome()")
        assert kind == "SupervisionError" and "SIGKILL" in message and "rank 3" in message, message
        assert c.eval("f.slice(hosts=1, procs=0).nap.call_one(0.0).get(timeout=60)") > 0
    finally:
        os.kill(child, signal.SIGKILL)
