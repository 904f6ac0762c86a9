"""The scale rows' bound of this machine: a fan-out to N bare Python processes.

A parent writes one byte to each of N children's pipes; each child answers one byte
on a pipe they share; a round ends when the parent has read N bytes. No protocol, no
serialization of note, no agents: what remains is waking N processes on this
machine's CPUs, the part of a ``call()`` to N procs that no transport can remove.

- ``one``: the child's one thread reads the call and writes the reply (one wake per
  call);
- ``three``: a reader thread hands the call to the thread that runs it, which hands
  the reply to a writer thread (three wakes per call: a worker's shape today, its
  runtime thread receiving, its actor's thread running the endpoint, the runtime
  thread sending the reply).

    python -m bench.bare_fanout N MODE ROUNDS   # prints the median round in seconds

Run in a fresh interpreter of its own (``median``): it forks N children, which must
not inherit another program's threads."""

from __future__ import annotations

import os
import queue
import statistics
import subprocess
import sys
import threading
import time

WARMUP = 5


def _child(calls: int, replies: int, mode: str) -> None:
    if mode == "one":
        while os.read(calls, 1):
            os.write(replies, b"r")
        os._exit(0)
    got: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    out: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def reader() -> None:
        while True:
            b = os.read(calls, 1)
            got.put(b)
            if not b:
                return

    def writer() -> None:
        while True:
            os.write(replies, out.get())

    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=writer, daemon=True).start()
    while got.get():
        out.put(b"r")
    os._exit(0)


def run(n: int, mode: str, rounds: int) -> float:
    """The median round, in seconds, of ``rounds`` fan-outs to ``n`` children."""
    replies_r, replies_w = os.pipe()
    calls, pids = [], []
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            _child(r, replies_w, mode)
        os.close(r)
        calls.append(w)
        pids.append(pid)
    samples = []
    try:
        for k in range(WARMUP + rounds):
            t = time.perf_counter()
            for w in calls:
                os.write(w, b"c")
            got = 0
            while got < n:
                got += len(os.read(replies_r, n - got))
            if k >= WARMUP:
                samples.append(time.perf_counter() - t)
    finally:
        for w in calls:
            os.close(w)  # each child reads EOF and exits
        for pid in pids:
            os.waitpid(pid, 0)
    return statistics.median(samples)


def median(n: int, mode: str, rounds: int = 40) -> float:
    """``run`` in a fresh interpreter: the median round in seconds."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bare_fanout", str(n), mode, str(rounds)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    return float(done.stdout.split()[-1])


if __name__ == "__main__":
    print(run(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
