"""Chaos across three test hosts (issue 24): while a workload calls every live rank
and checks every result, hosts are partitioned for 6-9 s (one at a time, and the
controller's own link), workers are killed and respawned. Calls to a partitioned
host wait and complete; no call fails, is lost or runs twice because of a
partition (RESUME-1). Calls to a killed worker fail with its death, and only those.

The mesh is started with SSHJob, two procs on each of h1, h2, h3; the controller
runs on the login host. About a minute and a half."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from controller import Controller
from test_meshes import SETUP, _down_all
from test_partitions import LEDGER

from tools.testcluster import Cluster, unavailable

#: Seconds the workload runs before anything happens, and after each event.
SETTLE_S = 3.0

WORKLOAD = """
import threading

ledger = procs.spawn('ledger', Ledger)
ranks = [ledger.slice(hosts=h, procs=p) for h in range(3) for p in range(2)]
outcomes = []      # (round, rank, pid or None, 'ok' | what went wrong)
stop_work = threading.Event()

def work():
    i = 0
    while not stop_work.is_set():
        pending = []
        status = procs.status()
        for r, one in enumerate(ranks):
            if status[r] == 'dead':
                continue
            try:
                pending.append((r, one.record.call_one(f'{i}/{r}')))
            except Exception as e:
                outcomes.append((i, r, f'{type(e).__name__}: {e}'))
        for r, fut in pending:
            try:
                n = fut.get(timeout=180)
                outcomes.append((i, r, 'ok' if n == [1, 0] else f'ran {n[0]} times'))
            except Exception as e:
                outcomes.append((i, r, f'{type(e).__name__}: {e}'))
        i += 1
        time.sleep(0.02)

worker = threading.Thread(target=work, daemon=True)
worker.start()
"""


@pytest.fixture(scope="module")
def cluster3() -> Iterator[Cluster]:
    if reason := unavailable():
        pytest.skip(f"no test cluster: {reason}")
    with Cluster.up(hosts=3, slurm=False) as made:
        yield made


def _link(cluster: Cluster, host: str, up: bool) -> None:
    bridge = cluster.record["namespaces"][0]
    subprocess.run(["ip", "-n", bridge, "link", "set", host, "up" if up else "down"], check=True)


def _partition(cluster: Cluster, host: str, seconds: float) -> None:
    _link(cluster, host, False)
    try:
        time.sleep(seconds)
    finally:
        _link(cluster, host, True)
    time.sleep(SETTLE_S)


def _kill_and_respawn(c: Controller, rank: int) -> None:
    pid = c.eval(f"ranks[{rank}].pid.call_one().get(timeout=60)")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while c.eval(f"procs.status()[{rank}]") != "dead" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert c.eval("procs.respawn()") == [rank]
    time.sleep(SETTLE_S)


def test_partitions_kills_and_respawns_lose_and_repeat_no_call(cluster3, state_home):
    c = Controller(cluster3, str(state_home))
    try:
        c.run(SETUP)
        c.run(
            "procs = SSHJob(hosts=['h1', 'h2', 'h3'], "
            f"ssh_args=['-F', {str(cluster3.ssh_config)!r}]).state(cached_path=None).hosts"
            ".spawn_procs(per_host={'procs': 2})"
        )
        c.run("procs.on_failure(record)")
        c.run(LEDGER)
        c.run(WORKLOAD)
        time.sleep(SETTLE_S)
        killed: set[int] = set()
        _partition(cluster3, "h2", 7.0)
        _kill_and_respawn(c, 5)
        killed.add(5)
        _partition(cluster3, "h1", 8.0)
        _partition(cluster3, "login", 6.0)  # the controller's own link
        _kill_and_respawn(c, 0)
        killed.add(0)
        _partition(cluster3, "h3", 9.0)
        c.run("stop_work.set(); worker.join(240)")
        assert not c.eval("worker.is_alive()"), "the workload hangs"
        outcomes = [tuple(o) for o in c.eval("outcomes")]
        counts = c.eval(
            "list(zip(ledger.pid.call().get(timeout=60).values(), ledger.counts.call().get(timeout=60).values()))"
        )
        failures = c.eval("failures")
    finally:
        c.close()
        _down_all(cluster3, state_home)
    ok = [o for o in outcomes if o[2] == "ok"]
    bad = [o for o in outcomes if o[2] != "ok"]
    # Only calls to a killed worker may fail, and only with its death.
    unexpected = [o for o in bad if o[1] not in killed or "SupervisionError" not in o[2]]
    assert not unexpected, unexpected[:10]
    assert len([o for o in bad if o[1] in killed]) <= 2 * len(killed), bad
    assert {o[1] for o in ok} == set(range(6)), "some rank never answered"
    rounds = max(o[0] for o in outcomes)
    # Exactly once: no process ran a call twice (a killed one's calls went with it).
    for rank, (pid, runs) in enumerate(counts):
        twice = {k: n for k, n in runs.items() if n != 1}
        assert not twice, f"rank {rank} (pid {pid}) ran calls more than once: {twice}"
    kinds = [f[0] for f in failures]
    assert "unreachable" in kinds and "host_back" in kinds, kinds
    assert not [f for f in failures if f[0] in ("host_lost", "lost")], failures
    print(f"{rounds} rounds, {len(ok)} calls answered, {len(bad)} failed (killed ranks only)")
