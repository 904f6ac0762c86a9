"""``Future``: the result of a call, by ``.get()`` (blocking) or ``await``.

``.get()`` never needs the event loop, so it works, without warnings, inside a running
asyncio loop: every notebook cell runs inside one.
"""

from __future__ import annotations

import collections.abc
import concurrent.futures
import contextlib
import functools
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Generator, Sequence
from typing import Any, Generic, TypeVar

from monarch_kernel import _native
from monarch_kernel.errors import FULL_TRACEBACK_ENV

R = TypeVar("R")

# A fan-out's calls (``Fanout.call``) are a sequence, as a list of calls is, for the
# code that waits on them (``slow_wait``) and for anyone else's.
collections.abc.Sequence.register(_native.Calls)

_UNSET: Any = object()

#: ``wait(calls, timeout, what)`` for waits that last more than a second (it shows
#: progress): the front end's (``controller.set_frontend``). None: plain waits.
_slow_wait: list[Callable[[Sequence[Any], float | None, str], list[Any]] | None] = [None]


def set_slow_wait(wait: Callable[[Sequence[Any], float | None, str], list[Any]] | None) -> None:
    """Sets what takes over waits longer than ``SLOW_S`` (None: nothing)."""
    _slow_wait[0] = wait


#: How long a wait runs before ``slow_wait`` takes over.
SLOW_S = 1.0


#: Calls interrupted once that had not replied then, with when (INTERRUPT-2), by key.
_interrupted: dict[int, tuple[Any, float]] = {}
_interrupted_lock = threading.Lock()
#: Cancels less than this apart are one interrupt (a cell cancels its calls one
#: future at a time); a later one is a second interrupt.
SAME_INTERRUPT_S = 0.5


def cancel_calls(calls: Sequence[Any], *, all_earlier: bool = False) -> int:
    """An interrupt: each of ``calls`` still running is cancelled (a sync endpoint gets
    KeyboardInterrupt, an async one is cancelled). INTERRUPT-2: only a repeated
    interrupt of the *same* call escalates: one of ``calls`` that an earlier interrupt
    did not stop is cancelled again, and its worker exits if the call has not stopped
    1 s later (reported dead; ``procs.respawn()`` restarts it). Calls of other cells
    are never touched, except with ``all_earlier`` (a stop pressed while the kernel is
    idle: the cell that was stopped has ended, its call runs on). Returns how many
    calls were escalated."""
    now = time.monotonic()
    # (by each call's key, not its object: the calls of a fan-out are made as they
    # are read, so one call is a new object each time)
    mine = {c.key for c in calls}
    with _interrupted_lock:
        for key, (c, _t) in list(_interrupted.items()):
            if c.done():
                del _interrupted[key]
        again = [
            c
            for c, t in _interrupted.values()
            if now - t >= SAME_INTERRUPT_S and (all_earlier or c.key in mine)
        ]
        for c in again:
            del _interrupted[c.key]
        escalated = {c.key for c in again}
        first = []
        for c in calls:
            key = c.key
            if not c.done() and key not in _interrupted and key not in escalated:
                # (the call alone: one of a fan-out's would keep all its replies)
                _interrupted[key] = (c.detached(), now)
                first.append(c)
    for c in again + first:
        c.cancel()
    return len(again)


def interrupt(futures: Sequence[Future[Any]]) -> None:
    """An interrupt of ``futures``' remote calls, as one (see :func:`cancel_calls`);
    says which of them it did not stop."""
    cancel_calls([c for f in futures for c in f._calls])
    say_still_running([c for f in futures for c in f._calls], [lb for f in futures for lb in f._labels])


#: How long an interrupt gives the remote calls to stop before it says which did not
#: (the wait ends as soon as they have: a loaded machine may take longer than usual).
STOP_GRACE_S = 1.0


def say_still_running(calls: Sequence[Any], labels: Sequence[str]) -> None:
    """After an interrupt: says (on stderr: the cell's output) which calls still run
    ``STOP_GRACE_S`` later, and what stops them. Never silent: escalation
    (INTERRUPT-2) comes only after this."""
    pending = [c for c in calls if not c.done()]
    if not pending:
        return
    try:
        _native.wait_all(pending, STOP_GRACE_S)
    except TimeoutError:
        pass
    except KeyboardInterrupt:  # stop pressed again meanwhile: a second interrupt (INTERRUPT-2)
        cancel_calls(pending)
    still = [label for c, label in zip(calls, labels) if not c.done()]
    if still:
        print(
            f"monarch: the interrupt did not stop {', '.join(still)}: its code does not see "
            "interrupts (a blocking native call?). Press stop again to end that worker (its "
            "actors' state is lost; procs.respawn() starts it again), or let the call finish; "
            "%mesh stacks shows what it runs.",
            file=sys.stderr,
            flush=True,
        )


#: monarch-kernel's own code: an interrupt's notebook rendering leaves its frames out.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def interrupted(message: str) -> KeyboardInterrupt:
    """The KeyboardInterrupt that an interrupted wait raises: ``message`` says what the
    interrupt stopped. A notebook shows it as the user's own frames and that line, as
    it shows a local interrupt, not the frames of monarch's wait machinery;
    ``MONARCH_FULL_TRACEBACK=1`` shows everything."""
    exc = KeyboardInterrupt(message)
    # (IPython asks the exception itself; an attribute keeps the type KeyboardInterrupt,
    # which is what front ends and tools look for.)
    exc._render_traceback_ = functools.partial(_render_interrupt, exc)  # type: ignore[attr-defined]
    return exc


def _render_interrupt(exc: KeyboardInterrupt) -> list[str]:
    if os.environ.get(FULL_TRACEBACK_ENV) == "1":
        return "".join(traceback.format_exception(exc)).rstrip("\n").splitlines()
    own = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(_PACKAGE_DIR) and f"{os.sep}IPython{os.sep}" not in f.filename
    ]
    lines = ["Traceback (most recent call last):"] if own else []
    lines += "".join(traceback.format_list(own)).rstrip("\n").splitlines()
    return [*lines, f"KeyboardInterrupt: {exc}"]


def what_stopped(calls: Sequence[Any], labels: Sequence[str]) -> str:
    """After an interrupt (and ``say_still_running``): which remote calls stopped and
    which still run, in words."""
    stopped = [label for c, label in zip(calls, labels) if c.done()]
    running = [label for c, label in zip(calls, labels) if not c.done()]
    if not running:
        return f"interrupted; the remote calls stopped: {', '.join(stopped)}"
    if not stopped:
        return f"interrupted; the remote calls still run (see above): {', '.join(running)}"
    return f"interrupted; the remote calls stopped: {', '.join(stopped)}; still running (see above): {', '.join(running)}"


def escalate_interrupted() -> int:
    """A second interrupt with no call to interrupt (the kernel is idle): escalates
    what earlier interrupts did not stop (see :func:`cancel_calls`)."""
    return cancel_calls([], all_earlier=True)


def wait_calls(calls: Sequence[Any], timeout: float | None, what: str = "calls") -> list[Any]:
    """``_native.wait_all`` with ``fail_fast`` (a call whose worker died ends the wait at
    once: None stands for the calls still running), handing waits longer than
    ``SLOW_S`` to ``slow_wait``."""
    hook = _slow_wait[0]
    if hook is None or (timeout is not None and timeout <= SLOW_S):
        return _native.wait_all(calls, timeout, fail_fast=True)
    try:
        return _native.wait_all(calls, SLOW_S, fail_fast=True)
    except TimeoutError:
        return hook(calls, None if timeout is None else timeout - SLOW_S, what)


class Future(Generic[R]):
    """A value that will be there once the calls behind it reply.

    Endpoints' adverbs and ``PortReceiver.recv()`` return them; ``Future(coro=c)``
    runs coroutine ``c`` (on a background event loop when ``get()`` is used, in the
    caller's loop when awaited), as Monarch's does.
    """

    __slots__ = ("_calls", "_finish", "_value", "_error", "_where", "_local", "_coro")

    def __init__(
        self,
        *,
        coro: Any = None,
        _calls: Sequence[Any] = (),
        _finish: Callable[[list[Any]], R] | None = None,
        _where: tuple[str, str, Sequence[int]] | None = None,
        _local: concurrent.futures.Future[Any] | None = None,
    ) -> None:
        #: The calls, as given when a fan-out's ``_native.Calls`` (one object for
        #: all its procs), else copied.
        self._calls = _calls if type(_calls) is _native.Calls else list(_calls)
        self._finish = _finish if _finish is not None else _first
        #: (mesh, endpoint, rank of each call): what the calls are, for a user.
        self._where = _where
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        #: The value comes from this process (a port's message, a coroutine), not
        #: from the replies of ``_calls`` (which an interrupt still cancels).
        self._local = _local
        #: ``Future(coro=...)``: started on first use.
        self._coro = coro

    @property
    def _labels(self) -> list[str]:
        """Each call as a user knows it: ``rank 1 of mesh 'm' (counter.incr)``. Made
        only when needed (an interrupt that did not stop a call), not per call."""
        if self._where is None:
            return [f"call {c.call_id}" for c in self._calls]
        mesh, what, ranks = self._where
        return [f"rank {r} of mesh {mesh!r} ({what})" for r in ranks]

    @classmethod
    def _resolved(cls, value: R) -> Future[R]:
        f: Future[R] = cls(_calls=[], _finish=lambda _: value)
        f._value = value
        return f

    def _settle(self, results: list[Any]) -> None:
        try:
            self._value = self._finish(results)
        except BaseException as e:  # cached and re-raised by every get()
            self._error = e
            self._value = None

    def done(self) -> bool:
        if self._value is not _UNSET:
            return True
        if self._coro is not None or self._local is not None:
            return self._local is not None and self._local.done()
        calls = self._calls
        return calls.done() if type(calls) is _native.Calls else all(c.done() for c in calls)

    def _started(self) -> concurrent.futures.Future[Any]:
        """The local future, starting ``coro`` on the background loop if needed."""
        if self._local is None:
            self._local = _background().run(self._coro)
            self._coro = None
        return self._local

    def _get_local(self, timeout: float | None) -> None:
        try:
            value = self._started().result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the value did not arrive within {timeout} s") from None
        except KeyboardInterrupt as e:
            if not self._calls:
                raise e.with_traceback(None) from None
            self._cancel_remote()
            say_still_running(self._calls, self._labels)
            raise interrupted(what_stopped(self._calls, self._labels)) from None
        except BaseException as e:  # cached and re-raised by every get()
            self._error = e
            self._value = None
            return
        self._value = value

    def get(self, timeout: float | None = None) -> R:
        """Blocks until the value is there (or ``timeout`` seconds pass: TimeoutError).

        The result, or the exception, is cached: a second ``get()`` gives the same.
        """
        if timeout is not None and (timeout < 0 or not math.isfinite(timeout)):
            raise ValueError(f"timeout must be a finite number >= 0, not {timeout!r}")
        if self._value is _UNSET and (self._local is not None or self._coro is not None):
            self._get_local(timeout)
        elif self._value is _UNSET:
            try:
                replies = wait_calls(self._calls, timeout, f"{len(self._calls)} call(s)")
            except KeyboardInterrupt:  # the remote code gets it too, then we stop waiting
                self._cancel_remote()
                say_still_running(self._calls, self._labels)
                raise interrupted(what_stopped(self._calls, self._labels)) from None
            self._settle(replies)
        if self._error is not None:
            raise self._error
        return self._value

    result = get

    def as_asyncio(self) -> Any:
        """This Future as an ``asyncio.Future`` of the running event loop (for
        ``asyncio.gather``, ``asyncio.wait_for`` and the like)."""
        import asyncio

        async def value() -> R:
            return await self

        return asyncio.ensure_future(value())

    def _cancel_remote(self) -> None:
        """Asks the workers to interrupt the calls that have not replied yet (see
        :func:`cancel_calls`)."""
        cancel_calls(self._calls)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.get(timeout)
        except (TimeoutError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            return e
        return None

    def __await__(self) -> Generator[Any, None, R]:
        if self._value is _UNSET and self._coro is not None and self._local is None:
            coro, self._coro = self._coro, None  # runs in the awaiting loop
            try:
                self._value = yield from coro.__await__()
            except BaseException as e:
                self._error, self._value = e, None
                raise
            return self._value
        if self._value is _UNSET and self._local is not None and not self._local.done():
            import asyncio

            yield from asyncio.wrap_future(self._local).__await__()
        elif not self.done():
            yield from self._until_done().__await__()
        return self.get()

    async def _until_done(self) -> None:
        import asyncio  # only awaiting code pays for importing it

        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        remaining = [len(self._calls)]

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        def one_done() -> None:  # runs on a runtime thread (PY-1)
            remaining[0] -= 1
            if remaining[0] == 0 and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # closed since (an await that timed out)
                    loop.call_soon_threadsafe(wake)

        for c in self._calls:
            c.add_done_callback(one_done)
        await waiter

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<monarch_kernel.Future {state}>"


class Done(Future[R]):
    """A ``Future`` whose value is there from the start that is also a coroutine
    object: what a method that is ``async def`` in Monarch, and whose work is done by
    the time it returns here, gives. Code that ignores it, ``get()``s it, ``await``s
    it or runs it with ``asyncio.run(...)`` all works."""

    __slots__ = ()

    def __init__(self, value: R) -> None:
        super().__init__(_calls=[], _finish=lambda _: value)
        self._value = value

    def send(self, _: Any) -> Any:
        raise StopIteration(self._value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        raise typ if val is None else val

    def close(self) -> None:
        pass


collections.abc.Coroutine.register(Done)


def _first(replies: list[Any]) -> Any:
    return replies[0] if replies else None


class _Background:
    """One event loop on a daemon thread, for ``Future(coro=...).get()`` (a caller
    that is not in a loop, or is in one it cannot block)."""

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="monarch-futures", daemon=True).start()

    def run(self, coro: Any) -> concurrent.futures.Future[Any]:
        import asyncio

        return asyncio.run_coroutine_threadsafe(_awaited(coro), self.loop)


async def _awaited(x: Any) -> Any:
    return await x


_bg: list[_Background] = []
_bg_lock = threading.Lock()


def _background() -> _Background:
    with _bg_lock:
        if not _bg:
            _bg.append(_Background())
        return _bg[0]
