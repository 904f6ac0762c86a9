"""``TransferBuffer``: an explicit handle on memory, in the shape of Monarch's
``RDMABuffer``, and mesh helpers to gather and scatter tensors.

A ``TransferBuffer`` wraps a tensor or any contiguous buffer where it lives. Passed
to an actor (or returned from one), it travels as a small descriptor; the receiver
then pulls the bytes with ``read_into(dst)`` or pushes with ``write_from(src)``,
through the transfer engine, with the GIL released. The owner keeps the memory
registered until it calls ``drop()`` (or the handle is garbage collected there).

XFER-6: a handle is a capability. Its registration is made under a token of its own
(random, not the mesh's), which travels with the descriptor: whoever holds the
handle, in any mesh of the controller's tree or in the controller, can read, write
and drop that one buffer, and nothing else of its owner.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from monarch_kernel import _native
from monarch_kernel.mesh import _buffers
from monarch_kernel.mesh._future import Future
from monarch_kernel.mesh._shape import Point, Shape
from monarch_kernel.mesh._value_mesh import ValueMesh


def _byte_view(data: Any) -> tuple[memoryview, Any]:
    """A flat byte view of ``data`` (a tensor's memory for tensors), and what keeps it."""
    if _buffers.is_tensor(data):
        import torch

        t = data.detach()
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("TransferBuffer needs a contiguous CPU tensor; use .contiguous() / .cpu() first")
        u8 = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        arr: Any = u8.numpy()
        return memoryview(arr), t
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError(
            "TransferBuffer needs a C-contiguous buffer (this one is strided or in Fortran order); "
            "use numpy.ascontiguousarray(...) first"
        )
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view, data


class _ThreadFuture(Future[Any]):
    """A Future whose value comes from ``fn()`` run on a thread (the native part
    releases the GIL); with ``timeout``, one not done that many seconds after it
    started is a ``TimeoutError``."""

    __slots__ = ("_done", "_deadline")

    def __init__(self, fn: Callable[[], Any], timeout: float | None = None) -> None:
        super().__init__(_calls=[], _finish=lambda _: None)
        self._done = threading.Event()
        self._deadline = None if timeout is None else time.monotonic() + timeout

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as e:
                self._error, self._value = e, None
            finally:
                self._done.set()

        threading.Thread(target=run, name="monarch-transfer", daemon=True).start()

    def done(self) -> bool:
        return self._done.is_set()

    def get(self, timeout: float | None = None) -> Any:
        if self._deadline is not None:
            left = max(0.0, self._deadline - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        if not self._done.wait(timeout):
            raise TimeoutError(f"the transfer did not finish within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._value

    result = get

    async def _until_done(self) -> None:
        import asyncio

        await asyncio.get_running_loop().run_in_executor(None, self._done.wait)


class TransferBuffer:
    """A handle on ``data`` (a contiguous tensor or buffer) that any process it is
    sent to (an actor of any mesh, the controller) can read from and write into."""

    def __init__(self, data: Any) -> None:
        self._view, self._keep = _byte_view(data)
        #: XFER-6: this buffer's own token; registered on the first send.
        self._cap = secrets.token_urlsafe(32)
        self._desc: _native.Descriptor | None = None
        self._remote: _native.Descriptor | None = None
        self._dropped = False

    @property
    def nbytes(self) -> int:
        return self._view.nbytes if self._remote is None else self._remote.len

    size = nbytes

    @property
    def backend(self) -> str:
        """What moves the bytes: ``"tcp"``, the native transfer engine (Monarch's
        ``RDMABuffer.backend``; there is no RDMA path here)."""
        return "tcp"

    @property
    def owner(self) -> str:
        """Where the memory lives: ``"here"``, or the owner's transfer-engine address."""
        return "here" if self._remote is None else self._remote.addr

    def _check(self) -> None:
        if self._dropped:
            raise RuntimeError("this TransferBuffer was dropped")

    def __reduce__(self) -> Any:
        self._check()
        if self._remote is not None:
            return (_remote, (self._remote, self._cap))
        if self._desc is None:
            self._desc = _native.xfer_register(
                self._view,
                self._cap,
                _native.XFER_HANDLE,
                None,
                writable=not self._view.readonly,
                own_token=True,
            )
        return (_remote, (self._desc, self._cap))

    def read_into(self, dst: Any, *, timeout: float | None = None) -> Future[None]:
        """Copies the whole buffer into ``dst`` (a contiguous tensor or buffer of the
        same byte size); ``.get()`` or ``await`` the result. With ``timeout``, a copy
        not done that many seconds after it started is a ``TimeoutError``."""
        self._check()
        view, _keep = _byte_view(dst)
        if view.nbytes != self.nbytes:
            raise ValueError(f"read_into: destination has {view.nbytes} bytes, the buffer {self.nbytes}")
        if self._remote is None:
            src = self._view
            return _ThreadFuture(lambda: view.__setitem__(slice(None), src), timeout)
        desc, cap = self._remote, self._cap
        return _ThreadFuture(lambda: desc.fetch(cap, view, _buffers.STREAMS, handle=True), timeout)

    def write_from(self, src: Any, *, timeout: float | None = None) -> Future[None]:
        """Copies ``src`` (same byte size) into the buffer, wherever it lives (with
        ``timeout``: as ``read_into``)."""
        self._check()
        view, _keep = _byte_view(src)
        if view.nbytes != self.nbytes:
            raise ValueError(f"write_from: source has {view.nbytes} bytes, the buffer {self.nbytes}")
        if self._remote is None:
            dst = self._view
            return _ThreadFuture(lambda: dst.__setitem__(slice(None), view), timeout)
        desc, cap = self._remote, self._cap
        return _ThreadFuture(lambda: desc.write(cap, view, 0), timeout)

    def drop(self) -> Future[None]:
        """Ends the registration, from the owner or from any holder of the handle: the
        memory is no longer reachable (the owner's tensor itself is untouched).
        Without ``drop()``, a registration lasts as long as its owner process."""
        if not self._dropped:
            if self._remote is None:
                if self._desc is not None:
                    _native.xfer_drop(self._desc.id)
            else:
                self._remote.release(self._cap)
        self._dropped = True
        return Future._resolved(None)

    def __repr__(self) -> str:
        where = "remote" if self._remote is not None else "local"
        return f"<TransferBuffer {self.nbytes:,} bytes, {where}>"


def _remote(desc: _native.Descriptor, cap: str) -> TransferBuffer:
    b = TransferBuffer.__new__(TransferBuffer)
    b._view, b._keep, b._cap, b._desc, b._remote, b._dropped = memoryview(b""), None, cap, None, desc, False
    return b


def gather(values: Any, stack: bool = False, *, dim: int | None = None, mesh_dim: str | None = None) -> Any:
    """Joins the tensors of a ValueMesh (from ``endpoint.call().get()``, so they came
    through the transfer engine) into the controller.

    - ``gather(v)``: the ValueMesh as it is.
    - ``gather(v, stack=True)``: stacked along a new first dimension (or ``dim``).
    - ``gather(v, dim=d)``: the shards of one tensor, concatenated along its dimension
      ``d`` in rank order.
    - ``mesh_dim="tp"``: join only along that mesh dimension; the result is a ValueMesh
      over the other dimensions (a tensor when there are none), e.g. the tensor-parallel
      shards of each data-parallel replica.
    """
    if not stack and dim is None:
        if mesh_dim is not None:
            raise ValueError("gather(mesh_dim=...) needs dim=D (concatenate) or stack=True")
        return values
    import torch

    def join(tensors: list[Any]) -> Any:
        return torch.stack(tensors, dim or 0) if stack else torch.cat(tensors, dim)  # type: ignore[arg-type]

    items = list(values.items())
    if mesh_dim is None:
        return join([t for _, t in items])
    values._shape._check_dim(mesh_dim)
    rest = [label for label in values._shape.labels if label != mesh_dim]
    groups: dict[tuple[int, ...], list[tuple[int, Any]]] = {}
    for point, t in items:
        groups.setdefault(tuple(point[label] for label in rest), []).append((point[mesh_dim], t))
    joined = {k: join([t for _, t in sorted(g, key=lambda c: c[0])]) for k, g in groups.items()}
    if not rest:
        return joined[()]
    sub = values.slice(**{mesh_dim: 0})
    return ValueMesh(sub._shape, [joined[tuple(p[label] for label in rest)] for p, _ in sub.items()])


def scatter(
    endpoint: Any, tensor: Any, *args: Any, dim: int = 0, mesh_dim: str | None = None, **kwargs: Any
) -> Future[Any]:
    """Splits ``tensor`` along its dimension ``dim`` into one shard per rank of
    ``endpoint``'s mesh (or per index of the mesh dimension ``mesh_dim``, each shard
    then going to every proc at that index) and calls ``endpoint`` on each rank with
    its shard first; a Future of the ValueMesh of their results. Shards travel
    through the transfer engine."""
    import torch

    mesh = endpoint._mesh
    extent = mesh._shape.extent
    points = [Point(i, extent) for i in range(len(mesh._shape))]
    if mesh_dim is None:
        shards = torch.tensor_split(tensor, len(points), dim=dim)
        shard_of = list(range(len(points)))
    else:
        mesh._shape._check_dim(mesh_dim)
        shards = torch.tensor_split(tensor, extent[mesh_dim], dim=dim)
        shard_of = [p[mesh_dim] for p in points]
    futures = [
        getattr(mesh.slice(**dict(p)), endpoint._name).call_one(shards[k].contiguous(), *args, **kwargs)
        for p, k in zip(points, shard_of)
    ]
    shape = Shape(extent)
    return _ThreadFuture(lambda: ValueMesh(shape, [f.get() for f in futures]))


__all__ = ["TransferBuffer", "gather", "scatter"]
