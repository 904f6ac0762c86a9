"""Cancels of calls (the stop button, ``KeyboardInterrupt`` in the caller) on the
worker's side: a sync call gets ``KeyboardInterrupt`` on its actor's thread, an async
one has its task cancelled (or ``CancelledError`` raised in it when it holds the
event loop), a call not started yet ends without running; and a second cancel of a
call that still runs ends the worker (INTERRUPT-2, stated in ``mesh._future``).

A part of ``Dispatcher`` (see ``_dispatcher``): the functions that take it are its
methods."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monarch_kernel.worker._state import ActorEntry, DispatcherLike

#: A worker's exit status when a second interrupt ended it (INTERRUPT-2), as a shell's 128 + SIGINT.
EXIT_INTERRUPTED = 130


def cancel(d: DispatcherLike, call_id: int) -> None:
    running = _running(d, call_id) is not None  # only these count (INTERRUPT-2)
    for a in d.actors.values():
        if a.runner is not None:
            a.runner.interrupt(call_id)
    if d._aloop is not None:
        actors = list(d.actors.values())
        d._aloop.call_soon_threadsafe(_cancel_async, actors, call_id)
        if any(call_id in a.running for a in actors):
            threading.Thread(
                target=_break_async, args=(d, actors, call_id), name="monarch-cancel", daemon=True
            ).start()
    if not running:  # queued behind another call (or not here yet): it will not run
        d._early_cancels[call_id] = True
        while len(d._early_cancels) > 1000:
            d._early_cancels.popitem(last=False)
        return
    n = d._cancels.pop(call_id, 0) + 1
    d._cancels[call_id] = n
    while len(d._cancels) > 1000:
        d._cancels.popitem(last=False)
    if n >= 2:
        threading.Thread(target=_escalate, args=(d, call_id), name="monarch-escalate", daemon=True).start()


def _running(d: DispatcherLike, call_id: int) -> str | None:
    """``actor.method``-ish name of what runs call ``call_id`` here, if anything does."""
    for a in list(d.actors.values()):
        if (a.runner is not None and a.runner.running_call == call_id) or call_id in a.running:
            return a.name
    return None


def _escalate(d: DispatcherLike, call_id: int, grace: float = 1.0) -> None:
    """INTERRUPT-2: a second interrupt of a call that still runs ``grace`` s later
    ends this worker (a thread stuck in C code cannot be stopped otherwise); the
    controller reports it dead, and ``procs.respawn()`` starts it again."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if _running(d, call_id) is None:
            return
        time.sleep(0.02)
    actor = _running(d, call_id)
    if actor is None:
        return
    sys.stderr.write(
        f"monarch: interrupted twice, actor {actor!r} of rank {d.point.rank} still ran its call: "
        "this worker exits to stop it (procs.respawn() starts it again)\n"
    )
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def _break_async(d: DispatcherLike, actors: list[ActorEntry], call_id: int, grace: float = 0.2) -> None:
    """A cancelled async call whose code does not await (a Python loop) holds the
    event loop, so ``task.cancel()`` never runs. If it still runs ``grace`` s later
    and is the loop's current task, CancelledError is raised in it, as the stop
    button raises KeyboardInterrupt in a sync endpoint (a KeyboardInterrupt would
    end the event loop itself)."""
    import asyncio

    time.sleep(grace)
    loop, thread = d._aloop, d._aloop_thread
    task = next((a.running[call_id] for a in actors if call_id in a.running), None)
    if loop is None or thread is None or thread.ident is None or task is None or task.done():
        return
    try:
        current = asyncio.current_task(loop)
    except RuntimeError:
        return
    if current is task:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(asyncio.CancelledError)
        )


def _cancel_async(actors: list[ActorEntry], call_id: int) -> None:
    for a in actors:
        task = a.running.get(call_id)
        if task is not None:
            task.cancel()
            return


__all__ = ["EXIT_INTERRUPTED", "cancel"]
