"""Port messages delivered by this process's own dispatcher (``this_proc()``,
in-process): what a port receives, in order (PORT-1); what it refuses, and says on
the sender's stderr (PORT-2); and what it drops without a word (a late message on
the port of a call that has its answer)."""

from __future__ import annotations

import time

from monarch_kernel import Channel
from monarch_kernel.mesh import _port

TIMEOUT = 30


def _stderr_until(capfd, text: str, seconds: float = 10.0) -> str:
    deadline = time.monotonic() + seconds
    seen = ""
    while text not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
        seen += capfd.readouterr().err
    return seen


def test_a_port_opened_here_receives_what_is_sent_on_it_in_order():
    port, receiver = Channel.open()
    for i in range(20):
        port.send(i)
    assert [receiver.recv().get(timeout=TIMEOUT) for _ in range(20)] == list(range(20))


def test_a_ranked_receiver_gets_the_rank_a_port_carries():
    port, receiver = Channel.open_ranked()
    addr, token = _port.local_address()
    _port.Port(addr, token, port._id, rank=3).send("x")
    assert receiver.recv().get(timeout=TIMEOUT) == (3, "x")


def test_an_exception_sent_on_a_port_is_raised_where_the_receiver_waits():
    port, receiver = Channel.open()
    port.exception(LookupError("sent"))
    try:
        receiver.recv().get(timeout=TIMEOUT)
    except LookupError as e:
        assert e.args == ("sent",)
    else:
        raise AssertionError("no exception")


def test_a_message_for_a_port_never_opened_here_is_refused_and_said(capfd):
    Channel.open()  # (this process's server, started on first use)
    addr, token = _port.local_address()
    _port.Port(addr, token, 987_654_321).send(1)
    seen = _stderr_until(capfd, "was refused")
    assert "a message on port 987654321 was refused: port 987654321 is closed" in seen


def test_a_once_port_refuses_a_second_message_here_too(capfd):
    port, receiver = Channel.open(once=True)
    addr, token = _port.local_address()
    port.send(1)
    assert receiver.recv().get(timeout=TIMEOUT) == 1
    _port.Port(addr, token, port._id).send(2)  # another sender of the same port
    assert "was refused" in _stderr_until(capfd, "was refused")


def test_a_late_message_on_an_answered_calls_port_is_dropped_without_a_word(capfd):
    port, answer, _fail = _port.call_port(1, lambda got: _port.value_of(got[0]))
    port.send("first")
    assert answer.result(timeout=TIMEOUT) == "first"
    port.send("late")
    # The late message is acknowledged, not refused: nothing is said.
    probe, receiver = Channel.open()
    probe.send("after")  # in order behind the late one (PORT-1)
    assert receiver.recv().get(timeout=TIMEOUT) == "after"
    time.sleep(0.2)
    assert "refused" not in capfd.readouterr().err
