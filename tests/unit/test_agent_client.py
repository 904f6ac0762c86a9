"""``AgentClient``'s connections: a client is never refused for an earlier agent's
failure at the same address (ports are reused: a new mesh's agent can get the port
of one that died a moment before, as happened in CI)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from concurrent import futures

import grpc
import pytest

from monarch_kernel.control import AgentClient
from monarch_kernel.errors import SupervisionError
from monarch_kernel.v1 import agent_pb2, agent_pb2_grpc


class _Answers(agent_pb2_grpc.HostAgentServicer):
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def Ping(self, request, context):  # noqa: N802 (the service's name)
        return agent_pb2.AgentPingReply(pid=self.pid)


def _serve(port: int, pid: int) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    agent_pb2_grpc.add_HostAgentServicer_to_server(_Answers(pid), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


def _ping(client: AgentClient) -> int:
    return int(client._call("Ping", agent_pb2.AgentPingRequest(), 5.0).pid)


def test_a_new_client_is_not_refused_for_a_dead_server_that_had_its_port():
    first, port = _serve(0, pid=1)
    addr = f"127.0.0.1:{port}"
    old = AgentClient(addr, "token")
    assert _ping(old) == 1
    first.stop(0).wait()
    with pytest.raises(SupervisionError, match="did not answer Ping"):
        _ping(old)  # the old client's connection fails and backs off
    second, again = _serve(port, pid=2)  # the next server gets the same port
    try:
        assert again == port
        # gRPC's shared connection pool would hand this client the old one's
        # connection, refused until its backoff ends.
        assert _ping(AgentClient(addr, "token")) == 2
    finally:
        second.stop(0).wait()


class _Front:
    """A TCP front for 127.0.0.1:``to_port`` that can cut the connections it passes
    (a link that breaks)."""

    def __init__(self, to_port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.live: list[socket.socket] = []
        self.to_port = to_port
        threading.Thread(target=self._accept, daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def _hold(self, conn: socket.socket) -> None:
        back = socket.create_connection(("127.0.0.1", self.to_port))
        self.live += [conn, back]
        threading.Thread(target=self._pipe, args=(conn, back), daemon=True).start()
        self._pipe(back, conn)

    def _accept(self) -> None:
        while not self.stopped.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = self.listener.accept()
                threading.Thread(target=self._hold, args=(conn,), daemon=True).start()
        self.listener.close()

    def cut(self) -> None:
        """Resets every connection passed so far."""
        for s in self.live:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
        self.live.clear()


class _Records(agent_pb2_grpc.HostAgentServicer):
    """Records actors; the first time, the link breaks once the request is in."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.front: _Front | None = None

    def RecordActor(self, request, context):  # noqa: N802 (the service's name)
        self.names.append(request.name)
        if len(self.names) == 1 and self.front is not None:
            self.front.cut()
            time.sleep(0.5)
        return agent_pb2.RecordActorReply()


def test_a_record_whose_connection_broke_after_it_was_sent_is_sent_again():
    # At 1,024 procs the agents' keepalive gave up on a starved controller while it
    # recorded an actor: "did not answer RecordActor: UNAVAILABLE: Stream removed
    # (sendmsg: Broken pipe)", and the record (what a later attach re-creates) was lost.
    records = _Records()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    agent_pb2_grpc.add_HostAgentServicer_to_server(records, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    records.front = front = _Front(port)
    try:
        AgentClient(f"127.0.0.1:{front.port}", "token").record_actor("echo", b"x", [], b"", 1, timeout=20)
        assert records.names == ["echo", "echo"]
    finally:
        front.stopped.set()
        server.stop(0).wait()


class _SlowFront(_Front):
    """A front whose every connection takes ``delay`` s to set up (a loaded host)."""

    def __init__(self, to_port: int, delay: float) -> None:
        self.delay = delay
        super().__init__(to_port)

    def _hold(self, conn: socket.socket) -> None:
        time.sleep(self.delay)
        super()._hold(conn)


def test_a_request_whose_connection_is_slow_to_set_up_is_sent_once_it_is_up():
    # bench.scale, 1,024 procs starting: "TLS with the host agent ... failed
    # (SpawnWorkers): failed to connect to all addresses; ... handshaker shutdown".
    # gRPC gives a first connection attempt 200 ms (grpc.min_reconnect_backoff_ms).
    server, port = _serve(0, pid=7)
    front = _SlowFront(port, delay=0.6)
    try:
        client = AgentClient(f"127.0.0.1:{front.port}", "token")
        with pytest.raises(SupervisionError, match="timed out before receiving SETTINGS"):
            _ping(client)  # a request that is not sent again fails, as before
        reply = client._call("Ping", agent_pb2.AgentPingRequest(), 30.0, resend=True)
        assert reply.pid == 7
    finally:
        front.stopped.set()
        server.stop(0).wait()
