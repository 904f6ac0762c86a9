"""Distributed tensors (the tensor engine) beside baselines measured in the same run:
op issue rate, ``inspect`` against ``call_one``, a 64 MiB fetch against memcpy, the
first ``activate()`` to its first value, and ``reduce`` against a plain
``torch.distributed.all_reduce`` on the same procs. Run alone: ``python -m bench.tensors``."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

import monarch_kernel as mk
from bench.run import timed
from monarch_kernel import Actor, endpoint, this_host

Row = tuple[str, float, str, str, float, str]


class AllReduce(Actor):
    """The baseline collective: torch.distributed directly, on the same procs."""

    def __init__(self) -> None:
        self.kept: torch.Tensor | None = None

    @endpoint
    def all_reduce(self, nbytes: int) -> float:
        """Into a new tensor (as ``reduce`` makes one)."""
        import torch.distributed as dist

        x = torch.ones(nbytes // 4)
        dist.all_reduce(x)
        return float(x[0])

    @endpoint
    def all_reduce_kept(self, nbytes: int) -> float:
        """In place, on a tensor this proc keeps (as ``reduce_`` does)."""
        import torch.distributed as dist

        if self.kept is None:
            self.kept = torch.ones(nbytes // 4)
        dist.all_reduce(self.kept)
        return float(self.kept[0])


class Echo(Actor):
    @endpoint
    def ping(self, x: object) -> object:
        return x

    @endpoint
    def use_torch(self) -> str:
        import torch

        return str(torch.__version__)


def _alternating(fns: list[Callable[[], object]], rounds: int, block: int) -> list[float]:
    """Median seconds of each of ``fns``, measured in alternating blocks of ``block``
    runs (the machine's state then weighs on each alike)."""
    samples: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        for _ in range(block):
            fn()
    for _ in range(rounds):
        for fn, out in zip(fns, samples):
            for _ in range(block):
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
    return [statistics.median(s) for s in samples]


def _memcpy(nbytes: int) -> float:
    src = torch.rand(nbytes // 4)
    dst = torch.empty_like(src)
    return timed(lambda: dst.copy_(src), 20, warmup=3)


def _first_value(procs: mk.ProcMesh) -> float:
    t = time.perf_counter()
    with procs.activate():
        first = torch.ones(4)
    mk.inspect(first)
    return time.perf_counter() - t


def _import_torch() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t


def rows() -> list[Row]:
    fresh = this_host().spawn_procs(per_host={"procs": 4})
    try:
        fresh.status()  # up; nothing of torch imported there yet
        cold_value = _first_value(fresh)  # each proc imports torch first
    finally:
        fresh.stop()
    import_torch = _import_torch()
    procs = this_host().spawn_procs(per_host={"procs": 4})
    try:
        # Warm procs: torch is imported there, as in a notebook that used torch on them.
        echoes = procs.spawn("echo", Echo)
        echoes.use_torch.call().get()
        echo = echoes.slice(procs=0)
        first_value = _first_value(procs)

        def thousand() -> None:
            with procs.activate():
                x = torch.zeros(4)
                for _ in range(1000):
                    x = x + 1
            mk.inspect(x)

        issue = 1000 / timed(thousand, 7, warmup=2)
        local_x = torch.zeros(4)

        def local_thousand() -> None:
            x = local_x
            for _ in range(1000):
                x = x + 1

        local = 1000 / timed(local_thousand, 7, warmup=2)

        with procs.activate():
            small = torch.ones(4)
        call_one, inspect_small = _alternating(
            [lambda: echo.ping.call_one(1).get(), lambda: mk.inspect(small)], rounds=20, block=50
        )

        nbytes = 64 << 20
        with procs.activate():
            big = torch.rand(nbytes // 4)
        fetch64 = timed(lambda: mk.inspect(big), 15)
        mcp = _memcpy(nbytes)

        with procs.activate():
            r = big.reduce("procs", "sum")  # sets torch.distributed up (once)
        mk.inspect(r[:1])

        def ours() -> None:
            with procs.activate():
                s = big.reduce("procs", "sum")
            mk.inspect(s[:1])

        def ours_in_place() -> None:
            with procs.activate():
                big.reduce_("procs", "sum")
            mk.inspect(big[:1])

        baseline = procs.spawn("allreduce", AllReduce)
        plain, reduce64, kept, reduce64_ = _alternating(
            [
                lambda: baseline.all_reduce.call(nbytes).get(),
                ours,
                lambda: baseline.all_reduce_kept.call(nbytes).get(),
                ours_in_place,
            ],
            rounds=4,
            block=2,
        )
    finally:
        procs.stop()
    us, ms = 1e6, 1e3
    return [
        (
            "tensor ops issued, 1000 x = x + 1 then inspect",
            issue,
            "ops/s",
            "local torch, same loop",
            local,
            ">= 20000/s",
        ),
        (
            "inspect of a small mesh tensor",
            inspect_small * us,
            "us",
            "call_one round trip",
            call_one * us,
            "<= 1.5 x",
        ),
        ("fetch of a 64 MiB shard", fetch64 * ms, "ms", "two memcpy of 64 MiB", 2 * mcp * ms, "<= 1.5 x"),
        (
            "first activate() on warm procs to first value",
            first_value * ms,
            "ms",
            "",
            float("nan"),
            "<= 500 ms",
        ),
        (
            "first activate() on procs without torch yet",
            cold_value * ms,
            "ms",
            "python -c 'import torch'",
            import_torch * ms,
            "(each proc imports torch)",
        ),
        (
            "reduce(sum) of 64 MiB over 4 procs, a new tensor",
            reduce64 * ms,
            "ms",
            "dist.all_reduce into a new tensor",
            plain * ms,
            "<= 1.3 x",
        ),
        (
            "reduce_(sum) in place, 64 MiB over 4 procs",
            reduce64_ * ms,
            "ms",
            "dist.all_reduce in place",
            kept * ms,
            "<= 1.3 x",
        ),
    ]


if __name__ == "__main__":
    from bench.run import print_table

    print_table(rows())
