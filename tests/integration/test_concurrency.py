"""``@concurrent_endpoint`` (ENDPOINT-2) and the default of one message at a time
(DISPATCH-1), on real workers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from monarch_kernel import Actor, concurrent_endpoint, endpoint


class Gathering(Actor):
    """``meet(n)`` returns once ``n`` calls of it are running at the same time."""

    def __init__(self) -> None:
        self.arrived = 0
        self.everyone = asyncio.Event()
        self.started: list[int] = []

    @concurrent_endpoint
    async def meet(self, n: int) -> int:
        self.arrived += 1
        if self.arrived >= n:
            self.everyone.set()
        await asyncio.wait_for(self.everyone.wait(), 30)
        return self.arrived

    @concurrent_endpoint
    async def record_start(self, i: int) -> None:
        self.started.append(i)
        await asyncio.sleep(0.05)

    @endpoint
    async def starts(self) -> list[int]:
        return self.started


class InheritsGathering(Gathering):
    pass


class OneAtATime(Actor):
    def __init__(self) -> None:
        self.running = 0
        self.most = 0

    @endpoint
    async def work(self) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.05)
        self.running -= 1

    @endpoint
    async def most_at_once(self) -> int:
        return self.most


class Stoppable(Actor):
    def __init__(self, log: str) -> None:
        self.log = Path(log)

    def _write(self, line: str) -> None:
        with self.log.open("a") as f:
            f.write(line + "\n")

    @concurrent_endpoint
    async def forever(self) -> None:
        self._write("task started")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self._write("task cancelled")
            raise

    @endpoint
    async def ready(self) -> bool:
        return True

    async def __cleanup__(self, exc: object) -> None:
        self._write("cleanup")


@pytest.mark.parametrize("cls", [Gathering, InheritsGathering])
def test_concurrent_endpoint_messages_run_at_the_same_time(procs2, cls):
    mesh = procs2.spawn(f"gathering_{cls.__name__}", cls).slice(procs=0)
    try:
        # Each call waits for all five to be running: one at a time, they never would.
        futures = [mesh.meet.call_one(5) for _ in range(5)]
        assert [f.get(timeout=60) for f in futures] == [5] * 5
    finally:
        mesh.stop().get(timeout=30)


def test_concurrent_endpoint_messages_start_in_arrival_order(procs2):
    mesh = procs2.spawn("ordered", Gathering).slice(procs=1)
    try:
        for f in [mesh.record_start.call_one(i) for i in range(20)]:
            f.get(timeout=30)
        assert mesh.starts.call_one().get(timeout=30) == list(range(20))
    finally:
        mesh.stop().get(timeout=30)


def test_endpoints_of_an_async_actor_run_one_message_at_a_time_by_default(procs2):
    mesh = procs2.spawn("one_at_a_time", OneAtATime).slice(procs=0)
    try:
        for f in [mesh.work.call_one() for _ in range(6)]:
            f.get(timeout=30)
        assert mesh.most_at_once.call_one().get(timeout=30) == 1
    finally:
        mesh.stop().get(timeout=30)


def test_stopping_an_actor_cancels_its_concurrent_tasks_before_its_cleanup(procs2, tmp_path):
    log = tmp_path / "log"
    mesh = procs2.spawn("stoppable", Stoppable, str(log)).slice(procs=0)
    mesh.forever.call_one()  # never answers
    mesh.forever.call_one()
    assert mesh.ready.call_one().get(timeout=30)
    mesh.stop().get(timeout=30)
    lines = []
    for _ in range(100):
        lines = log.read_text().splitlines()
        if "cleanup" in lines:
            break
        import time

        time.sleep(0.1)
    assert lines.count("task started") == 2
    assert lines.count("task cancelled") == 2
    assert lines.index("cleanup") > max(i for i, line in enumerate(lines) if line == "task cancelled")
    assert lines.count("cleanup") == 1
