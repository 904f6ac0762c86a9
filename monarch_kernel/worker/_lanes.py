"""Lane threads: a thread that waits on one lane of the native ``WorkerServer`` inbox
(INBOX-1: the routing thread on ``LANE_LOOP``; INBOX-3: each sync actor on a lane of
its own) and runs what arrives, between jobs other threads submit to it.

DISPATCH-3: no lane thread is left waiting in native code when the interpreter
exits (they are stopped and joined at exit)."""

from __future__ import annotations

import contextlib
import ctypes
import queue
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from monarch_kernel import _native
from monarch_kernel._shutdown import Stage, shutdown

# LANE-1: an idle lane thread sleeps in native code until its lane has an item or is
# woken (``server.wake``: a job submitted, its stop, an interrupt), never on a timer:
# 1,024 idle workers each waking their lane threads twice a second took a quarter of
# a 2-CPU machine. How long the exit waits for each to come back:
_JOIN_S = 1.0


# Every live lane thread, stopped at exit: a daemon thread still waiting inside native
# code when the interpreter finalizes aborts the process (DISPATCH-3).
lane_threads: weakref.WeakSet[LaneThread] = weakref.WeakSet()


def _stop_lane_threads() -> None:
    runners = list(lane_threads)
    for r in runners:
        r.stopped = True
        r.server.wake(r.lane)
    for r in runners:
        if r.thread.ident is not None:  # one made but never started has nothing to stop
            r.thread.join(timeout=_JOIN_S)


shutdown.at(Stage.LANES, _stop_lane_threads)


class LaneThread:
    """A thread that runs its jobs, then hands what arrives on its native lane to
    ``handle``: the routing thread (lane LANE_LOOP) or one sync actor's thread."""

    def __init__(
        self,
        server: Any,
        name: str,
        handle: Callable[[LaneThread, _native.Incoming], None],
        lane: int | None = None,
    ) -> None:
        self.server = server
        self.handle = handle
        self.lane: int = self.server.open_lane() if lane is None else lane
        # Jobs put here by other threads (constructor, __cleanup__, routing updates).
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.stopped = False
        self.running_call: int | None = None
        #: ``actor.method`` of the running call (what a call queued behind it waits for).
        self.running_what = ""
        #: FAST-1: a sync actor's plain calls, run by the native server (``serve``); its
        #: table (actor -> (instance, place, context, entry)) is the dispatcher's to fill.
        self.plain: _native.PlainCalls | None = None
        self.plain_table: dict[str, tuple[Any, Any, Any, Any]] = {}
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        lane_threads.add(self)

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)
        self.server.wake(self.lane)

    def interrupt(self, call_id: int) -> None:
        if self.running_call == call_id and self.thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self.thread.ident), ctypes.py_object(KeyboardInterrupt)
            )
            # LANE-1: had the call just ended, the exception waits for the thread's next
            # Python line: wake it now, so that it lands between calls (caught in
            # _run), not on the next call's arrival.
            with contextlib.suppress(ValueError):  # its lane closed meanwhile: it has ended
                self.server.wake(self.lane)

    def _run(self) -> None:
        while not self.stopped:
            try:
                # (a call's hot path: no jobs, and no queue.Empty raised to say so)
                while not self.stopped and not self.jobs.empty():
                    self.jobs.get_nowait()()
                if self.stopped:
                    return
                if self.plain is not None:
                    self.server.serve(self.lane, self.handle, self, self.plain)
                    continue
                for item in self.server.take_wait(self.lane):
                    self.handle(self, item)
            except KeyboardInterrupt:  # a cancel that arrived between calls
                continue


def thread_stacks() -> str:
    """Every thread's current Python stack, innermost call last, named by thread."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the routing thread answering this
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {names.get(ident, ident)!s} ({ident}):\n{stack}")
    return "\n".join(parts)


__all__ = ["LaneThread", "lane_threads", "thread_stacks"]
