"""``AgentClient``'s connections: a client is never refused for an earlier agent's
failure at the same address (ports are reused: a new mesh's agent can get the port
of one that died a moment before, as happened in CI)."""

from __future__ import annotations

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
