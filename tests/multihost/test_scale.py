"""A mesh on 16 test hosts: the CI-sized run of what `make bench` measures at 64 x 16
(bench/scale.py). The calls go through the fan-out tree (TREE-1: with
``MONARCH_TREE_LIMIT=4`` the 16 hosts are 4 groups of 4, so a call to every proc is
4 messages), and what must hold at any size is checked here: every rank answers, the
views read through the agents (VIEW-2), a broadcast keeps its place before the next
call (ORDER-1 along the tree), a worker's
death names its rank and host, a lost group head is reported once as a host and the
rest of its group is still reached, and stop leaves nothing on any host.

Marked ``scale`` (and ``multihost``): ``-m 'not scale'`` skips it on a machine that
cannot make 16 namespaces."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from controller import Controller, ControllerError
from test_meshes import SETUP, _down_all, _wait_failure, _wait_gone

from tools.testcluster import Cluster

pytestmark = pytest.mark.scale

HOSTS, PER_HOST, GROUPS = 16, 8, 4


@pytest.fixture(scope="module")
def wide(can_make_clusters: None) -> Iterator[Cluster]:
    with Cluster.up(hosts=HOSTS) as made:
        yield made


@pytest.fixture
def ctl(wide: Cluster, state_home: Path) -> Iterator[Controller]:
    c = Controller(wide, str(state_home), env={"MONARCH_TREE_LIMIT": str(GROUPS)})
    c.run(SETUP)
    c.run("from monarch_kernel import _native")
    yield c
    c.close()
    _down_all(wide, state_home)


def test_a_mesh_on_16_hosts_calls_through_the_tree_and_reports_a_lost_head_as_one_host(
    ctl: Controller, wide: Cluster
) -> None:
    n = HOSTS * PER_HOST
    ctl.run(
        f"procs = SlurmJob(meshes={{'hosts': {HOSTS}}}, partition={wide.partition!r})"
        f".state(cached_path=None).hosts.spawn_procs(per_host={{'procs': {PER_HOST}}})"
    )
    ctl.run("procs.on_failure(record)")
    ctl.run("counter = procs.spawn('counter', Counter)")
    assert ctl.eval("counter.incr.call().get(timeout=120).values()") == [1] * n
    # One message per group head, not one per host.
    ctl.run("sent, (batches, replies) = _native.calls_sent(), _native.replies_received()")
    assert ctl.eval("counter.incr.call().get(timeout=60).values()") == [2] * n
    assert ctl.eval("_native.calls_sent() - sent") == GROUPS
    # Every reply came back through the heads, in their batches (make bench shows how many).
    got, in_batches = ctl.eval(
        "(_native.replies_received()[1] - replies, _native.replies_received()[0] - batches)"
    )
    assert got >= n and 1 <= in_batches <= got, (got, in_batches)  # (>=: a supervision call may reply too)
    where = ctl.eval("counter.where.call().get(timeout=60).values()")
    names = [where[h * PER_HOST][0] for h in range(HOSTS)]  # (SLURM's order of the hosts)
    assert sorted(names) == sorted(f"h{i}" for i in range(1, HOSTS + 1))
    assert [w[0] for w in where] == [names[r // PER_HOST] for r in range(n)]
    # VIEW-2: beyond 64 live ranks a view reads what each uses through the agents (one
    # message per host): no worker is asked.
    ctl.run("import monarch_kernel.controller._view as _v\n_v.ask_workers = None")
    ctl.run("view = _v.view_of(procs.name)")
    assert ctl.eval("[r['state'] for r in view['ranks']]") == ["alive"] * n
    assert ctl.eval("all(r['usage']['rss'] > 0 for r in view['ranks'])")
    # A broadcast, then a call: every worker ran the broadcast first.
    ctl.run("counter.incr.broadcast()")
    assert ctl.eval("counter.incr.call().get(timeout=60).values()") == [4] * n

    # A worker of a host that is not its group's head: its death names rank and host.
    dead = 5 * PER_HOST + 3  # on host 5, in the group of hosts 4..7
    os.kill(where[dead][1], signal.SIGKILL)
    kind, host, text = _wait_failure(ctl, "dead")
    assert host == names[5] and f"rank {dead}" in text, text
    with pytest.raises(ControllerError) as failed:
        ctl.eval("counter.incr.call().get(timeout=60)")
    assert failed.value.kind == "SupervisionError" and f"rank {dead}" in failed.value.message

    # The head of that group (host 4) lost with its agent: one host_lost, no deaths of its
    # ranks one by one; the rest of its group is reached through the next head.
    os.kill(ctl.eval("procs._session('t').rec.hosts[4]['agent_pid']"), signal.SIGKILL)
    kind, host, text = _wait_failure(ctl, "host_lost")
    assert host == names[4], text
    time.sleep(1)
    failures = ctl.eval("failures")
    assert [f for f in failures if f[0] == "host_lost"] == [[kind, host, text]]
    assert not [f for f in failures if f[0] == "dead" and f[1] == names[4]], failures
    survivors = "counter.slice(hosts=slice(6, 8))"
    assert ctl.eval(f"{survivors}.incr.call().get(timeout=60).values()") == [5] * (2 * PER_HOST)
    ctl.run("procs.stop()")
    assert _wait_gone(wide), "a process of ours is left on a host"
