"""The call rows of ``make bench`` (``call_one``, ``call()`` to 2 procs, pipelined
``call_one``), in one place: ``bench/run.py`` imports them, and ``bench/ab.py`` runs
this file as a script with each build it compares (``python bench/calls.py N``
prints the rows as JSON). It uses only names every version of the package has
(``Actor``, ``endpoint``, ``this_host``, ``Channel``), and imports nothing else of the checkout,
so the build under test is the one imported."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

from monarch_kernel import Actor, Channel, endpoint, this_host


class Echo(Actor):
    @endpoint
    def ping(self, x: object) -> object:
        return x


def _porter() -> type[Actor] | None:
    """An actor that answers through ports; None where the build under test has no
    explicit-response endpoints (an older commit in ``bench/ab.py``)."""
    try:

        class Porter(Actor):
            @endpoint(explicit_response_port=True)
            def answer(self, port: object, x: object) -> None:
                port.send(x)  # type: ignore[attr-defined]

            @endpoint
            def burst(self, port: object, n: int) -> None:
                for i in range(n):
                    port.send(i)  # type: ignore[attr-defined]

    except NotImplementedError:
        return None
    return Porter


def timed(fn: Callable[[], object], n: int, warmup: int = 100) -> float:
    """Median seconds of one ``fn()`` over ``n`` runs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def calls(n: int) -> tuple[float, float, float]:
    """Seconds of a ``call_one`` round trip and of a ``call()`` to 2 procs (medians of
    ``n``), and pipelined ``call_one``s per second (1,000 outstanding)."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        e = procs.spawn("echo", Echo)
        one = e.slice(procs=0).ping
        rt = timed(lambda: one.call_one(7).get(), n)
        both = timed(lambda: e.ping.call(7).get(), n)
        pipelined = []
        for _ in range(5):
            t = time.perf_counter()
            futures = [one.call_one(i) for i in range(1000)]
            for f in futures:
                f.get()
            pipelined.append(1000 / (time.perf_counter() - t))
        return rt, both, statistics.median(pipelined)
    finally:
        procs.stop()


def port_rows(n: int) -> tuple[float, float] | None:
    """Seconds of an explicit-response ``call_one`` (the answer is a port message), and
    port messages per second received from an actor that sends 1,000 (None: the build
    has no explicit-response endpoints)."""
    porter = _porter()
    if porter is None:
        return None
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        e = procs.spawn("porter", porter)
        answer = timed(lambda: e.answer.call_one(7).get(), n)
        port, receiver = Channel.open()
        rates = []
        for _ in range(5):
            t = time.perf_counter()
            e.burst.call_one(port, 1000).get()
            for _ in range(1000):
                receiver.recv().get()
            rates.append(1000 / (time.perf_counter() - t))
        return answer, statistics.median(rates)
    finally:
        procs.stop()


if __name__ == "__main__":
    n = int(sys.argv[1])
    rt, both, rate = calls(n)
    rows = {"call_one": rt * 1e6, "call": both * 1e6, "pipelined": rate}
    ports = port_rows(n)
    if ports is not None:
        rows.update(port_answer=ports[0] * 1e6, port_burst=ports[1])
    print(json.dumps(rows))
