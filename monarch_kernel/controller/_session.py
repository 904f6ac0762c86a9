"""``Session``: this controller's hold on one mesh.

A session is made by creating a mesh or attaching to one (``_lifecycle``). It holds
the mesh's agent client and epoch (fencing: the controller that attached last owns
the mesh), the lease (an open ``Watch`` stream, which also brings worker exits and
output), its ``Supervisor`` (deaths, heartbeats, failure hooks), and the commands a
controller sends to the agent and the workers' built-in actor.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from monarch_kernel import _native, _origin
from monarch_kernel._caller import user_stacklevel
from monarch_kernel._wire import BUILTIN
from monarch_kernel.control import (
    ActorFailure,
    AgentGroup,
    DisplayMessage,
    HostLink,
    LineKind,
    LineWindow,
    MergedLine,
    check_tail,
)
from monarch_kernel.controller._frontend import frontend
from monarch_kernel.controller._supervision import MeshFailure, Supervisor
from monarch_kernel.errors import (
    ActorError,
    MeshIndexError,
    MeshOwnershipError,
    MeshSpecError,
    MonarchKernelError,
    SupervisionError,
)
from monarch_kernel.hosts import AgentProcess, MeshRecord, agent_alive, end_reason, follow, registry, release
from monarch_kernel.mesh import (
    Extent,
    Future,
    MeshState,
    ProcMesh,
    ProcRef,
    Shape,
    call_builtin,
    decode_reply,
    know_token,
    loads,
)
from monarch_kernel.torch import DIST_ACTOR
from monarch_kernel.torch import rejoin as torch_rejoin
from monarch_kernel.torch import setup as torch_setup


def _forward_output() -> bool:
    return os.environ.get("MONARCH_FORWARD_OUTPUT", "1") != "0"


def _print_line(stream: str, text: str) -> None:
    """A worker's line in a script: on this process's stdout or stderr, in one write
    (lines of several threads stay whole)."""
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(text)
    out.flush()


class Session:
    """This process's hold on mesh ``rec.name`` (see the module docstring)."""

    def __init__(
        self,
        rec: MeshRecord,
        client: AgentGroup,
        epoch: int,
        workers: list[Any],
        actors: list[Any],
        agent: AgentProcess | None,
    ) -> None:
        self.rec = rec
        self.name = rec.name
        self.token = rec.token
        follow(rec.job)  # (to tell later how its hosts ended)
        self.client = client
        self.agent = agent
        self.epoch = epoch
        self.sizes: dict[str, int] = sizes_of(rec.spec)
        workers = sorted(workers, key=lambda w: w.rank)
        self.ref = ProcRef(
            rec.name,
            rec.token,
            tuple(w.addr for w in workers),
            rec.agent_addr,
            Extent(list(self.sizes), list(self.sizes.values())),
            tuple((link.addr, link.first_rank, link.nprocs) for link in client.links) if rec.hosts else (),
        )
        self.state: MeshState = self.ref.state()
        self.state.ref = self.ref
        self.state.stopped = False
        self.state.fenced = False
        self.state.lost = None
        self.state.dead.clear()
        self.state.changed()
        #: Actor meshes by name: (payload, buffers, pickled shape) as recorded by the agent.
        self.records: dict[str, tuple[bytes, list[bytes], bytes]] = {
            a.name: (a.payload, list(a.buffers), a.shape) for a in actors
        }
        self.callbacks: list[Callable[[MeshFailure], Any]] = []
        #: Whether worker lines are shown here as they come (``logging_option``).
        self.show_output = True
        #: ``logging_option(aggregate_window_sec=)``: text lines merged over a window.
        self.window: LineWindow | None = None
        self.closed = False
        self.stopping = False
        #: Serializes respawns.
        self.lock = threading.Lock()
        self.fenced = False
        self.supervisor = Supervisor(self)
        know_token(rec.token)  # TransferBuffers from this mesh can be read here
        _native.set_epoch(rec.token, self.epoch)
        _native.watch_through_agents(rec.token)  # its heartbeats go through the agents
        #: Hosts that do not answer now (a partition, a stopped agent), and hosts whose
        #: agent is gone, by link index (SUPERVISE-4).
        self.unreachable: set[int] = set()
        self.lost_hosts: set[int] = set()
        # The lease and the event stream first; then what happened before it opened
        # (the agent does not replay events): exits are marked from the agent's list.
        self._cancels: dict[int, Callable[[], None]] = {
            link.index: client.watch_link(link, self._on_event, self._on_end) for link in client.links
        }
        try:
            workers = client.list_workers_raw()
        except MonarchKernelError:
            pass  # the watch reports what happens next
        self.supervisor.died_in(workers, notify=False)  # exited before we watched
        self._raise_epochs()
        self.supervisor.start()

    def _raise_epochs(self) -> None:
        """Raises every worker's epoch now, so an older controller is fenced at once
        (FENCE-1). Across hosts each agent pings its workers on their pipes with this
        epoch (one message per host, START-1): calls go through the relays there, and a
        ping from here opened a TLS connection to every worker that no call used (at
        64 x 16, 1,024 handshakes, 1.1 s of the bring-up, and 1,024 idle connections
        kept alive). On this host the ping opens each worker's direct connection
        before the first call needs it (ORDER-1 holds either way, but a broadcast is
        not held back for a direct call still connecting: see docs/invariants.md,
        "Open questions")."""
        if self.rec.hosts:
            self.client.ping_workers(self.epoch, 2.0)
            return
        live = [r for r in range(len(self.ref.addrs)) if r not in self.state.dead]
        _native.ping_all(self.state.connect(live), 2.0)

    # -- events (watch thread) -----------------------------------------------------------

    def _on_event(self, ev: Any) -> None:
        if ev.HasField("worker_exited"):
            self.supervisor.worker_died(ev.worker_exited, notify=True)
        elif ev.HasField("stopping"):
            if not (self.stopping or self.closed):  # someone else stops it
                self.supervisor.stopped_by(ev.stopping.by)
        elif ev.HasField("dropped") and not self.closed:  # this watcher fell behind the workers
            text = (
                f"monarch: mesh {self.name!r}: {ev.dropped} lines of worker output were not shown "
                "here (they came faster than the notebook took them); procs.logs() or %mesh logs "
                "has every line.\n"
            )
            notice = frontend().on_notice
            if notice is not None:
                notice(text)
            else:
                sys.stderr.write(text)
        elif ev.HasField("log") and not self.closed:
            line, kind = ev.log, ev.log.kind
            if kind == LineKind.ACTOR_FAILURE:  # OWN-1: an actor of the mesh failed
                self.supervisor.actor_failed(ActorFailure.of(line))
                return
            if not self.show_output:  # logging_option(stream_to_client=False): logs() has them
                return
            on_line = frontend().on_line
            if on_line is not None:
                on_line(self, line)
                return
            # A script: text as it comes, a display as its text form; a prompt cannot
            # come (a breakpoint outside a notebook cell is skipped), nor is a mark shown.
            if not _forward_output() or kind not in (LineKind.TEXT, LineKind.DISPLAY):
                return
            if kind == LineKind.TEXT and self.window is not None:
                self.window.add(line)  # (out through show_merged)
                return
            text = (
                line.text
                if kind == LineKind.TEXT
                else DisplayMessage.of(self.name, line, self.token).as_text()
            )
            _print_line(line.stream, f"[{self.name} {line.rank}] {text}\n")

    def show_merged(self, merged: MergedLine) -> None:
        """A line of the window (``logging_option(aggregate_window_sec=)``): to the
        front end, or printed with the ranks that wrote it."""
        on_merged = frontend().on_merged
        if on_merged is not None:
            on_merged(self, merged)
        else:
            _print_line(merged.stream, f"[{self.name} {merged.label}] {merged.shown}\n")

    def _cancel_watch(self) -> None:
        for cancel in list(self._cancels.values()):
            cancel()

    def _on_end(self, err: BaseException | None, link: HostLink) -> None:
        """A host's Watch stream ended: watch again if its agent is there (a hiccup),
        wait for it while it is unreachable (SUPERVISE-4), else its host is lost."""
        if self.closed or self.stopping or err is None:
            return
        if len(self.client.links) == 1 and not self.rec.hosts:
            if agent_alive(self.rec):  # a hiccup, not a death: watch again
                time.sleep(0.2)
                self._rewatch(link)
                return
            self.supervisor.agent_lost(err)
            return
        first = True
        while not (self.closed or self.stopping):
            how = link.reach()
            if how == "unreachable" and first:  # a stream's end can come before its port closes
                first = False
                time.sleep(0.3)
                continue
            if how == "mute" and not self.supervisor.mute_too_long(link):  # busy, or stopped
                time.sleep(1.0)
                continue
            if how == "alive":
                if link.index in self.unreachable:
                    self.supervisor.host_back(link)
                self._rewatch(link)
                return
            if how == "gone":
                self.supervisor.host_lost(link, err)
                return
            if link.index not in self.unreachable:
                self.supervisor.host_unreachable(link)
            time.sleep(1.0)

    def _rewatch(self, link: HostLink) -> None:
        if not self.closed:
            self._cancels[link.index] = self.client.watch_link(link, self._on_event, self._on_end)

    def host_index(self, rank: int) -> int:
        """The index of the host that runs ``rank``."""
        return self.client.link_of(rank).index

    def explain_host_loss(self, wait: float = 0.0, host: str | None = None) -> str | None:
        """Why the hosts' agents (or host ``host``'s) went away, when the allocator
        knows (a SLURM job that ended, a Kubernetes pod deleted or OOM-killed: its
        state and reason, given ``wait`` s to be recorded); None otherwise."""
        return end_reason(self.rec.job, wait, host)

    def forget_record(self) -> None:
        """Removes the mesh's state file, if it is still this mesh's."""
        registry.remove_if_ours(self.name, self.token)

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
        self.supervisor.supervised.pop(name, None)
        if supervised is not None:
            self.supervisor.supervised[name] = supervised
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
        rec = self.records.get(name)
        if rec is not None and not set(loads(rec[2]).ranks) <= set(ranks):
            return
        self.records.pop(name, None)
        self.client.forget_actor(name, self.epoch)

    def respawn(self, timeout: float) -> list[int]:
        """Restarts dead ranks and re-creates their actors; returns the ranks. Ranks
        of a lost host stay dead: their agent, which would restart them, is gone."""
        with self.lock:
            try:  # an exit the watch has not brought yet (a call's failure can be first)
                self.supervisor.died_in(self.client.list_workers_raw(), notify=True)
            except MonarchKernelError:
                pass
            ranks = [r for r in sorted(self.state.dead) if self.host_index(r) not in self.lost_hosts]
            if not ranks:
                return []
            workers = self.client.respawn_workers(ranks, self.epoch)
            addrs = list(self.state.ref.addrs)
            for w in workers:
                addrs[w["rank"]] = w["addr"]
            ref = dataclasses.replace(self.state.ref, addrs=tuple(addrs))
            self.state.ref = ref
            # A respawned rank imports from the workspace its host's last sync of this
            # mesh named, if any (its actors' classes may come from there).
            _native.wait_all(self._builtin(ranks, "workspace_use", self.name, None, [], False), timeout)
            # The ranks stay dead until their actors are back: a call made meanwhile
            # (another thread's) fails as to a dead rank, not with "no actor named".
            for name, (payload, buffers, shape_blob) in list(self.records.items()):
                shape = loads(shape_blob)
                targets = [r for r in shape.ranks if r in ranks]
                if not targets:
                    continue
                conns = self.state.connect(targets)
                calls = [c.spawn_actor(name, payload, buffers) for c in conns]
                what = f"respawn of mesh {self.name!r}: re-creating actor {name!r}"
                for r, reply in zip(targets, _native.wait_all(calls, timeout)):
                    try:
                        decode_reply(reply, self.state.ref, r, self.state.ref.point(r), what, value=False)
                    except (MonarchKernelError, ActorError) as e:
                        raise SupervisionError(
                            f"respawn of mesh {self.name!r}: actor {name!r} could not be re-created on "
                            f"rank {r}: {e}",
                            mesh=self.name,
                            rank=r,
                        ) from e
            for r in ranks:
                self.state.dead.pop(r, None)
            self.state.changed()
            if DIST_ACTOR in self.records:  # the new ranks join torch.distributed too
                why = torch_rejoin(self, self.procs(), ranks)
                if why is not None:
                    warnings.warn(
                        f"mesh {self.name!r}: rank(s) {ranks} were restarted without torch.distributed: {why}",
                        stacklevel=user_stacklevel(),
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
        sessions.pop(self.name, None)
        self._cancel_watch()
        self._flush_window()
        # Calls still waiting on a host the stop could not reach fail now (RESUME-1
        # would have them wait for it).
        self.state.ref.abandon_calls(f"mesh {self.name!r} was stopped")
        release(self.rec.job)
        registry.remove_if_ours(self.name, self.token)
        if self.agent is not None:
            self.agent.wait(timeout)

    def workers(self) -> dict[int, dict[str, Any]]:
        """What the agent says of each worker (pid, host, state, restarts...), by rank."""
        return {w["rank"]: w for w in self.client.list_workers()}

    def usage(self, ranks: list[int], timeout: float = 1.0) -> list[dict[str, Any] | None]:
        """Each worker's CPU, memory and GPU use, measured on its own host (None for
        a rank that does not answer within ``timeout``)."""
        return [None if u is None else dict(u) for u in self._ask(ranks, "usage", timeout)]

    def calls_in_flight(self, ranks: list[int], timeout: float = 2.0) -> dict[int, int]:
        """How many calls each of workers ``ranks`` holds unanswered now, for those that
        say within ``timeout``. Across hosts one question per host, through the relays
        (START-1); on this host each worker's ``Stats``, on the connection calls use."""
        if not ranks or self.closed or self.state.lost is not None:
            return {}
        if self.state.ref.hosts:
            answers = self._ask(ranks, "calls_in_flight", timeout)
            return {r: int(n) for r, n in zip(ranks, answers) if n is not None}
        out: dict[int, int] = {}
        for rank, conn in zip(ranks, self.state.connect(ranks)):
            try:
                out[rank] = int(conn.stats()["calls_in_flight"])
            except Exception:
                pass
        return out

    def _ask(self, ranks: list[int], method: str, timeout: float) -> list[Any]:
        """What the built-in actor of each of ``ranks`` answers to ``method()``; None
        for a rank that does not answer within ``timeout`` (its call is cancelled)."""
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        for r, c in zip(ranks, self._builtin(ranks, method)):
            try:
                reply = c.wait(max(0.0, deadline - time.monotonic()))
                out.append(decode_reply(reply, self.state.ref, r, self.state.ref.point(r), method))
            except Exception:
                c.cancel()
                out.append(None)
        return out

    @property
    def nprocs(self) -> int:
        """How many procs the mesh has (alive or not)."""
        return len(self.state.ref.addrs)

    def procs(self) -> ProcMesh:
        """The whole proc mesh this session controls."""
        return ProcMesh(self.ref, Shape.of(self.sizes))

    def setup_torch_distributed(self, procs: ProcMesh, backend: str, timeout: float) -> dict[str, Any]:
        """``ProcMesh.setup_torch_distributed`` (see ``monarch_kernel.torch``)."""
        return torch_setup(self, procs, backend, timeout)

    def activate(self, procs: ProcMesh) -> Any:
        """``ProcMesh.activate`` (see ``monarch_kernel.tensor``)."""
        from monarch_kernel.tensor import activate

        return activate(procs)

    def rank_tensor(self, procs: ProcMesh, dims: Any) -> Any:
        """``ProcMesh.rank_tensor`` (see ``monarch_kernel.tensor``)."""
        from monarch_kernel.tensor import rank_tensor

        return rank_tensor(procs, dims)

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
        if sessions.get(self.name) is self:
            sessions.pop(self.name, None)
        self._cancel_watch()
        self._flush_window()

    def _flush_window(self) -> None:
        """What the window holds is let out as the session ends: no line is lost."""
        window, self.window = self.window, None
        if window is not None:
            window.flush()

    def flush(self, origin: str, timeout: float = 5.0) -> list[int]:
        """Asks every live worker to write a flush marker tagged ``origin`` on stdout
        and stderr (``WorkerBuiltin.flush``); returns the ranks asked."""
        ranks = [r for r in range(len(self.state.ref.addrs)) if r not in self.state.dead]
        if not ranks or self.closed or self.state.lost is not None:
            return []
        _native.wait_all(self._builtin(ranks, "flush", origin=origin), timeout)
        return ranks

    def _builtin(self, ranks: list[int], method: str, *args: Any, origin: str = "") -> Sequence[Any]:
        """Calls ``method(*args)`` of the actor every worker has (``worker._builtin``)
        on ``ranks``: one pending call each."""
        return call_builtin(
            self.state.connect(ranks), ranks, method, *args, origin=origin, fan=self.state.ref.fanout()
        )

    def send_builtin(self, rank: int, method: str, *args: Any) -> None:
        """Calls ``method(*args)`` of rank ``rank``'s built-in actor, without waiting
        (the reply, or the failure, is not looked at)."""
        if rank in self.state.dead or self.closed or self.state.lost is not None:
            return
        self._builtin([rank], method, *args)

    def tell_root(self, root: str, timeout: float = 5.0) -> None:
        """SINGLE-1: the live workers' ``MONARCH_ROOT`` becomes ``root`` (an attach)."""
        live = [r for r in range(self.nprocs) if r not in self.state.dead]
        if not live or self.state.lost is not None:
            return
        try:
            _native.wait_all(self._builtin(live, "root", root), timeout)
        except Exception:  # a worker that does not answer keeps the root it had
            pass

    def report(self, failure: MeshFailure) -> None:
        """Tells supervision of ``failure`` (found here, not by the watch), on a thread
        of its own: it may wait on an actor of this very thread (an owner's
        ``__supervise__``)."""
        threading.Thread(
            target=self.supervisor.notify, args=(failure,), name="monarch-report", daemon=True
        ).start()

    def logging_option(
        self, stream_to_client: bool, level: int, window: float | None = None, timeout: float = 10.0
    ) -> None:
        """``ProcMesh.logging_option``: whether worker lines are shown here, over what
        window identical lines from many ranks are merged (None or 0: none), and the
        workers' root logger level."""
        self.show_output = bool(stream_to_client)
        old, self.window = self.window, LineWindow(window, self.show_merged) if window else None
        if old is not None:
            old.flush()
        live = [r for r in range(self.nprocs) if r not in self.state.dead]
        if live and not self.closed and self.state.lost is None:
            _native.wait_all(self._builtin(live, "log_level", int(level)), timeout)

    def sync_workspace(
        self, ranks: list[int], workspace: Any, auto_reload: bool, timeout: float = 600.0
    ) -> Any:
        """Sends ``workspace`` (``_workspace.folders_of``) to the hosts of ``ranks``,
        what changed only, once per host (its first live proc writes the host's
        copy), then has every rank of ``ranks`` import from it and, with
        ``auto_reload``, reload the modules whose files changed. A ``SyncResult``."""
        from monarch_kernel.controller import _workspace as ws
        from monarch_kernel.mesh import TransferBuffer

        folders = ws.folders_of(workspace)
        files, skipped = ws.scan(folders)
        dirs = sorted(set(folders.values()))
        manifest = {rel: h for rel, (_, h, _) in files.items()}
        live = [r for r in ranks if r not in self.state.dead]
        if not live or self.closed or self.state.lost is not None:
            raise MeshSpecError(f"sync_workspace: mesh {self.name!r} has no live proc among those given")
        heads: dict[int, int] = {}
        for r in live:
            heads.setdefault(self.client.link_of(r).index, r)
        first = list(heads.values())
        ref = self.state.ref

        def answers(calls: Sequence[Any], on: list[int], what: str) -> list[Any]:
            return [decode_reply(c.wait(timeout), ref, r, ref.point(r), what) for r, c in zip(on, calls)]

        plans = answers(self._builtin(first, "workspace_plan", self.name, manifest), first, "sync_workspace")
        wanted = set().union(*map(set, plans))
        blob, index = ws.pack(files, wanted)
        buffer = TransferBuffer(blob) if index else None
        try:
            applied = []
            for r, plan in zip(first, plans):
                need = set(plan)  # (what this host lacks, of the buffer's files)
                part = [i for i in index if i[0] in need]
                applied.append(self._builtin([r], "workspace_apply", self.name, manifest, buffer, part))
            removed = answers([c for (c,) in applied], first, "sync_workspace")
        finally:
            if buffer is not None:
                buffer.drop()
        used = answers(
            self._builtin(live, "workspace_use", self.name, dirs, sorted(wanted), bool(auto_reload)),
            live,
            "sync_workspace",
        )
        reloaded: dict[str, list[int]] = {}
        for r, names in zip(live, used):
            for m in names:
                reloaded.setdefault(m, []).append(r)
        return ws.SyncResult(
            files=len(wanted),
            nbytes=len(blob),
            hosts=len(first),
            removed=max(removed, default=0),
            unchanged=len(files) - len(wanted),
            reloaded=reloaded,
            skipped=skipped,
        )

    def post_mortem(self, rank: int) -> Future[None]:
        """Starts pdb on worker ``rank``'s last exception; the Future completes when
        the debugging session ends."""
        self._check_rank(rank, "post_mortem()")
        (call,) = self._builtin([rank], "post_mortem", origin=_origin.current())
        return Future(_calls=[call], _finish=lambda _replies: None)

    def pdb_input(self, rank: int, line: str, timeout: float = 10.0) -> bool:
        """Sends ``line`` to the debugger waiting on worker ``rank``; True if one was."""
        (call,) = self._builtin([rank], "pdb_input", line)
        ref = self.state.ref
        return bool(decode_reply(call.wait(timeout), ref, rank, ref.point(rank), f"{BUILTIN}.pdb_input"))

    def busy(self, rank: int, timeout: float = 1.0) -> list[tuple[int, str, str]]:
        """What worker ``rank``'s actors run now: (call id, ``actor.method``, where).
        Answered by the worker's routing thread, so a busy actor does not hold it up;
        TimeoutError if the worker does not answer (stopped, or hung in native code)."""
        self._check_rank(rank, "busy()")
        (call,) = self._builtin([rank], "busy")
        ref = self.state.ref
        return list(decode_reply(call.wait(timeout), ref, rank, ref.point(rank), f"{BUILTIN}.busy"))

    def stacks(self, ranks: list[int], timeout: float = 10.0) -> list[str]:
        """The Python stacks of workers ``ranks`` (text; a dead or silent rank says so)."""
        calls = self._builtin(ranks, "stacks")
        out = []
        deadline = time.monotonic() + timeout
        for r, c in zip(ranks, calls):
            try:
                reply = c.wait(max(0.0, deadline - time.monotonic()))
                out.append(str(decode_reply(reply, self.state.ref, r, self.state.ref.point(r), "stacks")))
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

    def logs(self, rank: int | None, tail: int, labelled: bool = False) -> list[str]:
        self._check_rank(rank, "logs()")
        return self.client.logs(rank=rank, tail=check_tail(tail, "logs()"), labelled=labelled)

    def stream_logs(self, rank: int | None = None) -> Iterator[str]:
        """New output lines as they come, ``[mesh rank] text``, until the iterator is closed."""
        self._check_rank(rank, "stream_logs()")
        return self._stream_logs(rank)

    def _stream_logs(self, rank: int | None) -> Iterator[str]:
        events = self.client.watch()
        try:
            for ev in events:
                if (
                    ev.HasField("log")
                    and ev.log.kind == LineKind.TEXT
                    and (rank is None or ev.log.rank == rank)
                ):
                    yield f"[{self.name} {ev.log.rank}] {ev.log.text}"
        finally:
            events.close()


def sizes_of(spec: dict[str, Any]) -> dict[str, int]:
    """A mesh's dims from its spec: ``{"hosts": N, **per_host}`` across hosts."""
    per_host = dict(spec["per_host"])
    return {"hosts": int(spec["hosts"]), **per_host} if spec.get("hosts") else per_host


#: Sessions of this process, by mesh name.
sessions: dict[str, Session] = {}
sessions_lock = threading.RLock()


__all__ = ["Session", "sessions", "sessions_lock", "sizes_of"]
