"""``Dispatcher``: runs the actors of one process for its native ``Worker`` server.

Threads:
- the *loop thread* runs an asyncio loop that waits on the server's loop lane (an
  eventfd, INBOX-1): spawns, stops, cancels and async actors' calls;
- the *sync thread* (the main thread in a worker) waits on the sync lane, where the
  native server puts calls to sync actors (INBOX-3), and runs them, and sync actors'
  constructors, one at a time, with no event loop (as Monarch does).

DISPATCH-1: each actor handles one message at a time, in arrival order (async ones
too: the next handler starts when the previous coroutine has finished).
DISPATCH-2: an endpoint's exception goes back to the caller (REPLY_EXCEPTION) and the
actor stays usable; nothing an actor does takes the dispatcher down.
"""

from __future__ import annotations

import asyncio
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monarch_kernel import _native
from monarch_kernel.actor import Context, Instance, _current, _process_default, endpoints_of, is_async_actor
from monarch_kernel.mesh._serial import dumps, loads
from monarch_kernel.mesh._shape import Extent, Point

_SPAWN, _STOP, _CALL, _CANCEL = _native.KIND_SPAWN, _native.KIND_STOP, _native.KIND_CALL, _native.KIND_CANCEL
_LANE_SYNC, _LANE_LOOP = _native.LANE_SYNC, _native.LANE_LOOP
# How often the sync thread comes back to Python while idle, so signals are handled.
_IDLE_WAKE_S = 0.1


@dataclass
class _Actor:
    name: str
    instance: Any
    is_async: bool
    endpoints: frozenset[str]
    context: Context
    # Async actors: messages wait here for the actor's consumer task (DISPATCH-1).
    inbox: asyncio.Queue[Any] | None = None
    task: asyncio.Task[None] | None = None
    running: dict[int, asyncio.Task[Any]] = field(default_factory=dict)


class Dispatcher:
    """Runs actors for ``server`` (a ``_native.WorkerServer``)."""

    def __init__(self, server: Any, point: Point, sync_on_main: bool = True) -> None:
        self.server = server
        self.point = point
        self.sync_on_main = sync_on_main
        self.actors: dict[str, _Actor] = {}
        self.loop = asyncio.new_event_loop()
        # Work for the sync thread; None stops it.
        self.sync_jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # The call the sync thread is running, so a cancel can interrupt it.
        self.sync_running: int | None = None
        self.sync_thread_id: int | None = None
        _process_default[0] = Context(Instance(point, name="root"), message_rank=point)

    # -- threads -----------------------------------------------------------------------

    def start(self) -> None:
        """Starts the loop thread and, unless ``sync_on_main``, the sync thread."""
        threading.Thread(target=self._run_loop, name="monarch-dispatch", daemon=True).start()
        if not self.sync_on_main:
            threading.Thread(target=self.run_sync, name="monarch-sync-actors", daemon=True).start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.add_reader(self.server.fileno(_LANE_LOOP), self._drain)
        self.loop.run_forever()

    def run_sync(self) -> None:
        """Runs sync actors' work until a ``None`` job; in a worker, on the main thread."""
        self.sync_thread_id = threading.get_ident()
        while True:
            try:
                for item in self.server.take_wait(_LANE_SYNC, _IDLE_WAKE_S):
                    self._run_sync_item(item)
                while True:
                    try:
                        job = self.sync_jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        return
                    job()
            except KeyboardInterrupt:  # a cancel that arrived between jobs
                continue

    def _to_sync(self, job: Callable[[], None]) -> None:
        self.sync_jobs.put(job)
        self.server.wake(_LANE_SYNC)

    # -- routing (loop thread) -----------------------------------------------------------

    def _drain(self) -> None:
        for item in self.server.take():
            try:
                self._route(item)
            except Exception:  # DISPATCH-2: report, never stop dispatching
                self._reply_exception(item[0], sys.exc_info()[1], None)

    def _route(self, item: tuple[Any, ...]) -> None:
        token, kind, call_id, actor, method, payload, buffers, where = item
        if kind == _CALL:
            a = self.actors.get(actor)
            if a is None:
                return self._reject(token, f"no actor named {actor!r} on {self.point} (stopped, or never spawned)")
            if method not in a.endpoints:
                return self._reject(token, f"actor {actor!r} has no endpoint {method!r}")
            if a.is_async:
                assert a.inbox is not None
                a.inbox.put_nowait((token, call_id, method, payload, buffers, where))
            else:  # queued before the actor was routed to the sync lane
                self._to_sync(lambda: self._run_sync_item(item))
        elif kind == _SPAWN:
            cls, args, kwargs = loads(payload, buffers)
            if is_async_actor(cls):
                self._construct(token, actor, cls, args, kwargs, True)
            else:
                self._to_sync(lambda: self._construct(token, actor, cls, args, kwargs, False))
        elif kind == _STOP:
            self._stop_actor(token, actor)
        elif kind == _CANCEL:
            self._cancel(call_id)

    def _reject(self, token: int, message: str) -> None:
        if token:
            self.server.reply(token, _native.REPLY_REJECTED, message.encode(), [])

    # -- actors --------------------------------------------------------------------------

    def _construct(self, token: int, name: str, cls: type, args: Any, kwargs: Any, is_async: bool) -> None:
        ctx = Context(
            Instance(self.point, name=name, class_name=f"{cls.__module__}.{cls.__qualname__}"),
            message_rank=self.point,
        )
        reset = _current.set(ctx)
        try:
            instance = cls(*args, **kwargs)
        except BaseException as e:  # DISPATCH-2
            self._reply_exception(token, e, None)
            return
        finally:
            _current.reset(reset)
        old = self.actors.get(name)
        a = _Actor(name, instance, is_async, frozenset(endpoints_of(cls)), ctx)
        if is_async:
            a.inbox = asyncio.Queue()
            a.task = self.loop.create_task(self._consume(a))
        self.actors[name] = a
        self.server.route(name, None if is_async else _LANE_SYNC)
        if old is not None:
            self._cleanup(old)
        self._reply(token, None, f"spawn of {name}")

    def _stop_actor(self, token: int, name: str) -> None:
        a = self.actors.pop(name, None)
        self.server.route(name, None)
        if a is not None:
            self._cleanup(a)
        self._reply(token, None, f"stop of {name}")

    def _cleanup(self, a: _Actor) -> None:
        if a.task is not None:
            a.task.cancel()
        hook = getattr(a.instance, "__cleanup__", None)
        if hook is None:
            return
        if a.is_async:
            self.loop.create_task(self._guard(hook(None), f"{a.name}.__cleanup__"))
        else:
            self._to_sync(lambda: self._guarded_sync(hook, f"{a.name}.__cleanup__"))

    async def _guard(self, coro: Any, what: str) -> None:
        try:
            await coro
        except BaseException:
            traceback.print_exc()
            print(f"monarch: {what} raised (above); ignored", file=sys.stderr)

    def _guarded_sync(self, fn: Callable[[Any], Any], what: str) -> None:
        try:
            fn(None)
        except BaseException:
            traceback.print_exc()
            print(f"monarch: {what} raised (above); ignored", file=sys.stderr)

    @staticmethod
    def _message_context(a: _Actor, where: tuple[int, list[str], list[int]]) -> Context:
        rank, dims, sizes = where
        return Context(a.context.actor_instance, message_rank=Point(rank, Extent(dims, sizes)))

    def _run_sync_item(self, item: tuple[Any, ...]) -> None:
        token, _kind, call_id, actor, method, payload, buffers, where = item
        a = self.actors.get(actor)
        if a is None:
            return self._reject(token, f"no actor named {actor!r} on {self.point} (stopped, or never spawned)")
        if method not in a.endpoints:
            return self._reject(token, f"actor {actor!r} has no endpoint {method!r}")
        self._run_sync_call(a, token, call_id, method, payload, buffers, where)

    def _run_sync_call(
        self, a: _Actor, token: int, call_id: int, method: str, payload: bytes, buffers: list[Any], where: Any
    ) -> None:
        reset = _current.set(self._message_context(a, where))
        self.sync_running = call_id
        try:
            args, kwargs = loads(payload, buffers)
            result = getattr(a.instance, method)(*args, **kwargs)
        except BaseException as e:  # DISPATCH-2, KeyboardInterrupt from a cancel included
            self.sync_running = None
            self._reply_exception(token, e, f"{a.name}.{method}")
            return
        finally:
            self.sync_running = None
            _current.reset(reset)
        self._reply(token, result, f"{a.name}.{method}")

    async def _consume(self, a: _Actor) -> None:
        assert a.inbox is not None
        while True:
            token, call_id, method, payload, buffers, where = await a.inbox.get()
            task = asyncio.ensure_future(self._run_async_call(a, token, method, payload, buffers, where))
            a.running[call_id] = task
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():  # the consumer itself was cancelled (actor stopped)
                    task.cancel()
                    raise
            finally:
                a.running.pop(call_id, None)

    async def _run_async_call(
        self, a: _Actor, token: int, method: str, payload: bytes, buffers: list[Any], where: Any
    ) -> None:
        _current.set(self._message_context(a, where))
        try:
            args, kwargs = loads(payload, buffers)
            result = await getattr(a.instance, method)(*args, **kwargs)
        except BaseException as e:  # DISPATCH-2, CancelledError from a cancel included
            self._reply_exception(token, e, f"{a.name}.{method}")
            return
        self._reply(token, result, f"{a.name}.{method}")

    def _cancel(self, call_id: int) -> None:
        for a in self.actors.values():
            task = a.running.get(call_id)
            if task is not None:
                task.cancel()
                return
        if self.sync_running == call_id and self.sync_on_main and self.sync_thread_id is not None:
            signal.pthread_kill(self.sync_thread_id, signal.SIGINT)

    # -- replies -------------------------------------------------------------------------

    def _reply(self, token: int, value: Any, what: str) -> None:
        if not token:
            return
        try:
            data, raws = dumps(value, f"return value of {what}")
        except Exception as e:
            self._reply_exception(token, e, what)
            return
        self.server.reply(token, _native.REPLY_RESULT, data, raws)

    def _reply_exception(self, token: int, exc: BaseException | None, what: str | None) -> None:
        assert exc is not None
        tb = exc.__traceback__
        # Drop the dispatcher's own frame: the user's code starts at the next one.
        formatted = "".join(traceback.format_exception(type(exc), exc, tb.tb_next if tb else None))
        if not token:
            print(f"monarch: {what or 'a message'} raised:\n{formatted}", file=sys.stderr, flush=True)
            return
        try:
            data, raws = dumps((exc, formatted), "exception")
        except Exception:  # the exception itself does not pickle: send its text
            data, raws = dumps((None, formatted), "exception")
        self.server.reply(token, _native.REPLY_EXCEPTION, data, raws)
