"""``this_proc()``: this process as a one-proc mesh (in a controller, a worker server
and dispatcher of its own, started on first use)."""

from __future__ import annotations

import os
import secrets
import threading

from monarch_kernel import _native
from monarch_kernel.mesh import Extent, Point, ProcMesh, ProcRef, Shape, current_proc, set_this_proc
from monarch_kernel.worker import Dispatcher

_this_proc_lock = threading.Lock()


def this_proc() -> ProcMesh:
    """The process this code runs in, as a one-proc mesh. In the controller, actors
    spawned on it run in this process (on background threads)."""
    with _this_proc_lock:
        mesh = current_proc()
        if mesh is None:
            token = secrets.token_urlsafe(32)
            # Reachable from other hosts once a mesh across hosts set where (ports)
            host = os.environ.get("MONARCH_TRANSFER_HOST", "127.0.0.1")
            server = _native.WorkerServer(token, addr=f"{host}:0")
            Dispatcher(server, Point(0, Extent([], [])), token).start()
            mesh = ProcMesh(ProcRef("this_proc", token, (server.addr,)), Shape(Extent([], [])))
            set_this_proc(mesh)
        return mesh


__all__ = ["this_proc"]
