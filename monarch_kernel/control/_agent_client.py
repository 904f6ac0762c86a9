"""``AgentClient``: the one client of the ``HostAgent`` gRPC service.

grpc is imported on first use, so worker processes that never talk to an agent do
not pay for it at start-up.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from monarch_kernel.errors import MeshAuthError, MonarchKernelError, SupervisionError

_STATES = {1: "running", 2: "exited"}


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def worker_dict(w: Any) -> dict[str, Any]:
    return {
        "rank": w.rank,
        "pid": w.pid,
        "addr": w.addr,
        "host": w.host,
        "state": _STATES.get(w.state, "unknown"),
        "exit_code": w.exit_code,
        "signal": w.signal,
        "signal_name": _signal_name(w.signal) if w.signal else None,
    }


class AgentClient:
    """Talks to one host agent. Every call carries the mesh token."""

    def __init__(self, addr: str, token: str) -> None:
        import grpc

        from monarch_kernel.v1 import agent_pb2, agent_pb2_grpc

        self._grpc = grpc
        self._pb = agent_pb2
        self.addr = addr
        self._channel = grpc.insecure_channel(
            addr,
            options=[
                # The gRPC default never notices a silent peer (DESIGN.md section 4).
                ("grpc.keepalive_time_ms", 1000),
                ("grpc.keepalive_timeout_ms", 3000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.enable_http_proxy", 0),
            ],
        )
        self._stub = agent_pb2_grpc.HostAgentStub(self._channel)
        self._md = (("authorization", f"Bearer {token}"),)

    def _call(self, name: str, request: Any, timeout: float) -> Any:
        try:
            return getattr(self._stub, name)(request, metadata=self._md, timeout=timeout)
        except self._grpc.RpcError as e:
            raise self._error(e, name) from None

    def _error(self, e: Any, name: str) -> MonarchKernelError:
        code = e.code()
        if code == self._grpc.StatusCode.UNAUTHENTICATED:
            return MeshAuthError(f"the host agent at {self.addr} rejected the mesh token ({name})")
        return SupervisionError(
            f"the host agent at {self.addr} did not answer {name}: {code.name}: {e.details()}"
        )

    def ping(self, timeout: float = 5.0) -> dict[str, Any]:
        r = self._call("Ping", self._pb.AgentPingRequest(), timeout)
        return {"pid": r.pid, "name": r.name}

    def spawn_workers(
        self,
        count: int,
        executable: str,
        args: list[str],
        env: dict[str, str],
        cwd: str,
        timeout: float = 60.0,
    ) -> list[dict[str, Any]]:
        req = self._pb.SpawnWorkersRequest(count=count, executable=executable, args=args, env=env, cwd=cwd)
        return [worker_dict(w) for w in self._call("SpawnWorkers", req, timeout).workers]

    def list_workers(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        return [
            worker_dict(w) for w in self._call("ListWorkers", self._pb.ListWorkersRequest(), timeout).workers
        ]

    def worker(self, rank: int) -> dict[str, Any] | None:
        return next((w for w in self.list_workers() if w["rank"] == rank), None)

    def logs(self, rank: int | None = None, tail: int = 100, timeout: float = 5.0) -> list[str]:
        req = self._pb.LogsRequest(rank=-1 if rank is None else rank, tail=tail)
        return [ln.text for ln in self._call("Logs", req, timeout).lines]

    def shutdown(self, timeout: float = 15.0) -> None:
        self._call("Shutdown", self._pb.ShutdownRequest(), timeout)

    def watch(self) -> Iterator[Any]:
        """Agent events as they happen; holding this stream open is the controller's lease."""
        try:
            yield from self._stub.Watch(self._pb.WatchRequest(), metadata=self._md)
        except self._grpc.RpcError as e:
            if e.code() != self._grpc.StatusCode.CANCELLED:
                raise self._error(e, "Watch") from None

    def watch_in_thread(
        self, on_event: Callable[[Any], None], on_end: Callable[[BaseException | None], None]
    ) -> None:
        """Runs :meth:`watch` on a daemon thread, calling ``on_event`` per event."""

        def run() -> None:
            try:
                for ev in self.watch():
                    on_event(ev)
            except BaseException as e:  # reported to the owner, never raised on a bare thread
                on_end(e)
                return
            on_end(None)

        threading.Thread(target=run, name=f"monarch-watch-{self.addr}", daemon=True).start()

    def close(self) -> None:
        self._channel.close()


_clients: dict[tuple[str, str], AgentClient] = {}
_clients_lock = threading.Lock()


def agent_client(addr: str, token: str) -> AgentClient:
    """This process's client of the agent at ``addr`` (shared)."""
    with _clients_lock:
        c = _clients.get((addr, token))
        if c is None:
            c = _clients[(addr, token)] = AgentClient(addr, token)
        return c
