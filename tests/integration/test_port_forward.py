"""``PortForwarder`` (``monarch_kernel.job``, Monarch's): servers on workers reached
from this process through forwards, with real sockets both ways: an HTTP server per
rank at its coordinates, an echo server with payloads larger than the flow-control
window, EOF in each direction, refusals, and stopping the forwarder."""

from __future__ import annotations

import http.server
import os
import socket
import socketserver
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from monarch_kernel import Actor, ActorError, current_rank, endpoint, this_proc
from monarch_kernel.job import PortForwarder

TIMEOUT = 120


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)
        # socketserver then shuts the writing side: the client reads EOF


class _RankPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"rank {self.server.rank}".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Servers(Actor):
    """Servers on its proc, on 127.0.0.1 and free ports; shut down when it stops."""

    def __init__(self) -> None:
        self._servers: list[socketserver.BaseServer] = []

    def _serve(self, server: socketserver.TCPServer) -> int:
        server.daemon_threads = True  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._servers.append(server)
        return server.server_address[1]

    @endpoint
    def http(self) -> int:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RankPage)
        server.rank = current_rank().rank  # type: ignore[attr-defined]
        return self._serve(server)

    @endpoint
    def echo(self) -> int:
        return self._serve(socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo))

    def __cleanup__(self, exc: Exception | None) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def servers(procs2: Any) -> Iterator[Any]:
    actors = procs2.spawn("pf_servers", Servers)
    try:
        yield actors
    finally:
        actors.stop().get(timeout=TIMEOUT)


@pytest.fixture
def forwarder(state_home: Any) -> Iterator[Any]:
    fwd = this_proc().spawn("pf_forwarder", PortForwarder)
    try:
        yield fwd
    finally:
        fwd.stop().get(timeout=TIMEOUT)


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=TIMEOUT)


def _echo_through(address: str, payload: bytes) -> bytes:
    """Sends ``payload``, then EOF, while reading what comes back, to EOF."""
    got = bytearray()
    with _connect(address) as conn:

        def read() -> None:
            while data := conn.recv(65536):
                got.extend(data)

        reader = threading.Thread(target=read)
        reader.start()
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        reader.join(TIMEOUT)
        assert not reader.is_alive(), "the echo did not end with EOF"
    return bytes(got)


def test_each_rank_serves_its_own_http_server_at_the_same_coordinates(procs2, servers, forwarder):
    ports = servers.http.call().get(timeout=TIMEOUT).values()
    addresses = forwarder.forward.call_one(
        procs2, lambda point: ports[point.rank], procs2, "127.0.0.1:0"
    ).get(timeout=TIMEOUT)
    assert len(addresses) == 2
    for rank, address in enumerate(addresses):
        with urllib.request.urlopen(f"http://{address}/", timeout=TIMEOUT) as page:
            assert page.read() == f"rank {rank}".encode()


def test_rank_0_is_reached_from_this_process_both_ways_with_large_payloads(procs2, servers, forwarder):
    port = servers.echo.call().get(timeout=TIMEOUT).values()[0]
    (address,) = forwarder.forward.call_one(procs2.slice(procs=0), port, this_proc(), "127.0.0.1:0").get(
        timeout=TIMEOUT
    )
    payloads = [os.urandom(3 * 1024 * 1024), os.urandom(1536 * 1024)]
    results: list[bytes] = [b""] * len(payloads)

    def one(i: int) -> None:
        results[i] = _echo_through(address, payloads[i])

    clients = [threading.Thread(target=one, args=(i,)) for i in range(len(payloads))]
    for c in clients:
        c.start()
    for c in clients:
        c.join(TIMEOUT)
    assert results == payloads
    assert _echo_through(address, b"") == b""  # EOF alone, answered by EOF


def test_one_proc_meshes_of_different_extents_are_paired(procs2, servers, forwarder):
    port = servers.http.call().get(timeout=TIMEOUT).values()[1]
    one_proc = procs2.slice(procs=slice(1, 2))  # extent {'procs': 1}; this_proc()'s is {}
    (address,) = forwarder.forward.call_one(one_proc, port, this_proc(), "127.0.0.1:0").get(timeout=TIMEOUT)
    with urllib.request.urlopen(f"http://{address}/", timeout=TIMEOUT) as page:
        assert page.read() == b"rank 1"


def test_meshes_of_different_extents_and_bad_ports_are_refused(procs2, forwarder):
    with pytest.raises(ActorError) as info:
        forwarder.forward.call_one(procs2, 8000, this_proc(), "127.0.0.1:0").get(timeout=TIMEOUT)
    assert isinstance(info.value.exception, ValueError)
    assert "extent" in str(info.value.exception)
    with pytest.raises(ActorError) as info:
        forwarder.forward.call_one(procs2.slice(procs=0), 0, this_proc(), "127.0.0.1:0").get(timeout=TIMEOUT)
    assert isinstance(info.value.exception, ValueError)
    with pytest.raises(ActorError) as info:
        forwarder.forward.call_one(procs2.slice(procs=0), 8000, this_proc(), "no-port").get(timeout=TIMEOUT)
    assert isinstance(info.value.exception, ValueError)


def test_a_connection_to_a_port_nobody_listens_on_is_closed(procs2, forwarder):
    with socket.socket() as probe:  # a port that was free, and nobody listens on now
        probe.bind(("127.0.0.1", 0))
        unused = probe.getsockname()[1]
    (address,) = forwarder.forward.call_one(procs2.slice(procs=0), unused, this_proc(), "127.0.0.1:0").get(
        timeout=TIMEOUT
    )
    with _connect(address) as conn:
        try:
            assert conn.recv(1) == b""
        except ConnectionResetError:
            pass  # reset rather than closed: closed either way


def test_stopping_the_forwarder_closes_its_ports_and_its_connections(procs2, servers, state_home):
    port = servers.echo.call().get(timeout=TIMEOUT).values()[0]
    fwd = this_proc().spawn("pf_stopped", PortForwarder)
    try:
        (address,) = fwd.forward.call_one(procs2.slice(procs=0), port, this_proc(), "127.0.0.1:0").get(
            timeout=TIMEOUT
        )
        conn = _connect(address)
        conn.sendall(b"ping")
        assert conn.recv(4) == b"ping"  # connected all the way
    finally:
        fwd.stop().get(timeout=TIMEOUT)
    with conn:
        try:
            assert conn.recv(1) == b""
        except ConnectionResetError:
            pass
    with pytest.raises(ConnectionRefusedError):
        _connect(address).close()
