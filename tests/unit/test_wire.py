"""The formats Python and Rust share (``monarch_kernel._wire``) agree: Python takes
what Rust owns from the native module, and the native parser reads what Python writes."""

from __future__ import annotations

import io

from monarch_kernel import _native, _origin, _wire
from monarch_kernel.mesh import _buffers
from monarch_kernel.worker import _output


def test_what_rust_owns_python_takes_from_the_native_module():
    assert _wire.MESSAGE_HEADER == bytes(_native.MESSAGE_HEADER) == _buffers.HEADER
    for name in ("FLUSH_MARK", "PROMPT_MARK", "INPUT_MARK", "DISPLAY_MARK", "ACTOR_FAILURE_MARK"):
        assert getattr(_wire, name) == getattr(_native, name), name
    assert (_wire.ORIGIN_START, _wire.ORIGIN_END) == (_native.ORIGIN_START, _native.ORIGIN_END)
    assert _wire.TRANSFER_STREAMS_ENV == _native.TRANSFER_STREAMS_ENV == "MONARCH_TRANSFER_STREAMS"


def test_the_agent_reads_the_origin_tag_a_worker_writes():
    sink = io.StringIO()
    stream = _output.TaggedStream(sink)  # what a worker's stdout is
    token = _origin.set_context("cell-42")
    try:
        stream.write("hello\n")
    finally:
        _origin.reset(token)
    assert _native.split_origin(sink.getvalue().encode()) == ("cell-42", b"hello\n")
    assert _native.split_origin(b"plain\n") == ("", b"plain\n")


def test_a_flush_mark_with_an_origin_is_recognised_after_the_tag():
    origin, text = _native.split_origin(
        f"{_wire.ORIGIN_START}c1{_wire.ORIGIN_END}{_wire.FLUSH_MARK}\n".encode()
    )
    assert origin == "c1"
    assert text.rstrip(b"\n").decode() == _wire.FLUSH_MARK


def test_the_worker_states_are_the_protos():
    from monarch_kernel import control
    from monarch_kernel.v1 import agent_pb2

    assert control.WORKER_RUNNING == agent_pb2.WORKER_STATE_RUNNING
    assert control.WORKER_EXITED == agent_pb2.WORKER_STATE_EXITED


def test_the_line_kinds_are_the_protos():
    from monarch_kernel.control import LineKind
    from monarch_kernel.v1 import agent_pb2

    assert {k.name: k.value for k in LineKind} == dict(agent_pb2.LogLine.Kind.items())


def test_the_agent_reads_each_control_line_a_worker_writes_as_its_kind():
    """What the worker's writers put on stdout is classified by the agent's own code
    into the kind Python dispatches on, with the text after the mark."""
    import contextlib
    import json

    from monarch_kernel.control import LineKind
    from monarch_kernel.worker import _debug, _display

    def classify(written: str) -> tuple[LineKind, str]:
        line = written.strip("\n").split("\n")[-1].encode()
        kind, payload = _native.classify_line(_native.split_origin(line)[1])
        return LineKind(kind), payload.decode()

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        _display.send({"data": {"text/plain": "x"}})
    kind, payload = classify(sink.getvalue())
    assert kind == LineKind.DISPLAY and json.loads(payload)["data"] == {"text/plain": "x"}
    assert classify(_wire.FLUSH_MARK) == (LineKind.END_MARK, "")
    assert classify(_debug.PROMPT_MARK) == (LineKind.PROMPT, "")
    assert classify(f"{_debug.INPUT_MARK}your name? ") == (LineKind.INPUT, "your name? ")
    assert classify(_wire.ACTOR_FAILURE_MARK + '{"actor": "a"}') == (LineKind.ACTOR_FAILURE, '{"actor": "a"}')
    assert classify("what the user printed") == (LineKind.TEXT, "what the user printed")


def _server_and_items(token: str = "wire-test") -> tuple[object, object]:
    """A worker server of this process with no dispatcher: the test takes its items."""
    server = _native.WorkerServer(token)

    def items() -> list:
        got = server.take_wait(_native.LANE_LOOP, 10.0)
        assert got, "nothing arrived within 10 s"
        return got

    return server, items


def test_a_port_message_arrives_as_its_own_kind_with_typed_fields_and_the_value_alone():
    from monarch_kernel.mesh._port import Port
    from monarch_kernel.mesh._serial import loads, rebuild_exception

    server, items = _server_and_items()
    try:
        Port(server.addr, "wire-test", 5, rank=2).send({"a": 1})
        (item,) = items()
        assert item.kind == _native.KIND_PORT != _native.KIND_CALL
        assert (item.port, item.sender_rank, item.is_exception) == (5, 2, False)
        assert (item.actor, item.method) == ("", "")
        assert loads(item.payload, list(item.buffers)) == {"a": 1}
        server.reply(item.token, _native.REPLY_RESULT, b"", [])

        Port(server.addr, "wire-test", 6).exception(KeyError("k"))
        (item,) = items()
        assert (item.port, item.sender_rank, item.is_exception) == (6, None, True)
        exc = rebuild_exception(*loads(item.payload, list(item.buffers)))
        assert isinstance(exc, KeyError) and exc.args == ("k",)
        server.reply(item.token, _native.REPLY_RESULT, b"", [])
    finally:
        server.shutdown()


def test_a_call_says_it_is_no_port_message():
    server, items = _server_and_items()
    try:
        conn = _native.WorkerConn(server.addr, "wire-test")
        _native.call(_native.Endpoint("a", "m"), [conn], [0], b"x", [])
        (item,) = items()
        assert item.kind == _native.KIND_CALL
        assert (item.port, item.sender_rank, item.is_exception) == (0, None, False)
        server.reply(item.token, _native.REPLY_RESULT, b"", [])
    finally:
        server.shutdown()


def test_a_refused_port_message_is_said_on_the_senders_stderr(capfd):
    """PORT-2, the sender's side: the receiver's refusal is printed where it was sent."""
    import time

    from monarch_kernel.mesh._port import Port

    server, items = _server_and_items()
    try:
        Port(server.addr, "wire-test", 9).send(1)
        (item,) = items()
        server.reply(item.token, _native.REPLY_REJECTED, b"port 9 is closed", [])
        deadline = time.monotonic() + 10
        seen = ""
        while "was refused" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += capfd.readouterr().err
        assert "a message on port 9 was refused: port 9 is closed" in seen
    finally:
        server.shutdown()
