"""What TLS costs the control plane (TLS-1, TLS-2), over loopback: two meshes of one
worker each, one plaintext and one serving its TLS identity, started as a controller
starts a mesh across hosts (but on 127.0.0.1).

Prints, for each, the median of: ``call_one(x).get()`` round trips on an open
connection (8 bytes, 64 KiB and 1 MiB of payload, all on the control plane), and a new connection's first call (what a
handshake costs: TCP, TLS, HTTP/2, one refused ping). Rounds alternate between the two meshes, so drift hits both.

    python bench/tls.py  [BENCH_CALLS=2000]
"""

from __future__ import annotations

import os

# Every payload here travels on the control plane, which is what TLS covers (buffers
# of 64 KiB and more go through the transfer engine otherwise, which stays plaintext).
# Read at import, by this process and by the workers it starts.
os.environ["MONARCH_TRANSFER_THRESHOLD"] = str(1 << 30)

import json  # noqa: E402
import secrets  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

from monarch_kernel import Actor, ProcMesh, Shape, _native, endpoint  # noqa: E402
from monarch_kernel.control import AgentClient  # noqa: E402
from monarch_kernel.hosts import (  # noqa: E402
    AgentConfig,
    new_tls_identity,
    start_local_agent,  # noqa: E402
)
from monarch_kernel.mesh._proc_ref import ProcRef  # noqa: E402

N_CALLS = int(os.environ.get("BENCH_CALLS", "2000"))
N_CONNECTS = 100
ROUNDS = 5


class Echo(Actor):
    @endpoint
    def ping(self, x: object) -> object:
        return x


@contextmanager
def mesh(tls: bool) -> Iterator[tuple[Any, str, str]]:
    """An echo actor on a new one-worker mesh: (actor mesh, token, worker address)."""
    token = secrets.token_urlsafe(32)
    identity = new_tls_identity() if tls else None
    agent = start_local_agent(AgentConfig(f"bench-{'tls' if tls else 'plain'}", token, 60.0, tls=identity))
    ca = identity["ca"] if identity else None
    client = AgentClient(agent.addr, token, ca)
    try:
        epoch = client.attach().epoch
        env = {
            "MONARCH_SHAPE": json.dumps([["procs"], [1]]),
            "MONARCH_SYS_PATH": json.dumps([p for p in sys.path if p and os.path.isdir(p)]),
        }
        (w,) = client.spawn_workers_raw(
            1, sys.executable, ["-m", "monarch_kernel.worker"], env, os.getcwd(), epoch=epoch
        )
        _native.set_mesh_ca(token, ca)
        procs = ProcMesh(ProcRef(f"bench-{tls}", token, (w.addr,)), Shape.of({"procs": 1}))
        yield procs.spawn("echo", Echo).slice(procs=0), token, w.addr
    finally:
        client.shutdown()
        agent.wait(10)
        client.close()


def samples(fn: Callable[[], object], n: int, warmup: int = 50) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    os.environ.setdefault("XDG_STATE_HOME", tempfile.mkdtemp(prefix="monarch-bench-tls-"))
    small, mid, big = b"8 bytes!", bytes(64 << 10), bytes(1 << 20)
    results: dict[str, dict[str, list[float]]] = {"plaintext": {}, "TLS": {}}
    with mesh(tls=False) as plain, mesh(tls=True) as secure:
        for _ in range(ROUNDS):
            for label, (echo, token, addr) in (("plaintext", plain), ("TLS", secure)):
                r = results[label]
                r.setdefault("call_one, 8 B", []).extend(
                    samples(lambda e=echo: e.ping.call_one(small).get(), N_CALLS // ROUNDS)
                )
                r.setdefault("call_one, 64 KiB", []).extend(
                    samples(lambda e=echo: e.ping.call_one(mid).get(), N_CALLS // (2 * ROUNDS), 20)
                )
                r.setdefault("call_one, 1 MiB", []).extend(
                    samples(lambda e=echo: e.ping.call_one(big).get(), N_CALLS // (10 * ROUNDS), 5)
                )

                def connect(a: str = addr, ca: str | None = _native.mesh_ca(token)) -> None:
                    # A connection of its own: this process shares one per (address,
                    # token), so a token of its own (refused: the round trip is the same).
                    t = secrets.token_urlsafe(8)
                    _native.set_mesh_ca(t, ca)
                    try:
                        _native.WorkerConn(a, t).ping()
                    except _native.AuthError:
                        pass

                r.setdefault("new connection + call", []).extend(samples(connect, N_CONNECTS // ROUNDS, 2))
    print(f"{'metric (median)':<26}{'plaintext':>12}{'TLS':>12}{'TLS / plain':>13}")
    for metric in results["plaintext"]:
        p = statistics.median(results["plaintext"][metric]) * 1e6
        t = statistics.median(results["TLS"][metric]) * 1e6
        print(f"{metric:<26}{p:>10.0f}us{t:>10.0f}us{t / p:>12.2f}x")


if __name__ == "__main__":
    main()
