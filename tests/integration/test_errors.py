"""What a user sees when something goes wrong: endpoint exceptions, bad calls, stopped
meshes, dead workers and oversized messages."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from monarch_kernel import (
    Actor,
    ActorError,
    MeshStoppedError,
    SupervisionError,
    _native,
    current_rank,
    endpoint,
    this_host,
    this_proc,
)
from monarch_kernel.errors import (
    DimensionError,
    MeshIndexError,
    MeshSpecError,
    MessageTooLargeError,
    SerializationError,
    UnknownEndpointError,
)

TIMEOUT = 30


class Faulty(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def ping(self) -> int:
        self.calls += 1
        return self.calls

    @endpoint
    def explode(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    def explode_on(self, rank: int) -> int:
        if current_rank()["procs"] == rank:
            raise RuntimeError(f"rank {rank} refuses")
        return current_rank()["procs"]

    @endpoint
    def two_args(self, a, b):
        return a + b

    @endpoint
    def give_lock(self):
        return threading.Lock()

    @endpoint
    def size_of(self, data: bytes) -> int:
        return len(data)

    @endpoint
    def die(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "woke"

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def helper(self) -> str:
        return "not an endpoint"


class TwoArgError(Exception):
    """Its __init__ takes other arguments than it gives Exception: pickle cannot rebuild it."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}-{b} went wrong")


class RaisesTwoArg(Actor):
    def __init__(self, in_init: bool = False) -> None:
        if in_init:
            raise TwoArgError(3, 4)

    @endpoint
    def fail(self) -> None:
        raise TwoArgError(1, 2)


class BrokenInit(Actor):
    def __init__(self, fail_on: int) -> None:
        if current_rank()["procs"] == fail_on:
            raise KeyError(f"no config for rank {fail_on}")

    @endpoint
    def ping(self) -> str:
        return "pong"


class BrokenHere(Actor):
    def __init__(self) -> None:
        raise KeyError("nothing to run on here")


class AsyncFaulty(Actor):
    @endpoint
    async def explode(self, message: str) -> None:
        raise LookupError(message)

    @endpoint
    async def ping(self) -> str:
        return "pong"


@pytest.fixture(scope="module")
def faulty(procs4):
    mesh = procs4.spawn("faulty", Faulty)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT)


@pytest.fixture
def own_procs2(state_home):
    """Two procs that a test may break."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    yield procs
    procs.stop()


def _worker(procs, rank: int) -> dict:
    return next(w for w in procs._session("test").client.list_workers() if w["rank"] == rank)


# -- endpoint exceptions -------------------------------------------------------------


def test_an_endpoint_exception_comes_back_as_actor_error_with_the_remote_traceback(faulty):
    with pytest.raises(ActorError) as info:
        faulty.slice(procs=1).explode.call_one("the flux capacitor melted").get(timeout=TIMEOUT)
    err = info.value
    text = str(err)
    assert "the flux capacitor melted" in text
    assert "ValueError" in text
    assert "in explode" in text  # the traceback line of the endpoint
    assert err.rank is not None
    assert isinstance(err.exception, ValueError)
    assert "faulty.explode" in err.message


def test_an_actor_stays_usable_after_its_endpoint_raised(faulty):
    one = faulty.slice(procs=2)
    before = one.ping.call_one().get(timeout=TIMEOUT)
    with pytest.raises(ActorError):
        one.explode.call_one("once").get(timeout=TIMEOUT)
    assert one.ping.call_one().get(timeout=TIMEOUT) == before + 1


def test_call_raises_actor_error_naming_the_rank_that_failed(faulty):
    with pytest.raises(ActorError) as info:
        faulty.explode_on.call(2).get(timeout=TIMEOUT)
    err = info.value
    assert err.rank is not None and err.rank["procs"] == 2
    assert "rank 2 refuses" in str(err)
    assert "{'procs': 2/4}" in str(err)
    assert "in explode_on" in str(err)


def test_the_other_ranks_keep_working_after_one_rank_raised(faulty):
    with pytest.raises(ActorError):
        faulty.explode_on.call(0).get(timeout=TIMEOUT)
    assert faulty.explode_on.call(-1).get(timeout=TIMEOUT).values() == [0, 1, 2, 3]


def test_stream_gives_the_error_only_for_the_rank_that_raised(faulty):
    futures = list(faulty.explode_on.stream(1))
    assert futures[0].get(timeout=TIMEOUT) == 0
    with pytest.raises(ActorError):
        futures[1].get(timeout=TIMEOUT)
    assert [f.get(timeout=TIMEOUT) for f in futures[2:]] == [2, 3]


def test_an_async_endpoint_exception_comes_back_as_actor_error(procs4):
    mesh = procs4.spawn("async_faulty", AsyncFaulty)
    try:
        with pytest.raises(ActorError, match="lost in the loop") as info:
            mesh.slice(procs=3).explode.call_one("lost in the loop").get(timeout=TIMEOUT)
        assert "in explode" in str(info.value)
        assert isinstance(info.value.exception, LookupError)
        assert mesh.ping.call().get(timeout=TIMEOUT).values() == ["pong"] * 4
    finally:
        mesh.stop().get(timeout=TIMEOUT)


def test_a_constructor_that_raises_is_a_supervision_failure_and_calls_to_it_raise_actor_error(fresh_procs2):
    # As in Monarch: the spawn returns, the failure goes to supervision (one per rank
    # that failed), and a call to that rank raises the constructor's ActorError.
    heard: list[Any] = []
    fresh_procs2.on_failure(heard.append)
    mesh = fresh_procs2.spawn("broken", BrokenInit, 1)
    deadline = time.monotonic() + TIMEOUT
    while not heard and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [f.kind for f in heard] == ["actor_failed"] and heard[0].rank == 1
    assert "broken" in heard[0].report() and "no config for rank 1" in heard[0].report()
    with pytest.raises(ActorError) as info:
        mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT)
    text = str(info.value)
    assert "no config for rank 1" in text and "BrokenInit" in text and "__init__" in text
    assert info.value.rank is not None
    assert mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT) == "pong"


def test_a_constructor_that_raises_on_this_proc_fails_the_spawn(state_home):
    # this_proc() is supervised by nobody: the spawn itself raises.
    with pytest.raises(ActorError, match="BrokenHere"):
        this_proc().spawn("broken_here", BrokenHere)


def test_an_exception_that_cannot_be_rebuilt_still_shows_its_remote_traceback(procs4):
    mesh = procs4.spawn("two_arg", RaisesTwoArg)
    try:
        with pytest.raises(ActorError) as info:
            mesh.slice(procs=1).fail.call_one().get(timeout=TIMEOUT)
        text = str(info.value)
        assert "TwoArgError: 1-2 went wrong" in text and "in fail" in text, text
        assert "could not be rebuilt here" in text
        assert info.value.exception is None
    finally:
        mesh.stop().get(timeout=TIMEOUT)
    broken = procs4.spawn("two_arg_init", RaisesTwoArg, True)  # (its failure goes to supervision)
    with pytest.raises(ActorError) as info:
        broken.slice(procs=0).fail.call_one().get(timeout=TIMEOUT)
    text = str(info.value)
    assert "TwoArgError: 3-4 went wrong" in text and "__init__" in text, text


# -- bad calls -----------------------------------------------------------------------


def test_logs_of_a_rank_out_of_range_and_choose_on_an_empty_slice_say_what_is_wrong(faulty, procs4):
    with pytest.raises(MeshIndexError, match="rank 4 is out of range.*ranks 0 to 3"):
        procs4.logs(rank=4)
    with pytest.raises(MeshIndexError, match="rank -1 is out of range"):
        procs4.stream_logs(rank=-1)  # at once, not when the iterator is first read
    with pytest.raises(ValueError, match="tail=-3 must be 0 or more"):
        procs4.logs(tail=-3)
    with pytest.raises(MeshIndexError, match="choose\\(\\): the mesh is empty"):
        faulty.slice(procs=slice(1, 1)).ping.choose()


@pytest.mark.parametrize("tail", [2**32, 10**20])
def test_logs_with_a_tail_above_what_the_agent_takes_say_the_limit(procs4, tail):
    # A tail travels as a uint32: a larger one is refused saying so, not by protobuf.
    with pytest.raises(MeshSpecError, match=f"tail={tail} is more than 4294967295"):
        procs4.logs(tail=tail)
    assert isinstance(procs4.logs(tail=2**32 - 1), list)  # the largest one: every line kept


def test_an_unknown_endpoint_raises_unknown_endpoint_error_listing_the_endpoints(faulty):
    with pytest.raises(UnknownEndpointError, match="no_such_thing") as info:
        _ = faulty.no_such_thing
    assert isinstance(info.value, AttributeError)
    assert "ping" in str(info.value)
    assert not hasattr(faulty, "no_such_thing")


def test_a_method_that_is_not_an_endpoint_cannot_be_called_on_the_mesh(faulty):
    with pytest.raises(UnknownEndpointError, match="not an endpoint"):
        faulty.helper.call()


def test_slicing_an_unknown_dimension_raises_dimension_error(faulty):
    with pytest.raises(DimensionError, match="gpus") as info:
        faulty.slice(gpus=0)
    assert isinstance(info.value, TypeError)


def test_slicing_out_of_range_raises_mesh_index_error(faulty):
    with pytest.raises(MeshIndexError) as info:
        faulty.slice(procs=4)
    assert isinstance(info.value, IndexError)


def test_an_unpicklable_argument_raises_serialization_error_naming_it(faulty):
    with pytest.raises(SerializationError, match="faulty.ping|faulty.two_args") as info:
        faulty.two_args.call(threading.Lock(), 1)
    assert isinstance(info.value, TypeError)
    assert "lock" in str(info.value).lower()
    # The mesh is unaffected.
    assert len(faulty.ping.call().get(timeout=TIMEOUT)) == 4


def test_an_unpicklable_return_value_comes_back_as_actor_error(faulty):
    with pytest.raises(ActorError, match="(?i)pickle"):
        faulty.slice(procs=0).give_lock.call_one().get(timeout=TIMEOUT)
    assert faulty.slice(procs=0).two_args.call_one(1, 2).get(timeout=TIMEOUT) == 3


def test_the_wrong_number_of_arguments_raises_type_error_before_sending(faulty):
    with pytest.raises(TypeError, match="faulty.two_args"):
        faulty.two_args.call(1)
    with pytest.raises(TypeError):
        faulty.slice(procs=0).two_args.call_one(1, 2, 3)
    with pytest.raises(TypeError):
        faulty.two_args.call(1, c=2)


def test_a_message_above_the_limit_raises_message_too_large_error(faulty):
    data = "x" * (_native.MAX_MESSAGE_BYTES + 1)  # (text travels in the message; bytes would not)
    try:
        with pytest.raises(MessageTooLargeError) as info:
            faulty.slice(procs=0).size_of.call_one(data).get(timeout=TIMEOUT)
    finally:
        del data
    assert isinstance(info.value, ValueError)
    assert f"{_native.MAX_MESSAGE_BYTES:,}" in str(info.value)
    assert faulty.slice(procs=0).size_of.call_one(b"small").get(timeout=TIMEOUT) == 5


# -- stopped meshes ------------------------------------------------------------------


def test_a_stopped_mesh_raises_mesh_stopped_error_on_later_calls_and_spawns(own_procs2):
    mesh = own_procs2.spawn("faulty", Faulty)
    assert mesh.ping.call().get(timeout=TIMEOUT).values() == [1, 1]
    own_procs2.stop()
    with pytest.raises(MeshStoppedError) as info:
        mesh.ping.call().get(timeout=TIMEOUT)
    assert isinstance(info.value, SupervisionError)
    assert own_procs2.name in str(info.value)
    with pytest.raises(MeshStoppedError):
        mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT)
    with pytest.raises(MeshStoppedError):
        own_procs2.spawn("again", Faulty)


def test_a_stopped_actor_mesh_refuses_calls_but_its_procs_keep_working(own_procs2):
    mesh = own_procs2.spawn("faulty", Faulty)
    mesh.stop().get(timeout=TIMEOUT)
    with pytest.raises(SupervisionError, match="faulty"):
        mesh.ping.call().get(timeout=TIMEOUT)
    again = own_procs2.spawn("faulty", Faulty)
    assert again.ping.call().get(timeout=TIMEOUT).values() == [1, 1]


# -- dead workers --------------------------------------------------------------------


def test_a_worker_that_exits_during_a_call_fails_it_with_supervision_error(own_procs2):
    mesh = own_procs2.spawn("faulty", Faulty)
    with pytest.raises(SupervisionError) as info:
        mesh.slice(procs=1).die.call_one(3).get(timeout=TIMEOUT)
    err = info.value
    assert not isinstance(err, MeshStoppedError)
    assert "rank 1" in str(err)
    assert "code 3" in str(err)
    assert err.rank == 1
    assert err.exit_code == 3
    assert mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT) == 1


def test_a_worker_killed_during_a_call_fails_it_with_supervision_error_naming_the_signal(own_procs2):
    mesh = own_procs2.spawn("faulty", Faulty)
    pid = _worker(own_procs2, 0)["pid"]
    assert mesh.slice(procs=0).pid.call_one().get(timeout=TIMEOUT) == pid
    pending = mesh.slice(procs=0).sleep.call_one(60)
    conn = _native.WorkerConn(own_procs2._proc.addrs[0], own_procs2._proc.token)
    deadline = time.monotonic() + TIMEOUT
    while conn.stats()["calls_in_flight"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SupervisionError) as info:
        pending.get(timeout=TIMEOUT)
    err = info.value
    assert "rank 0" in str(err)
    assert "SIGKILL" in str(err) or "signal 9" in str(err)
    assert err.signal == signal.SIGKILL
    assert err.pid == pid
    assert mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT) == 1


def test_calls_to_a_dead_rank_keep_failing_while_live_ranks_answer(own_procs2):
    mesh = own_procs2.spawn("faulty", Faulty)
    with pytest.raises(SupervisionError):
        mesh.slice(procs=0).die.call_one(5).get(timeout=TIMEOUT)
    with pytest.raises(SupervisionError, match="rank 0"):
        mesh.ping.call().get(timeout=TIMEOUT)
    with pytest.raises(SupervisionError):
        mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT)
    # Once the death is known, a call() that needs rank 0 fails before sending
    # anything, and says how to recover; rank 1 goes on.
    with pytest.raises(SupervisionError, match=r"respawn\(\)"):
        mesh.ping.call().get(timeout=TIMEOUT)
    assert mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT) in (1, 2)
    assert _worker(own_procs2, 0)["state"] == "exited"
    assert _worker(own_procs2, 1)["state"] == "running"


class ActorFailure(BaseException):
    """Not an Exception: ends the actor that raises it (DISPATCH-4)."""


class EndsItself(Actor):
    @endpoint
    def fail(self) -> None:
        raise ActorFailure("the actor cannot go on")

    @endpoint
    def ping(self) -> str:
        return "pong"


class AsyncEndsItself(Actor):
    @endpoint
    async def fail(self) -> None:
        raise ActorFailure("the actor cannot go on")

    @endpoint
    async def ping(self) -> str:
        return "pong"


@pytest.mark.parametrize("cls", [EndsItself, AsyncEndsItself])
def test_a_base_exception_ends_the_actor_its_calls_say_why_and_supervision_hears_it(fresh_procs1, cls):
    heard: list[Any] = []
    fresh_procs1.on_failure(heard.append)
    mesh = fresh_procs1.spawn("ends", cls)
    with pytest.raises(SupervisionError, match="exited because of the following reason") as first:
        mesh.fail.call_one().get(timeout=TIMEOUT)
    assert "ActorFailure: the actor cannot go on" in str(first.value)
    with pytest.raises(SupervisionError, match="ActorFailure: the actor cannot go on"):
        mesh.ping.call_one().get(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while not heard and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [f.kind for f in heard] == ["actor_failed"]
    # The proc is fine: the same name spawned again works.
    assert fresh_procs1.spawn("ends", cls).ping.call_one().get(timeout=TIMEOUT) == "pong"
