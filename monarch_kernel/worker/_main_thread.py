"""The worker's main thread runs SPMD code (``%%mesh`` cells), so that an interrupt
can reach it with a real SIGINT: Python handles signals only in the main thread, and
only a signal breaks a blocking call such as ``time.sleep`` or a socket read.

MAIN-1: ``run(fn)`` runs ``fn`` on the main thread and waits for it. If the waiting
thread is interrupted (the call was cancelled: the dispatcher raised
KeyboardInterrupt in it), the main thread gets SIGINT, and ``run`` still waits for
``fn`` to end, so the next job never receives a stale interrupt.
"""

from __future__ import annotations

import contextvars
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any

_jobs: queue.Queue[Callable[[], None]] = queue.Queue()
_running = threading.Lock()  # held by the main thread while a job runs


def serve_forever() -> None:
    """The worker's main thread: runs jobs, forever."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    while True:
        try:
            # No timeout (LANE-1: an idle worker does not wake); a SIGINT still breaks
            # the wait (a lock's wait is interruptible on POSIX).
            job = _jobs.get()
            with _running:
                job()
        except KeyboardInterrupt:  # an interrupt that came between jobs
            continue


def run(fn: Callable[[], Any]) -> Any:
    """Runs ``fn()`` on the main thread; returns its value or raises its exception."""
    done = threading.Event()
    outcome: list[Any] = []
    ctx = contextvars.copy_context()  # the call's context: its origin tags the output

    def job() -> None:
        try:
            outcome.append((True, ctx.run(fn)))
        except BaseException as e:  # handed to the caller
            outcome.append((False, e))
        finally:
            done.set()

    _jobs.put(job)
    while True:
        try:
            if done.wait(0.05):
                break
        except KeyboardInterrupt:  # every cancel is passed on (code may catch one)
            ident = threading.main_thread().ident
            if ident is not None and not done.is_set():
                signal.pthread_kill(ident, signal.SIGINT)
    ok, value = outcome[0]
    if ok:
        return value
    raise value
