"""TLS of the control plane (TLS-1, TLS-2, TLS-3), with real processes: an agent and
its workers given a mesh's TLS identity answer a process that has the mesh's CA, over
TLS, actor calls between the workers included; a process without that CA, or with
another mesh's, gets MeshTLSError naming the address at once; the private key is in no
process's argv or environment and in no file."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from monarch_kernel import Actor, ActorMesh, ProcMesh, Shape, _native, endpoint
from monarch_kernel.control import AgentClient
from monarch_kernel.errors import MeshTLSError, SupervisionError
from monarch_kernel.hosts import AgentConfig, new_tls_identity, start_local_agent
from monarch_kernel.mesh._builtin import call_builtin
from monarch_kernel.mesh._proc_ref import ProcRef

TIMEOUT = 30


class Counter(Actor):
    def __init__(self) -> None:
        self.v = 0

    @endpoint
    def incr(self) -> int:
        self.v += 1
        return self.v


class Sleeper(Actor):
    @endpoint
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Caller(Actor):
    """Calls another actor mesh of the same procs: worker to worker, over TLS."""

    @endpoint
    def incr_on(self, mesh: ActorMesh, rank: int) -> int:
        return mesh.slice(procs=rank).incr.call_one().get(timeout=TIMEOUT)


@contextmanager
def _tls_mesh(nprocs: int) -> Iterator[SimpleNamespace]:
    """A mesh of ``nprocs`` workers whose agent and workers serve TLS, started as a
    controller starts one across hosts (but on 127.0.0.1); this process has its CA."""
    name, token = f"tls-{uuid.uuid4().hex[:6]}", secrets.token_urlsafe(32)
    tls = new_tls_identity()
    agent = start_local_agent(AgentConfig(name, token, idle_timeout=60.0, tls=tls))
    client = AgentClient(agent.addr, token, tls["ca"])
    try:
        epoch = client.attach().epoch
        env = {
            "MONARCH_SHAPE": json.dumps([["procs"], [nprocs]]),
            "MONARCH_SYS_PATH": json.dumps([p for p in sys.path if p and os.path.isdir(p)]),
            "PYTHONUNBUFFERED": "1",
        }
        workers = client.spawn_workers_raw(
            nprocs, sys.executable, ["-m", "monarch_kernel.worker"], env, os.getcwd(), epoch=epoch
        )
        _native.set_mesh_ca(token, tls["ca"])
        ref = ProcRef(name, token, tuple(w.addr for w in workers), agent_addr=agent.addr)
        yield SimpleNamespace(
            name=name,
            token=token,
            tls=tls,
            agent=agent,
            client=client,
            addrs=[w.addr for w in workers],
            pids=[agent.popen.pid, *(w.pid for w in workers)],
            procs=ProcMesh(ref, Shape.of({"procs": nprocs})),
        )
    finally:
        try:
            client.shutdown()
        finally:
            agent.wait(10)
            client.close()
            _native.set_mesh_ca(token, None)


@pytest.fixture(scope="module")
def tls_mesh(state_home: Path) -> Iterator[SimpleNamespace]:
    with _tls_mesh(2) as mesh:
        yield mesh


_CLIENT = textwrap.dedent(
    """
    import json, sys, time
    from monarch_kernel import _native
    from monarch_kernel.control import AgentClient
    args = json.loads(sys.stdin.readline())
    if args["ca"]:
        _native.set_mesh_ca(args["token"], args["ca"])
    out = {}
    for what, call in [
        ("worker", lambda: _native.WorkerConn(args["worker"], args["token"]).ping(timeout=20)),
        ("agent", lambda: AgentClient(args["agent"], args["token"], args["ca"]).ping(timeout=20)),
    ]:
        try:
            call()
            out[what] = ["answered", ""]
        except Exception as e:
            out[what] = [type(e).__name__, str(e)]
    print(json.dumps(out))
    """
)


def _client_in_another_process(token: str, worker: str, agent: str, ca: str | None) -> dict[str, list[str]]:
    """What a process that has CA ``ca`` (None: plaintext) gets when it pings the
    ``worker`` and the ``agent`` of the mesh with ``token``: {"worker"|"agent":
    [outcome, message]}. Its own calls time out after 20 s, so an error class other
    than a timeout's says it did not wait."""
    args = {"token": token, "ca": ca, "worker": worker, "agent": agent}
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT], input=json.dumps(args), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_tls_mesh_answers_a_controller_with_its_ca_over_tls(tls_mesh):
    conns = tls_mesh.procs._proc.conns([0, 1])
    assert all(c.tls for c in conns)
    pings = _native.ping_all(conns, 10.0)
    assert all(isinstance(p, tuple) for p in pings), pings
    replies = _native.wait_all(call_builtin(conns, [0, 1], "stacks"), timeout=TIMEOUT)
    assert [r.kind for r in replies] == [_native.REPLY_RESULT] * 2
    assert tls_mesh.client.tls
    assert [w["rank"] for w in tls_mesh.client.list_workers()] == [0, 1]


def test_actors_of_a_tls_mesh_answer_and_call_each_other_over_tls(tls_mesh):
    counter = tls_mesh.procs.spawn("counter", Counter)
    caller = tls_mesh.procs.spawn("caller", Caller)
    assert counter.incr.call().get(timeout=TIMEOUT).values() == [1, 1]
    # Rank 0's worker calls rank 1's: the workers have the mesh's CA too.
    assert caller.slice(procs=0).incr_on.call_one(counter, 1).get(timeout=TIMEOUT) == 2


def test_a_call_fanned_out_through_a_tls_agent_reaches_its_workers_over_tls(tls_mesh):
    # As a mesh across hosts is called (RELAY-1): one message to the host's agent,
    # which relays it to its workers, all of it over TLS.
    ref = dataclasses.replace(tls_mesh.procs._proc, hosts=((tls_mesh.agent.addr, 0, 2),))
    counter = ProcMesh(ref, Shape.of({"procs": 2})).spawn("fanned", Counter)
    before = _native.calls_sent()
    assert counter.incr.call().get(timeout=TIMEOUT).values() == [1, 1]
    assert _native.calls_sent() == before + 1
    assert _native.WorkerConn.relay(tls_mesh.agent.addr, tls_mesh.token).tls


def test_a_spawn_and_a_stop_go_through_the_agent_and_no_worker_is_connected_to(state_home):
    # SPAWN-1: a spawn and a stop to a mesh across hosts go as calls do (RELAY-1), one
    # message to the host's agent each; LINK-1: the connections to the workers that
    # this process names but never calls directly are never opened.
    with _tls_mesh(2) as m:
        ref = dataclasses.replace(m.procs._proc, hosts=((m.agent.addr, 0, 2),))
        procs = ProcMesh(ref, Shape.of({"procs": 2}))
        before = _native.calls_sent()
        counter = procs.spawn("fanned", Counter)
        assert _native.calls_sent() == before + 1
        assert counter.incr.call().get(timeout=TIMEOUT).values() == [1, 1]
        counter.stop().get(timeout=TIMEOUT)
        assert _native.calls_sent() == before + 3
        with pytest.raises(SupervisionError, match="no actor named 'fanned'"):
            counter.incr.call().get(timeout=TIMEOUT)
        ports = {int(a.rsplit(":", 1)[1]) for a in m.addrs}
        mine = [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port in ports]
        assert mine == [], mine


def test_a_process_without_the_mesh_ca_gets_a_tls_error_naming_the_address(tls_mesh):
    got = _client_in_another_process(tls_mesh.token, tls_mesh.addrs[0], tls_mesh.agent.addr, ca=None)
    for what, addr in [("worker", tls_mesh.addrs[0]), ("agent", tls_mesh.agent.addr)]:
        kind, message = got[what]
        assert kind == "MeshTLSError", got
        assert addr in message and "TLS" in message and "does not have the mesh's CA" in message, message


def test_a_process_with_another_meshs_ca_gets_a_tls_error_naming_the_address(tls_mesh):
    other = new_tls_identity()["ca"]
    got = _client_in_another_process(tls_mesh.token, tls_mesh.addrs[0], tls_mesh.agent.addr, ca=other)
    for what, addr in [("worker", tls_mesh.addrs[0]), ("agent", tls_mesh.agent.addr)]:
        kind, message = got[what]
        assert kind == "MeshTLSError", got
        assert addr in message and "TLS" in message, message


def test_a_process_with_the_mesh_ca_in_another_process_is_answered(tls_mesh):
    ca = tls_mesh.tls["ca"]
    got = _client_in_another_process(tls_mesh.token, tls_mesh.addrs[0], tls_mesh.agent.addr, ca=ca)
    assert got == {"worker": ["answered", ""], "agent": ["answered", ""]}


def test_a_process_with_a_ca_gets_a_tls_error_from_a_plaintext_mesh(procs2):
    ref = procs2._proc
    got = _client_in_another_process(ref.token, ref.addrs[0], ref.agent_addr, ca=new_tls_identity()["ca"])
    for what, addr in [("worker", ref.addrs[0]), ("agent", ref.agent_addr)]:
        kind, message = got[what]
        assert kind == "MeshTLSError", got
        assert addr in message and "only one side of the connection uses TLS" in message, message


def test_an_actor_mesh_reached_without_the_ca_raises_mesh_tls_error(tls_mesh):
    counter = tls_mesh.procs.spawn("counter2", Counter)
    _native.set_mesh_ca(tls_mesh.token, None)
    try:
        with pytest.raises(MeshTLSError, match=r"rank 0 of mesh .*TLS"):
            counter.slice(procs=0).incr.call_one().get(timeout=TIMEOUT)
    finally:
        _native.set_mesh_ca(tls_mesh.token, tls_mesh.tls["ca"])
    assert counter.slice(procs=0).incr.call_one().get(timeout=TIMEOUT) == 1


def test_a_worker_of_a_tls_mesh_that_dies_is_reported_dead_not_as_a_tls_failure(state_home):
    with _tls_mesh(1) as mesh:
        sleeper = mesh.procs.spawn("sleeper", Sleeper)
        pending = sleeper.slice(procs=0).sleep.call_one(60)
        time.sleep(0.5)  # (the call has reached the worker)
        worker_pid = mesh.pids[1]
        os.kill(worker_pid, signal.SIGKILL)
        with pytest.raises(SupervisionError) as info:
            pending.get(timeout=TIMEOUT)
        assert not isinstance(info.value, MeshTLSError)
        # What the agent said of it, asked over TLS with the CA this process has.
        assert info.value.pid == worker_pid and info.value.signal == signal.SIGKILL, info.value


def test_the_private_key_is_in_no_argv_environment_or_file(tls_mesh, state_home):
    body = "".join(ln for ln in tls_mesh.tls["key"].splitlines() if "PRIVATE KEY" not in ln)
    assert len(body) > 40
    for pid in tls_mesh.pids:
        for part in ("cmdline", "environ"):
            text = Path(f"/proc/{pid}/{part}").read_bytes().replace(b"\0", b"")
            assert body.encode() not in text, f"the key is in /proc/{pid}/{part}"
    for f in state_home.rglob("*"):
        if f.is_file():
            assert body.encode() not in f.read_bytes(), f"the key is in {f}"


def test_a_bad_identity_is_refused_where_it_is_given():
    tls = new_tls_identity()
    with pytest.raises(ValueError, match="go together"):
        _native.WorkerServer("tok", tls_cert=tls["cert"])
    with pytest.raises(ValueError, match="does not parse"):
        _native.WorkerServer("tok", tls_cert=tls["cert"], tls_key="not a key")
    with pytest.raises(ValueError, match="CA certificate"):
        _native.set_mesh_ca("tok", "not a certificate")
    assert _native.TLS_DOMAIN == "monarch-mesh.invalid"
