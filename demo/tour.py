"""A short tour of the monarch-kernel API on a local mesh, as a plain script (the
notebook tests run it; `make demo` runs notebooks/quickstart.ipynb)."""

import os
import subprocess
import sys
import time

from monarch_kernel import (
    Actor,
    ActorError,
    MeshOwnershipError,
    attach,
    current_rank,
    endpoint,
    list_meshes,
    this_host,
)


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.v = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.v += by
        return self.v

    @endpoint
    def fail(self) -> None:
        raise ValueError(f"rank {current_rank()} refuses")


class Where(Actor):
    @endpoint
    async def where(self) -> tuple[str, int]:
        return str(current_rank()), os.getpid()


class Relay(Actor):
    @endpoint
    def total(self, counters: "object") -> int:
        # An actor calling another actor mesh passed in as an argument.
        return sum(counters.incr.call(0).get().values())  # type: ignore[attr-defined]


def step(title: str) -> None:
    print(f"\n== {title}")


def main() -> None:
    step("spawn 4 worker processes")
    t = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": 4})
    c = procs.spawn("counter", Counter, 10)
    print(f"procs = {procs!r}; counter actors up in {time.perf_counter() - t:.2f} s")

    step("c.incr.call(2).get()  -> a ValueMesh over {procs: 4}")
    print(c.incr.call(2).get())

    step("c.slice(procs=1).incr.call_one().get()")
    print(c.slice(procs=1).incr.call_one().get())

    step("broadcast, choose, stream")
    c.incr.broadcast()
    print("choose ->", c.incr.choose().get())
    print("stream ->", [f.get() for f in c.incr.stream()])

    step("an async actor: where does each rank run?")
    for point, (rank, pid) in procs.spawn("where", Where).where.call().get().items():
        print(f"  {point}: current_rank()={rank} pid={pid}")

    step("actor-to-actor: a relay on rank 0 sums the counters")
    relay = procs.slice(procs=0).spawn("relay", Relay)
    print("total =", relay.total.call_one(c).get())

    step("an endpoint that raises gives ActorError with the remote traceback")
    try:
        c.slice(procs=2).fail.call_one().get()
    except ActorError as e:
        print(str(e).rstrip())
    print("the actor is still usable:", c.slice(procs=2).incr.call_one().get())

    step("stop the mesh")
    procs.stop()
    print("stopped; worker processes are gone")

    step("a named mesh outlives its controller: another process attaches to it")
    named = this_host().spawn_procs(per_host={"procs": 2}, name="tour")
    named.spawn("counter", Counter, 100).incr.call().get()
    other = subprocess.run(
        [sys.executable, "-c", _ATTACH],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MONARCH_FORWARD_OUTPUT": "0"},
    )
    print(other.stdout.rstrip())
    try:
        named.spawn("again", Counter, 0)
    except MeshOwnershipError as e:
        print("this process was fenced:", str(e).splitlines()[0][:100], "...")
    attach("tour").stop()
    print("monarch-kernel ls ->", [m.name for m in list_meshes()] or "no running meshes")


_ATTACH = """
from monarch_kernel import attach, list_meshes
print("other process: list_meshes() ->", [(m.name, m.procs, m.alive) for m in list_meshes()])
procs = attach("tour")
print("other process: counter state continued ->", list(procs.actors["counter"].incr.call().get().values()))
procs._session("demo").detach()
"""


if __name__ == "__main__":
    main()
