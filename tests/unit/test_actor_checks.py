"""What ``spawn`` checks about an actor class before anything runs, ``@endpoint``'s
Monarch options, and how Monarch's other names behave when defined and used."""

from __future__ import annotations

import pytest

from monarch_kernel import (
    Actor,
    Channel,
    Port,
    PortReceiver,
    as_endpoint,
    concurrent_endpoint,
    endpoint,
    returns_future,
    this_proc,
)
from monarch_kernel.errors import MeshSpecError


class Mixed(Actor):
    @endpoint
    def sync_one(self):
        return 1

    @endpoint
    async def async_one(self):
        return 2


class NotAnActor:
    @endpoint
    def hello(self):
        return "hi"


class WithOptions(Actor):
    @endpoint(propagate=None, instrument=False)
    def hello(self, who):
        return f"hello {who}"

    @endpoint(instrument=True)
    def bare(self):
        return "bare"


class ShadowsTheMesh(Actor):
    @endpoint
    def slice(self):
        return "mine"


class AsyncWithSyncCleanup(Actor):
    @endpoint
    async def work(self):
        return 1

    def __cleanup__(self, exc):
        pass


class SyncWithAsyncCleanup(Actor):
    @endpoint
    def work(self):
        return 1

    async def __cleanup__(self, exc):
        pass


def test_an_actor_mixing_sync_and_async_endpoints_is_refused():
    with pytest.raises(MeshSpecError, match="mixes both async and sync") as info:
        this_proc().spawn("mixed", Mixed)
    assert isinstance(info.value, ValueError)
    assert "sync_one" in str(info.value) and "async_one" in str(info.value)


def test_an_actor_mixing_sync_and_async_endpoints_is_a_value_error():
    with pytest.raises(ValueError, match="mixes both async and sync"):
        this_proc().spawn("mixed", Mixed)


class AsyncGenerating(Actor):
    @endpoint
    async def ticks(self):
        yield 1

    @endpoint
    async def ping(self):
        return 1


def test_an_async_generator_endpoint_is_refused_saying_what_to_do_instead():
    with pytest.raises(MeshSpecError, match=r"\['ticks'\] are async generators.*Return a list"):
        this_proc().spawn("gen", AsyncGenerating)


def test_a_class_that_is_not_an_actor_is_refused():
    with pytest.raises(MeshSpecError, match="must subclass monarch_kernel.Actor"):
        this_proc().spawn("not_an_actor", NotAnActor)


def test_an_endpoint_named_like_a_mesh_method_is_refused():
    with pytest.raises(MeshSpecError, match="slice"):
        this_proc().spawn("shadow", ShadowsTheMesh)


def test_an_async_actor_with_a_sync_cleanup_is_refused():
    with pytest.raises(MeshSpecError, match="__cleanup__"):
        this_proc().spawn("bad_cleanup", AsyncWithSyncCleanup)


def test_a_sync_actor_with_an_async_cleanup_is_refused():
    with pytest.raises(MeshSpecError, match="__cleanup__"):
        this_proc().spawn("bad_cleanup", SyncWithAsyncCleanup)


def test_an_empty_actor_name_is_refused():
    with pytest.raises(MeshSpecError, match="name"):
        this_proc().spawn("", WithOptions)


def test_endpoint_takes_monarchs_keyword_options():
    mesh = this_proc().spawn("with_options", WithOptions)
    try:
        assert mesh.hello.call_one("world").get(timeout=30) == "hello world"
        assert mesh.bare.call_one().get(timeout=30) == "bare"
    finally:
        mesh.stop().get(timeout=30)


def test_an_endpoint_on_an_instance_is_the_plain_method():
    assert WithOptions().hello("you") == "hello you"


def test_a_module_using_every_decorator_and_name_of_monarch_actor_imports_cleanly():
    # Part of issue 16: nothing raises while a class is being defined; a name that is
    # not supported raises only when it is used.
    class _EveryDecorator(Actor):
        @endpoint(explicit_response_port=True)
        def answers_later(self, port: Port[int]) -> None:
            port.send(1)

        @concurrent_endpoint
        async def concurrently(self) -> int:
            return 1

        @concurrent_endpoint(explicit_response_port=True)
        async def concurrently_with_port(self, port: Port[int]) -> None:
            port.send(1)

        @endpoint(propagate=None, instrument=False)
        def plain(self) -> int:
            return 1

    @returns_future
    async def later() -> int:
        return 1

    assert _EveryDecorator is not None
    assert Channel[int] is not None and Port[str] is not None and PortReceiver[int] is not None


def test_concurrent_endpoint_refuses_a_sync_method_as_monarch_does():
    with pytest.raises(ValueError, match="only wrap async endpoints"):

        class _Sync(Actor):
            @concurrent_endpoint
            def f(self):
                pass


def test_concurrent_endpoint_refuses_to_wrap_an_endpoint_as_monarch_does():
    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class _Chained(Actor):
            @concurrent_endpoint
            @endpoint
            async def f(self):
                pass


@pytest.mark.parametrize(
    ("name", "instead"),
    [
        ("sim_proc_mesh", "spawn_procs"),
        ("debug_controller", "%mesh debug"),
        ("run_worker_loop_forever", "host agents"),
        ("run_worker_loop_until_shutdown", "host agents"),
        ("start_worker_loop_forever", "host agents"),
        ("default_bootstrap_cmd", "with_python_executable"),
        ("ProcId", "mesh and rank"),
        ("Uid", "mesh and rank"),
        ("attach_to_workers", "job"),
    ],
)
def test_names_without_a_meaning_here_raise_only_when_called_naming_what_to_use(name, instead):
    import monarch_kernel

    fn = getattr(monarch_kernel, name)  # importing it is fine
    with pytest.raises(NotImplementedError, match=instead):
        fn()


def test_as_endpoint_refuses_what_is_not_a_method_of_a_spawned_actor():
    with pytest.raises(ValueError, match="method of a spawned actor"):
        as_endpoint(lambda: None)


def test_returns_future_gives_a_future_whose_body_starts_on_first_use():
    started = []

    @returns_future
    async def body(x):
        started.append(x)
        return x * 2

    f = body(21)
    assert started == []
    assert f.get(timeout=10) == 42
    assert started == [21]
