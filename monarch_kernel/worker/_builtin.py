"""The actor every worker has without spawning it (``_wire.BUILTIN``): what the
controller asks of a worker itself (flush marks, stacks, pdb input, post-mortem)."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native, _origin
from monarch_kernel._wire import BUILTIN
from monarch_kernel.mesh._serial import loads
from monarch_kernel.worker import _debug, _output
from monarch_kernel.worker._lanes import thread_stacks

if TYPE_CHECKING:
    from monarch_kernel.worker._dispatcher import Dispatcher


def serve_builtin(d: Dispatcher, item: _native.Incoming) -> None:
    """Calls to the actor every worker has (``BUILTIN``), on the routing thread.

    ``flush``: writes an end-of-output marker, tagged with the call's origin, to
    stdout and stderr; once the caller has seen both, it has seen everything this
    worker printed for that origin before the call (the pipes are in order).

    ``pdb_input``: the payload (UTF-8) is the next line for the debugger waiting
    longest in this worker (see ``_debug``).

    ``busy``: what the worker's actors run now (see ``running_calls``).

    ``stacks``: the current Python stack of every thread, as text; answered here
    (not by an actor's thread), so it works while the main thread or an actor is
    busy in Python code.

    ``comm_msg``: the payload (JSON) is what the front end sent to one of this
    worker's comms (DISPLAY-2, the way back); it is handed to that comm.

    ``supervise``: the payload is (actor, owner, port): failures of ``actor`` here go
    on ``port`` to the actor ``owner`` that spawned it (OWN-1).

    ``root``: ``MONARCH_ROOT`` becomes the payload (SINGLE-1: a controller attached).

    ``log_level``: the root logger's level becomes the payload (a number, as text).

    ``usage``: this worker's CPU (percent since the last ``usage``), resident memory
    and, where NVML lists its GPU, the GPU's use and this process's GPU memory,
    measured on its own host (the inspector shows them for every host)."""
    token, method = item.token, item.method
    if method == "usage":
        d._reply(token, usage(), f"{BUILTIN}.usage")
        return
    if method == "busy":
        d._reply(token, running_calls(d), f"{BUILTIN}.busy")
        return
    if method == "stacks":
        d._reply(token, thread_stacks(), f"{BUILTIN}.stacks")
        return
    if method == "post_mortem":
        origin = item.origin

        def run() -> None:
            reset = _origin.set_context(origin)
            try:
                d._reply(token, _debug.post_mortem(), f"{BUILTIN}.post_mortem")
            finally:
                _origin.reset(reset)

        threading.Thread(target=run, name="monarch-post-mortem", daemon=True).start()
        return
    if method == "pdb_input":
        d._reply(token, _debug.feed(bytes(item.payload).decode("utf-8", "replace")), f"{BUILTIN}.pdb_input")
        return
    if method == "comm_msg":  # DISPLAY-2: the front end wrote to a comm of this worker
        _comm_msg(bytes(item.payload))
        d._reply(token, None, f"{BUILTIN}.comm_msg")
        return
    if method == "supervise":  # OWN-1: an actor spawned these actors: their failures go to it
        actor, owner, port = loads(item.payload, item.buffers, d.token)
        d._supervisors[actor] = (owner, port)
        d._reply(token, None, f"{BUILTIN}.supervise")
        return
    if method == "root":  # SINGLE-1: a controller attached; it is the root now
        import os

        os.environ["MONARCH_ROOT"] = bytes(item.payload).decode()
        d._reply(token, None, f"{BUILTIN}.root")
        return
    if method == "log_level":  # ProcMesh.logging_option(level=...)
        import logging

        logging.getLogger().setLevel(int(bytes(item.payload).decode()))
        d._reply(token, None, f"{BUILTIN}.log_level")
        return
    if method == "flush":
        reset = _origin.set_context(item.origin)
        try:
            _output.mark_end()
        finally:
            _origin.reset(reset)
        d._reply(token, None, f"{BUILTIN}.flush")
    else:
        d._reject(token, f"the built-in actor has no method {method!r}")


def _comm_msg(payload: bytes) -> None:
    """Hands a front end's message to this worker's comm (on a thread of its own: a
    widget's observers are the user's code)."""
    import base64
    import json

    msg = json.loads(payload)
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
    """See ``serve_builtin``: ``{"cpu": %, "rss": bytes[, "gpu": %, "gpu_mem": bytes]
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


def running_calls(d: Dispatcher) -> list[tuple[int, str, str]]:
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


__all__ = ["serve_builtin"]
