"""``AgentClient``'s connections: a client is never refused for an earlier agent's
failure at the same address (ports are reused: a new mesh's agent can get the port
of one that died a moment before, as happened in CI)."""

from __future__ import annotations

import contextlib
import socket
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


def _slow_front(to_port: int, delay: float) -> tuple[int, threading.Event]:
    """A TCP front for 127.0.0.1:``to_port`` that holds each connection ``delay``
    seconds before passing its bytes (a host too loaded to finish a handshake at
    once); its port, and the event that stops it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def hold(conn: socket.socket) -> None:
        time.sleep(delay)
        back = socket.create_connection(("127.0.0.1", to_port))
        threading.Thread(target=pipe, args=(conn, back), daemon=True).start()
        pipe(back, conn)

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = listener.accept()
                threading.Thread(target=hold, args=(conn,), daemon=True).start()
        listener.close()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1], stop


def test_a_connection_slow_to_set_up_is_waited_for():
    # gRPC gives a connection attempt "grpc.min_reconnect_backoff_ms" to finish; at
    # 200 ms a loaded host's agent (1,024 procs starting) failed SpawnWorkers with
    # "tcp handshaker shutdown".
    server, port = _serve(0, pid=3)
    front, stop = _slow_front(port, delay=2.0)
    try:
        assert _ping(AgentClient(f"127.0.0.1:{front}", "token")) == 3
    finally:
        stop.set()
        server.stop(0).wait()
