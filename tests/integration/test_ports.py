"""Ports and channels (PORT-1, PORT-2), endpoints that answer through a port
(ENDPOINT-1), ``send(port=...)`` and ``as_endpoint``, on real workers."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from monarch_kernel import (
    Actor,
    ActorError,
    Channel,
    Port,
    SupervisionError,
    _native,
    as_endpoint,
    endpoint,
    send,
)


class Sender(Actor):
    """Sends on ports it is given."""

    @endpoint
    def send_each(self, port: Port[int], values: list[int]) -> None:
        for v in values:
            port.send(v)

    @endpoint
    def send_value(self, port: Port[object], value: object) -> None:
        port.send(value)

    @endpoint
    def send_error(self, port: Port[int], text: str) -> None:
        port.exception(KeyError(text))

    @endpoint
    def send_twice(self, port: Port[int]) -> str:
        port.send(1)
        try:
            port.send(2)
        except ValueError as e:
            return str(e)
        return "sent twice"

    @endpoint
    def relay(self, target: object, port: Port[int], value: int) -> None:
        # The port goes on, from this actor to an actor of another mesh.
        target.send_value.call_one(port, value).get()  # type: ignore[attr-defined]

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def not_an_endpoint(self, x: int) -> int:
        return x * 10


class Answerer(Actor):
    """Endpoints that answer through the port they get (explicit_response_port)."""

    @endpoint(explicit_response_port=True)
    def later(self, port: Port[int], x: int) -> None:
        # Answers from another thread, after the endpoint has returned.
        threading.Timer(0.2, lambda: port.send(x * 2)).start()

    @endpoint(explicit_response_port=True)
    def several(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)

    @endpoint(explicit_response_port=True)
    def by_another_actor(self, port: Port[int], helper: object, x: int) -> None:
        helper.send_value.call_one(port, x + 1).get()  # type: ignore[attr-defined]

    @endpoint(explicit_response_port=True)
    def raises(self, port: Port[int]) -> None:
        raise ValueError("no answer from me")

    @endpoint(explicit_response_port=True)
    def dies(self, port: Port[int]) -> None:
        os._exit(3)

    @endpoint(explicit_response_port=True)
    def answer_error(self, port: Port[int]) -> None:
        port.exception(RuntimeError("told through the port"))

    @endpoint
    def plain(self, x: int) -> int:
        return x + 1


class Opener(Actor):
    """An actor that opens a channel of its own and waits on it."""

    def __init__(self) -> None:
        self.port, self.receiver = Channel.open()

    @endpoint
    def its_port(self) -> Port[str]:
        return self.port

    @endpoint
    def receive(self) -> str:
        return self.receiver.recv().get(timeout=30)


@pytest.fixture
def senders(procs2):
    mesh = procs2.spawn("senders", Sender)
    yield mesh
    mesh.stop().get(timeout=30)


@pytest.fixture
def answerers(procs2):
    mesh = procs2.spawn("answerers", Answerer)
    yield mesh
    mesh.stop().get(timeout=30)


def test_messages_on_a_port_arrive_in_the_order_sent(senders):
    port, receiver = Channel.open()
    senders.slice(procs=0).send_each.call_one(port, list(range(50))).get(timeout=30)
    assert [receiver.recv().get(timeout=30) for _ in range(50)] == list(range(50))


def test_a_ranked_receiver_says_which_rank_sent_each_message(senders):
    port, receiver = Channel.open_ranked()
    senders.send_value.call(port, "hi").get(timeout=30)
    got = sorted(receiver.recv().get(timeout=30) for _ in range(2))
    assert got == [(0, "hi"), (1, "hi")]


def test_port_exception_is_raised_where_the_receiver_waits(senders):
    port, receiver = Channel.open()
    senders.slice(procs=1).send_error.call_one(port, "missing").get(timeout=30)
    with pytest.raises(KeyError, match="missing"):
        receiver.recv().get(timeout=30)


def test_a_once_port_sends_one_message_and_refuses_a_second(senders):
    port, receiver = Channel.open(once=True)
    said = senders.slice(procs=0).send_twice.call_one(port).get(timeout=30)
    assert "once port" in said
    assert receiver.recv().get(timeout=30) == 1


def test_a_port_passes_from_an_actor_to_an_actor_of_another_mesh(senders, fresh_procs1):
    other = fresh_procs1.spawn("other_senders", Sender)
    try:
        port, receiver = Channel.open()
        senders.slice(procs=0).relay.call_one(other, port, 7).get(timeout=30)
        assert receiver.recv().get(timeout=30) == 7
    finally:
        other.stop().get(timeout=30)


def test_an_actor_receives_on_a_channel_it_opened(fresh_procs1):
    opener = fresh_procs1.spawn("opener", Opener)
    try:
        port = opener.its_port.call_one().get(timeout=30)
        waiting = opener.receive.call_one()
        port.send("from the controller")
        assert waiting.get(timeout=30) == "from the controller"
    finally:
        opener.stop().get(timeout=30)


def test_a_large_message_on_a_port_goes_through_the_transfer_engine(senders):
    before = _native.xfer_stats()
    port, receiver = Channel.open()
    big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
    senders.slice(procs=0).send_value.call_one(port, big).get(timeout=60)
    got = receiver.recv().get(timeout=60)
    assert np.array_equal(got, big)
    after = _native.xfer_stats()
    assert after != before  # this process pulled it from the worker


def test_a_message_for_a_port_whose_receiver_is_gone_is_refused_and_said(senders, capfd):
    port, receiver = Channel.open()
    del receiver
    senders.slice(procs=0).send_value.call_one(port, 1).get(timeout=30)
    deadline = time.monotonic() + 20
    seen = ""
    while time.monotonic() < deadline and "was refused" not in seen:
        time.sleep(0.2)
        seen += capfd.readouterr().err + capfd.readouterr().out
    assert "was refused" in seen and "closed" in seen


def test_an_explicit_response_endpoint_answers_call_one_later_from_another_thread(answerers):
    assert answerers.slice(procs=1).later.call_one(21).get(timeout=30) == 42


def test_an_explicit_response_endpoint_answers_call_with_a_value_per_rank(answerers):
    values = answerers.later.call(5).get(timeout=30)
    assert list(values.values()) == [10, 10]


def test_an_explicit_response_endpoint_answers_choose(answerers):
    assert answerers.later.choose(4).get(timeout=30) == 8


def test_an_explicit_response_endpoint_may_answer_several_times_in_a_stream(answerers):
    # Two actors send two messages each: the stream's two Futures are the first two.
    got = [f.get(timeout=30) for f in answerers.several.stream(2)]
    assert len(got) == 2 and set(got) <= {0, 1}


def test_an_explicit_response_endpoint_may_have_another_actor_answer(answerers, senders):
    helper = senders.slice(procs=0)
    assert answerers.slice(procs=0).by_another_actor.call_one(helper, 9).get(timeout=30) == 10


def test_an_explicit_response_endpoint_that_raises_fails_the_call_and_the_actor_stays(answerers):
    with pytest.raises(ActorError, match="no answer from me"):
        answerers.slice(procs=0).raises.call_one().get(timeout=30)
    assert answerers.slice(procs=0).plain.call_one(1).get(timeout=30) == 2


def test_an_exception_sent_on_the_port_is_raised_by_the_caller(answerers):
    with pytest.raises(RuntimeError, match="told through the port"):
        answerers.slice(procs=0).answer_error.call_one().get(timeout=30)


def test_an_explicit_response_call_fails_instead_of_hanging_when_the_worker_dies(fresh_procs1):
    mesh = fresh_procs1.spawn("dying", Answerer)
    with pytest.raises(SupervisionError, match="exited with code 3"):
        mesh.dies.call_one().get(timeout=60)


def test_broadcast_of_an_explicit_response_endpoint_runs_it_with_a_dropping_port(answerers):
    answerers.several.broadcast(3)
    assert list(answerers.plain.call(1).get(timeout=30).values()) == [2, 2]


def test_send_with_a_port_puts_each_actors_answer_on_it_ranked(answerers):
    port, receiver = Channel.open_ranked()
    send(answerers.plain, (1,), {}, port=port)
    assert sorted(receiver.recv().get(timeout=30) for _ in range(2)) == [(0, 2), (1, 2)]


def test_send_to_an_explicit_response_endpoint_gives_it_the_port(answerers):
    port, receiver = Channel.open()
    send(answerers.later, (3,), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=30) == 6


def test_as_endpoint_calls_a_method_that_is_not_an_endpoint(senders):
    assert list(as_endpoint(senders.not_an_endpoint).call(4).get(timeout=30).values()) == [40, 40]


def test_awaiting_a_port_future_in_an_event_loop(senders):
    import asyncio

    port, receiver = Channel.open()

    async def main() -> int:
        senders.slice(procs=0).send_value.broadcast(port, 5)
        return await receiver.recv()

    assert asyncio.run(main()) == 5
