"""`make bench`: this project's figures beside baselines measured in the same run.

Prints one table: metric, this project, the baseline, the ratio (project / baseline)
and the issue's target. Medians unless the metric says otherwise. The output format is
stable: other tools read it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench import cells
from bench.calls import Echo, timed
from bench.calls import calls as bench_calls
from monarch_kernel import Actor, SupervisionError, attach, endpoint, this_host
from monarch_kernel.mesh._buffers import prefer_huge_pages
from tools.testcluster import ClusterError, unavailable

prefer_huge_pages()  # as the kernel does at start (its baselines here run with it too)

N_CALLS = int(os.environ.get("BENCH_CALLS", "2000"))


# -- baselines -------------------------------------------------------------------------


def _pipe_echo(conn: mp.connection.Connection) -> None:
    while True:
        x = conn.recv()
        if x is None:
            return
        conn.send(x)


def pipe_round_trip() -> float:
    a, b = mp.Pipe()
    p = mp.get_context("fork").Process(target=_pipe_echo, args=(b,))
    p.start()
    try:
        return timed(lambda: (a.send(1), a.recv()), N_CALLS)
    finally:
        a.send(None)
        p.join()


def tcp_round_trip() -> float:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := c.recv(64):
            c.sendall(data)
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cli = socket.create_connection(srv.getsockname())
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        return timed(lambda: (cli.sendall(b"x" * 16), cli.recv(64)), N_CALLS)
    finally:
        cli.close()
        srv.close()


def memcpy_seconds(nbytes: int = 64 << 20) -> float:
    src = bytearray(os.urandom(1 << 20)) * (nbytes >> 20)
    dst = bytearray(nbytes)
    mv = memoryview(dst)
    return timed(lambda: mv.__setitem__(slice(None), src), 20, warmup=3)


# -- this project ----------------------------------------------------------------------


def cold_spawn() -> tuple[float, float]:
    t = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": 4})
    e = procs.spawn("echo", Echo)
    e.ping.call(0).get(timeout=60)
    cold = time.perf_counter() - t
    samples = []
    for i in range(20):
        t = time.perf_counter()
        procs.spawn(f"echo{i}", Echo)
        samples.append(time.perf_counter() - t)
    procs.stop()
    return cold, statistics.median(samples)


def calls() -> tuple[float, float, float]:
    return bench_calls(N_CALLS)


class Sleeper(Actor):
    @endpoint
    def sleep(self, s: float) -> None:
        time.sleep(s)


def python_startup() -> float:
    """Seconds for a bare ``python -c pass``: the floor of any new process."""
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


_ATTACH = """
import sys, time
from monarch_kernel import attach
procs = attach(sys.argv[1])
procs.actors["echo"].ping.call(0).get(timeout=60)
print(time.time() - float(sys.argv[2]))
procs._session("bench").detach()
"""


def attach_seconds() -> float:
    """A new process attaches to a running 4-proc mesh and calls it: seconds from
    starting that process until the first call returns (median of 5)."""
    name = f"bench-attach-{os.getpid()}"
    procs = this_host().spawn_procs(per_host={"procs": 4}, name=name, ephemeral=False)
    procs.on_failure(lambda failure: None)  # each new process fences this one: expected
    try:
        procs.spawn("echo", Echo).ping.call(0).get(timeout=60)
        samples = []
        for _ in range(5):
            out = subprocess.run(
                [sys.executable, "-c", _ATTACH, name, repr(time.time())],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "MONARCH_FORWARD_OUTPUT": "0"},
            )
            samples.append(float(out.stdout.strip().splitlines()[-1]))
        return statistics.median(samples)
    finally:
        attach(name).stop()


def kill_to_error(n: int = 20) -> float:
    """Median seconds from kill -9 of a worker serving a call to SupervisionError in
    the caller (the rank is respawned between kills)."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    procs.on_failure(lambda failure: None)  # expected: no line on stderr per kill
    session = procs._session("bench")
    try:
        s = procs.spawn("sleeper", Sleeper).slice(procs=1)
        samples = []
        for _ in range(n):
            pid = session.client.worker(1)["pid"]
            fut = s.sleep.call_one(60)
            time.sleep(0.1)
            t = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            try:
                fut.get(timeout=30)
            except SupervisionError:
                samples.append(time.perf_counter() - t)
            while procs.status()[1] != "dead":
                time.sleep(0.01)
            procs.respawn()
        return statistics.median(samples)
    finally:
        procs.stop()


def picture() -> tuple[float, float]:
    """Median seconds to read the picture of a running 4-proc mesh that the Meshes
    panel, the inspector and ls show (VIEW-1: its agents' listing and each worker's
    figures), and of the agents' listing alone (its baseline)."""
    from monarch_kernel.controller import view_of
    from monarch_kernel.hosts import _admin, _registry

    name = f"bench-view-{os.getpid()}"
    procs = this_host().spawn_procs(per_host={"procs": 4}, name=name)
    try:
        view = timed(lambda: view_of(name), 50, warmup=5)
        rec = _registry.read(name)
        assert rec is not None
        agents = _admin.connect(rec)
        assert agents is not None
        try:
            listing = timed(agents.list_workers, 50, warmup=5)
        finally:
            agents.close()
        return view, listing
    finally:
        procs.stop()


class Tensors(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def hold(self, nbytes: int) -> object:
        import torch

        from monarch_kernel import TransferBuffer

        self.t = torch.ones(nbytes // 4, dtype=torch.float32)
        return TransferBuffer(self.t)


class Puller(Actor):
    @endpoint
    def pull(self, buf: object, n: int) -> float:
        """Median seconds of ``buf.read_into`` (n tries) into touched memory."""
        import torch

        dst = torch.zeros(buf.nbytes // 4, dtype=torch.float32)
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            buf.read_into(dst).get(timeout=120)
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)

    @endpoint
    def rss(self) -> int:
        import psutil

        return int(psutil.Process().memory_info().rss)


def loopback_tcp_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes/s of one loopback TCP socket: sendall of ``nbytes`` into recv_into."""
    src = bytearray(nbytes)
    dst = bytearray(nbytes)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    got = [0.0]

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            view, n = memoryview(dst), 0
            while n < nbytes:
                k = conn.recv_into(view[n:], min(nbytes - n, 1 << 24))
                if not k:
                    break
                n += k
        got[0] = time.perf_counter()

    samples = []
    for _ in range(3):
        th = threading.Thread(target=receive)
        th.start()
        with socket.create_connection(("127.0.0.1", port)) as c:
            t = time.perf_counter()
            c.sendall(src)
        th.join()
        samples.append(got[0] - t)
    server.close()
    return nbytes / statistics.median(samples)


def tcp_path() -> float:
    """Bytes/s of read_into of 1 GiB with the TCP path forced (MONARCH_TRANSFER_TCP=1 in
    the reading worker), both ends on loopback."""
    import torch

    from monarch_kernel import TransferBuffer

    procs = this_host().spawn_procs(per_host={"procs": 1}, env={"MONARCH_TRANSFER_TCP": "1"})
    try:
        t = torch.ones((1 << 30) // 4, dtype=torch.float32)
        buf = TransferBuffer(t)
        secs = procs.spawn("p", Puller).pull.call_one(buf, 3).get(timeout=300)
        buf.drop()
        return (1 << 30) / secs
    finally:
        procs.stop()


def pickled_echo() -> float:
    """Median seconds of the 64 MiB echo with the engine off: the tensor is pickled
    into the gRPC messages both ways."""
    import torch

    from monarch_kernel.mesh import _buffers

    off = str(1 << 40)
    procs = this_host().spawn_procs(per_host={"procs": 1}, env={"MONARCH_TRANSFER_THRESHOLD": off})
    old, _buffers.THRESHOLD = _buffers.THRESHOLD, 1 << 40
    try:
        a = procs.spawn("t", Tensors)
        t = torch.randn(16 << 20)
        return timed(lambda: a.echo.call_one(t).get(timeout=60), 5, warmup=2)
    finally:
        _buffers.THRESHOLD = old
        procs.stop()


def memory_growth(n: int = 100, nbytes: int = 256 << 20) -> tuple[float, float]:
    """Resident-size growth (bytes) of the controller and the worker over ``n`` echoes
    of ``nbytes``, after 5 echoes to warm the pools."""
    import psutil
    import torch

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        a = procs.spawn("t", Tensors)
        p = procs.spawn("p", Puller)
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        for _ in range(5):
            a.echo.call_one(t).get(timeout=60)
        me = psutil.Process()
        c0, w0 = me.memory_info().rss, p.rss.call_one().get()
        for _ in range(n):
            a.echo.call_one(t).get(timeout=60)
        return me.memory_info().rss - c0, p.rss.call_one().get() - w0
    finally:
        procs.stop()


def transfers() -> tuple[float, float]:
    """(median seconds of a 64 MiB float32 tensor echo through an endpoint,
    read_into bandwidth in bytes/s for 1 GiB), one host."""
    import torch

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        a = procs.spawn("t", Tensors)
        t = torch.randn(16 << 20)
        echo = timed(lambda: a.echo.call_one(t).get(timeout=60), 10, warmup=3)
        buf = a.hold.call_one(1 << 30).get(timeout=120)
        dst = torch.zeros((1 << 30) // 4, dtype=torch.float32)  # touched: no page faults timed
        secs = timed(lambda: buf.read_into(dst).get(timeout=120), 3, warmup=1)
        buf.drop()
        return echo, (1 << 30) / secs
    finally:
        procs.stop()


class Lengths(Actor):
    @endpoint
    def length(self, x: object) -> int:
        x = x.data if isinstance(x, Batch) else x
        return len(x)  # type: ignore[arg-type]


class Batch:
    """A user's object that holds its data in an attribute."""

    def __init__(self, data: object) -> None:
        self.data = data


def bytes_beside_array(nbytes: int = 300 << 20) -> tuple[float, float, float]:
    """Median seconds to pass ``nbytes`` to an endpoint (one host): as a numpy array,
    as ``bytes``, and as ``bytes`` in an attribute of a user's object."""
    import numpy as np

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        a = procs.spawn("lengths", Lengths)
        array = np.ones(nbytes, dtype=np.uint8)
        data = array.tobytes()
        batch = Batch(data)
        return tuple(  # type: ignore[return-value]
            timed(lambda v=v: a.length.call_one(v).get(timeout=120), 5, warmup=2)
            for v in (array, data, batch)
        )
    finally:
        procs.stop()


def main() -> None:
    pipe = pipe_round_trip()
    tcp = tcp_round_trip()
    mcp = memcpy_seconds()
    rt, both, thru = calls()
    cold, warm = cold_spawn()
    startup = python_startup()
    att = attach_seconds()
    kill = kill_to_error()
    echo64, read_bw = transfers()
    pickled = pickled_echo()
    array300, bytes300, batch300 = bytes_beside_array()
    tcp_bw, raw_tcp_bw = tcp_path(), loopback_tcp_bandwidth()
    grow_ctl, grow_worker = memory_growth()
    plain_cell, mesh_cell = cells.cell_round_trips()
    view, listing = picture()
    us, ms = 1e6, 1e3
    rows = [
        # metric, value, unit, baseline name, baseline value, target
        (
            "call_one round trip ping(x)->x, 2 procs",
            rt * us,
            "us",
            "raw Pipe round trip",
            pipe * us,
            "<= 150 us",
        ),
        ("call() to 2 procs and gather", both * us, "us", "raw Pipe round trip", pipe * us, "<= 250 us"),
        (
            "pipelined call_one, 1000 outstanding",
            thru,
            "calls/s",
            "1 / raw Pipe round trip",
            1 / pipe,
            ">= 30000/s",
        ),
        ("call_one round trip (vs loopback TCP)", rt * us, "us", "loopback TCP round trip", tcp * us, ""),
        ("cold spawn_procs(4) to first reply", cold * ms, "ms", "", float("nan"), "<= 400 ms"),
        ("second actor mesh on warm procs (4)", warm * ms, "ms", "", float("nan"), "<= 5 ms"),
        (
            "attach from a new process to first reply (4)",
            att * ms,
            "ms",
            "python -c pass",
            startup * ms,
            "<= 1000 ms",
        ),
        ("kill -9 of a worker to SupervisionError", kill * ms, "ms", "", float("nan"), "<= 1000 ms"),
        (
            "echo of a 64 MiB tensor through an endpoint",
            echo64 * ms,
            "ms",
            "two memcpy of 64 MiB",
            2 * mcp * ms,
            "<= 15 ms",
        ),
        (
            "read_into of 1 GiB, one host (GB/s)",
            read_bw / 1e9,
            "GB/s",
            "memcpy bandwidth",
            (64 << 20) / mcp / 1e9,
            ">= 0.7 x memcpy",
        ),
        (
            "echo of 64 MiB pickled through gRPC (engine off)",
            pickled * ms,
            "ms",
            "echo through the engine",
            echo64 * ms,
            "(comparison)",
        ),
        (
            "pass 300 MiB of bytes to an endpoint",
            bytes300 * ms,
            "ms",
            "300 MiB numpy array",
            array300 * ms,
            "(comparison)",
        ),
        (
            "pass 300 MiB of bytes in a user's object",
            batch300 * ms,
            "ms",
            "300 MiB numpy array",
            array300 * ms,
            "(comparison)",
        ),
        (
            "read_into 1 GiB, TCP path forced (GB/s)",
            tcp_bw / 1e9,
            "GB/s",
            "one loopback TCP socket",
            raw_tcp_bw / 1e9,
            ">= 0.8 x socket",
        ),
        ("RSS growth, controller, 100 echoes of 256 MiB", grow_ctl / 2**20, "MiB", "", float("nan"), "flat"),
        ("RSS growth, worker, 100 echoes of 256 MiB", grow_worker / 2**20, "MiB", "", float("nan"), "flat"),
        ("memcpy 64 MiB", mcp * ms, "ms", "memcpy 64 MiB", mcp * ms, ""),
        (
            "%%mesh cell on 4 ranks, round trip (jupyter_client)",
            mesh_cell * ms,
            "ms",
            "plain cell round trip",
            plain_cell * ms,
            "<= plain + 5 ms",
        ),
        (
            "picture of a 4-proc mesh (panel, inspector, ls)",
            view * ms,
            "ms",
            "the agents' ListWorkers",
            listing * ms,
            "(the panel looks every 500 ms)",
        ),
    ]
    from bench import (
        k8s,
        multihost,
        scale,
        tensors,  # (imports torch: after the rows above, whose procs never need it)
    )

    more, skipped = cluster_rows("multi-host", multihost.rows)
    wide, wide_skipped = cluster_rows("scale", scale.rows)
    pods, pods_skipped = cluster_rows("k8s", k8s.rows, k8s.missing)
    print_table(rows + tensors.rows() + more + wide + pods)
    for why in (skipped, wide_skipped, pods_skipped):
        if why:
            print(why)
    sys.stdout.flush()


def cluster_rows(
    what: str, make: Any, missing: Any = None
) -> tuple[list[tuple[str, float, str, str, float, str]], str | None]:
    """The rows ``make()`` measures on a test cluster made on this machine meanwhile
    (bench/multihost.py, bench/scale.py: 1,024 procs on 64 test hosts, bench/k8s.py:
    the k8s bed); where there are none, the line that says why."""
    if reason := unavailable():
        return [], f"{what} rows skipped: no test cluster ({reason})"
    if missing is not None and (gone := missing()):
        return (
            [],
            f"{what} rows skipped: the k8s bed's binaries are not built ({', '.join(gone)}): make k8s-bed",
        )
    try:
        return make(), None
    except ClusterError as e:
        print(e, file=sys.stderr)
        return [], f"{what} rows skipped: {str(e).splitlines()[0]}"


def print_cluster_rows(rows: Any, hosts: int, what: str, missing: Any = None) -> None:
    """``python -m bench.multihost`` / ``bench.scale`` / ``bench.k8s``: ``rows()`` (made
    on a test cluster of ``hosts`` hosts) as a table, or the line that says why there
    are none (``missing()``: what the cluster lacks, the k8s bed's binaries)."""
    if reason := unavailable():
        print(f"{what} rows skipped: no test cluster ({reason})")
        return
    if missing is not None and (gone := missing()):
        print(f"{what} rows skipped: the k8s bed's binaries are not built ({', '.join(gone)}): make k8s-bed")
        return
    t = time.monotonic()
    print_table(rows())
    print(f"({hosts} test hosts; {time.monotonic() - t:.0f} s in all)")


def print_table(rows: list[tuple[str, float, str, str, float, str]]) -> None:
    """The table: metric, value and unit, baseline (value and name), ratio, target."""
    w = max(len(r[0]) for r in rows)
    print(f"{'metric':<{w}}  {'monarch-kernel':>16}  {'baseline':>26}  {'ratio':>7}  target")
    for name, val, unit, bname, bval, target in rows:
        base = f"{bval:,.1f} ({bname})" if bname else "-"
        ratio = f"{val / bval:.2f}" if bname and bval else "-"  # (an idle baseline may be 0)
        print(f"{name:<{w}}  {val:>10,.1f} {unit:<5}  {base:>26}  {ratio:>7}  {target}")


if __name__ == "__main__":
    main()
