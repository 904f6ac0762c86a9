"""The adverbs of an endpoint (call, call_one, broadcast, choose, stream), futures,
and what an endpoint sees of where it runs, on real workers."""

from __future__ import annotations

import asyncio
import sys
import time
import warnings
from typing import Any

import pytest

from monarch_kernel import (
    Actor,
    Future,
    Point,
    Shape,
    ValueMesh,
    _native,
    context,
    current_rank,
    current_size,
    endpoint,
    this_host,
)

TIMEOUT = 30


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.v = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.v += by
        return self.v

    @endpoint
    def value(self) -> int:
        return self.v

    @endpoint
    def set(self, v: int) -> None:
        self.v = v

    @endpoint
    def as_list(self) -> list[int]:
        return [self.v]

    @endpoint
    def nap(self, seconds: float) -> str:
        import time

        time.sleep(seconds)
        return "rested"

    @endpoint
    def where(self) -> tuple[str, dict[str, int], Point]:
        return str(current_rank()), current_size(), context().actor_instance.rank

    @endpoint
    def my_value_from(self, values: ValueMesh[Any]) -> Any:
        return values.item(procs=current_rank()["procs"])

    @endpoint
    def squares_of(self, n: int) -> ValueMesh[int]:
        return ValueMesh(Shape.of({"n": n}), [i * i for i in range(n)])


class AsyncCounter(Actor):
    def __init__(self) -> None:
        self.v = 0

    @endpoint
    async def incr(self, by: int = 1) -> int:
        await asyncio.sleep(0)
        self.v += by
        return self.v

    @endpoint
    async def where(self) -> str:
        await asyncio.sleep(0)
        return str(current_rank())


@pytest.fixture
def counter(procs4):
    """A fresh Counter(0) on each of the 4 procs."""
    mesh = procs4.spawn("counter", Counter, 0)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT)


@pytest.fixture(scope="module")
def places(procs4):
    """A Counter mesh used only by tests that read, never change, its state."""
    mesh = procs4.spawn("places", Counter, 0)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT)


def test_call_returns_a_value_mesh_over_every_proc(counter):
    vm = counter.incr.call(5).get(timeout=TIMEOUT)
    assert isinstance(vm, ValueMesh)
    assert vm.extent == {"procs": 4}
    assert vm.values() == [5, 5, 5, 5]
    assert [(dict(p), v) for p, v in vm.items()] == [({"procs": i}, 5) for i in range(4)]
    assert [vm.item(procs=i) for i in range(4)] == [5, 5, 5, 5]


def test_call_one_on_a_slice_calls_only_that_actor(counter):
    assert counter.slice(procs=2).incr.call_one(7).get(timeout=TIMEOUT) == 7
    assert counter.value.call().get(timeout=TIMEOUT).values() == [0, 0, 7, 0]


def test_call_one_on_a_mesh_of_several_actors_raises_value_error(counter):
    with pytest.raises(ValueError, match="exactly 1 actor"):
        counter.incr.call_one()
    with pytest.raises(ValueError):
        counter.slice(procs=slice(0, 2)).incr.call_one()
    # Nothing was sent.
    assert counter.value.call().get(timeout=TIMEOUT).values() == [0, 0, 0, 0]


def test_broadcast_returns_nothing_and_a_later_call_sees_its_effect(counter):
    assert counter.set.broadcast(42) is None
    assert counter.value.call().get(timeout=TIMEOUT).values() == [42, 42, 42, 42]


def test_broadcast_to_a_slice_reaches_only_the_slice(counter):
    counter.slice(procs=slice(2, 4)).set.broadcast(9)
    assert counter.value.call().get(timeout=TIMEOUT).values() == [0, 0, 9, 9]


def test_choose_calls_exactly_one_actor(counter):
    assert counter.incr.choose(1).get(timeout=TIMEOUT) == 1
    assert sorted(counter.value.call().get(timeout=TIMEOUT).values()) == [0, 0, 0, 1]


def test_choose_on_a_slice_stays_inside_the_slice(counter):
    for _ in range(4):
        counter.slice(procs=3).incr.choose().get(timeout=TIMEOUT)
    assert counter.value.call().get(timeout=TIMEOUT).values() == [0, 0, 0, 4]


def test_stream_yields_one_future_per_actor_in_rank_order(places):
    futures = list(places.where.stream())
    assert len(futures) == 4
    assert all(isinstance(f, Future) for f in futures)
    ranks = [f.get(timeout=TIMEOUT)[0] for f in futures]
    assert ranks == [f"{{'procs': {i}/4}}" for i in range(4)]


def test_future_get_with_a_timeout_raises_timeout_error_and_can_be_retried(counter):
    future = counter.slice(procs=0).nap.call_one(3)
    with pytest.raises(TimeoutError):
        future.get(timeout=0.05)
    assert future.get(timeout=TIMEOUT) == "rested"


def test_future_get_returns_the_same_value_every_time(counter):
    future = counter.slice(procs=1).incr.call_one()
    assert future.get(timeout=TIMEOUT) == 1
    assert future.get(timeout=TIMEOUT) == 1
    assert future.done()


def test_ranks_that_return_equal_values_share_one_reply_but_each_gets_its_own_mutable_value(counter):
    # wait_all gives equal replies one Reply object (TREE-1's per-reply cost); the
    # values read from it are the same object only where that cannot be seen
    # (immutable), and each rank's list is its own.
    counter.set.call(5).get(timeout=TIMEOUT)
    future = counter.value.call()
    replies = _native.wait_all(future._calls, TIMEOUT)
    assert len(replies) == 4 and all(r is replies[0] for r in replies)
    assert future.get(timeout=TIMEOUT).values() == [5, 5, 5, 5]
    lists = counter.as_list.call().get(timeout=TIMEOUT).values()
    assert lists == [[5], [5], [5], [5]]
    lists[0].append(6)
    assert lists[1:] == [[5], [5], [5]]
    assert len({id(v) for v in lists}) == 4


def test_future_get_refuses_a_negative_timeout(counter):
    future = counter.slice(procs=1).value.call_one()
    with pytest.raises(ValueError):
        future.get(timeout=-1)
    assert future.get(timeout=TIMEOUT) == 0


def test_futures_can_be_awaited_in_async_code(counter):
    async def main() -> tuple[ValueMesh[int], int, list[int]]:
        every = await counter.incr.call(2)
        one = await counter.slice(procs=3).incr.call_one(10)
        many = await asyncio.gather(*(counter.slice(procs=i).value.call_one() for i in range(4)))
        return every, one, list(many)

    every, one, many = asyncio.run(main())
    assert every.values() == [2, 2, 2, 2]
    assert one == 12
    assert many == [2, 2, 2, 12]


def test_an_await_that_timed_out_leaves_no_error_when_the_reply_comes_later(counter, monkeypatch):
    ignored: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: ignored.append(repr(u.exc_value)))

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(counter.slice(procs=2).nap.call_one(0.5), 0.05)

    asyncio.run(main())  # its loop is closed before the reply arrives
    time.sleep(1.0)
    assert ignored == []


def test_awaiting_a_future_that_is_already_done_gives_its_value(counter):
    future = counter.slice(procs=0).incr.call_one(3)
    assert future.get(timeout=TIMEOUT) == 3

    async def main() -> int:
        return await future

    assert asyncio.run(main()) == 3


def test_get_inside_a_running_event_loop_gives_no_warning(counter):
    async def cell() -> tuple[ValueMesh[int], int]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            every = counter.incr.call().get(timeout=TIMEOUT)
            one = counter.slice(procs=0).value.call_one().get(timeout=TIMEOUT)
        return every, one

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        every, one = asyncio.run(cell())
    assert every.values() == [1, 1, 1, 1]
    assert one == 1


def test_async_endpoints_are_called_with_the_same_adverbs(procs4):
    mesh = procs4.spawn("async_counter", AsyncCounter)
    try:
        assert mesh.incr.call(3).get(timeout=TIMEOUT).values() == [3, 3, 3, 3]
        assert mesh.slice(procs=1).incr.call_one().get(timeout=TIMEOUT) == 4
        mesh.incr.broadcast(1)
        assert mesh.incr.call(0).get(timeout=TIMEOUT).values() == [4, 5, 4, 4]
        assert mesh.incr.choose(0).get(timeout=TIMEOUT) in (4, 5)
        assert [f.get(timeout=TIMEOUT) for f in mesh.where.stream()] == [
            f"{{'procs': {i}/4}}" for i in range(4)
        ]
    finally:
        mesh.stop().get(timeout=TIMEOUT)


def test_current_rank_reads_the_point_the_message_was_sent_to(places):
    vm = places.where.call().get(timeout=TIMEOUT)
    rank, _, _ = vm.item(procs=1)
    assert rank == "{'procs': 1/4}"
    assert [r for r, _, _ in vm.values()] == [f"{{'procs': {i}/4}}" for i in range(4)]


def test_current_size_is_the_size_of_the_called_mesh(places):
    vm = places.where.call().get(timeout=TIMEOUT)
    assert all(size == {"procs": 4} for _, size, _ in vm.values())
    sliced = places.slice(procs=slice(1, 3)).where.call().get(timeout=TIMEOUT)
    assert all(size == {"procs": 2} for _, size, _ in sliced.values())


def test_context_gives_the_actor_its_own_rank(places):
    vm = places.where.call().get(timeout=TIMEOUT)
    for i in range(4):
        _, _, actor_rank = vm.item(procs=i)
        assert actor_rank.rank == i
        assert dict(actor_rank) == {"procs": i}


def test_the_actor_rank_is_its_proc_rank_even_when_called_through_a_slice(places):
    _, _, actor_rank = places.slice(procs=2).where.call_one().get(timeout=TIMEOUT)
    assert actor_rank.rank == 2
    assert dict(actor_rank) == {"procs": 2}


def test_slicing_with_a_python_slice_calls_the_selected_actors(places):
    vm = places.slice(procs=slice(1, 3)).where.call().get(timeout=TIMEOUT)
    assert vm.extent == {"procs": 2}
    assert [actor.rank for _, _, actor in vm.values()] == [1, 2]
    stepped = places.slice(procs=slice(None, None, 2)).where.call().get(timeout=TIMEOUT)
    assert [actor.rank for _, _, actor in stepped.values()] == [0, 2]


def test_slicing_a_slice_selects_within_it(places):
    _, _, actor_rank = places.slice(procs=slice(1, 4)).slice(procs=1).where.call_one().get(timeout=TIMEOUT)
    assert actor_rank.rank == 2


def test_an_actor_mesh_reports_its_sizes(places):
    assert places.sizes == {"procs": 4}
    assert places.size() == 4
    assert len(places.slice(procs=slice(0, 3))) == 3


def test_flatten_calls_every_actor_under_the_new_dimension(places):
    vm = places.flatten("all").where.call().get(timeout=TIMEOUT)
    assert vm.extent == {"all": 4}
    assert vm.item(all=3)[0] == "{'all': 3/4}"


@pytest.mark.filterwarnings(
    "ignore::monarch_kernel.hosts._placement.GpuPlacementWarning"
)  # no GPU is fine here
def test_a_two_dimensional_mesh_can_be_sliced_and_flattened():
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    try:
        mesh = procs.spawn("grid", Counter, 0)
        vm = mesh.where.call().get(timeout=TIMEOUT)
        assert vm.extent == {"hosts": 2, "gpus": 2}
        assert vm.item(hosts=1, gpus=0)[0] == "{'hosts': 1/2, 'gpus': 0/2}"
        assert vm.item(hosts=1, gpus=0)[1] == {"hosts": 2, "gpus": 2}
        row = mesh.slice(hosts=1).where.call().get(timeout=TIMEOUT)
        assert row.extent == {"gpus": 2}
        assert [actor.rank for _, _, actor in row.values()] == [2, 3]
        flat = mesh.flatten("all").where.call().get(timeout=TIMEOUT)
        assert [r for r, _, _ in flat.values()] == [f"{{'all': {i}/4}}" for i in range(4)]
    finally:
        procs.stop()


def test_a_value_mesh_can_be_passed_to_an_endpoint(places):
    tens = ValueMesh(Shape.of({"procs": 4}), [10 * i for i in range(4)])
    assert places.my_value_from.call(tens).get(timeout=TIMEOUT).values() == [0, 10, 20, 30]


def test_a_value_mesh_can_be_returned_by_an_endpoint(places):
    vm = places.slice(procs=0).squares_of.call_one(5).get(timeout=TIMEOUT)
    assert isinstance(vm, ValueMesh)
    assert vm.extent == {"n": 5}
    assert vm.values() == [0, 1, 4, 9, 16]


def test_a_value_mesh_returned_by_call_can_be_sent_back(places):
    answers = places.where.call().get(timeout=TIMEOUT)
    echoed = places.my_value_from.call(answers).get(timeout=TIMEOUT)
    assert echoed == answers
