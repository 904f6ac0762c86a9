"""``Session``: this controller's hold on one mesh.

A session is made by creating a mesh or attaching to one. It holds the mesh's agent
client and epoch (fencing: the controller that attached last owns the mesh), the
lease (an open ``Watch`` stream, which also brings worker exits and output), the
heartbeats that tell a hung worker from a dead one, and the failure hooks.

SUPERVISE-1: a worker's exit is known here as soon as the agent reports it, whether a
call is pending or not: its rank is marked dead (later calls needing it fail fast,
other ranks go on), ``on_failure`` callbacks and actors' ``__supervise__`` hooks run,
and with neither a line goes to stderr.
SUPERVISE-2: a worker that misses ``MISSES`` heartbeats in a row is *unresponsive*
(alive but not answering: SIGSTOP, a hung native call), reported once, distinct from
dead; it is alive again when it answers.
SUPERVISE-3: when the agent itself goes, its workers exit (AGENT-1) and the mesh is
*lost*: every later call fails with a SupervisionError that says so.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from monarch_kernel import _native
from monarch_kernel.control import AgentClient
from monarch_kernel.errors import (
    MeshIndexError,
    MeshNotFoundError,
    MeshOwnershipError,
    MeshSpecError,
    MonarchKernelError,
    SupervisionError,
)
from monarch_kernel.hosts import AgentProcess, start_local_agent
from monarch_kernel.mesh import _registry
from monarch_kernel.mesh._placement import placement_env
from monarch_kernel.mesh._proc_ref import MeshState, ProcRef, death_error, describe
from monarch_kernel.mesh._registry import MeshRecord
from monarch_kernel.mesh._shape import Extent
from monarch_kernel.worker._dispatcher import BUILTIN, FLUSH_MARK

#: Default idle timeout of a named mesh: how long it waits for a controller.
DEFAULT_IDLE_TIMEOUT = 24 * 3600.0
#: Heartbeat period and the misses that make a worker unresponsive (SUPERVISE-2).
HEARTBEAT_S = 1.0
MISSES = 3


@dataclass
class MeshFailure:
    """What went wrong with a mesh, as given to ``on_failure`` callbacks and actors'
    ``__supervise__``. ``kind`` is "dead" (a worker exited), "unresponsive" (alive but
    not answering heartbeats), "recovered" (answering again), "lost" (the host agent
    is gone, so is every worker) or "fenced" (another controller attached)."""

    mesh: str
    kind: str
    message: str
    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    log_tail: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message

    @classmethod
    def of(cls, err: SupervisionError, kind: str) -> MeshFailure:
        return cls(
            mesh=err.mesh or "",
            kind=kind,
            message=str(err),
            rank=err.rank,
            pid=err.pid,
            host=err.host,
            exit_code=err.exit_code,
            signal=err.signal,
            log_tail=list(err.log_tail),
        )


def _forward_output() -> bool:
    return os.environ.get("MONARCH_FORWARD_OUTPUT", "1") != "0"


#: Where worker output goes instead of this process's stdout/stderr: the Jupyter
#: kernel routes it to the cell each line's origin names. Called on a watch thread
#: with (session, LogLine).
output_sink: Callable[[Session, Any], None] | None = None
#: Where failures that no ``on_failure`` callback or ``__supervise__`` hook handled
#: go instead of a line on stderr (the kernel shows them in the notebook).
failure_sink: Callable[[MeshFailure], None] | None = None
#: Where monarch's own notices about a mesh's output go (the kernel: the running cell).
notice_sink: Callable[[str], None] | None = None


class Session:
    """This process's hold on mesh ``rec.name`` (see the module docstring)."""

    def __init__(
        self,
        rec: MeshRecord,
        client: AgentClient,
        epoch: int,
        workers: list[Any],
        actors: list[Any],
        agent: AgentProcess | None,
    ) -> None:
        self.rec = rec
        self.name = rec.name
        self.token = rec.token
        self.client = client
        self.agent = agent
        self.epoch = epoch
        self.sizes: dict[str, int] = dict(rec.spec["per_host"])
        workers = sorted(workers, key=lambda w: w.rank)
        self.ref = ProcRef(
            rec.name,
            rec.token,
            tuple(w.addr for w in workers),
            rec.agent_addr,
            Extent(list(self.sizes), list(self.sizes.values())),
        )
        self.state: MeshState = self.ref.state()
        self.state.ref = self.ref
        self.state.stopped = False
        self.state.fenced = False
        self.state.lost = None
        self.state.dead.clear()
        self.state.changed()
        #: Actor meshes by name: (payload, buffers, pickled shape) as recorded by the agent.
        #: Whether each actor mesh's class defines __supervise__ (where known).
        self._supervised: dict[str, bool] = {}
        self.records: dict[str, tuple[bytes, list[bytes], bytes]] = {
            a.name: (a.payload, list(a.buffers), a.shape) for a in actors
        }
        self.callbacks: list[Callable[[MeshFailure], Any]] = []
        self.closed = False
        self.stopping = False
        self.lock = threading.Lock()
        self._dead_lock = threading.Lock()
        self.fenced = False
        from monarch_kernel.mesh._transfer_buffer import know_token

        know_token(rec.token)  # TransferBuffers from this mesh can be read here
        _native.set_epoch(rec.token, self.epoch)
        # The lease and the event stream first; then what happened before it opened
        # (the agent does not replay events): exits are marked from the agent's list.
        self._cancel_watch = client.watch_in_thread(self._on_event, self._on_end)
        try:
            workers = client.list_workers_raw()
        except MonarchKernelError:
            pass  # the watch reports what happens next
        for w in workers:
            if w.state == 2 and w.rank not in self.state.dead:  # exited before we watched
                self._worker_died(w, notify=False)
        # Raise every worker's epoch now, so an older controller is fenced at once.
        live = [r for r in range(len(self.ref.addrs)) if r not in self.state.dead]
        _native.ping_all([_native.WorkerConn(self.ref.addrs[r], self.token) for r in live], 2.0)
        self._heartbeat = threading.Thread(
            target=self._beat, name=f"monarch-heartbeat-{self.name}", daemon=True
        )
        self._heartbeat.start()

    # -- events (watch thread) -----------------------------------------------------------

    def _on_event(self, ev: Any) -> None:
        if ev.HasField("worker_exited"):
            self._worker_died(ev.worker_exited, notify=True)
        elif ev.HasField("dropped") and not self.closed:  # this watcher fell behind the workers
            text = (
                f"monarch: mesh {self.name!r}: {ev.dropped} lines of worker output were not shown "
                "here (they came faster than the notebook took them); procs.logs() or %mesh logs "
                "has every line.\n"
            )
            if notice_sink is not None:
                notice_sink(text)
            else:
                sys.stderr.write(text)
        elif ev.HasField("log") and not self.closed:
            line = ev.log
            if output_sink is not None:
                output_sink(self, line)
                return
            if not _forward_output() or line.text == FLUSH_MARK:
                return
            out = sys.stderr if line.stream == "stderr" else sys.stdout
            out.write(f"[{self.name} {line.rank}] {line.text}\n")  # one write: lines stay whole
            out.flush()

    def _on_end(self, err: BaseException | None) -> None:
        if self.closed or self.stopping or err is None:
            return
        if _agent_alive(self.rec):  # a hiccup, not a death: watch again
            time.sleep(0.2)
            if not self.closed:
                self._cancel_watch = self.client.watch_in_thread(self._on_event, self._on_end)
            return
        lost = SupervisionError(
            f"mesh {self.name!r} is lost: its host agent ({self.rec.agent_addr}, pid {self.rec.agent_pid}) "
            f"went away ({err}), and its workers exit with it. Start it again with "
            f"this_host().spawn_procs(..., name={self.name!r}).",
            mesh=self.name,
        )
        self.state.lost = lost
        self.state.changed()
        _registry.remove_if_ours(self.name, self.token)
        self._notify(MeshFailure.of(lost, "lost"))

    def _worker_died(self, w: Any, notify: bool) -> None:
        from monarch_kernel.control._agent_client import worker_dict

        info = worker_dict(w)
        try:
            info["log_tail"] = list(self.client.logs(rank=info["rank"], tail=10))
        except MonarchKernelError:
            info["log_tail"] = []
        err = death_error(self.name, info["rank"], info, None)
        with self._dead_lock:  # the watch and the heartbeat may both see it
            known = self.state.dead.get(info["rank"])
            if known is not None and known.pid == info["pid"]:
                return
            self.state.dead[info["rank"]] = err
            self.state.unresponsive.discard(info["rank"])
            self.state.changed()
        if notify and not (self.closed or self.stopping):
            self._notify(MeshFailure.of(err, "dead"))

    def _notify(self, failure: MeshFailure) -> None:
        handled = False
        for cb in list(self.callbacks):
            handled = True
            try:
                cb(failure)
            except Exception as e:
                print(f"monarch: on_failure callback {cb!r} raised {type(e).__name__}: {e}", file=sys.stderr)
        if failure.kind in ("dead", "unresponsive"):
            handled = self._supervise(failure) or handled
        if not handled and failure_sink is not None:
            failure_sink(failure)
        elif not handled:
            hint = {
                "dead": "calls that need it fail; procs.respawn() restarts it",
                "unresponsive": "calls to it wait; it is alive but does not answer",
                "recovered": "it answers again",
                "lost": "",
                "fenced": "",
            }[failure.kind]
            first = failure.message.splitlines()[0]
            print(f"monarch: {first}{f' ({hint})' if hint else ''}", file=sys.stderr, flush=True)

    def _supervise(self, failure: MeshFailure) -> bool:
        """Sends ``__supervise__(failure)`` to the live actors of every actor mesh
        that spans the failed rank and whose class defines it; True if any did."""
        from monarch_kernel.mesh._serial import dumps, loads

        any_hook = False
        for name, (payload, buffers, shape_blob) in list(self.records.items()):
            supervised = self._supervised.get(name)
            try:
                if supervised is None:  # a record from another controller: look once
                    supervised = self._supervised[name] = hasattr(loads(payload, buffers)[0], "__supervise__")
                if not supervised:
                    continue
                shape = loads(shape_blob)
            except Exception:
                continue
            if failure.rank not in shape.ranks:
                continue
            local = [i for i, r in enumerate(shape.ranks) if r not in self.state.dead and r != failure.rank]
            if not local:
                continue
            conns = [_native.WorkerConn(self.state.ref.addrs[shape.ranks[i]], self.token) for i in local]
            data, raws = dumps(((failure,), {}), "supervision event")
            _native.call(
                conns,
                local,
                list(shape.labels),
                list(shape.extent.sizes),
                name,
                "__supervise__",
                data,
                raws,
                True,
            )
            any_hook = True
        return any_hook

    # -- heartbeats (SUPERVISE-2) --------------------------------------------------------

    def _beat(self) -> None:
        misses: dict[int, int] = {}
        while not self.closed and self.state.lost is None:
            started = time.monotonic()
            ranks = [r for r in range(len(self.state.ref.addrs)) if r not in self.state.dead]
            try:
                conns = [_native.WorkerConn(self.state.ref.addrs[r], self.token) for r in ranks]
                results = _native.ping_all(conns, HEARTBEAT_S)
            except Exception:
                results = [None] * len(ranks)
            for r, res in zip(ranks, results):
                if self.closed or r in self.state.dead:
                    continue
                if isinstance(res, tuple):
                    misses[r] = 0
                    if res[1] > self.epoch and not self.fenced:
                        self._fence(res[1])
                    if r in self.state.unresponsive:
                        self.state.unresponsive.discard(r)
                        self._notify(
                            MeshFailure(
                                self.name, "recovered", f"rank {r} of mesh {self.name!r} answers again", r
                            )
                        )
                    continue
                if isinstance(res, BaseException) and self._exited(r):
                    continue  # an exit the event stream missed (SUPERVISE-1)
                misses[r] = misses.get(r, 0) + 1
                if misses[r] == MISSES and r not in self.state.unresponsive:
                    self.state.unresponsive.add(r)
                    self._notify(MeshFailure.of(self._unresponsive_error(r), "unresponsive"))
            time.sleep(max(0.0, HEARTBEAT_S - (time.monotonic() - started)))

    def _exited(self, rank: int) -> bool:
        """Asks the agent whether ``rank`` exited; if so, handles it as a death. For
        exits the watch stream did not deliver (it drops events when a reader lags)."""
        try:
            w = next((w for w in self.client.list_workers_raw() if w.rank == rank), None)
        except MonarchKernelError:
            return False
        if w is None or w.state != 2 or rank in self.state.dead:
            return False
        self._worker_died(w, notify=True)
        return True

    def _fence(self, epoch: int) -> None:
        """Another controller attached (epoch ``epoch``): stop listening to the mesh,
        say so once."""
        self.fenced = self.state.fenced = True
        self._notify(
            MeshFailure(
                self.name,
                "fenced",
                f"mesh {self.name!r}: another controller attached (epoch {epoch}; this one has {self.epoch}); "
                f"commands from here now raise MeshOwnershipError. attach({self.name!r}) takes it back.",
            )
        )
        self.detach()

    def _unresponsive_error(self, rank: int) -> SupervisionError:
        info: dict[str, Any] | None
        try:
            info = self.client.worker(rank)
        except MonarchKernelError:
            info = None
        how = describe(info, f"no heartbeat for {MISSES} s") if info else f"missed {MISSES} heartbeats"
        where = f" (pid {info['pid']} on {info['host']})" if info else ""
        return SupervisionError(
            f"The worker of rank {rank} of mesh {self.name!r}{where} is unresponsive: it {how}",
            mesh=self.name,
            rank=rank,
            pid=info["pid"] if info else None,
            host=info["host"] if info else None,
        )

    # -- commands ------------------------------------------------------------------------

    def record_actor(
        self, name: str, payload: bytes, buffers: list[Any], shape_blob: bytes, supervised: bool | None = None
    ) -> None:
        """Keeps the actor mesh's record here and with the agent (for attach and
        respawn). ``supervised``: whether its class defines ``__supervise__``, when
        known, so that a failure need not unpickle the constructor's arguments."""
        bufs = [bytes(b) for b in buffers]
        self.records.pop(name, None)
        self.records[name] = (payload, bufs, shape_blob)
        self._supervised.pop(name, None)
        if supervised is not None:
            self._supervised[name] = supervised
        try:
            self.client.record_actor(name, payload, bufs, shape_blob, self.epoch)
        except MonarchKernelError as e:  # the actors run; only a later attach() misses them
            print(
                f"monarch: actor mesh {name!r} runs, but the agent could not keep its record ({e}); "
                "a later attach() or respawn() will not re-create it",
                file=sys.stderr,
            )

    def forget_actor(self, name: str, ranks: list[int]) -> None:
        """Forgets actor mesh ``name`` once it is stopped on every rank it spans (a
        stopped slice leaves the record: the other ranks' actors still run)."""
        from monarch_kernel.mesh._serial import loads

        rec = self.records.get(name)
        if rec is not None and not set(loads(rec[2]).ranks) <= set(ranks):
            return
        self.records.pop(name, None)
        self.client.forget_actor(name, self.epoch)

    def respawn(self, timeout: float) -> list[int]:
        """Restarts dead ranks and re-creates their actors; returns the ranks."""
        from monarch_kernel.mesh._serial import loads

        with self.lock:
            ranks = sorted(self.state.dead)
            if not ranks:
                return []
            workers = self.client.respawn_workers(ranks, self.epoch)
            addrs = list(self.state.ref.addrs)
            for w in workers:
                addrs[w["rank"]] = w["addr"]
            ref = ProcRef(self.name, self.token, tuple(addrs), self.rec.agent_addr, self.ref.extent)
            self.state.ref = ref
            for r in ranks:
                self.state.dead.pop(r, None)
            self.state.changed()
            for name, (payload, buffers, shape_blob) in list(self.records.items()):
                shape = loads(shape_blob)
                targets = [r for r in shape.ranks if r in ranks]
                if not targets:
                    continue
                conns = [_native.WorkerConn(addrs[r], self.token) for r in targets]
                calls = [c.spawn_actor(name, payload, buffers) for c in conns]
                for r, reply in zip(targets, _native.wait_all(calls, timeout)):
                    if isinstance(reply, BaseException) or reply[0] != _native.REPLY_RESULT:
                        raise SupervisionError(
                            f"respawn of mesh {self.name!r}: actor {name!r} could not be re-created on "
                            f"rank {r}: {reply if isinstance(reply, BaseException) else bytes(reply[1])[:500]!r}",
                            mesh=self.name,
                            rank=r,
                        )
            return ranks

    def stop(self, timeout: float = 15.0) -> None:
        """Stops the workers and the agent, and forgets the mesh. Idempotent."""
        if self.closed and self.state.stopped:
            return
        self.stopping = True  # the exits that shutdown causes are not failures
        try:
            self.client.shutdown(self.epoch, timeout=timeout)
        except MeshOwnershipError:
            self.stopping = False
            raise  # another controller owns it now: not ours to stop
        except MonarchKernelError:
            pass  # the agent is gone already
        self.state.stopped = True
        self.state.changed()
        self.closed = True
        _sessions.pop(self.name, None)
        self._cancel_watch()
        _registry.remove_if_ours(self.name, self.token)
        if self.agent is not None:
            self.agent.wait(timeout)

    def owns(self) -> bool:
        """True while this session still controls a running mesh (not closed, lost,
        nor fenced by a later controller)."""
        if self.closed or self.state.lost is not None:
            return False
        try:
            return int(self.client.ping(timeout=3.0)["epoch"]) == self.epoch
        except MonarchKernelError:
            return False

    def detach(self) -> None:
        """Lets go of the mesh without stopping it (the lease ends)."""
        if self.closed:
            return
        self.closed = True
        if _sessions.get(self.name) is self:
            _sessions.pop(self.name, None)
        self._cancel_watch()

    def flush(self, origin: str, timeout: float = 5.0) -> list[int]:
        """Asks every live worker to write a flush marker tagged ``origin`` on stdout
        and stderr (see ``Dispatcher._builtin``); returns the ranks asked."""
        ranks = [r for r in range(len(self.state.ref.addrs)) if r not in self.state.dead]
        if not ranks or self.closed or self.state.lost is not None:
            return []
        _native.wait_all(self._builtin(ranks, "flush", origin=origin), timeout)
        return ranks

    def _builtin(self, ranks: list[int], method: str, payload: bytes = b"", origin: str = "") -> list[Any]:
        """Calls ``method`` of the actor every worker has (``Dispatcher._builtin``)."""
        conns = [_native.WorkerConn(self.state.ref.addrs[r], self.token) for r in ranks]
        return _native.call(conns, ranks, [], [], BUILTIN, method, payload, [], False, origin)

    def post_mortem(self, rank: int) -> Any:
        """Starts pdb on worker ``rank``'s last exception; returns the pending call
        (it completes when the session ends)."""
        from monarch_kernel import _origin

        (call,) = self._builtin([rank], "post_mortem", origin=_origin.current())
        return call

    def pdb_input(self, rank: int, line: str, timeout: float = 10.0) -> bool:
        """Sends ``line`` to the debugger waiting on worker ``rank``; True if one was."""
        (call,) = self._builtin([rank], "pdb_input", line.encode())
        _kind, payload, buffers = call.wait(timeout)
        from monarch_kernel.mesh._serial import loads

        return bool(loads(payload, buffers, self.token))

    def stacks(self, ranks: list[int], timeout: float = 10.0) -> list[str]:
        """The Python stacks of workers ``ranks`` (text; a dead or silent rank says so)."""
        from monarch_kernel.mesh._serial import loads

        calls = self._builtin(ranks, "stacks")
        out = []
        deadline = time.monotonic() + timeout
        for r, c in zip(ranks, calls):
            try:
                _kind, payload, buffers = c.wait(max(0.0, deadline - time.monotonic()))
                out.append(str(loads(payload, buffers, self.token)))
            except TimeoutError:
                out.append(f"(rank {r} did not answer within {timeout:g} s: stopped, or hung in native code)")
            except Exception as e:
                out.append(f"(rank {r} did not answer: {e})")
        return out

    def _check_rank(self, rank: int | None, what: str) -> None:
        n = len(self.state.ref.addrs)
        if rank is not None and not 0 <= rank < n:
            raise MeshIndexError(
                f"{what}: rank {rank} is out of range; mesh {self.name!r} has ranks 0 to {n - 1}"
            )

    def logs(self, rank: int | None, tail: int) -> list[str]:
        self._check_rank(rank, "logs()")
        if tail < 0:
            raise ValueError(f"logs(): tail={tail} must be 0 or more (the number of last lines)")
        return self.client.logs(rank=rank, tail=tail)

    def stream_logs(self, rank: int | None = None) -> Iterator[str]:
        """New output lines as they come, ``[mesh rank] text``, until the iterator is closed."""
        self._check_rank(rank, "stream_logs()")
        return self._stream_logs(rank)

    def _stream_logs(self, rank: int | None) -> Iterator[str]:
        stream = self.client.watch()
        try:
            for ev in stream:
                if ev.HasField("log") and (rank is None or ev.log.rank == rank):
                    yield f"[{self.name} {ev.log.rank}] {ev.log.text}"
        finally:
            stream.cancel()


# Sessions of this process, by mesh name.
_sessions: dict[str, Session] = {}
_sessions_lock = threading.RLock()


def session_for(ref: ProcRef) -> Session | None:
    s = _sessions.get(ref.name)
    return s if s is not None and s.token == ref.token and not s.closed else None


def _worker_env(env: Mapping[str, str] | None) -> dict[str, str]:
    return {
        "MONARCH_SYS_PATH": json.dumps([p for p in sys.path if p and os.path.isdir(p)]),
        "PYTHONUNBUFFERED": "1",
        # A native abort's Rust backtrace would fill the log tail that a SupervisionError
        # shows in place of its message; spawn_procs(env={"RUST_BACKTRACE": "1"}) keeps it.
        "RUST_BACKTRACE": "0",
        **(env or {}),
    }


def _agent_alive(rec: MeshRecord) -> bool:
    """True if ``rec``'s agent process still runs on this host (whether or not it
    answers): a busy or stopped agent is not a stale record."""
    if rec.host != os.uname().nodename:
        return False
    try:
        with open(f"/proc/{rec.agent_pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{rec.agent_pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"monarch_kernel.hosts._agent_main" in cmd and state not in ("Z", "X")


class _Busy(MonarchKernelError):
    """The agent runs but did not answer in time."""


def _connect(rec: MeshRecord) -> AgentClient | None:
    """A client of ``rec``'s agent if it answers as that mesh; None if it is gone
    (REGISTRY-2: only then may its record be removed). An agent that runs but does
    not answer raises ``_Busy``."""
    client = AgentClient(rec.agent_addr, rec.token)
    try:
        if client.ping(timeout=3.0)["name"] == rec.name:
            return client
    except MonarchKernelError as e:
        if _agent_alive(rec):
            client.close()
            raise _Busy(
                f"the host agent of mesh {rec.name!r} (pid {rec.agent_pid}) runs but does not answer: {e}"
            ) from None
    client.close()
    return None


def attach_record(rec: MeshRecord) -> Session:
    """Attaches to the mesh ``rec`` describes (bumping its epoch); a stale record is
    removed and raises MeshNotFoundError."""
    with _sessions_lock:
        client = _connect(rec)
        if client is None:
            _registry.remove_if_ours(rec.name, rec.token)
            raise MeshNotFoundError(
                f"mesh {rec.name!r} is not running: its host agent (pid {rec.agent_pid}, {rec.agent_addr}) is "
                "gone, and its state file was removed. Start it again with "
                f"this_host().spawn_procs(..., name={rec.name!r})."
            )
        reply = client.attach()
        # The new lease opens before the old one (if this process had one) closes: an
        # ephemeral mesh must never see no controller in between.
        session = Session(rec, client, reply.epoch, list(reply.workers), list(reply.actors), agent=None)
        old = _sessions.get(rec.name)
        if old is not None and old.token == rec.token and not old.closed:
            session.callbacks.extend(old.callbacks)
            session.agent = old.agent
            old.detach()
        rec.epoch = session.epoch
        _registry.write(rec)
        _sessions[rec.name] = session
        return session


def create(
    name: str | None,
    sizes: dict[str, int],
    env: Mapping[str, str] | None,
    ephemeral: bool,
    idle_timeout: float,
) -> Session:
    """Starts a new mesh: a host agent, its workers, and (if named) a state file."""
    mesh_name = name or f"anon-{uuid.uuid4().hex[:8]}"
    gpu_env = placement_env(sizes)  # PLACE-1: checked before anything starts
    token = _new_token()
    spec = {"per_host": sizes, "env": dict(env or {})}
    meta = json.dumps({"spec": spec, "ephemeral": ephemeral, "idle_timeout": idle_timeout})
    agent = start_local_agent(
        mesh_name,
        token,
        idle_timeout=idle_timeout,
        meta=meta,
        state_file=str(_registry.path_of(mesh_name)),
    )
    client = AgentClient(agent.addr, token)
    try:
        epoch = client.attach().epoch
        nprocs = 1
        for v in sizes.values():
            nprocs *= v
        worker_env = {
            "MONARCH_SHAPE": json.dumps([list(sizes), list(sizes.values())]),
            **_worker_env(env),
            **gpu_env,
        }
        workers = client.spawn_workers_raw(
            nprocs, sys.executable, ["-m", "monarch_kernel.worker"], worker_env, os.getcwd(), epoch=epoch
        )
        rec = MeshRecord(
            name=mesh_name,
            token=token,
            agent_addr=agent.addr,
            agent_pid=agent.popen.pid,
            host=os.uname().nodename,
            spec=spec,
            idle_timeout=idle_timeout,
            ephemeral=ephemeral,
            epoch=epoch,
        )
        session = Session(rec, client, epoch, workers, [], agent)
        _registry.write(rec)
    except BaseException:  # nothing may be left running that no state file names
        try:
            client.shutdown()
        except Exception:
            pass  # the original error is the one to report
        finally:
            agent.wait(10)
        raise
    with _sessions_lock:
        _sessions[mesh_name] = session
    return session


def _new_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


def get_or_create(
    name: str | None,
    sizes: dict[str, int],
    env: Mapping[str, str] | None,
    *,
    replace: bool,
    ephemeral: bool | None,
    idle_timeout: float | None,
) -> Session:
    """``spawn_procs``: the running mesh ``name`` if its spec matches, else a new one."""
    if ephemeral is None:
        ephemeral = name is None
    if idle_timeout is None:
        idle_timeout = 0.0 if ephemeral else DEFAULT_IDLE_TIMEOUT
    elif not isinstance(idle_timeout, (int, float)) or idle_timeout < 0:
        raise MeshSpecError(f"idle_timeout must be a number of seconds >= 0, not {idle_timeout!r}")
    if name is None:
        return create(None, sizes, env, ephemeral, float(idle_timeout))
    _registry.check_name(name)
    spec = {"per_host": sizes, "env": dict(env or {})}
    with _registry.locked(name):
        rec = _registry.read(name)
        if rec is not None:
            mine = _sessions.get(name)
            if rec.spec == spec:
                if mine is not None and mine.token == rec.token and mine.owns():
                    return mine
                try:
                    return attach_record(rec)
                except MeshNotFoundError:
                    pass  # stale: create it anew below
            elif not replace:
                if _connect(rec) is None:
                    _registry.remove_if_ours(rec.name, rec.token)
                else:
                    raise MeshSpecError(
                        f"mesh {name!r} is running with {_spec_text(rec.spec)}, not {_spec_text(spec)}. Pass "
                        f"replace=True to stop it and start a new one, or attach({name!r}) to use it as it is."
                    )
            else:
                stop_record(rec)
        return create(name, sizes, env, ephemeral, float(idle_timeout))


def _spec_text(spec: dict[str, Any]) -> str:
    env = f", env={spec['env']}" if spec.get("env") else ""
    return f"per_host={spec['per_host']}{env}"


def stop_record(rec: MeshRecord) -> bool:
    """Stops the mesh ``rec`` describes as an administrator (never fenced); True if
    it was running."""
    s = _sessions.get(rec.name)
    if s is not None and s.token == rec.token:
        try:
            s.stop()
            return True
        except MeshOwnershipError:
            s.detach()  # fenced: stop it as an administrator below
    try:
        client = _connect(rec)
    except _Busy:  # hung: its workers exit with it (AGENT-1)
        os.kill(rec.agent_pid, signal.SIGKILL)
        _registry.remove_if_ours(rec.name, rec.token)
        return True
    _registry.remove_if_ours(rec.name, rec.token)
    if client is None:
        return False
    try:
        client.shutdown(epoch=0)
    except MonarchKernelError:
        pass
    finally:
        client.close()
    return True


@dataclass
class MeshInfo:
    """One running mesh, as ``list_meshes()`` gives it."""

    name: str
    procs: int
    alive: int
    owner_epoch: int
    attached: bool
    agent_pid: int
    host: str
    spec: dict[str, Any]
    ephemeral: bool
    idle_timeout: float
    created: float


def list_meshes() -> list[MeshInfo]:
    """The running meshes this user can attach to; stale state files are removed."""
    out = []
    for name in _registry.names():
        with _registry.locked(name):
            rec = _registry.read(name)
            if rec is None:
                continue
            try:
                client = _connect(rec)
            except _Busy as e:
                warnings.warn(str(e), _registry.MeshStateWarning, stacklevel=2)
                continue
            if client is None:
                _registry.remove_if_ours(name, rec.token)
                warnings.warn(
                    f"mesh {name!r}: its host agent (pid {rec.agent_pid}) is gone; its state file was removed",
                    _registry.MeshStateWarning,
                    stacklevel=2,
                )
                continue
        try:
            ping = client.ping()
            workers = client.list_workers()
        except MonarchKernelError:
            continue
        finally:
            client.close()
        out.append(
            MeshInfo(
                name=name,
                procs=len(workers),
                alive=sum(w["state"] == "running" for w in workers),
                owner_epoch=ping["epoch"],
                attached=ping["watchers"] > 0,
                agent_pid=rec.agent_pid,
                host=rec.host,
                spec=rec.spec,
                ephemeral=rec.ephemeral,
                idle_timeout=rec.idle_timeout,
                created=rec.created,
            )
        )
    return out


def attach(name: str) -> Session:
    _registry.check_name(name)
    with _registry.locked(name):
        rec = _registry.read(name)
        if rec is None:
            running = ", ".join(repr(n) for n in _registry.names()) or "none"
            raise MeshNotFoundError(
                f"no mesh named {name!r} is running (running: {running}). Create it with "
                f"this_host().spawn_procs(per_host={{'procs': N}}, name={name!r})."
            )
        return attach_record(rec)


def stop_all_ephemeral() -> None:
    """At exit: ephemeral meshes of this process stop; persistent ones are let go."""
    for s in list(_sessions.values()):
        try:
            if s.rec.ephemeral:
                s.stop(timeout=5)
            else:
                s.detach()
        except Exception:
            pass


__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "MeshFailure",
    "MeshInfo",
    "Session",
    "attach",
    "get_or_create",
    "list_meshes",
    "session_for",
    "stop_all_ephemeral",
    "stop_record",
]
