"""Actors calling actors: meshes passed as arguments and to constructors, sync actors
waiting on async ones, actors in the controller (``this_proc()``), and classes and
functions that travel by value."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from monarch_kernel import Actor, ActorMesh, current_rank, endpoint, this_proc

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


class AsyncEcho(Actor):
    @endpoint
    async def echo(self, x):
        await asyncio.sleep(0)
        return (x, current_rank()["procs"])


class Caller(Actor):
    """A sync actor that calls other meshes with ``.get()``."""

    def __init__(self, target: ActorMesh | None = None) -> None:
        self.target = target

    @endpoint
    def values_of(self, mesh: ActorMesh) -> list[int]:
        return mesh.value.call().get(timeout=TIMEOUT).values()

    @endpoint
    def bump_mine(self, mesh: ActorMesh) -> int:
        me = current_rank()["procs"]
        return mesh.slice(procs=me).incr.call_one(100).get(timeout=TIMEOUT)

    @endpoint
    def incr_on(self, mesh: ActorMesh) -> int:
        return mesh.incr.call_one(1).get(timeout=TIMEOUT)

    @endpoint
    def bump_target(self) -> int:
        assert self.target is not None
        return self.target.incr.call_one(1).get(timeout=TIMEOUT)

    @endpoint
    def echo_through(self, mesh: ActorMesh, x):
        return mesh.echo.call(x).get(timeout=TIMEOUT).values()


class AsyncCaller(Actor):
    @endpoint
    async def values_of(self, mesh: ActorMesh) -> list[int]:
        return (await mesh.value.call()).values()


class Applier(Actor):
    """Runs functions it is given."""

    @endpoint
    def apply(self, fn, *args):
        return fn(*args)

    @endpoint
    def make(self, cls, *args):
        obj = cls(*args)
        return obj.describe()


@pytest.fixture(scope="module")
def callers(procs4):
    mesh = procs4.spawn("caller", Caller)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT)


@pytest.fixture
def counters(procs2):
    """A fresh Counter(0) on the 2 procs of another mesh."""
    mesh = procs2.spawn("counter", Counter, 0)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT)


def test_an_actor_mesh_passed_to_an_endpoint_can_be_called_there(callers, counters):
    counters.slice(procs=1).incr.call_one(5).get(timeout=TIMEOUT)
    got = callers.values_of.call(counters).get(timeout=TIMEOUT)
    assert got.values() == [[0, 5]] * 4


def test_an_actor_mesh_received_as_an_argument_can_be_sliced_there(callers, counters):
    got = callers.slice(procs=slice(0, 2)).bump_mine.call(counters).get(timeout=TIMEOUT)
    assert got.values() == [100, 100]
    assert counters.value.call().get(timeout=TIMEOUT).values() == [100, 100]


def test_an_actor_mesh_passed_to_a_constructor_can_be_called_by_the_new_actors(procs4, counters):
    target = counters.slice(procs=0)
    forwarders = procs4.spawn("forwarder", Caller, target)
    try:
        got = forwarders.bump_target.call().get(timeout=TIMEOUT)
        assert sorted(got.values()) == [1, 2, 3, 4]
        assert counters.value.call().get(timeout=TIMEOUT).values() == [4, 0]
    finally:
        forwarders.stop().get(timeout=TIMEOUT)


def test_a_sync_actor_can_wait_on_an_async_actor_on_other_procs(callers, procs2):
    echoes = procs2.spawn("echo", AsyncEcho)
    try:
        got = callers.slice(procs=3).echo_through.call_one(echoes, "hi").get(timeout=TIMEOUT)
        assert got == [("hi", 0), ("hi", 1)]
    finally:
        echoes.stop().get(timeout=TIMEOUT)


def test_a_sync_actor_can_wait_on_an_async_actor_on_the_same_procs(callers, procs4):
    echoes = procs4.spawn("echo", AsyncEcho)
    try:
        got = callers.echo_through.call(echoes, 7).get(timeout=TIMEOUT)
        assert got.values() == [[(7, i) for i in range(4)]] * 4
    finally:
        echoes.stop().get(timeout=TIMEOUT)


def test_an_async_actor_can_await_a_sync_actor_mesh(procs4, counters):
    async_callers = procs4.spawn("async_caller", AsyncCaller)
    try:
        counters.incr.call(3).get(timeout=TIMEOUT)
        got = async_callers.values_of.call(counters).get(timeout=TIMEOUT)
        assert got.values() == [[3, 3]] * 4
    finally:
        async_callers.stop().get(timeout=TIMEOUT)


def test_actors_spawned_on_this_proc_run_in_the_controller():
    mesh = this_proc().spawn("local_counter", Counter, 10)
    try:
        assert mesh.incr.call_one(5).get(timeout=TIMEOUT) == 15
        assert mesh.value.call().get(timeout=TIMEOUT).values() == [15]
    finally:
        mesh.stop().get(timeout=TIMEOUT)


def test_workers_can_call_an_actor_that_lives_in_the_controller(callers):
    local = this_proc().spawn("tally", Counter, 0)
    try:
        got = callers.incr_on.call(local).get(timeout=TIMEOUT)
        assert sorted(got.values()) == [1, 2, 3, 4]
        assert local.value.call_one().get(timeout=TIMEOUT) == 4
    finally:
        local.stop().get(timeout=TIMEOUT)


def test_a_class_defined_in_a_test_function_travels_by_value(procs2):
    class Greeter(Actor):
        def __init__(self, greeting: str) -> None:
            self.greeting = greeting

        @endpoint
        def greet(self, who: str) -> str:
            return f"{self.greeting}, {who} from {current_rank()['procs']}"

    mesh = procs2.spawn("greeter", Greeter, "hello")
    try:
        assert mesh.greet.call("you").get(timeout=TIMEOUT).values() == [
            "hello, you from 0",
            "hello, you from 1",
        ]
    finally:
        mesh.stop().get(timeout=TIMEOUT)


def test_lambdas_and_closures_passed_as_arguments_run_on_the_workers(procs2):
    mesh = procs2.spawn("applier", Applier)
    offset = 1000
    try:
        assert mesh.apply.call(lambda x: x * 2, 21).get(timeout=TIMEOUT).values() == [42, 42]
        assert mesh.apply.call(lambda: offset + current_rank()["procs"]).get(timeout=TIMEOUT).values() == [
            1000,
            1001,
        ]
    finally:
        mesh.stop().get(timeout=TIMEOUT)


def test_instances_of_local_classes_travel_both_ways(procs2):
    class Box:
        def __init__(self, item):
            self.item = item

        def describe(self):
            return Box(f"box of {self.item}")

    mesh = procs2.spawn("applier", Applier)
    try:
        got = mesh.slice(procs=0).make.call_one(Box, "apples").get(timeout=TIMEOUT)
        assert type(got).__name__ == "Box"
        assert got.item == "box of apples"
    finally:
        mesh.stop().get(timeout=TIMEOUT)


def test_a_script_that_used_this_proc_exits_cleanly():
    script = textwrap.dedent(
        """
        import sys, time
        from monarch_kernel import Actor, endpoint, this_proc

        class A(Actor):
            @endpoint
            def f(self):
                return 1

        mesh = this_proc().spawn("a", A)
        assert mesh.f.call_one().get(timeout=30) == 1
        time.sleep(float(sys.argv[1]))
        """
    )
    # The exit races the dispatcher's threads; try it at several moments.
    for i in range(10):
        done = subprocess.run(
            [sys.executable, "-c", script, str(i / 100)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (
            f"exit status {done.returncode} after {i / 100} s; stderr:\n{done.stderr}"
        )
