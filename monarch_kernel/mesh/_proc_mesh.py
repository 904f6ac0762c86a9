"""``ProcMesh``: processes that actors are spawned on, as every process sees them
(where they come from, ``this_host().spawn_procs`` and ``attach``, is the
controller's: ``controller/_host_mesh.py``)."""

from __future__ import annotations

import logging
import pickle
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from monarch_kernel import _native, _origin
from monarch_kernel._shutdown import Stage, shutdown
from monarch_kernel.actor import _current, is_async_actor
from monarch_kernel.errors import (
    ActorError,
    MeshOwnershipError,
    MeshSpecError,
    SerializationError,
)
from monarch_kernel.mesh import _control
from monarch_kernel.mesh._actor_mesh import ActorMesh, check_endpoint_names, decode_all
from monarch_kernel.mesh._buffers import HEADER, drop_now, drop_when_done
from monarch_kernel.mesh._builtin import call_builtin
from monarch_kernel.mesh._control import MeshControl, MeshFailure, session_for
from monarch_kernel.mesh._future import Done, Future, wait_calls
from monarch_kernel.mesh._proc_ref import ProcRef
from monarch_kernel.mesh._proc_rows import ProcRow, html_table, text_lines
from monarch_kernel.mesh._role import here
from monarch_kernel.mesh._serial import dumps, loads
from monarch_kernel.mesh._shape import MeshTrait, Point, Shape

T = TypeVar("T")


#: Seconds to wait for every worker to construct an actor.
SPAWN_TIMEOUT = 300.0


class ProcMesh(MeshTrait):
    """Processes, laid out over named dims, that actors are spawned on."""

    def __init__(self, proc: ProcRef, shape: Shape) -> None:
        self._proc = proc
        self._shape = shape
        #: The HostMesh it was spawned from (``host_mesh``); None when found otherwise.
        self._host_mesh: Any = None

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._proc, shape)

    @property
    def name(self) -> str:
        return self._proc.name

    def _session(self, what: str) -> MeshControl:
        s = session_for(self._proc)
        if s is None:
            raise MeshSpecError(
                f"{what} needs this process to control mesh {self.name!r}: call attach({self.name!r}) first"
            )
        return s

    @property
    def actors(self) -> Mapping[str, ActorMesh[Any]]:
        """The actor meshes on these procs, by name: those spawned here and, after
        ``attach``, those a previous controller spawned."""
        return _Actors(self)

    def on_failure(self, callback: Callable[[MeshFailure], Any]) -> Callable[[MeshFailure], Any]:
        """Calls ``callback(failure)`` (on a background thread) whenever a worker dies,
        stops answering, answers again, or the whole mesh is lost; also works as a
        decorator. Registered callbacks replace the default line on stderr."""
        self._session("on_failure").callbacks.append(callback)
        return callback

    def status(self) -> list[str]:
        """Each proc's state, by proc rank: "alive", "unresponsive", "dead"; all
        "stopped" or "lost" when the whole mesh is."""
        st = self._proc.state()
        n = len(st.ref.addrs)
        if st.stopped or st.lost is not None:
            return ["stopped" if st.stopped else "lost"] * n
        return [
            "dead" if r in st.dead else "unresponsive" if r in st.unresponsive else "alive" for r in range(n)
        ]

    @property
    def degraded(self) -> bool:
        """True while some procs are dead and others alive."""
        return any(s != "alive" for s in self.status())

    def respawn(self, timeout: float = SPAWN_TIMEOUT) -> list[int]:
        """Restarts dead procs (same ranks) and re-creates their actors with their
        original constructor arguments; returns the restarted ranks. Module state and
        actor state of those procs start afresh; other procs are untouched."""
        return self._session("respawn()").respawn(timeout)

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> Any:  # noqa: N803 (Monarch's name)
        """Creates actor ``Class(*args, **kwargs)`` on every proc, under ``name``.

        Returns an ``ActorMesh`` once every constructor has returned; a constructor that
        raises goes to supervision (Monarch's meaning), and calls to its rank raise its
        ``ActorError``. From the controller, a name already in use is replaced (a cell run
        again replaces its actors); an actor's spawns get a name of their own,
        ``name-<id>``, as in Monarch, so that actors spawning alike never collide.
        """
        if not isinstance(name, str) or not name:
            raise MeshSpecError(f"spawn() needs a non-empty actor name, not {name!r}")
        if _current.get().actor_instance.name != "root" and _control.has_dispatcher():
            name = f"{name}-{uuid.uuid4().hex[:12]}"  # OWN-1: spawned by an actor
        is_async_actor(Class)
        check_endpoint_names(Class)
        what = f"class and constructor arguments of actor {name!r}"
        ranks = list(self._shape.ranks)
        conns = self._proc.conns(ranks)  # first: a dead rank fails before anything is registered
        regs: list[int] = []
        payload, buffers = dumps((Class, args, kwargs), what, self._proc.token, len(ranks), regs)
        origin = _origin.current()
        if origin:
            _origin.touched.add(self._proc.name)
        try:
            calls = self._proc.command_calls(
                _native.Endpoint.spawning(name),
                conns,
                ranks,
                lambda c: c.spawn_actor(name, payload, buffers, origin),
                payload,
                buffers,
                origin,
            )
        except BaseException:
            drop_now(regs)  # (some may have gone; their readers release what they read)
            raise
        drop_when_done(calls, regs)
        replies = wait_calls(calls, SPAWN_TIMEOUT, f"spawn of {name} on {len(calls)} procs")
        failed = f"Actor {name} ({Class.__qualname__}) failed in __init__."
        points = [self._proc.point(base) for base in ranks]
        session = session_for(self._proc)
        init_errors: dict[int, ActorError] = {}
        try:
            decode_all(
                replies, self._proc, ranks, points.__getitem__, f"spawn of {name}", failed=failed, value=False
            )
        except ActorError:
            if session is None:  # nobody supervises this mesh from here: the spawn fails
                raise
            init_errors = self._init_failures(name, replies, ranks, points, failed, session)
        if session is not None:  # so that attach() and respawn() find it
            if payload[:4] == HEADER:  # the record keeps its own copy, for later controllers
                payload, buffers = dumps((Class, args, kwargs), what)
            session.record_actor(
                name, payload, buffers, pickle.dumps(self._shape), hasattr(Class, "__supervise__")
            )
        mesh: ActorMesh[Any] = ActorMesh(name, Class, self._proc, self._shape)
        mesh._init_errors = init_errors
        owner = _current.get().actor_instance.name
        if owner != "root" and _control.has_dispatcher():  # OWN-1: an actor spawned them
            _control.adopt(
                f"actors {name!r} of mesh {self.name!r}", lambda: mesh.stop().get(timeout=30), supervise=False
            )
            self._supervised_by(owner, name, conns, ranks)
        return mesh

    def _supervised_by(self, owner: str, name: str, conns: list[Any], ranks: list[int]) -> None:
        """OWN-1: failures of actors ``name`` (just spawned by actor ``owner`` of this
        process) go to ``owner``: their workers get this process's failures port."""
        calls = call_builtin(
            conns, ranks, "supervise", name, owner, _control.failures_port(), fan=self._proc.fanout()
        )
        wait_calls(calls, SPAWN_TIMEOUT, f"supervision of {name}")

    def _init_failures(
        self,
        name: str,
        replies: list[Any],
        ranks: list[int],
        points: list[Any],
        failed: str,
        session: MeshControl,
    ) -> dict[int, ActorError]:
        """As in Monarch, an exception in ``__init__`` is a failure of the actor, which
        goes to supervision (``on_failure``, the owner's ``__supervise__``,
        ``unhandled_fault_hook``, else the notebook), one per rank; calls to those
        ranks raise it. Returns it by proc rank."""
        errors: dict[int, ActorError] = {}
        for reply, base, point in zip(replies, ranks, points):
            try:
                decode_all(
                    [reply],
                    self._proc,
                    [base],
                    [point].__getitem__,
                    f"spawn of {name}",
                    failed=failed,
                    value=False,
                )
            except ActorError as e:
                errors[base] = e
        for base, err in errors.items():
            session.report(
                MeshFailure(
                    self.name, "actor_failed", f"actor {name} on rank {base} failed in __init__: {err}", base
                )
            )
        return errors

    def setup_torch_distributed(self, backend: str = "auto", timeout: float = 60.0) -> dict[str, Any]:
        """Sets up torch.distributed on these procs: ``MASTER_ADDR``, ``MASTER_PORT`` (a
        free port), ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in each proc's
        environment, then ``init_process_group`` on every rank. ``backend`` is
        "gloo", "nccl" or "auto" (nccl where the procs have GPUs, else gloo). Calling it
        again is a no-op. A rank that does not join within ``timeout`` seconds, or
        fails, is named in the ``DistributedSetupError``. Returns the backend, world
        size, master address and whether a group was created now."""
        return self._session("setup_torch_distributed()").setup_torch_distributed(self, backend, timeout)

    def logging_option(
        self, stream_to_client: bool = True, aggregate_window_sec: float | None = 3, level: int = logging.INFO
    ) -> Future[None]:
        """Monarch's: whether the workers' output is shown here (``stream_to_client``;
        ``logs()`` keeps every line either way); ``aggregate_window_sec``: the lines
        that come within that many seconds are shown once each, with the ranks that
        wrote them and a count (``[mesh ranks 0-7] [8 similar log lines] loss 0.31``;
        None or 0: each line as it comes); and the level of the workers' root logger.
        A ``%%mesh`` cell's own output keeps its view (its blocks, or its merged
        lines)."""
        if aggregate_window_sec is not None and (
            not isinstance(aggregate_window_sec, (int, float)) or aggregate_window_sec < 0
        ):
            raise ValueError(
                f"aggregate_window_sec must be None or a number >= 0, not {aggregate_window_sec!r}"
            )
        if not isinstance(level, int):
            raise ValueError(f"level must be a logging level (logging.INFO, ...), not {level!r}")
        self._session("logging_option()").logging_option(stream_to_client, level, aggregate_window_sec)
        return Done(None)  # done already; Monarch's is async: its code awaits it, or asyncio.run()s it

    def sync_workspace(
        self, workspace: Any = None, conda: bool = False, auto_reload: bool = False
    ) -> Future[Any]:
        """Sends ``workspace`` to the hosts of these procs, only what changed since the
        last sync and once per host (through the transfer engine), for meshes whose
        hosts do not share this filesystem (pods, hosts without NFS): None is the
        working directory, at the root of the hosts' copy; a folder or a list of them
        go each under its own name; ``{folder: destination}`` or a ``Workspace`` as
        given. The procs then import from that copy first, and with ``auto_reload``
        reload the modules whose files changed. The ``Future``'s value (it is done
        already; Monarch's is async) says what was sent and reloaded. ``conda=True``
        (Monarch's copy of the active conda environment) is refused."""
        if conda:
            raise MeshSpecError(
                "sync_workspace(conda=True): the hosts' Python environment is not copied here; install "
                "packages in the image (Kubernetes) or on the hosts, and sync your own code with sync_workspace()"
            )
        ranks = list(self._shape.ranks)
        return Done(self._session("sync_workspace()").sync_workspace(ranks, workspace, auto_reload))

    def stop(self, reason: str = "stopped by the user") -> Future[None]:
        """Stops every worker and the host agent, and forgets the mesh's name. Later
        calls raise MeshStoppedError, which gives ``reason``."""
        st = self._proc.state()
        st.stop_reason = str(reason)
        session = session_for(self._proc)
        if session is not None:
            session.stop(timeout=10)
        elif st.fenced:
            raise MeshOwnershipError(
                f"mesh {self.name!r} is controlled by another controller now; attach({self.name!r}) first "
                "to stop it from here (or: monarch-kernel down NAME)",
                mesh=self.name,
            )
        elif not st.stopped and self._proc.agent_addr is not None:
            from monarch_kernel.hosts import registry, stop_unowned  # (grpcio: only when needed)

            rec = registry.read(self.name)
            if rec is not None and rec.token == self._proc.token:
                stop_unowned(rec)
        st.stopped = True
        st.changed()
        return Future._resolved(None)

    @property
    def initialized(self) -> Future[bool]:
        return Future._resolved(True)

    @property
    def host_mesh(self) -> Any:
        """The ``HostMesh`` these procs were spawned from; None for a mesh found
        with ``attach`` (its state file says where it runs: ``list_meshes()``)."""
        return self._host_mesh

    def logs(self, rank: int | None = None, tail: int = 100, labelled: bool = False) -> list[str]:
        """The last ``tail`` lines the workers printed (of one rank, or of each rank),
        oldest first: the lines of all ranks in the order they were printed.
        ``labelled``: each line starts with ``[rank N] ``."""
        return self._session("logs()").logs(rank, tail, labelled)

    def stream_logs(self, rank: int | None = None) -> Iterator[str]:
        """Output lines as the workers print them, ``[mesh rank] text``; runs until
        the iterator is closed (``break`` out of the loop)."""
        return self._session("stream_logs()").stream_logs(rank)

    # -- distributed tensors (the tensor engine lives in monarch_kernel.tensor) --

    def activate(self) -> AbstractContextManager[None]:
        """Within the block, torch code runs on these procs: each op makes one tensor
        per proc (a ``monarch_kernel.Tensor``), issued without a round trip. Blocks
        nest; ``no_mesh.activate()`` runs locally inside one."""
        return self._session("activate()").activate(self)  # type: ignore[no-any-return]

    def rank_tensor(self, dim: str | Sequence[str]) -> Any:
        """A 0-d long mesh tensor: each proc's index along ``dim`` (row-major over several)."""
        return self._session("rank_tensor()").rank_tensor(self, dim)

    def rank_tensors(self) -> dict[str, Any]:
        """``rank_tensor(dim)`` for each dimension."""
        return {d: self.rank_tensor(d) for d in self._shape.labels}

    def to_table(self) -> str:
        """A text table of the procs by their coordinates (Monarch's ``to_table``):
        each cell is the proc's rank, and its host where there are several."""
        labels, sizes = self._shape.labels, [self._shape.extent[d] for d in self._shape.labels]
        multi = len(self._proc.hosts) > 1

        def cell(r: int) -> str:
            return f"{self._proc.host_of(r)}.{r}" if multi else str(r)

        cells = [cell(r) for r in self._shape.ranks]
        if not labels:
            return "(no procs)"
        if len(labels) == 1:
            return f"{labels[0]}: " + "  ".join(f"{i}={c}" for i, c in enumerate(cells))
        cols = sizes[-1]
        rows_label = " x ".join(labels[:-1])
        width = max(len(c) for c in cells + [str(cols)]) + 1
        lines = [
            f"{rows_label} \\ {labels[-1]}".ljust(12) + "".join(str(i).rjust(width) for i in range(cols))
        ]
        for i in range(len(cells) // cols):
            first = Point(i * cols, self._shape.extent)  # the row's first proc
            name = ",".join(str(first[d]) for d in labels[:-1])
            lines.append(name.ljust(12) + "".join(c.rjust(width) for c in cells[i * cols : (i + 1) * cols]))
        return "\n".join(lines)

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ProcMesh(name={self._proc.name!r}, shape={self._shape.extent})"

    def proc_rows(self) -> list[ProcRow]:
        """One row per proc of this (sliced) mesh: state, pid, host, restarts and the
        first line of its death report. ``%mesh status`` and the mesh's own repr
        show these rows."""
        session = session_for(self._proc)
        try:
            workers = session.workers() if session is not None else {}
        except Exception:  # the agent does not answer: show what is known here
            workers = {}
        states = self.status()
        errors = self.death_lines()
        rows = []
        for r in self._shape.ranks:
            w = workers.get(r, {})
            rows.append(
                ProcRow(
                    rank=r,
                    state=states[r] if r < len(states) else "?",
                    pid=int(w.get("pid", 0)),
                    host=str(w.get("host", "")),
                    restarts=int(w.get("restarts", 0)),
                    error=errors.get(r, ""),
                )
            )
        return rows

    def death_lines(self) -> dict[int, str]:
        """The first line of the death report of each dead rank of this mesh (what
        ``proc_rows`` and the inspector show), known here: no agent is asked."""
        dead = self._proc.state().dead
        return {r: str(dead[r]).splitlines()[0] for r in self._shape.ranks if r in dead}

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text("\n".join([repr(self), *text_lines(self.proc_rows())]))

    def _repr_html_(self) -> str:
        """A static table (what nbconvert and GitHub show of a mesh); a summary from
        ``COMPACT_FROM`` procs on (``_proc_rows``)."""
        import html

        title = f"<b>ProcMesh {html.escape(self.name)}</b> {html.escape(str(self._shape.extent))}"
        return title + html_table(self.proc_rows())

    def __reduce__(self) -> Any:
        return (ProcMesh, (self._proc, self._shape))


class _Actors(Mapping[str, "ActorMesh[Any]"]):
    """``ProcMesh.actors``: actor meshes by name, unpickled on access."""

    def __init__(self, procs: ProcMesh) -> None:
        self._procs = procs
        s = session_for(procs._proc)
        self._records = dict(s.records) if s is not None else {}

    def __getitem__(self, name: str) -> ActorMesh[Any]:
        rec = self._records.get(name)
        if rec is None:
            known = ", ".join(map(repr, self._records)) or "none"
            raise KeyError(f"no actor mesh named {name!r} on mesh {self._procs.name!r} (known: {known})")
        payload, buffers, shape_blob = rec
        try:
            cls = loads(payload, buffers)[0]
        except Exception as e:
            raise SerializationError(
                f"actor mesh {name!r}: its class cannot be unpickled here ({type(e).__name__}: {e}); "
                "import or define the class in this process first"
            ) from e
        return ActorMesh(name, cls, self._procs._proc, loads(shape_blob))

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"<actors of mesh {self._procs.name!r}: {', '.join(self._records) or 'none'}>"


# The native runtime goes last, after the controller's meshes stop (Stage.MESHES).
shutdown.at(Stage.RUNTIME, _native.shutdown_runtime)


def current_proc() -> ProcMesh | None:
    """This process as a one-proc mesh, once a worker (or ``this_proc()``) set it."""
    mesh: ProcMesh | None = here.this_proc
    return mesh


__all__ = ["ProcMesh", "ProcRow", "current_proc"]
