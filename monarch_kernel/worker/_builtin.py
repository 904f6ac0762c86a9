"""The actor every worker has without spawning it (``_wire.BUILTIN``): what the
controller asks of a worker itself (flush marks, stacks, pdb input, post-mortem...).

``WorkerBuiltin`` is an actor whose ``@endpoint``s are called as every actor's are
(``mesh._builtin.call_builtin``: arguments pickled as ``(args, kwargs)``, the
reply a pickled value, an exception or a refusal). Unlike another actor's, its calls
are served by the dispatcher's routing thread itself (``serve_builtin``), never
queued behind an actor's: ``stacks`` and ``busy`` answer while every actor of the
worker is busy. An endpoint that waits for the user (``post_mortem``) runs on a
thread of its own instead.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native, _origin
from monarch_kernel._wire import BUILTIN
from monarch_kernel.actor import Actor, endpoint, endpoints_of
from monarch_kernel.mesh import loads
from monarch_kernel.worker import _debug, _output
from monarch_kernel.worker._lanes import thread_stacks

if TYPE_CHECKING:
    from monarch_kernel.worker._state import DispatcherLike


class WorkerBuiltin(Actor):
    """The built-in actor of one worker's dispatcher (see the module docstring)."""

    #: Endpoints that run on a thread of their own, not on the routing thread: they
    #: wait for the user (a debugging session) or for files and the network (a
    #: workspace sync), and the routing thread must not.
    OWN_THREAD = frozenset({"post_mortem", "workspace_apply", "workspace_use"})

    def __init__(self, dispatcher: DispatcherLike) -> None:
        self._d = dispatcher

    @endpoint
    def flush(self) -> None:
        """Writes an end-of-output marker, tagged with the call's origin, to stdout
        and stderr; once the caller has seen both, it has seen everything this worker
        printed for that origin before the call (the pipes are in order)."""
        _output.mark_end()

    @endpoint
    def pdb_input(self, line: str) -> bool:
        """``line`` is the next line for the debugger waiting longest in this worker
        (see ``_debug``); whether one was waiting."""
        return _debug.feed(line)

    @endpoint
    def debug_waiting(self) -> list[str]:
        """Where each debugger of this worker that waits for a line stands
        (``file:line``), longest first: ``monarch-kernel debug`` lists them."""
        return _debug.waiting()

    @endpoint
    def post_mortem(self) -> bool:
        """pdb on this worker's last exception; answers when the session ends."""
        return _debug.post_mortem()

    @endpoint
    def busy(self) -> list[tuple[int, str, str]]:
        """What the worker's actors run now (see ``running_calls``)."""
        return running_calls(self._d)

    @endpoint
    def stacks(self) -> str:
        """The current Python stack of every thread, as text; works while the main
        thread or an actor is busy in Python code."""
        return thread_stacks()

    @endpoint
    def comm_msg(self, msg: dict[str, Any]) -> None:
        """DISPLAY-2, the way back: ``msg`` (``comm_id``, ``data``, ``buffers`` in
        base64) is what the front end sent to one of this worker's comms; it is
        handed to that comm."""
        _comm_msg(msg)

    @endpoint
    def supervise(self, actor: str, owner: str, port: Any) -> None:
        """OWN-1: failures of ``actor`` here go on ``port`` to the actor ``owner``
        that spawned it."""
        self._d._supervisors[actor] = (owner, port)

    @endpoint
    def root(self, root: str) -> None:
        """SINGLE-1: a controller attached; ``MONARCH_ROOT`` becomes ``root``."""
        import os

        os.environ["MONARCH_ROOT"] = root

    @endpoint
    def log_level(self, level: int) -> None:
        """``ProcMesh.logging_option(level=...)``: the root logger's level."""
        import logging

        logging.getLogger().setLevel(int(level))

    @endpoint
    def workspace_plan(self, mesh: str, manifest: dict[str, str]) -> list[str]:
        """Workspace sync: the files of ``manifest`` this host lacks (``_workspace``)."""
        from monarch_kernel.worker import _workspace

        return _workspace.plan(mesh, manifest)

    @endpoint
    def workspace_apply(
        self, mesh: str, manifest: dict[str, str], buffer: Any, index: list[tuple[str, int, int, int]]
    ) -> int:
        """Workspace sync: writes the changed files on this host (``_workspace``)."""
        from monarch_kernel.worker import _workspace

        return _workspace.apply(mesh, manifest, buffer, index)

    @endpoint
    def workspace_use(
        self, mesh: str, folders: list[str] | None, changed: list[str], reload: bool
    ) -> list[str]:
        """Workspace sync: this proc imports from the host's copy, and reloads what
        changed on request; ``folders`` None: as the last sync of its mesh on this
        host said, if any (a respawned proc; ``_workspace``)."""
        from monarch_kernel.worker import _workspace

        return _workspace.use(mesh, folders, changed, reload, self._d.token)

    @endpoint
    def calls_in_flight(self) -> int:
        """How many calls this worker holds unanswered (queued or running), this one
        not counted: what ``Stats`` says, asked as a call so that it can go through the
        hosts' relays (START-1)."""
        return max(0, self._d.server.in_flight() - 1)

    @endpoint
    def usage(self) -> dict[str, Any]:
        """This worker's CPU (percent since the last ``usage``), resident memory and,
        where NVML lists its GPU, the GPU's use and this process's GPU memory,
        measured on its own host (the inspector shows them for every host)."""
        return usage()


#: The names ``serve_builtin`` answers: ``WorkerBuiltin``'s endpoints, nothing else.
ENDPOINTS = frozenset(endpoints_of(WorkerBuiltin))


def serve_builtin(d: DispatcherLike, item: _native.Incoming) -> None:
    """A call to the built-in actor (``BUILTIN``), on the routing thread: its
    arguments unpickled as every call's, ``d.builtin``'s endpoint run here (or on a
    thread of its own, ``WorkerBuiltin.OWN_THREAD``) with the call's origin, and
    the reply sent. A name that is no endpoint of it is refused."""
    method = item.method
    if method not in ENDPOINTS:
        d._reject(item.token, f"the built-in actor has no method {method!r}")
        return
    args, kwargs = loads(item.payload, item.buffers, d.token)
    run = getattr(d.builtin, method)
    if method in WorkerBuiltin.OWN_THREAD:
        threading.Thread(
            target=_serve,
            args=(d, item.token, item.origin, method, run, args, kwargs),
            name=f"monarch-{method.replace('_', '-')}",
            daemon=True,
        ).start()
    else:
        _serve(d, item.token, item.origin, method, run, args, kwargs)


def _serve(
    d: DispatcherLike,
    token: int,
    origin: str,
    method: str,
    run: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    reset = _origin.set_context(origin)
    try:
        value = run(*args, **kwargs)
    except Exception as e:  # DISPATCH-2: back to the caller, as any endpoint's
        d._reply_exception(token, e, None)
        return
    finally:
        _origin.reset(reset)
    d._reply(token, value, f"{BUILTIN}.{method}")


def _comm_msg(msg: dict[str, Any]) -> None:
    """Hands a front end's message to this worker's comm (on a thread of its own: a
    widget's observers are the user's code)."""
    import base64

    import comm

    target = comm.get_comm_manager().get_comm(msg["comm_id"])
    if target is None:
        return
    full = {
        "header": {"msg_type": "comm_msg"},
        "parent_header": {},
        "metadata": {},
        "content": {"comm_id": msg["comm_id"], "data": msg.get("data", {})},
        "buffers": [base64.b64decode(b) for b in msg.get("buffers", [])],
    }
    threading.Thread(target=target.handle_msg, args=(full,), name="monarch-comm", daemon=True).start()


#: The last ``usage`` sample: (CPU seconds, monotonic time).
_last_cpu: list[tuple[float, float]] = []


def usage() -> dict[str, Any]:
    """See ``WorkerBuiltin.usage``: ``{"cpu": %, "rss": bytes[, "gpu": %, "gpu_mem": bytes]
    [, "tensors": bytes, "tensor_refs": n]}`` (the last two: the tensor engine's)."""
    import os
    import time

    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    busy, now = t.user + t.system, time.monotonic()
    last = _last_cpu[-1] if _last_cpu else None
    _last_cpu[:] = [(busy, now)]
    out: dict[str, Any] = {
        "cpu": round(100 * (busy - last[0]) / max(1e-6, now - last[1])) if last else 0,
        "rss": me.memory_info().rss,
    }
    engine = sys.modules.get("monarch_kernel.tensor._engine")  # loaded only once a mesh was activated
    held = engine.held() if engine is not None else None
    if held is not None:
        out["tensors"], out["tensor_refs"] = held["bytes"], held["refs"]
    if os.path.isdir("/proc/driver/nvidia/gpus"):
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid == os.getpid():
                        out["gpu"] = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
                        out["gpu_mem"] = int(p.usedGpuMemory or 0)
        except Exception:
            pass  # no NVML: no GPU columns
    return out


def running_calls(d: DispatcherLike) -> list[tuple[int, str, str]]:
    """What this worker's actors run now: (call id, ``actor.method``, where its code
    is: the innermost Python frame), for a caller whose call waits behind one."""
    frames = sys._current_frames()
    main = threading.main_thread().ident
    out = []
    for a in list(d.actors.values()):
        r = a.runner
        call, what = (r.running_call, r.running_what) if r is not None else (None, "")
        if r is not None and call is not None:
            frame = frames.get(r.thread.ident or -1)
            if frame is not None and frame.f_code.co_filename.endswith("_main_thread.py"):
                frame = frames.get(main or -1)  # a %%mesh cell: it runs on the main thread (MAIN-1)
            out.append((call, what, _where(frame)))
        for call_id in list(a.running):  # async actors
            out.append((call_id, a.name, "(an async endpoint)"))
    return out


def _where(frame: Any) -> str:
    """``func (file:line)`` of the innermost Python frame, or "?"."""
    if frame is None:
        return "?"
    return f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})"


__all__ = ["ENDPOINTS", "WorkerBuiltin", "serve_builtin"]
