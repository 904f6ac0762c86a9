"""Every worker and agent call carries the mesh token; a wrong or empty token is
refused before anything is unpickled (AUTH-1)."""

from __future__ import annotations

import dataclasses
import re

import pytest

import monarch_kernel
from monarch_kernel import Actor, ActorMesh, Shape, _native, endpoint
from monarch_kernel.control import AgentClient
from monarch_kernel.errors import MeshAuthError
from monarch_kernel.mesh._serial import dumps

TIMEOUT = 30


class Counter(Actor):
    def __init__(self) -> None:
        self.v = 0

    @endpoint
    def incr(self) -> int:
        self.v += 1
        return self.v

    @endpoint
    def value(self) -> int:
        return self.v


@pytest.fixture(scope="module")
def counter(procs2):
    mesh = procs2.spawn("counter", Counter)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT)


def _payload() -> bytes:
    return dumps(((), {}), "x")[0]


def _incr_on(conn: _native.WorkerConn) -> _native.PendingCall:
    """``counter.incr()`` sent straight through the native client on ``conn``."""
    (pending,) = _native.call(
        _native.Endpoint("counter", "incr", ["procs"], [1]), [conn], [0], _payload(), []
    )
    return pending


def test_a_call_with_the_wrong_token_is_rejected_before_the_unpickler(counter):
    addr = counter._proc.addrs[0]
    good = _native.WorkerConn(addr, counter._proc.token)
    before = good.stats()
    pending = _incr_on(_native.WorkerConn(addr, "wrong-token"))
    with pytest.raises(_native.AuthError):
        pending.wait(timeout=TIMEOUT)
    after = good.stats()
    assert after["rejected_auth"] > before["rejected_auth"]
    assert after["calls_received"] == before["calls_received"]
    # The actor never ran.
    assert counter.slice(procs=0).value.call_one().get(timeout=TIMEOUT) == 0


def test_a_call_with_the_right_token_is_counted(counter):
    addr = counter._proc.addrs[1]
    good = _native.WorkerConn(addr, counter._proc.token)
    before = good.stats()["calls_received"]
    kind = _incr_on(good).wait(timeout=TIMEOUT).kind
    assert kind == _native.REPLY_RESULT
    assert good.stats()["calls_received"] == before + 1


def test_ping_and_stats_with_the_wrong_token_are_rejected(counter):
    bad = _native.WorkerConn(counter._proc.addrs[0], "wrong-token")
    with pytest.raises(_native.AuthError):
        bad.ping()
    with pytest.raises(_native.AuthError):
        bad.stats()


def test_an_empty_token_is_refused(counter):
    with pytest.raises(_native.AuthError, match="empty"):
        _native.WorkerConn(counter._proc.addrs[0], "")


def test_an_actor_mesh_with_the_wrong_token_raises_mesh_auth_error(counter):
    wrong = dataclasses.replace(counter._proc, token="wrong-token")
    impostor = ActorMesh("counter", Counter, wrong, Shape.of({"procs": 2}))
    with pytest.raises(MeshAuthError, match="rejected the token"):
        impostor.slice(procs=0).incr.call_one().get(timeout=TIMEOUT)
    assert counter.slice(procs=0).value.call_one().get(timeout=TIMEOUT) == 0


def test_the_agent_rejects_the_wrong_token(procs2):
    client = AgentClient(procs2._proc.agent_addr, "bad")
    try:
        with pytest.raises(MeshAuthError, match="rejected the mesh token"):
            client.list_workers()
    finally:
        client.close()


def test_the_agent_answers_the_right_token(procs2):
    client = AgentClient(procs2._proc.agent_addr, procs2._proc.token)
    try:
        assert [w["rank"] for w in client.list_workers()] == [0, 1]
    finally:
        client.close()


def test_the_auth_error_advice_names_an_api_that_exists(counter):
    bad = _native.WorkerConn(counter._proc.addrs[0], "wrong-token")
    with pytest.raises(_native.AuthError) as info:
        bad.ping()
    for name in re.findall(r"monarch_kernel\.(\w+)", str(info.value)):
        assert hasattr(monarch_kernel, name), (
            f"the message points to monarch_kernel.{name}, which does not exist"
        )
