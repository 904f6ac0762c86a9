"""The active mesh: ``ProcMesh.activate()``, under which torch code runs on the
mesh's procs, ``no_mesh`` and ``get_active_mesh`` (Monarch's names). A dispatch mode
sends ops to ``_tensor.run_op`` while a mesh is active; blocks nest, per thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from monarch_kernel.mesh import ProcMesh
from monarch_kernel.tensor._client import client_of
from monarch_kernel.tensor._tensor import run_op

_local = threading.local()


def _stack() -> list[ProcMesh | None]:
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def active_mesh() -> ProcMesh | None:
    s = _stack()
    return s[-1] if s else None


class _ActiveMesh(TorchDispatchMode):
    """Routes ops to the active mesh while one is active: ops on mesh tensors, and
    factories (``torch.rand``, ``torch.tensor``); an op on local tensors only stays
    local (so a fetched value prints as usual)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        mesh = active_mesh()
        if mesh is None:
            return func(*args, **(kwargs or {}))
        return run_op(func, args, kwargs or {}, mesh)


@contextlib.contextmanager
def activate(mesh: ProcMesh | None) -> Iterator[None]:
    """Makes ``mesh`` the active mesh (None: run locally) until the block ends; a
    block inside another takes over, and gives back when it ends."""
    stack = _stack()
    client = client_of(mesh) if mesh is not None else None
    stack.append(mesh)
    mode = _ActiveMesh() if len(stack) == 1 else None  # the outermost block's, for all
    if mode is not None:
        mode.__enter__()
    try:
        yield
    finally:
        stack.pop()
        if mode is not None:
            mode.__exit__(None, None, None)
        if client is not None:
            client.flush(deletes=False)


class _NoMesh:
    """``no_mesh.activate()``: torch runs locally inside the block, even within a mesh's."""

    def activate(self) -> contextlib.AbstractContextManager[None]:
        return activate(None)


no_mesh = _NoMesh()


def get_active_mesh() -> ProcMesh:
    """The active mesh (Monarch's meaning); ValueError if none is."""
    m = active_mesh()
    if m is None:
        raise ValueError("no device mesh is active: use `with procs.activate():` first")
    return m
