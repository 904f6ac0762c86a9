"""``ProcRef``: how to reach the procs of one mesh (addresses, token, agent), and how
to explain a failed call in terms a user can act on."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from monarch_kernel import _native
from monarch_kernel.errors import (
    ConnectionLost,
    MeshAuthError,
    MeshOwnershipError,
    MeshStoppedError,
    MeshTLSError,
    MessageTooLargeError,
    MonarchKernelError,
    SupervisionError,
)
from monarch_kernel.mesh._shape import Extent, Point

#: Whether a call to a mesh across hosts goes as one message per host, through each
#: host's agent (RELAY-1), where ORDER-1 allows (``_native.Fanout``); ``MONARCH_FANOUT=0``
#: sends every call to each worker directly (one message per proc).
FAN_OUT = os.environ.get("MONARCH_FANOUT", "1") != "0"


@dataclass(eq=False)
class MeshState:
    """This process's view of one mesh: where its procs are now (they move when
    respawned), which ranks are dead, and whether the whole mesh is stopped or lost.
    ``gen`` changes with any of these, so cached connections know to look again."""

    ref: ProcRef
    gen: int = 0
    dead: dict[int, SupervisionError] = field(default_factory=dict)
    unresponsive: set[int] = field(default_factory=set)
    stopped: bool = False
    #: Why it was stopped, as ``ProcMesh.stop(reason)`` said.
    stop_reason: str | None = None
    #: Another controller attached after this process's session (it was let go).
    fenced: bool = False
    lost: SupervisionError | None = None
    #: The native fan-out of calls across hosts (RELAY-1, ORDER-1) and the hosts it
    #: was made for: made on first use, again only for other hosts.
    _fanout: tuple[tuple[tuple[str, int, int], ...], Any] | None = field(default=None, init=False, repr=False)

    def changed(self) -> None:
        self.gen += 1

    def fanout(self, hosts: tuple[tuple[str, int, int], ...]) -> Any:
        """The ``_native.Fanout`` of the mesh on ``hosts`` (its ``ProcRef.hosts``)."""
        made = self._fanout
        if made is None or (made[0] is not hosts and made[0] != hosts):
            made = self._fanout = (hosts, _native.Fanout(self.ref.token, hosts))
        return made[1]

    def connect(self, ranks: Sequence[int]) -> list[Any]:
        """Connections to procs ``ranks`` where they are now, with no checks (the one
        place they are made; ``ProcRef.conns`` checks first)."""
        addrs, token = self.ref.addrs, self.ref.token
        return [_native.WorkerConn(addrs[r], token) for r in ranks]


# By (name, token): a mesh created again under the same name is another mesh.
_states: dict[tuple[str, str], MeshState] = {}


@dataclass(frozen=True)
class ProcRef:
    """Addresses of a mesh's procs (by proc rank), its token, and its host agent's address."""

    name: str
    token: str = field(repr=False)
    addrs: tuple[str, ...]
    agent_addr: str | None = None
    #: The dims of the whole proc mesh (proc ranks index it).
    extent: Extent = Extent([], [])
    #: Across hosts: each host's agent and its ranks, ``(agent_addr, first_rank, nprocs)``.
    hosts: tuple[tuple[str, int, int], ...] = ()

    def host_of(self, rank: int) -> int:
        """The index of the host that runs proc ``rank`` (0 on a single host)."""
        for i, (_addr, first, n) in enumerate(self.hosts):
            if first <= rank < first + n:
                return i
        return 0

    def abandon_calls(self, why: str, host: int | None = None) -> None:
        """Fails the calls this process waits for from the workers of host ``host``
        (of every host when None) and from its agent (the relay of fanned-out calls),
        with ``why``: the host is lost or the mesh stopped, and a connection that
        cannot reach them would otherwise wait for them (RESUME-1)."""
        if host is None:
            addrs = [*self.addrs, *(agent for agent, _first, _n in self.hosts)]
            procs = range(len(self.addrs))
        else:
            agent, first, n = self.hosts[host]
            addrs = [agent, *self.addrs[first : first + n]]
            procs = range(first, first + n)
        for addr in addrs:
            _native.abandon_calls(addr, self.token, why)
        # TREE-1: calls to them may wait on another host's agent, which forwards them.
        _native.abandon_relayed_calls(self.token, list(procs), why)

    def agent_of(self, rank: int) -> str | None:
        """The address of the agent that owns proc ``rank``."""
        for addr, first, n in self.hosts:
            if first <= rank < first + n:
                return addr
        return self.agent_addr

    def point(self, rank: int) -> Point:
        """Proc ``rank`` as a point of the whole proc mesh, e.g. ``{'procs': 2/4}``."""
        return (
            Point(rank, self.extent) if self.extent.nelements == len(self.addrs) else Point(0, Extent([], []))
        )

    def state(self) -> MeshState:
        st = _states.get((self.name, self.token))
        if st is None:
            st = _states.setdefault((self.name, self.token), MeshState(self))
        return st

    def fanout(self) -> Any:
        """The native fan-out through the hosts' relays (RELAY-1, ORDER-1) for a mesh
        across hosts; None for a mesh on no hosts (its calls go to each worker)."""
        return self.state().fanout(self.hosts) if self.hosts and FAN_OUT else None

    def command_calls(
        self,
        command: Any,
        conns: list[Any],
        ranks: list[int],
        unary: Callable[[Any], Any],
        payload: bytes = b"",
        buffers: Sequence[Any] = (),
        origin: str = "",
    ) -> list[Any]:
        """The calls of a spawn or a stop (``command``: ``_native.Endpoint.spawning``
        or ``stopping``) to procs ``ranks`` on ``conns``: as a call, through the hosts'
        relays, for a mesh across hosts (SPAWN-1); else ``unary(conn)``, the RPC, on
        each connection."""
        fan = self.fanout()
        if fan is not None:
            local = list(range(len(ranks)))
            return list(fan.call(command, conns, ranks, local, payload, list(buffers), False, origin))
        return [unary(c) for c in conns]

    def conns(self, ranks: Sequence[int]) -> list[Any]:
        """Connections to procs ``ranks`` where they are now; fails fast (without
        sending anything) when the mesh is stopped or lost or one of them is dead."""
        st = self.state()
        if st.stopped:
            raise MeshStoppedError(
                f"proc mesh {self.name!r} has been stopped{_why(st)}; spawn a new one with "
                "this_host().spawn_procs(...)",
                mesh=self.name,
            )
        if st.lost is not None:
            raise st.lost
        for r in ranks:
            err = st.dead.get(r)
            if err is not None:
                raise type(err)(
                    f"{err}\nCalls that need rank {r} fail until procs.respawn() restarts it; "
                    "calls to other ranks go on.",
                    mesh=err.mesh,
                    rank=err.rank,
                    host=err.host,
                    pid=err.pid,
                    exit_code=err.exit_code,
                    signal=err.signal,
                    log_tail=err.log_tail,
                )
        return st.connect(ranks)

    def _worker(self, rank: int, wait_exit: float) -> dict[str, Any] | None:
        """What the agent knows of worker ``rank``, waiting up to ``wait_exit`` s for its exit to be recorded."""
        agent = self.agent_of(rank)
        if agent is None:
            return None
        from monarch_kernel.control import agent_client  # (not at a worker's start)

        try:
            client = agent_client(agent, self.token)
            return worker_report(client, rank, wait_exit)
        except MonarchKernelError:
            return None

    def explain(self, exc: BaseException, rank: int, what: str) -> BaseException:
        """Turns a native failure of a call to proc ``rank`` into the error a user sees."""
        if isinstance(exc, MessageTooLargeError):
            return MessageTooLargeError(f"{what}: {exc}")
        if isinstance(exc, MeshTLSError):  # (before its base class: no token was seen)
            return MeshTLSError(f"{what} on rank {rank} of mesh {self.name!r}: {exc}")
        if isinstance(exc, MeshAuthError):
            return MeshAuthError(f"{what}: mesh {self.name!r} rejected the token: {exc}")
        st = self.state()
        if st.stopped:
            return MeshStoppedError(
                f"{what} failed: proc mesh {self.name!r} has been stopped{_why(st)}", mesh=self.name
            )
        if st.lost is not None:
            return st.lost
        if isinstance(exc, ConnectionLost):
            return self.lost(rank, what, str(exc))
        return SupervisionError(
            f"{what} failed on rank {rank} of mesh {self.name!r}: {exc}", mesh=self.name, rank=rank
        )

    def lost(self, rank: int, what: str, cause: str) -> SupervisionError:
        st = self.state()
        others = any(r != rank and r not in st.dead for r in range(len(st.ref.addrs)))
        return death_error(self.name, rank, self._worker(rank, wait_exit=1.0), what, cause, others)

    def fenced(self, message: str, rank: int, what: str) -> MeshOwnershipError:
        return MeshOwnershipError(
            f"{what} on rank {rank} of mesh {self.name!r} was refused: {message}. This controller "
            f"no longer owns the mesh; attach({self.name!r}) takes it back.",
            mesh=self.name,
            rank=rank,
        )

    def rejected(self, message: str, rank: int, what: str) -> SupervisionError:
        return MeshStoppedError(
            f"{what} on rank {rank} of mesh {self.name!r}: {message}", mesh=self.name, rank=rank
        )


def _why(st: MeshState) -> str:
    return f" ({st.stop_reason})" if st.stop_reason else ""


def worker_report(client: Any, rank: int, wait_exit: float) -> dict[str, Any] | None:
    """What ``client``'s agent knows of worker ``rank`` (with its last log lines),
    waiting up to ``wait_exit`` s for an exit to be recorded."""
    deadline = time.monotonic() + wait_exit
    while True:
        info = client.worker(rank)
        if info is None or info["state"] == "exited" or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if info is not None:
        info["log_tail"] = list(client.logs(rank=rank, tail=tail_lines(info)))
    return info


def _others(alive: bool | None) -> str:
    """What a death report says of the mesh's other ranks: only what is known."""
    if alive is None:
        return ""
    if alive:
        return "\nThe other ranks keep running."
    return "\nNo rank of the mesh is left running; procs.respawn() starts them again."


#: Last lines of a dead worker's output in its report; more for a native crash, whose
#: last lines are the Python stack faulthandler wrote (see ``worker/__main__.py``).
TAIL_LINES, CRASH_TAIL_LINES = 10, 24


def tail_lines(info: dict[str, Any]) -> int:
    """How many of a dead worker's last lines its report shows."""
    return CRASH_TAIL_LINES if info.get("signal") else TAIL_LINES


def describe(info: dict[str, Any], cause: str = "") -> str:
    """How a worker ended (or why it does not answer), in words."""
    if info["state"] == "exited":
        if info["signal"]:
            why = f": {info['exit_cause']}" if info.get("exit_cause") else ""
            return f"was killed by signal {info['signal']} ({info['signal_name']}){why}"
        return f"exited with code {info['exit_code']}"
    if info.get("proc_state") == "T":
        return "is stopped (SIGSTOP or a debugger); SIGCONT resumes it"
    return f"stopped answering{f' ({cause})' if cause else ''}"


def death_error(
    mesh: str,
    rank: int,
    info: dict[str, Any] | None,
    what: str | None,
    cause: str = "",
    others_alive: bool | None = None,
) -> SupervisionError:
    """The SupervisionError for worker ``rank`` of ``mesh`` given what its agent said;
    ``others_alive``: whether another rank of the mesh still runs (None: not known,
    and then the message says nothing of them)."""
    prefix = f"{what} failed: the" if what else "The"
    if info is None:
        return SupervisionError(
            f"{prefix} worker of rank {rank} of mesh {mesh!r} is gone ({cause})",
            mesh=mesh,
            rank=rank,
            endpoint=what,
        )
    # Its own lines only: the rank's log holds those of the workers respawned before it.
    tail = [t for t in info.get("log_tail") or [] if getattr(t, "pid", 0) in (0, info["pid"])]
    last = ("; its last output:\n    " + "\n    ".join(tail)) if tail else "; it wrote no output"
    exited = info["state"] == "exited"
    return SupervisionError(
        f"{prefix} worker of rank {rank} of mesh {mesh!r} (pid {info['pid']} on "
        f"{info['host']}) {describe(info, cause)}{last}{_others(others_alive)}",
        mesh=mesh,
        rank=rank,
        host=info["host"],
        pid=info["pid"],
        exit_code=info["exit_code"] if exited and not info["signal"] else None,
        signal=(info["signal"] or None) if exited else None,
        log_tail=tail,
        endpoint=what,
    )
