"""The worker side: the dispatcher that runs actors for the native ``Worker`` server,
and the worker process's entry point (``python -m monarch_kernel.worker``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch_kernel._lazy import lazy_getattr
from monarch_kernel.worker._dispatcher import Dispatcher

if TYPE_CHECKING:
    from monarch_kernel.worker._spmd import MeshCells

# (on first use: a worker that never runs a %%mesh cell never loads it)
_LAZY: dict[str, str] = {"MeshCells": "monarch_kernel.worker._spmd"}

__all__ = ["Dispatcher", "MeshCells"]

__getattr__ = lazy_getattr(__name__, _LAZY)
