"""The multi-host rows of `make bench`, measured on a test cluster on this machine.

One cluster (tools/testcluster: hosts h1..hN in network namespaces, each with
its own sshd and slurmd, and a login host) is made for the whole run. The controller
side runs inside the login host (this module with ``--inside``); the raw baselines run in
the hosts' namespaces (``--echo``, ``--sink``, ``--stream``). Traffic goes only to
loopback or to addresses of the cluster. ``down()`` kills whatever still runs in its
namespaces, meshes included.

Two things to know when reading the figures:

- The test hosts share this machine's kernel and pid namespace, so read_into between
  them would use process_vm_readv. The read_into row forces the TCP path
  (MONARCH_TRANSFER_TCP=1 in the workers), the path real hosts use.
- Every host shares this machine's CPUs (2 on the reference machine): 64 procs on 16
  test hosts is 64 processes on those CPUs, not a real 16-node cluster.

    python -m bench.multihost           # brings a cluster up, prints the rows, removes it
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.run import Echo, Puller, Tensors, timed  # the actors and timing make bench uses
from tools.testcluster import Cluster, ClusterError

#: This module run again, from the repository's root (``ROOT``): in a host's namespace
#: (the raw baselines), and as the controller in the login host (``--inside``).
ROOT = Path(__file__).resolve().parents[1]
_SELF = [sys.executable, "-m", "bench.multihost"]

#: Hosts of the cluster, and procs per host of the call() mesh (the issue: 16 x 4).
HOSTS = int(os.environ.get("BENCH_HOSTS", "16"))
PER_HOST = 4
#: Hosts x procs of the bring-up meshes (the issue: 4 x 2).
UP_HOSTS, UP_PROCS = 4, 2
N_CALLS = int(os.environ.get("BENCH_CALLS", "2000"))  # as bench/run.py
N_FANOUT = 50
N_UP = 3  # bring-ups of each kind (median)
INSIDE_TIMEOUT = 300  # seconds for every measurement of the controller side (about 30 s)
GIB = 1 << 30
#: The rows' format is bench/run.py's: metric, value, unit, baseline name, baseline
#: value (nan: none), target.
Row = tuple[str, float, str, str, float, str]


# -- actors (run in the workers; this file is __main__ there, so they travel by value) ---


# -- raw baselines, each run inside a host's namespace -----------------------------------


def serve_echo(addr: str) -> None:
    """Echoes small messages on one connection (in h1); prints the port first."""
    srv = socket.create_server((addr, 0))
    print(srv.getsockname()[1], flush=True)
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := c.recv(64):
        c.sendall(data)


def serve_sink(addr: str, nbytes: int, rounds: int) -> None:
    """Receives ``nbytes`` into one buffer, ``rounds`` times, answering a byte after
    each (in h2); prints the port first."""
    srv = socket.create_server((addr, 0))
    print(srv.getsockname()[1], flush=True)
    dst = bytearray(nbytes)
    for _ in range(rounds):
        conn, _ = srv.accept()
        with conn:
            view, n = memoryview(dst), 0
            while n < nbytes:
                k = conn.recv_into(view[n:], min(nbytes - n, 1 << 24))
                if not k:
                    break
                n += k
            conn.sendall(b"k")


def stream(addr: str, port: int, nbytes: int, rounds: int) -> None:
    """sendall of ``nbytes`` to the sink until it answers, ``rounds`` times (in h1);
    prints the median seconds."""
    src = bytearray(nbytes)
    samples = []
    for _ in range(rounds):
        with socket.create_connection((addr, port)) as c:
            t = time.perf_counter()
            c.sendall(src)
            c.recv(1)
            samples.append(time.perf_counter() - t)
    print(statistics.median(samples), flush=True)


def _in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *_SELF, *args]


def _port_of(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise ClusterError(f"a baseline server exited (status {proc.wait()}) before it listened")
    return int(line)


def tcp_stream_seconds(src_ns: str, dst_ns: str, dst_addr: str, rounds: int = 3) -> float:
    """Median seconds of one raw TCP stream of 1 GiB from ``src_ns`` to ``dst_ns``."""
    sink = subprocess.Popen(
        _in_ns(dst_ns, "--sink", dst_addr, str(GIB), str(rounds)), stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        port = _port_of(sink)
        out = subprocess.run(
            _in_ns(src_ns, "--stream", dst_addr, str(port), str(GIB), str(rounds)),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return float(out.stdout.split()[-1])
    finally:
        sink.kill()
        sink.wait()


# -- the controller side, inside the login host ------------------------------------------


def inside(cfg: dict[str, Any]) -> dict[str, float]:
    """Every measurement the controller makes (in the login host); seconds, bytes/s
    and counts by name."""
    from monarch_kernel import _native, this_host
    from monarch_kernel.job import SlurmJob, SSHJob

    out: dict[str, float] = {}
    hosts: list[str] = cfg["hosts"]
    ssh_args = ["-F", cfg["ssh_config"]]

    # One host: call_one to a proc beside the controller (the login host).
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        one = procs.spawn("echo", Echo).slice(procs=0).ping
        out["local_rt"] = timed(lambda: one.call_one(7).get(), N_CALLS, warmup=100)
    finally:
        procs.stop()

    # Raw TCP round trip from here to h1 (the echo server there).
    cli = socket.create_connection((cfg["echo_addr"], cfg["echo_port"]))
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def echo_once() -> None:
        cli.sendall(b"x" * 16)
        cli.recv(64)

    with cli:
        out["tcp_rt"] = timed(echo_once, N_CALLS, warmup=100)

    def ssh_true() -> None:
        subprocess.run(["ssh", *ssh_args, hosts[0], "true"], check=True, capture_output=True)

    def srun_true() -> None:
        subprocess.run(["srun", f"-N{UP_HOSTS}", "true"], check=True, capture_output=True)

    out["ssh_true"] = timed(ssh_true, 3, warmup=1)
    out["srun_true"] = timed(srun_true, 3, warmup=1)

    def bring_up(host_mesh: Any, env: dict[str, str] | None = None) -> tuple[Any, float]:
        """The last of N_UP meshes brought up (the others stopped), and the median
        seconds from spawn_procs to the first reply of every proc's actor."""
        samples, procs = [], None
        for _ in range(N_UP):
            if procs is not None:
                procs.stop()
            t = time.perf_counter()
            procs = host_mesh.spawn_procs(per_host={"procs": UP_PROCS}, env=env)
            procs.spawn("echo", Echo).ping.call(0).get(timeout=120)
            samples.append(time.perf_counter() - t)
        return procs, statistics.median(samples)

    # SSHJob 4 x 2: bring-up, call_one to h1, read_into from h1 to h2 (TCP path).
    job = SSHJob(hosts=hosts[:UP_HOSTS], ssh_args=ssh_args)
    procs, out["ssh_up"] = bring_up(job.state(cached_path=None).hosts, {"MONARCH_TRANSFER_TCP": "1"})
    try:
        e = procs.spawn("echo2", Echo).slice(hosts=0, procs=0).ping
        out["remote_rt"] = timed(lambda: e.call_one(7).get(), N_CALLS, warmup=100)
        buf = procs.slice(hosts=0, procs=0).spawn("holder", Tensors).hold.call_one(GIB).get(timeout=120)
        puller = procs.slice(hosts=1, procs=0).spawn("puller", Puller)
        out["read_into"] = puller.pull.call_one(buf, 3).get(timeout=600)
        buf.drop()
    finally:
        procs.stop()

    # SlurmJob 4 x 2: bring-up.
    slurm = SlurmJob(meshes={"hosts": UP_HOSTS}, partition=cfg["partition"])
    procs, out["slurm_up"] = bring_up(slurm.state(cached_path=None).hosts)
    procs.stop()

    # Every host x PER_HOST: call() and gather; call messages this controller sends per call.
    job = SSHJob(hosts=hosts, ssh_args=ssh_args)
    t = time.perf_counter()
    procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"procs": PER_HOST})
    try:
        fan = procs.spawn("echo", Echo).ping
        fan.call(0).get(timeout=120)
        out["wide_up"] = time.perf_counter() - t
        before = _native.calls_sent()
        out["fanout"] = timed(lambda: fan.call(7).get(timeout=60), N_FANOUT, warmup=5)
        out["messages"] = (_native.calls_sent() - before) / (N_FANOUT + 5)
        out["procs"] = len(procs._proc.addrs)
    finally:
        procs.stop()
    return out


# -- the rows ----------------------------------------------------------------------------


def measure(hosts: int = HOSTS) -> dict[str, float]:
    """Brings a cluster of ``hosts`` hosts up, measures, removes it; the figures."""
    cluster = Cluster.up(hosts=hosts)
    state = tempfile.mkdtemp(prefix="bench-multihost-")
    echo: subprocess.Popen[str] | None = None
    try:
        h1, h2 = cluster.hosts[0], cluster.hosts[1]
        stream_s = tcp_stream_seconds(h1.ns, h2.ns, h2.addr)
        echo = subprocess.Popen(_in_ns(h1.ns, "--echo", h1.addr), stdout=subprocess.PIPE, text=True, cwd=ROOT)
        cfg = {
            "hosts": [h.name for h in cluster.hosts],
            "ssh_config": str(cluster.ssh_config),
            "partition": cluster.partition,
            "echo_addr": h1.addr,
            "echo_port": _port_of(echo),
        }
        env = {**os.environ, **cluster.env(), "XDG_STATE_HOME": state, "MONARCH_FORWARD_OUTPUT": "0"}
        env.pop("MONARCH_TRANSFER_HOST", None)  # the controller's engine faces the hosts
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
        figures["stream"] = stream_s
        figures["hosts"] = hosts
        return figures
    except subprocess.SubprocessError as e:  # a baseline failed, or a timeout
        detail = getattr(e, "stderr", None) or ""
        raise ClusterError(f"{e}\n{detail[-3000:]}") from e
    finally:
        if echo is not None:
            echo.kill()
            echo.wait()
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)


def to_rows(f: dict[str, float]) -> list[Row]:
    """bench/run.py's rows from :func:`measure`'s figures."""
    us, ms = 1e6, 1e3
    n, procs = int(f["hosts"]), int(f["procs"])
    nan = float("nan")
    up = f"{UP_HOSTS} hosts x {UP_PROCS} procs"
    return [
        (
            "call_one round trip to a proc on another host",
            f["remote_rt"] * us,
            "us",
            "TCP RTT + one-host call_one",
            (f["tcp_rt"] + f["local_rt"]) * us,
            "<= 1.5 x (TCP RTT + one-host call_one)",
        ),
        (
            "one-host call_one (login host), vs TCP RTT",
            f["local_rt"] * us,
            "us",
            "TCP round trip login-h1",
            f["tcp_rt"] * us,
            "(the baseline above)",
        ),
        (f"call() to {procs} procs on {n} hosts and gather", f["fanout"] * ms, "ms", "", nan, "<= 25 ms"),
        (
            f"messages per call() to {procs} procs on {n} hosts",
            f["messages"],
            "msgs",
            "hosts in the call",
            n,
            f"{n} (one per host)",
        ),
        (f"bring-up, SSHJob {n} hosts x {PER_HOST} procs", f["wide_up"] * ms, "ms", "", nan, ""),
        (
            f"SSHJob {up}: spawn_procs to first reply",
            f["ssh_up"] * ms,
            "ms",
            "ssh h1 true",
            f["ssh_true"] * ms,
            "<= 1500 ms",
        ),
        (
            f"SlurmJob {up}: spawn_procs to first reply",
            f["slurm_up"] * ms,
            "ms",
            f"srun -N{UP_HOSTS} true",
            f["srun_true"] * ms,
            "<= 1500 ms + srun",
        ),
        (
            "read_into of 1 GiB, h1 -> h2, TCP path (GB/s)",
            GIB / f["read_into"] / 1e9,
            "GB/s",
            "raw TCP stream h1 -> h2",
            GIB / f["stream"] / 1e9,
            ">= 0.8 x raw TCP stream",
        ),
    ]


def rows() -> list[Row]:
    """The multi-host rows (a cluster is made and removed meanwhile)."""
    return to_rows(measure())


def main(argv: list[str]) -> None:
    mode = argv[0] if argv else ""
    if mode == "--inside":
        print(json.dumps(inside(json.loads(argv[1]))), flush=True)
    elif mode == "--echo":
        serve_echo(argv[1])
    elif mode == "--sink":
        serve_sink(argv[1], int(argv[2]), int(argv[3]))
    elif mode == "--stream":
        stream(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
    else:
        from bench.run import print_cluster_rows

        print_cluster_rows(rows, HOSTS, "multi-host")


if __name__ == "__main__":
    main(sys.argv[1:])
