"""``AgentClient``: the one client of the ``HostAgent`` gRPC service.

grpc is imported on first use, so worker processes that never talk to an agent do
not pay for it at start-up.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from monarch_kernel.errors import (
    MeshAuthError,
    MeshIndexError,
    MeshOwnershipError,
    MeshSpecError,
    MeshTLSError,
    MonarchKernelError,
    SupervisionError,
)

#: Set by the monarch kernel as it starts (``set_kernel_id``): its Jupyter kernel id
#: (OWNER-1).
KERNEL_ID: str | None = None


def set_kernel_id(kernel_id: str | None) -> None:
    """This controller is the Jupyter kernel ``kernel_id`` (None: a script), as the
    agents it attaches to are told (OWNER-1)."""
    global KERNEL_ID
    KERNEL_ID = kernel_id


def owner() -> dict[str, Any]:
    """OWNER-1: how this controller describes itself to the agents it attaches to:
    a Jupyter kernel (its id, and the notebook Jupyter started it for) or a script;
    its pid and host. ``monarch-kernel ls`` and the Meshes panel show it."""
    return {
        "kind": "kernel" if KERNEL_ID else "script",
        "kernel_id": KERNEL_ID,
        "notebook": os.environ.get("JPY_SESSION_NAME") or None,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }


#: The most last lines ``Logs`` can be asked for (``LogsRequest.tail`` is a uint32),
#: and the highest rank it can name (``LogsRequest.rank``, an int32): every number a
#: user gives for them (``procs.logs(tail=)``, ``%mesh logs -n``, the panel's
#: ``?tail=``) is checked against these before it reaches the wire.
MAX_TAIL = 2**32 - 1
MAX_RANK = 2**31 - 1


def check_tail(tail: object, what: str = "logs()") -> int:
    """``tail`` as a number of last lines for ``Logs``, or a ``MeshSpecError`` (a
    ValueError) that says what it must be."""
    if isinstance(tail, bool) or not isinstance(tail, int):
        raise MeshSpecError(f"{what}: tail={tail!r} must be a whole number (the number of last lines)")
    if tail < 0:
        raise MeshSpecError(f"{what}: tail={tail} must be 0 or more (the number of last lines)")
    if tail > MAX_TAIL:
        raise MeshSpecError(
            f"{what}: tail={tail} is more than {MAX_TAIL}, the most the host agents take "
            "(they keep fewer lines than that: any such number gives every line they have)"
        )
    return tail


#: The proto's ``WorkerState`` values (agent.proto; tests/unit/test_generated_stubs.py
#: checks them against the generated module, which this module imports only on use).
WORKER_RUNNING, WORKER_EXITED = 1, 2
_STATES = {WORKER_RUNNING: "running", WORKER_EXITED: "exited"}


def has_exited(w: Any) -> bool:
    """Whether the agent's ``WorkerInfo`` ``w`` is of a worker that exited."""
    return bool(w.state == WORKER_EXITED)


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
        "proc_state": w.proc_state,
        "restarts": w.restarts,
        "exit_cause": w.exit_cause,
    }


class LogText(str):
    """A line of a worker's output, as text, that knows the ``pid`` of the worker that
    wrote it (0: not known): a rank's log runs on across respawns, and a death report
    quotes only its own worker's lines."""

    pid: int = 0

    def __new__(cls, text: str, pid: int = 0) -> LogText:
        self = super().__new__(cls, text)
        self.pid = pid
        return self

    def __reduce__(self) -> Any:
        return LogText, (str(self), self.pid)


def log_texts(lines: list[Any], labelled: bool = False) -> list[str]:
    """The text of the agents' ``LogLine`` messages (``LogText``s); ``labelled``: each
    starts with ``[rank N] `` (the lines of several ranks: the Logs tab, ``%mesh logs``)."""
    return [LogText(f"[rank {ln.rank}] {ln.text}" if labelled else ln.text, ln.pid) for ln in lines]


#: How long the check for a TLS agent behind a refused plaintext connection waits.
_PROBE_TIMEOUT = 2.0
#: What grpc's TLS layer says when a handshake fails (a certificate the CA did not
#: sign, a plaintext peer), in a failed call's details.
_TLS_WORDS = ("ssl", "tls", "handshake", "certificate")


def speaks_tls(addr: str, timeout: float = _PROBE_TIMEOUT) -> bool:
    """Whether a TLS server listens at ``addr``: a handshake that trusts no CA fails on
    the certificate the server presents, and only a TLS server presents one. A
    plaintext client only sees its connection closed by a TLS agent (as by a dead
    one), so this tells the two apart (TLS-2)."""
    import socket
    import ssl

    from monarch_kernel import _native

    host, _, port = addr.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, against no CA at all
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            with ctx.wrap_socket(sock, server_hostname=_native.TLS_DOMAIN):
                return True
    except ssl.SSLCertVerificationError:
        return True
    except (OSError, ValueError):
        return False


#: How many times a request that may be sent again (``resend``: one the agent knows
#: by its id, a record, a reading) is, when its connection broke after it was sent.
RESENDS = 5


def _broke(e: Any) -> bool:
    """Whether a failed RPC's connection broke after it was sent (the agent may have
    got it), rather than never being made."""
    import grpc

    details = (e.details() or "").lower()
    return e.code() == grpc.StatusCode.UNAVAILABLE and any(
        w in details for w in ("goaway", "stream removed", "socket closed", "connection reset")
    )


def _cut_short(e: Any) -> bool:
    """Whether a failed RPC's connection attempt was cut before the connection was up
    (its TCP, TLS or HTTP/2 set-up slower than the attempt's time: gRPC gives a first
    attempt only ``grpc.min_reconnect_backoff_ms``, and a host starting 16 workers
    can take longer), so the request was never sent. Not a refusal: nothing listens
    there, and that fails at once."""
    import grpc

    details = (e.details() or "").lower()
    return e.code() == grpc.StatusCode.UNAVAILABLE and any(
        w in details for w in ("handshaker shutdown", "timed out before receiving settings")
    )


class _Failed:
    """A native stream's failure (WATCH-1) as grpcio's ``RpcError`` shows one, for
    :meth:`AgentClient._error`."""

    def __init__(self, grpc: Any, code: int, details: str) -> None:
        self._code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
        self._details = details

    def code(self) -> Any:
        return self._code

    def details(self) -> str:
        return self._details


class AgentClient:
    """Talks to one host agent. Every call carries the mesh token; with the mesh's CA
    (``ca_pem``), over TLS, checking that the agent presents the mesh's certificate
    (TLS-1)."""

    def __init__(self, addr: str, token: str, ca_pem: str | None = None) -> None:
        import grpc

        from monarch_kernel import _native
        from monarch_kernel.v1 import agent_pb2, agent_pb2_grpc

        self._grpc = grpc
        self._pb = agent_pb2
        self.addr = addr
        self.tls = ca_pem is not None
        #: Set once the agent has answered: a refused connection before that, in
        #: plaintext, may be a TLS agent's (``speaks_tls``).
        self._answered = False
        options: list[tuple[str, Any]] = [
            # The gRPC default never notices a silent peer (docs/architecture.md, "Supervision").
            ("grpc.keepalive_time_ms", 1000),
            ("grpc.keepalive_timeout_ms", 3000),
            # (only while calls are open: the Watch streams are native, WATCH-1, and
            # an idle channel pinged every second cost each agent and this process)
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
            # Attach brings every actor record (constructor arguments included):
            # no cap but memory, as the agent's own side (authenticated peers only).
            ("grpc.max_receive_message_length", -1),
            ("grpc.enable_http_proxy", 0),
            # After a partition the channel tries again within a second, not after
            # gRPC's default backoff (up to 120 s), so the host is usable once it answers.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 1000),
            # (also gRPC's minimum connect timeout; 5 s made a kernel's first cell,
            # which asks every recorded mesh's agents, wait minutes on unreachable
            # ones: docs/decisions.md)
            ("grpc.min_reconnect_backoff_ms", 200),
            # gRPC shares a connection, and its failure, among all channels to one
            # address: a new agent on the port of one that died (ports are reused)
            # would be refused for the old one's backoff. This client's are its own.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if ca_pem is None:
            self._channel = grpc.insecure_channel(addr, options=options)
        else:
            creds = grpc.ssl_channel_credentials(root_certificates=ca_pem.encode())
            # Every server of a mesh presents one certificate, for this name, wherever it runs.
            options.append(("grpc.ssl_target_name_override", _native.TLS_DOMAIN))
            self._channel = grpc.secure_channel(addr, creds, options=options)
        self._stub = agent_pb2_grpc.HostAgentStub(self._channel)
        self._md = (("authorization", f"Bearer {token}"),)
        self._token = token
        self._ca_pem = ca_pem
        self._native_conn: Any = None

    def _call(
        self, name: str, request: Any, timeout: float, wait_for_ready: bool = False, resend: bool = False
    ) -> Any:
        """``wait_for_ready``: a channel between connections (a partition that just
        healed) is waited for, up to ``timeout``, instead of failing the call at once.
        ``resend``: the request means the same sent twice (the agent knows it by its id,
        or it records or reads): a connection that breaks after it was sent (a starved
        or partitioned link: the agent's keepalive gives up on this process), or whose
        set-up was cut short before it was sent (a loaded host), is opened again and
        the request sent again, up to ``RESENDS`` times within ``timeout``; later
        attempts wait for the connection (each set-up gets up to a second, gRPC's
        backoff). A refused connection still fails at once."""
        deadline, attempt = time.monotonic() + timeout, 0
        while True:
            try:
                reply = getattr(self._stub, name)(
                    request,
                    metadata=self._md,
                    timeout=max(1.0, deadline - time.monotonic()) if attempt else timeout,
                    wait_for_ready=wait_for_ready or attempt > 0 or None,
                )
            except self._grpc.RpcError as e:
                again = _broke(e) or _cut_short(e)
                if resend and attempt < RESENDS and again and time.monotonic() < deadline:
                    attempt += 1
                    continue
                raise self._error(e, name) from None
            self._answered = True
            return reply

    def _tls_failure(self, code: Any, details: str) -> str | None:
        """Why TLS with the agent failed, if that is why the call did (TLS-2)."""
        if code != self._grpc.StatusCode.UNAVAILABLE:
            return None
        if self.tls:
            return details if any(w in details.lower() for w in _TLS_WORDS) else None
        if not self._answered and speaks_tls(self.addr):
            return "the agent speaks TLS, and this process does not have the mesh's CA (it talks plaintext)"
        return None

    def _error(self, e: Any, name: str) -> MonarchKernelError:
        code = e.code()
        tls = self._tls_failure(code, e.details() or "")
        if tls is not None:
            return MeshTLSError(
                f"TLS with the host agent at {self.addr} failed ({name}): {tls}. Across hosts, every "
                "server of a mesh presents the mesh's certificate and this process checks it against "
                f"the mesh's CA: either {self.addr} is not an agent of this mesh, or only one side "
                "of the connection uses TLS"
            )
        if code == self._grpc.StatusCode.UNAUTHENTICATED:
            return MeshAuthError(f"the host agent at {self.addr} rejected the mesh token ({name})")
        if code == self._grpc.StatusCode.FAILED_PRECONDITION and "epoch" in (e.details() or ""):
            return MeshOwnershipError(f"{e.details()}; attach again to take the mesh back")
        if code == self._grpc.StatusCode.FAILED_PRECONDITION:
            return SupervisionError(f"the host agent at {self.addr} refused {name}: {e.details()}")
        return SupervisionError(
            f"the host agent at {self.addr} did not answer {name}: {code.name}: {e.details()}"
        )

    def ping(self, timeout: float = 5.0) -> dict[str, Any]:
        """The agent's pid, mesh name and epoch; ``watchers``: attached controllers;
        ``idle_left``: seconds until the idle timeout stops the mesh (None while a
        controller is attached); ``owner``: the last controller's own description
        (OWNER-1), None if none attached yet."""
        r = self._call("Ping", self._pb.AgentPingRequest(), timeout)
        try:
            owner = json.loads(r.owner) if r.owner else None
        except ValueError:
            owner = None
        return {
            "pid": r.pid,
            "name": r.name,
            "epoch": r.epoch,
            "watchers": r.watchers,
            "idle_left": r.idle_left_ms / 1000 if r.idle_left_ms else None,
            "owner": owner if isinstance(owner, dict) else None,
        }

    def attach(self, at_least: int = 0, timeout: float = 10.0) -> Any:
        """Becomes the mesh's controller (bumps the epoch, to ``at_least`` at least),
        saying who it is (OWNER-1); the raw AttachReply."""
        req = self._pb.AttachRequest(at_least=at_least, owner=json.dumps(owner()))
        return self._call("Attach", req, timeout)

    def record_actor(
        self, name: str, payload: bytes, buffers: list[Any], shape: bytes, epoch: int, timeout: float = 10.0
    ) -> None:
        req = self._pb.ActorRecord(
            name=name, payload=payload, buffers=[bytes(b) for b in buffers], shape=shape, epoch=epoch
        )
        self._call("RecordActor", req, timeout, wait_for_ready=True, resend=True)

    def forget_actor(self, name: str, epoch: int, timeout: float = 10.0) -> None:
        req = self._pb.ForgetActorRequest(name=name, epoch=epoch)
        self._call("ForgetActor", req, timeout, wait_for_ready=True, resend=True)

    def respawn_workers(self, ranks: list[int], epoch: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        req = self._pb.RespawnWorkersRequest(ranks=ranks, epoch=epoch)
        return [worker_dict(w) for w in self._call("RespawnWorkers", req, timeout).workers]

    def spawn_workers_raw(
        self,
        count: int,
        executable: str,
        args: list[str],
        env: dict[str, str],
        cwd: str,
        epoch: int = 0,
        timeout: float = 60.0,
        first_rank: int = 0,
    ) -> list[Any]:
        """Starts ``count`` workers, ranked from ``first_rank``; the agent's
        WorkerInfo messages of them. A connection that breaks while the agent starts
        them (a starved or partitioned link: the agent's keepalive gives up on this
        process) is opened again and the request sent again with its id: the agent
        starts nothing more and answers with the workers the first copy started."""
        import uuid

        req = self._pb.SpawnWorkersRequest(
            count=count,
            executable=executable,
            args=args,
            env=env,
            cwd=cwd,
            epoch=epoch,
            first_rank=first_rank,
            request_id=uuid.uuid4().hex,
        )
        return list(self._call("SpawnWorkers", req, timeout, resend=True).workers)

    def list_workers(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        return [worker_dict(w) for w in self.list_workers_raw(timeout)]

    def native(self) -> Any:
        """WATCH-1: this client's native connection to the agent (``_native.AgentConn``),
        for its Watch streams and the heartbeat's PingWorkers; made on first use."""
        conn = self._native_conn
        if conn is None:
            from monarch_kernel import _native

            with _clients_lock:
                if self._native_conn is None:
                    self._native_conn = _native.AgentConn(self.addr, self._token, self._ca_pem)
                conn = self._native_conn
        return conn

    def failure(self, status: tuple[int, str], name: str) -> MonarchKernelError:
        """A native RPC's failure (``(grpc status code, text)``, WATCH-1) as the error
        a grpcio one of the same RPC gives."""
        return self._error(_Failed(self._grpc, *status), name)

    def list_workers_raw(self, timeout: float = 5.0) -> list[Any]:
        """:meth:`list_workers`, as the agent's WorkerInfo messages."""
        return list(self._call("ListWorkers", self._pb.ListWorkersRequest(), timeout, resend=True).workers)

    def worker(self, rank: int) -> dict[str, Any] | None:
        return next((w for w in self.list_workers() if w["rank"] == rank), None)

    def log_lines(self, rank: int | None = None, tail: int = 100, timeout: float = 5.0) -> list[Any]:
        """The last ``tail`` ``LogLine`` messages of ``rank`` (or of each rank), in the
        order the agent read them."""
        if rank is not None and not 0 <= rank <= MAX_RANK:
            raise MeshIndexError(f"logs(): rank {rank} is out of range (0 to {MAX_RANK})")
        req = self._pb.LogsRequest(rank=-1 if rank is None else rank, tail=check_tail(tail))
        return list(self._call("Logs", req, timeout, resend=True).lines)

    def logs(
        self, rank: int | None = None, tail: int = 100, timeout: float = 5.0, labelled: bool = False
    ) -> list[str]:
        """The last ``tail`` lines of ``rank`` (or of each rank); see ``log_texts``."""
        return log_texts(self.log_lines(rank, tail, timeout), labelled)

    def shutdown(self, epoch: int = 0, timeout: float = 15.0) -> None:
        """Stops the workers and the agent (epoch 0: as an administrator, never fenced)."""
        self._call("Shutdown", self._pb.ShutdownRequest(epoch=epoch), timeout)

    def watch(self) -> Any:
        """A stream of agent events as they happen (iterate it; ``.cancel()`` ends it).
        Holding it open is the controller's lease on the mesh."""
        return self._stub.Watch(self._pb.WatchRequest(), metadata=self._md)

    def watch_in_thread(
        self, on_event: Callable[[Any], None], on_end: Callable[[BaseException | None], None]
    ) -> Callable[[], None]:
        """A Watch stream handled on a daemon thread: ``on_event`` per event, then
        ``on_end`` once when the stream ends (None: cancelled by us, or closed by the
        agent). Returns the function that cancels it.

        WATCH-1: the stream is the native runtime's (:meth:`native`), not grpcio's: the
        thread sleeps until an event comes, where grpcio's woke ten times a second and
        kept a polling thread per channel. (:meth:`watch`, an iterator for a thread
        that must stay interruptible, is grpcio's.)"""
        watch = self.native().watch()
        pb = self._pb

        def run() -> None:
            while True:
                item = watch.next()
                if isinstance(item, bytes):
                    self._answered = True
                    try:
                        on_event(pb.AgentEvent.FromString(item))
                    except Exception:  # a handler's bug must not end the lease
                        traceback.print_exc()
                    continue
                on_end(None if item is None else self.failure(item, "Watch"))
                return

        threading.Thread(target=run, name=f"monarch-watch-{self.addr}", daemon=True).start()
        return watch.cancel

    def close(self) -> None:
        self._channel.close()
        self._native_conn = None  # (its connection closes with its last stream)


_clients: dict[tuple[str, str, str | None], AgentClient] = {}
_clients_lock = threading.Lock()


def agent_client(addr: str, token: str) -> AgentClient:
    """This process's client of the agent at ``addr`` (shared): TLS when this process
    has the mesh's CA (``_native.set_mesh_ca``), as its worker connections (TLS-2)."""
    from monarch_kernel import _native

    ca_pem = _native.mesh_ca(token)
    with _clients_lock:
        c = _clients.get((addr, token, ca_pem))
        if c is None:
            c = _clients[(addr, token, ca_pem)] = AgentClient(addr, token, ca_pem)
        return c
