"""The scale rows of `make bench`: 1,024 procs on 64 test hosts from one controller.

A cluster of ``BENCH_SCALE_HOSTS`` hosts (64; tools/testcluster: network namespaces on
this machine, each with its own sshd and slurmd) is made for these rows and removed
after. The controller runs inside the login host (this module with ``--inside``) and
measures, beside baselines taken in the same run:

- bring-up of hosts x 16 procs with SlurmJob and with SSHJob, to the first reply of
  every rank's actor (beside ``srun -N<hosts> true`` and one ``ssh true`` per host,
  16 at a time, as SSHJob starts its agents);
- ``call()`` to every rank and gather: the median, the call messages this controller
  sends per call (TREE-1 bounds them by 16) and the reply messages (relays' batches)
  it receives, the agents' CPU per call, and this process's CPU time per call
  on the call's path (the calling thread, and the native runtime less its idle use,
  measured in alternation) and in all (its supervision too),
  beside the same on 16 hosts x 4 procs;
- beside the call rows, the machine's bound: the same fan-out to as many bare Python
  processes, each answering a pipe byte with one thread and with three (a worker's
  wakes per call), ``bench/bare_fanout.py``;
- a worker killed among them: the time until the controller is told (``on_failure``);
- ``stop()``.

Every host shares this machine's CPUs (2 on the reference machine): 1,024 procs here
are 1,024 processes on those CPUs, not a real 64-node cluster.

    python -m bench.scale           # brings a cluster up, prints the rows, removes it
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import bare_fanout
from monarch_kernel import Actor, endpoint
from tools.testcluster import Cluster, ClusterError

ROOT = Path(__file__).resolve().parents[1]
_SELF = [sys.executable, "-m", "bench.scale"]

HOSTS = int(os.environ.get("BENCH_SCALE_HOSTS", "64"))
PER_HOST = int(os.environ.get("BENCH_SCALE_PROCS", "16"))
#: The baseline mesh of the CPU and latency rows (the multi-host rows' size).
BASE_HOSTS, BASE_PROCS = 16, 4
#: The calls to 1,024 procs (60 ms each): 30 per stretch, so that a stretch's first
#: call, slower after the idle one before it, is a small part of its CPU per call (the
#: baseline's stretches have 100).
N_CALLS = 90
#: The baseline's calls (3 ms each): enough for its CPU per call to be more than a few clock ticks.
BASE_CALLS = 300
#: Idle and busy stretches alternate this many times; each idle one lasts IDLE_S.
ROUNDS, IDLE_S = 3, 2.0
INSIDE_TIMEOUT = 900
Row = tuple[str, float, str, str, float, str]


class Echo(Actor):
    """Defined here, not imported from bench.run: this file is ``__main__`` in the
    measuring controller, so the class travels by value and no worker imports the
    bench (1,024 imports of bench.run took 80 s of this machine's bring-up)."""

    @endpoint
    def ping(self, x: Any) -> Any:
        return x


def _ticks(stat: Path) -> int:
    """utime + stime of a /proc ``stat`` file, in clock ticks (0 if it is gone)."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _cpu_of(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` have used (the test hosts share this
    machine's pid namespace)."""
    return sum(_ticks(Path(f"/proc/{pid}/stat")) for pid in pids) / os.sysconf("SC_CLK_TCK")


def _runtime_cpu() -> float:
    """CPU seconds this process's native runtime threads (``monarch-node``: the
    connections, the relays' replies, the slots calls wait on; ``monarch-block``: its
    blocking pool) have used, in nanoseconds' precision (``schedstat``: a clock tick,
    10 ms, is three of the baseline's calls)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() in ("monarch-node", "monarch-block"):
                total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _call_figures(procs: Any, name: str, n: int) -> dict[str, float]:
    """Median seconds of call() to every proc of ``procs`` with gather, the call
    messages sent per call, this process's CPU seconds per call on the call's path
    (the calling thread, and the native runtime less its idle use) and in all (its
    supervision too), what it uses per second while idle, and the floor this machine
    sets: the workers' own CPU per call (less their idle use) spread over every CPU.

    Idle stretches and stretches of calls alternate (``ROUNDS`` of each), so that the
    idle use subtracted from each stretch of calls is the one measured around it."""
    from monarch_kernel import _native

    ping = procs.spawn(name, Echo).ping
    ping.call(0).get(timeout=300)
    for _ in range(3):
        ping.call(1).get(timeout=60)
    session = procs._session("bench")
    pids = [w["pid"] for w in session.client.list_workers()]
    agents = [link.agent_pid for link in session.client.links if link.agent_pid]
    samples: list[float] = []
    idle = {"mine": 0.0, "theirs": 0.0, "agents": 0.0, "runtime": 0.0, "s": 0.0}
    busy = {"mine": 0.0, "theirs": 0.0, "agents": 0.0, "runtime": 0.0, "s": 0.0, "caller": 0.0}
    sent, (batches, _) = _native.calls_sent(), _native.replies_received()
    per_round = max(1, n // ROUNDS)

    # Reading 1,024 /proc files is this bench's work, not the calls': the clocks of
    # this process are read after the workers' at a stretch's start, and before them
    # at its end (read in the calling thread, it counted ~2 ms per call on the path).
    def start() -> dict[str, float]:
        theirs, of_agents, runtime = _cpu_of(pids), _cpu_of(agents), _runtime_cpu()
        return {
            "theirs": theirs,
            "agents": of_agents,
            "runtime": runtime,
            "mine": time.process_time(),
            "caller": time.thread_time(),
            "s": time.perf_counter(),
        }

    def add(into: dict[str, float], a: dict[str, float]) -> None:
        b = {"s": time.perf_counter(), "caller": time.thread_time(), "mine": time.process_time()}
        b["runtime"], b["agents"], b["theirs"] = _runtime_cpu(), _cpu_of(agents), _cpu_of(pids)
        for k in into:
            into[k] += b[k] - a[k]

    for _ in range(ROUNDS):
        a = start()
        time.sleep(IDLE_S)
        add(idle, a)
        a = start()
        for i in range(per_round):
            t = time.perf_counter()
            ping.call(i).get(timeout=60)
            samples.append(time.perf_counter() - t)
        add(busy, a)
    calls = per_round * ROUNDS
    rate = {k: idle[k] / idle["s"] for k in ("mine", "theirs", "agents", "runtime")}
    runtime = max(busy["runtime"] - rate["runtime"] * busy["s"], 0.0)
    return {
        "median": statistics.median(samples),
        "messages": (_native.calls_sent() - sent) / calls,
        "reply_messages": (_native.replies_received()[0] - batches) / calls,
        "cpu": busy["mine"] / calls,
        "cpu_path": (busy["caller"] + runtime) / calls,
        "cpu_caller": busy["caller"] / calls,
        "cpu_runtime": runtime / calls,
        "idle_cpu": rate["mine"],
        "workers_idle": rate["theirs"],
        "floor": max(busy["theirs"] - rate["theirs"] * busy["s"], 0.0) / calls / (os.cpu_count() or 1),
        "agents": max(busy["agents"] - rate["agents"] * busy["s"], 0.0) / calls / (os.cpu_count() or 1),
    }


def _bring_up(host_mesh: Any) -> tuple[Any, float]:
    """A mesh of PER_HOST procs per host with an actor on every proc; seconds from
    spawn_procs to the first reply of every rank."""
    t = time.perf_counter()
    procs = host_mesh.spawn_procs(per_host={"procs": PER_HOST})
    n = len(procs.spawn("first", Echo).ping.call(0).get(timeout=600).values())
    assert n == HOSTS * PER_HOST, n
    return procs, time.perf_counter() - t


def _death_seconds(procs: Any) -> float:
    """Seconds from SIGKILL of one worker (the middle rank) to the controller's report."""
    told = threading.Event()
    rank = HOSTS * PER_HOST // 2

    def seen(failure: Any) -> None:
        if failure.kind == "dead" and failure.rank == rank:
            told.set()

    procs.on_failure(seen)
    pid = next(w["pid"] for w in procs._session("bench").client.list_workers() if w["rank"] == rank)
    t = time.perf_counter()
    os.kill(pid, signal.SIGKILL)  # (the test hosts share this machine's pid namespace)
    if not told.wait(60):
        raise RuntimeError(f"the death of rank {rank} was not reported within 60 s")
    return time.perf_counter() - t


def inside(cfg: dict[str, Any]) -> dict[str, float]:
    """Every measurement of the controller side (in the login host)."""
    from monarch_kernel.job import SlurmJob, SSHJob

    out: dict[str, float] = {}
    hosts: list[str] = cfg["hosts"]
    ssh_args = ["-F", cfg["ssh_config"]]

    t = time.perf_counter()
    subprocess.run(["srun", f"-N{HOSTS}", "true"], check=True, capture_output=True)
    out["srun_true"] = time.perf_counter() - t
    t = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        for r in pool.map(
            lambda h: subprocess.run(["ssh", *ssh_args, h, "true"], capture_output=True), hosts
        ):
            r.check_returncode()
    out["ssh_true"] = time.perf_counter() - t

    # The baseline: call() to 16 hosts x 4 procs.
    base = SlurmJob(meshes={"hosts": BASE_HOSTS}, partition=cfg["partition"])
    procs = base.state(cached_path=None).hosts.spawn_procs(per_host={"procs": BASE_PROCS})
    try:
        for k, v in _call_figures(procs, "echo", BASE_CALLS).items():
            out[f"base_{k}"] = v
    finally:
        procs.stop()
        base.kill()

    slurm = SlurmJob(meshes={"hosts": HOSTS}, partition=cfg["partition"])
    procs, out["slurm_up"] = _bring_up(slurm.state(cached_path=None).hosts)
    try:
        for k, v in _call_figures(procs, "echo", N_CALLS).items():
            out[f"call_{k}"] = v
        out["death"] = _death_seconds(procs)
    finally:
        t = time.perf_counter()
        procs.stop()
        out["stop"] = time.perf_counter() - t
        slurm.kill()

    ssh = SSHJob(hosts=hosts, ssh_args=ssh_args)
    procs, out["ssh_up"] = _bring_up(ssh.state(cached_path=None).hosts)
    procs.stop()
    ssh.kill()
    return out


def measure() -> dict[str, float]:
    """Measures the bare fan-out, brings the cluster up, measures, removes it; the figures."""
    n = HOSTS * PER_HOST
    bare = {"bare_one": bare_fanout.median(n, "one"), "bare_three": bare_fanout.median(n, "three")}
    cluster = Cluster.up(hosts=HOSTS)
    state = tempfile.mkdtemp(prefix="bench-scale-")
    try:
        cfg = {
            "hosts": [h.name for h in cluster.hosts],
            "ssh_config": str(cluster.ssh_config),
            "partition": cluster.partition,
        }
        env = {**os.environ, **cluster.env(), "XDG_STATE_HOME": state, "MONARCH_FORWARD_OUTPUT": "0"}
        env.pop("MONARCH_TRANSFER_HOST", None)
        done = subprocess.run(
            cluster.login_cmd([*_SELF, "--inside", json.dumps(cfg)]),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=INSIDE_TIMEOUT,
        )
        if done.returncode:
            raise ClusterError(f"the measuring controller failed ({done.returncode}):\n{done.stderr[-3000:]}")
        figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
        return {**figures, **bare}
    except subprocess.SubprocessError as e:
        raise ClusterError(f"{e}\n{(getattr(e, 'stderr', None) or '')[-3000:]}") from e
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)


def to_rows(f: dict[str, float]) -> list[Row]:
    ms, nan = 1e3, float("nan")
    n, base_n = HOSTS * PER_HOST, BASE_HOSTS * BASE_PROCS
    size = f"{HOSTS} hosts x {PER_HOST} procs"
    return [
        (
            f"SlurmJob {size}: bring-up to every rank's reply",
            f["slurm_up"],
            "s",
            f"srun -N{HOSTS} true",
            f["srun_true"],
            "<= 30 s",
        ),
        (
            f"SSHJob {size}: bring-up to every rank's reply",
            f["ssh_up"],
            "s",
            f"ssh true x {HOSTS}, 16 at once",
            f["ssh_true"],
            "<= 45 s",
        ),
        (
            f"call() to {n} procs and gather",
            f["call_median"] * ms,
            "ms",
            f"call() to {base_n} procs",
            f["base_median"] * ms,
            "<= 50 ms",
        ),
        (
            f"  floor here: the {n} workers' CPU per call / {os.cpu_count()} CPUs",
            f["call_floor"] * ms,
            "ms",
            "",
            nan,
            "(a bound of this machine)",
        ),
        (
            f"  the {HOSTS} agents' CPU per call (their relays) / {os.cpu_count()} CPUs",
            f["call_agents"] * ms,
            "ms",
            f"the same, {BASE_HOSTS} agents, call() to {base_n}",
            f["base_agents"] * ms,
            "(with the floor: the call's CPU)",
        ),
        (
            f"  bare fan-out here: {n} Python processes answer a pipe byte, 3 threads each",
            f["bare_three"] * ms,
            "ms",
            "one thread each",
            f["bare_one"] * ms,
            "(no protocol: the wakes alone)",
        ),
        (
            f"messages per call() to {n} procs on {HOSTS} hosts",
            f["call_messages"],
            "msgs",
            "hosts",
            HOSTS,
            "<= 16",
        ),
        (
            f"  reply messages the controller receives per call() to {n} procs",
            f["call_reply_messages"],
            "msgs",
            f"call() to {base_n} procs",
            f["base_reply_messages"],
            "(relays' batches)",
        ),
        (
            f"controller CPU per call() to {n} procs, on its path",
            f["call_cpu_path"] * ms,
            "ms",
            f"the same, call() to {base_n} on {BASE_HOSTS} hosts",
            f["base_cpu_path"] * ms,
            "<= 4 x baseline",
        ),
        (
            "    of it, the calling thread",
            f["call_cpu_caller"] * ms,
            "ms",
            f"call() to {base_n}",
            f["base_cpu_caller"] * ms,
            "",
        ),
        (
            "    of it, the native runtime (less its idle use)",
            f["call_cpu_runtime"] * ms,
            "ms",
            f"call() to {base_n}",
            f["base_cpu_runtime"] * ms,
            "",
        ),
        (
            f"  controller CPU per call() to {n} procs, raw",
            f["call_cpu"] * ms,
            "ms",
            f"raw, call() to {base_n}",
            f["base_cpu"] * ms,
            "(with supervision)",
        ),
        (
            f"  controller CPU per second, idle, {n} procs",
            f["call_idle_cpu"] * ms,
            "ms",
            f"idle, {base_n} procs",
            f["base_idle_cpu"] * ms,
            "(supervision)",
        ),
        (
            f"  workers' CPU per second, idle, {n} procs",
            f["call_workers_idle"] * ms,
            "ms",
            f"idle, {base_n} procs",
            f["base_workers_idle"] * ms,
            "",
        ),
        (f"death of 1 worker among {n} reported", f["death"] * ms, "ms", "", nan, "<= 1000 ms"),
        (f"stop() of {n} procs", f["stop"], "s", "", nan, "seconds"),
    ]


def rows() -> list[Row]:
    return to_rows(measure())


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--inside":
        print(json.dumps(inside(json.loads(argv[1]))), flush=True)
    else:
        from bench.run import print_cluster_rows

        print_cluster_rows(rows, HOSTS, "scale")


if __name__ == "__main__":
    main(sys.argv[1:])
