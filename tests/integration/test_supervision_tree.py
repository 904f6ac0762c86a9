"""Actors that own meshes (OWN-1): made in ``__init__`` or an endpoint, called, stopped
with their owner (recursively), and the failures that go up the tree: to the owner's
``__supervise__``, else to the controller (``on_failure``, ``unhandled_fault_hook``)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import monarch_kernel
from monarch_kernel import (
    Actor,
    MeshFailure,
    SupervisionError,
    endpoint,
    get_or_spawn_controller,
    this_host,
    this_proc,
)


class Lambda(Actor):
    @endpoint
    def run(self, func: Callable[[], Any]) -> Any:
        return func()


class Nest(Actor):
    """Owns a one-proc mesh it makes in ``__init__``."""

    def __init__(self) -> None:
        self.nest = this_host().spawn_procs(per_host={"a_dim": 1}).spawn("nested", Lambda)

    @endpoint
    def nested(self, func: Callable[[], Any]) -> None:
        self.nest.run.broadcast(func)

    @endpoint
    def nested_call_one(self, func: Callable[[], Any]) -> Any:
        return self.nest.run.call_one(func).get(timeout=60)

    @endpoint
    def child_pid(self) -> int:
        return self.nest.run.call_one(os.getpid).get(timeout=60)

    @endpoint
    def kill_nest(self) -> int:
        pid = self.child_pid()  # (an endpoint is a plain method inside the actor)
        os.kill(pid, 9)
        return pid


class SuperviseNest(Nest):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure.kind)
        return True

    @endpoint
    def failures_seen(self) -> list[str]:
        return self.seen


class Grandparent(Actor):
    """Owns a mesh whose actor owns a mesh: a tree three deep."""

    @endpoint
    def make(self) -> list[int]:
        self.child = this_host().spawn_procs(per_host={"procs": 1}).spawn("middle", Nest)
        return [os.getpid(), self.child.child_pid.call_one().get(timeout=60)]

    @endpoint
    def middle_pid(self) -> int:
        return self.child.nested_call_one.call_one(lambda: os.getppid()).get(timeout=60)


class PingPong(Actor):
    """Two meshes an actor made, whose actors call each other."""

    @endpoint
    def play(self) -> list[list[str]]:
        a = this_host().spawn_procs(per_host={"procs": 1}).spawn("ping", Player, "ping")
        b = this_host().spawn_procs(per_host={"procs": 1}).spawn("pong", Player, "pong")
        return [a.hit.call_one(b).get(timeout=60), b.hit.call_one(a).get(timeout=60)]

    @endpoint
    def on_this_proc(self) -> int:
        here = this_proc().spawn("here", Lambda)
        return here.run.call_one(os.getpid).get(timeout=60)

    @endpoint
    def singleton(self) -> int:
        controller = get_or_spawn_controller("the_one", Lambda).get(timeout=60)
        return controller.run.call_one(os.getpid).get(timeout=60)


class Player(Actor):
    def __init__(self, name: str) -> None:
        self.name = name

    @endpoint
    def hit(self, other: Any) -> list[str]:
        return [self.name, other.back.call_one().get(timeout=60)]

    @endpoint
    def back(self) -> str:
        return self.name


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, limit: float = 20.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def error() -> None:
    raise ValueError("Error.")


class _Faults(list[MeshFailure]):
    arrived: threading.Event


@pytest.fixture
def faults() -> Iterator[_Faults]:
    """Failures that reach the controller's ``unhandled_fault_hook`` (set by the test,
    as Monarch users set it)."""
    got = _Faults()
    arrived = threading.Event()

    def hook(failure: MeshFailure) -> None:
        got.append(failure)
        arrived.set()

    previous = monarch_kernel.__dict__.get("unhandled_fault_hook")
    monarch_kernel.unhandled_fault_hook = hook  # type: ignore[assignment]
    got.arrived = arrived
    try:
        yield got
    finally:
        if previous is None:
            del monarch_kernel.unhandled_fault_hook
        else:
            monarch_kernel.unhandled_fault_hook = previous  # type: ignore[assignment]


def _next(faults: _Faults, limit: float = 30.0) -> MeshFailure:
    arrived = faults.arrived
    assert arrived.wait(limit), "no failure reached unhandled_fault_hook"
    arrived.clear()
    return faults[-1]


def test_an_actor_makes_a_mesh_in_init_and_calls_its_actors(fresh_procs1):
    top = fresh_procs1.spawn("top", Nest)
    assert top.nested_call_one.call_one(lambda: 4).get(timeout=60) == 4
    assert top.child_pid.call_one().get(timeout=60) != os.getpid()


def test_two_meshes_an_actor_made_call_each_other(fresh_procs1):
    game = fresh_procs1.spawn("game", PingPong)
    assert game.play.call_one().get(timeout=120) == [["ping", "pong"], ["pong", "ping"]]


def test_an_actor_spawns_on_this_proc_and_gets_a_singleton_controller(fresh_procs1):
    game = fresh_procs1.spawn("game", PingPong)
    worker = fresh_procs1.spawn("pid", Lambda).run.call_one(os.getpid).get(timeout=30)
    assert game.on_this_proc.call_one().get(timeout=60) == worker
    first = game.singleton.call_one().get(timeout=60)
    assert game.singleton.call_one().get(timeout=60) == first


def test_stopping_an_actor_stops_the_meshes_it_owns(fresh_procs1):
    top = fresh_procs1.spawn("top", Nest)
    child = top.child_pid.call_one().get(timeout=60)
    top.stop().get(timeout=30)
    assert _wait_gone(child), f"the owned mesh's worker {child} still runs after its owner stopped"
    assert fresh_procs1.spawn("after", Lambda).run.call_one(lambda: 1).get(timeout=30) == 1


def test_stopping_the_root_mesh_stops_the_whole_tree(state_home):
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        gp = procs.spawn("gp", Grandparent)
        _owner, grandchild = gp.make.call_one().get(timeout=120)
        middle = gp.middle_pid.call_one().get(timeout=60)
    finally:
        procs.stop()
    assert _wait_gone(middle) and _wait_gone(grandchild)


def test_a_failure_in_an_owned_mesh_goes_to_the_owners_supervise(fresh_procs1, faults):
    sup = fresh_procs1.spawn("sup", SuperviseNest)
    sup.kill_nest.call_one().get(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "dead" not in sup.failures_seen.call_one().get(timeout=30):
        time.sleep(0.2)
    assert "dead" in sup.failures_seen.call_one().get(timeout=30)
    time.sleep(1.0)
    assert faults == []  # handled: nothing reached the controller


def test_an_unhandled_death_in_an_owned_mesh_reaches_the_controllers_hook(fresh_procs1, faults):
    top = fresh_procs1.spawn("top", Nest)
    pid = top.kill_nest.call_one().get(timeout=60)
    failure = _next(faults)
    assert failure.kind == "actor_failed"
    report = failure.report()
    assert "Nest top" in report and f"pid {pid}" in report and "SIGKILL" in report


def test_an_unhandled_actor_error_in_an_owned_mesh_reaches_the_controller_naming_the_chain(
    fresh_procs1, faults
):
    top = fresh_procs1.spawn("top", Nest)
    top.nested.call_one(error).get(timeout=60)
    report = _next(faults).report()
    assert "<root>.<" in report and "Nest top" in report
    assert ".Nest top{'procs': 0/1}>.<" in report and "Lambda nested{'a_dim': 0/1}> failed" in report
    assert "ValueError: Error." in report


def test_a_broadcast_that_raises_goes_to_supervision(fresh_procs1, faults):
    actor = fresh_procs1.spawn("actor", Lambda)
    actor.run.broadcast(error)
    failure = _next(faults)
    assert failure.kind == "actor_failed" and failure.mesh == fresh_procs1.name
    assert "This occurred because the actor itself failed" in failure.report()
    assert actor.run.call_one(lambda: 5).get(timeout=30) == 5  # and the actor is still there


def test_on_failure_callbacks_hear_an_actor_failure_before_the_hook(fresh_procs1, faults):
    heard: list[MeshFailure] = []
    fresh_procs1.on_failure(heard.append)
    fresh_procs1.spawn("actor", Lambda).run.broadcast(error)
    deadline = time.monotonic() + 30
    while not heard and time.monotonic() < deadline:
        time.sleep(0.1)
    assert heard and heard[0].kind == "actor_failed"
    assert faults == []


class Store(Actor):
    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    @endpoint
    def put(self, key: str, value: Any) -> None:
        self.data[key] = value

    @endpoint
    def get(self, key: str) -> Any:
        return self.data.get(key)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class StoreUser(Actor):
    @endpoint
    def read(self, key: str) -> Any:
        return get_or_spawn_controller("store", Store).get(timeout=60).get.call_one(key).get(timeout=60)

    @endpoint
    def read_from_a_child(self, key: str) -> Any:
        child = this_host().spawn_procs(per_host={"procs": 1}).spawn("child", StoreUser)
        return child.read.call_one(key).get(timeout=60)


class AsyncStoreUser(Actor):
    @endpoint
    async def read(self, key: str) -> Any:
        store = await get_or_spawn_controller("store", Store)  # (never blocks this loop)
        return await store.get.call_one(key)


class Cleans(Actor):
    def __init__(self, store: Any) -> None:
        self.store = store

    @endpoint
    def ready(self) -> bool:
        return True

    def __cleanup__(self, exc: object) -> None:
        self.store.put.call_one(f"cleaned-{os.getpid()}", True).get(timeout=30)


class SpawnsOnPassedProcs(Actor):
    """Spawns actors on a proc mesh it was given: they are its own, too (OWN-1)."""

    def __init__(self, procs: Any, store: Any) -> None:
        self.cleans = procs.spawn("cleans", Cleans, store)

    @endpoint
    def ready(self) -> bool:
        return self.cleans.ready.call_one().get(timeout=30)


def test_get_or_spawn_controller_gives_every_actor_of_the_tree_the_same_singleton(fresh_procs1):
    store = get_or_spawn_controller("store", Store).get(timeout=60)
    store.put.call_one("a", 1).get(timeout=30)
    assert store.pid.call_one().get(timeout=30) == os.getpid()  # it lives in the root controller
    user = fresh_procs1.spawn("user", StoreUser)
    assert user.read.call_one("a").get(timeout=60) == 1
    assert fresh_procs1.spawn("async_user", AsyncStoreUser).read.call_one("a").get(timeout=60) == 1
    assert user.read_from_a_child.call_one("a").get(timeout=120) == 1  # two levels down


def test_actors_an_actor_spawned_on_a_mesh_it_was_given_stop_with_it(fresh_procs1):
    store = get_or_spawn_controller("cleanup_store", Store).get(timeout=60)
    owner = fresh_procs1.spawn("owner", SpawnsOnPassedProcs, fresh_procs1, store)
    assert owner.ready.call_one().get(timeout=60)
    owner.stop().get(timeout=30)
    worker = fresh_procs1.spawn("pid", Lambda).run.call_one(os.getpid).get(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not store.get.call_one(f"cleaned-{worker}").get(timeout=30):
        time.sleep(0.1)
    assert store.get.call_one(f"cleaned-{worker}").get(timeout=30) is True


class AsyncSpawner(Actor):
    @endpoint
    async def spawn_singleton(self, name: str) -> str:
        # An async singleton spawned on this very process: awaiting must leave the
        # event loop free for its constructor.
        singleton = await get_or_spawn_controller(name, AsyncStoreUser)
        return repr(singleton)


def test_an_async_actor_on_this_proc_awaits_an_async_singleton_without_blocking_its_loop(state_home):
    spawner = this_proc().spawn("async_spawner", AsyncSpawner)
    assert "async_single" in spawner.spawn_singleton.call_one("async_single").get(timeout=60)


class Fails(BaseException):
    pass


class Failing(Actor):
    @endpoint
    async def fail(self) -> None:
        raise Fails("the actor cannot go on")

    @endpoint
    async def check(self) -> str:
        return "ok"


class SupervisesWhatItSpawned(Actor):
    def __init__(self, procs: Any) -> None:
        self.mesh = procs.spawn("failing", Failing)  # on a mesh it was given
        self.seen: list[str] = []

    @endpoint
    async def fail_them(self) -> str:
        try:
            await self.mesh.fail.call()
        except SupervisionError:
            return "raised"
        return "did not raise"

    @endpoint
    async def broadcast_fail(self) -> None:
        self.mesh.fail.broadcast()

    @endpoint
    async def failures_seen(self) -> list[str]:
        return self.seen

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure.message)
        return True


def test_failures_of_actors_an_actor_spawned_on_a_mesh_it_was_given_go_to_its_supervise(fresh_procs1, faults):
    other = this_host().spawn_procs(per_host={"procs": 2})
    try:
        sup = fresh_procs1.spawn("sup", SupervisesWhatItSpawned, other)
        assert sup.fail_them.call_one().get(timeout=60) == "raised"
        deadline = time.monotonic() + 30
        seen: list[str] = []
        while time.monotonic() < deadline and len(seen) < 2:
            seen = sup.failures_seen.call_one().get(timeout=30)
            time.sleep(0.1)
        assert len(seen) == 2 and all("failing" in m and "Fails: the actor cannot go on" in m for m in seen)
        time.sleep(0.5)
        assert faults == []  # handled by the actor that spawned them
    finally:
        other.stop()
