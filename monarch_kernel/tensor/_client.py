"""``TensorClient``: the controller's side of one mesh's tensor engine. It spawns the
engine's built-in actors, hands out ref ids, batches commands and sends each batch as
one one-way message to the procs it is for (TENSOR-2), sets up the process groups
that collectives use, and fetches values at sync points.

TENSOR-2: commands leave in the order they were issued. A batch goes when a command
for other procs comes (so each proc sees its commands in order), when it is full,
at a sync point (a fetch, leaving ``activate()``), or after ``QUIET_S`` with no new
command; no command waits for a reply.

TENSOR-4: a proc's death fails every tensor of its mesh made before it: the next
sync point on one raises the death's SupervisionError (the proc's table is gone, and
a collective with it cannot run). Tensors made after a respawn work.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Any

from monarch_kernel.errors import SupervisionError
from monarch_kernel.mesh import Extent, ProcMesh, Shape
from monarch_kernel.tensor import _commands as C
from monarch_kernel.tensor._stream import get_active_stream

#: Commands per message at most (a full batch goes at once).
BATCH = 1024
#: A batch goes after this long with no new command.
QUIET_S = 0.001
#: Deleted refs wait to go until there are this many (or a sync point).
DELETES = 256

ENGINE = "__tensor_engine__"
INBOX = "__tensor_inbox__"

_clients: dict[tuple[str, str], TensorClient] = {}
_clients_lock = threading.Lock()


def client_of(procs: ProcMesh) -> TensorClient:
    """The tensor engine of ``procs``'s whole mesh (started on first use)."""
    key = (procs._proc.name, procs._proc.token)
    with _clients_lock:
        c = _clients.get(key)
        if c is None or c.closed:
            c = _clients[key] = TensorClient(procs)
        return c


class TensorClient:
    def __init__(self, procs: ProcMesh) -> None:
        from monarch_kernel.tensor._engine import TensorEngine, TensorInbox

        self.root = ProcMesh(procs._proc, Shape(procs._proc.extent))
        inbox = self.root.spawn(INBOX, TensorInbox)
        self.engine = self.root.spawn(ENGINE, TensorEngine, inbox)
        self._ids = itertools.count(1)
        #: Guards the batch: the quiet flusher sends from its own thread.
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._batch: list[tuple[Any, ...]] = []
        self._target: Shape | None = None
        self._seq = 0
        #: Appended to by Tensor.__del__ (any thread; list.append is atomic).
        self.deleted: list[int] = []
        self._groups: set[Any] = set()
        self._dist = False
        #: Raised by every later sync on a tensor made before it (a proc died).
        self.failure: SupervisionError | None = None
        self.gen = 0
        self._state_gen = -1
        #: This process's view of the mesh (dead ranks, stopped).
        self._state = self.root._proc.state()
        self.held = 0  # coalescing() blocks held open
        self.closed = False
        self._engines: dict[Shape, Any] = {}
        self._fetchers: dict[int, Any] = {}
        threading.Thread(
            target=_flusher, args=(weakref.ref(self),), name="monarch-tensor-flush", daemon=True
        ).start()

    def new_id(self) -> int:
        return next(self._ids)

    # -- sending ------------------------------------------------------------------------

    def send(self, shape: Shape, cmd: tuple[Any, ...]) -> None:
        stream = get_active_stream()
        if stream is not None and not stream.default:
            cmd = (C.ON, stream.name, cmd)
        with self._lock:
            if self._target is not None and self._target != shape:
                self._flush_locked()
            self._target = shape
            self._batch.append(cmd)
            self._seq += 1
            if len(self._batch) >= BATCH:
                self._flush_locked()
            elif len(self._batch) == 1:
                self._wake.notify()

    def flush(self, deletes: bool = True) -> None:
        if not self._batch and not self.deleted:  # (a sync point's hot path: nothing to send)
            return
        with self._lock:
            self._flush_locked()
            if deletes or len(self.deleted) >= DELETES:
                self._send_deletes()

    def engine_at(self, shape: Shape) -> Any:
        """The engine's actor mesh on the procs of ``shape`` (kept per shape)."""
        e = self._engines.get(shape)
        if e is None:
            e = self._engines[shape] = self.engine._new_with_shape(shape)
        return e

    def _flush_locked(self) -> None:
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        assert self._target is not None
        self.engine_at(self._target).run.broadcast(batch)
        if len(self.deleted) >= DELETES:
            self._send_deletes()

    def _send_deletes(self) -> None:
        if not self.deleted:
            return
        n = len(self.deleted)
        ids, self.deleted[:n] = self.deleted[:n], []
        self.engine_at(self.root._shape).run.broadcast([(C.DEL, ids)])

    def quiet_flush(self) -> bool:
        """Sends the batch if no command came for ``QUIET_S``; False once closed (or
        its mesh stopped or lost: the client goes, and the next ``client_of`` makes one)."""
        with self._lock:
            while not self._batch and not self.closed:
                self._wake.wait(1.0)
                if self._ended():
                    self.close()
            if self.closed:
                return False
            seen = self._seq
        time.sleep(QUIET_S)
        with self._lock:
            if self._seq == seen and self._batch and not self.held:
                try:
                    self._flush_locked()
                except Exception:  # a stopped mesh: the next sync says so
                    self._batch.clear()
        return True

    # -- collectives --------------------------------------------------------------------

    def group(self, shape: Shape, dims: tuple[str, ...]) -> Any:
        """The key of the process groups over ``dims`` of mesh ``shape`` (made on first use)."""
        key = (shape.labels, shape.ranks, dims)
        if key in self._groups:
            return key
        if not self._dist:
            self.flush()
            self.root.setup_torch_distributed("auto")
            self._dist = True
        groups = _groups_along(shape, dims)
        self.send(self.root._shape, (C.GROUP, key, groups))
        self._groups.add(key)
        return key

    # -- sync points --------------------------------------------------------------------

    def check(self, gen: int) -> None:
        """Raises the SupervisionError of a proc that died since generation ``gen``
        (every tensor made before a death is gone with it: TENSOR-4)."""
        state = self._state
        if state.gen != self._state_gen:
            self._state_gen = state.gen
            err = state.lost or next(iter(state.dead.values()), None)
            if err is None and state.stopped:
                err = SupervisionError(f"mesh {self.root.name!r} is stopped")
            if err is not None:
                self.failure = err
                self.gen += 1
                # The procs' groups go with a respawn: make them again on next use.
                self._groups.clear()
                self._dist = False
        if self.failure is not None and gen < self.gen:
            raise self.failure

    def engine_at_rank(self, rank: int) -> Any:
        return self.engine_at(Shape(Extent(["_"], [1]), [rank]))

    def fetcher(self, rank: int) -> Any:
        """The engine's ``fetch`` endpoint on proc ``rank`` (kept: a sync point's hot path)."""
        f = self._fetchers.get(rank)
        if f is None:
            f = self._fetchers[rank] = self.engine_at_rank(rank).fetch
        return f

    def _ended(self) -> bool:
        return self._state.stopped or self._state.lost is not None

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._wake.notify_all()
        with _clients_lock:
            key = (self.root._proc.name, self.root._proc.token)
            if _clients.get(key) is self:
                del _clients[key]


def _flusher(ref: weakref.ref[TensorClient]) -> None:
    while True:
        c = ref()
        if c is None or not c.quiet_flush():
            return
        del c


def _groups_along(shape: Shape, dims: tuple[str, ...]) -> list[list[int]]:
    """The proc ranks of each group that varies along ``dims`` (the others fixed)."""
    others = [d for d in shape.labels if d not in dims]
    return [
        list(shape.slice(**dict(zip(others, coords))).ranks)
        for coords in itertools.product(*(range(shape.extent[d]) for d in others))
    ]
