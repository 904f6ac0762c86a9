"""What ``spawn`` checks about an actor class before anything runs, ``@endpoint``'s
Monarch options, and the Monarch names that are not implemented yet."""

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


def test_explicit_response_port_is_refused_saying_what_to_do_instead():
    with pytest.raises(NotImplementedError, match="return the value"):

        class _UsesPort(Actor):
            @endpoint(explicit_response_port=True)
            def f(self, port):
                pass


@pytest.mark.parametrize("cls", [Channel, Port, PortReceiver])
def test_channel_and_ports_raise_not_implemented_naming_what_to_use_instead(cls):
    with pytest.raises(NotImplementedError, match=r"use call\(\)/stream\(\) instead"):
        cls()


def test_channel_can_still_be_used_in_type_annotations():
    assert Channel[int] is Channel
    assert Port[str] is Port


def test_channel_open_raises_not_implemented_naming_what_to_use_instead():
    # Monarch's way to make a channel is Channel.open(), not Channel().
    with pytest.raises(NotImplementedError, match="instead"):
        Channel.open()


def test_concurrent_endpoint_raises_not_implemented_naming_what_to_use_instead():
    with pytest.raises(NotImplementedError, match="use @endpoint"):

        class _Concurrent(Actor):
            @concurrent_endpoint
            def f(self):
                pass


@pytest.mark.parametrize(("fn", "instead"), [(as_endpoint, "@endpoint"), (returns_future, "await")])
def test_other_missing_names_raise_not_implemented_naming_what_to_use_instead(fn, instead):
    with pytest.raises(NotImplementedError, match=instead):
        fn(lambda: None)
