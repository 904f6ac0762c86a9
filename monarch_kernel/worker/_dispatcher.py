"""``Dispatcher``: runs the actors of one process for its native ``Worker`` server.

Threads:
- the *routing thread* waits on the server's loop lane (LANE_LOOP, INBOX-1): spawns,
  stops, cancels and async actors' calls. It owns the table of actors;
- each sync actor has a *thread of its own*, waiting on a lane of its own where the
  native server puts that actor's calls (INBOX-3); it runs the constructor and the
  endpoints one at a time, with no event loop (as Monarch does). So a sync endpoint
  may wait on another actor in the same process;
- async actors share one *asyncio thread*, started with the first async actor (a
  worker that has none never imports asyncio: a faster cold start). Their
  constructors, endpoints and ``__cleanup__`` run in its event loop.

DISPATCH-1: each actor handles one message at a time, in arrival order (async ones
too: the next handler starts when the previous coroutine has finished), except the
messages of its ``@concurrent_endpoint``s, which start in arrival order as tasks of
the event loop and run beside the others (ENDPOINT-2).
DISPATCH-2: an endpoint's exception goes back to the caller (REPLY_EXCEPTION) and the
actor stays usable; nothing an actor does takes the dispatcher down.
DISPATCH-4: a BaseException that is no Exception (and no interrupt) ends the actor,
as in Monarch: its call fails with a SupervisionError, later calls are refused with
the reason, its ``__cleanup__`` runs, and its controller hears of it.
(DISPATCH-3, in ``_lanes``: no lane thread is left waiting in native code at exit.)
"""

from __future__ import annotations

import collections
import ctypes
import functools
import inspect
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native, _origin
from monarch_kernel._wire import ACTOR_FAILED, ACTOR_FAILURE_MARK, BUILTIN
from monarch_kernel.actor import (
    Context,
    Instance,
    _current,
    _instance_hooks,
    _process_default,
    endpoints_of,
    is_async_actor,
)
from monarch_kernel.mesh import _control, _port
from monarch_kernel.mesh._buffers import wait_read
from monarch_kernel.mesh._control import MeshFailure
from monarch_kernel.mesh._serial import dumps, dumps_exception, loads
from monarch_kernel.mesh._shape import Extent, Point
from monarch_kernel.worker import _debug, _display, _output
from monarch_kernel.worker._builtin import serve_builtin
from monarch_kernel.worker._lanes import LaneThread, lane_threads

if TYPE_CHECKING:
    import asyncio

_SPAWN, _STOP, _CALL, _CANCEL = _native.KIND_SPAWN, _native.KIND_STOP, _native.KIND_CALL, _native.KIND_CANCEL
_LANE_LOOP = _native.LANE_LOOP
# Methods the controller may call on an actor that defines them, endpoints or not.
_HOOKS = frozenset({"__supervise__"})
#: Longest an actor waits for its caller to pull a large return value (XFER-2).
REPLY_WAIT_S = 10.0
#: This worker's mesh, as failures name it.
_MESH = os.environ.get("MONARCH_MESH", "mesh")
#: A worker's exit status when a second interrupt ended it (INTERRUPT-2), as a shell's 128 + SIGINT.
EXIT_INTERRUPTED = 130


@dataclass
class _Actor:
    name: str
    instance: Any
    is_async: bool
    endpoints: frozenset[str]
    context: Context
    # Async actors (touched only on the asyncio thread): messages wait here for the
    # actor's consumer task (DISPATCH-1).
    inbox: asyncio.Queue[_native.Incoming] | None = None
    task: asyncio.Task[None] | None = None
    running: dict[int, asyncio.Task[Any]] = field(default_factory=dict)
    #: Endpoints whose messages run concurrently (ENDPOINT-2), and their tasks.
    concurrent: frozenset[str] = frozenset()
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    # Sync actors: the thread that runs them.
    runner: LaneThread | None = None


def _fails_actor(e: BaseException) -> bool:
    """DISPATCH-4: whether ``e`` ends the actor: a BaseException that is no Exception
    (Monarch's meaning), except the interrupts the stop button sends."""
    import asyncio

    return not isinstance(e, (Exception, KeyboardInterrupt, asyncio.CancelledError))


def _forget(running: dict[int, Any], call_id: int, _task: Any) -> None:
    running.pop(call_id, None)


class Dispatcher:
    """Runs actors for ``server`` (a ``_native.WorkerServer``)."""

    def __init__(self, server: Any, point: Point, token: str) -> None:
        self.server = server
        self.point = point
        self.token = token  # the mesh's: transfers in and out use it
        # Owned by the routing thread.
        self.actors: dict[str, _Actor] = {}
        self.router = LaneThread(server, "monarch-dispatch", self._route_guarded, lane=_LANE_LOOP)
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._aloop_thread: threading.Thread | None = None
        self._async_cleanups: list[asyncio.Task[None]] = []  # __cleanup__ of async actors
        #: How many cancels each recent call got (INTERRUPT-2), oldest first.
        self._cancels: collections.OrderedDict[int, int] = collections.OrderedDict()
        #: Cancels of sync calls that had not started: they end without running.
        self._early_cancels: collections.OrderedDict[int, bool] = collections.OrderedDict()
        _process_default[0] = Context(Instance(point, name="root"), message_rank=point)
        #: DISPATCH-4: why each failed actor ended (calls to it are refused with it).
        self._failed: dict[str, str] = {}
        #: OWN-1: actors spawned by an actor: (that actor's name, the port its
        #: process hears failures on), set by the built-in ``supervise``.
        self._supervisors: dict[str, tuple[str, Any]] = {}
        _port.set_local(server.addr, token)
        _instance_hooks[:] = [self._instance_ends]
        _control.set_owner_supervision(self._supervise_owner)

    def start(self) -> None:
        """Starts the routing thread."""
        self.router.thread.start()

    def _async(self) -> asyncio.AbstractEventLoop:
        """The event loop of async actors, started on first use (routing thread)."""
        if self._aloop is None:
            import asyncio

            loop = self._aloop = asyncio.new_event_loop()

            def run() -> None:
                asyncio.set_event_loop(loop)
                while True:  # a break-in (_break_async) that missed its task must not end the loop
                    try:
                        loop.run_forever()
                        return
                    except BaseException:
                        traceback.print_exc()

            self._aloop_thread = threading.Thread(target=run, name="monarch-asyncio", daemon=True)
            self._aloop_thread.start()
        return self._aloop

    # -- routing (routing thread) --------------------------------------------------------

    def _route_guarded(self, _router: LaneThread, item: _native.Incoming) -> None:
        try:
            self._route(item)
        except Exception:  # DISPATCH-2: report, never stop dispatching
            self._reply_exception(item.token, sys.exc_info()[1], None)

    def _route(self, item: _native.Incoming) -> None:
        token, kind, actor, method = item.token, item.kind, item.actor, item.method
        if kind == _CALL and actor == BUILTIN:
            serve_builtin(self, item)
        elif kind == _CALL and actor == _port.PORTS:
            refused = _port.deliver(item, self.token)
            if refused is None:
                self._reply(token, None, "port message")
            else:
                self._reject(token, refused)
        elif kind == _CALL:
            a = self._callee(token, actor, method)
            if a is None:
                return
            if a.is_async:
                self._async().call_soon_threadsafe(self._enqueue, a, item)
            else:  # queued before the actor was routed to its lane
                runner = a.runner
                assert runner is not None
                runner.submit(functools.partial(self._run_sync_item, runner, item))
        elif kind == _SPAWN:
            cls, args, kwargs = loads(item.payload, item.buffers, self.token)
            origin = item.origin
            if is_async_actor(cls):
                self._async().call_soon_threadsafe(
                    self._construct, token, actor, cls, args, kwargs, None, origin
                )
            else:
                runner = LaneThread(self.server, f"monarch-actor-{actor}", self._run_sync_item)
                runner.submit(lambda: self._construct(token, actor, cls, args, kwargs, runner, origin))
                runner.thread.start()
        elif kind == _STOP:
            self._stop_actor(token, actor)
        elif kind == _CANCEL:
            self._cancel(item.call_id)

    def _callee(self, token: int, actor: str, method: str, runner: LaneThread | None = None) -> _Actor | None:
        """The actor a call is for, or None after rejecting the call. With ``runner``,
        the actor must still be the one that runner serves (not stopped or replaced)."""
        a = self.actors.get(actor)
        failed = self._failed.get(actor)
        if failed is not None:  # DISPATCH-4 (also while its stop is on its way)
            self._reject(token, ACTOR_FAILED + failed)
            return None
        if a is None or (runner is not None and a.runner is not runner):
            self._reject(token, f"no actor named {actor!r} on {self.point} (stopped, or never spawned)")
            return None
        if (
            method not in a.endpoints
            and not (method in _HOOKS and hasattr(a.instance, method))
            and (method.startswith("_") or not callable(getattr(type(a.instance), method, None)))
        ):  # (a public method that is not an endpoint: as_endpoint(mesh.method))
            self._reject(token, f"actor {actor!r} has no endpoint {method!r}")
            return None
        return a

    def _reject(self, token: int, message: str) -> None:
        if token:
            self.server.reply(token, _native.REPLY_REJECTED, message.encode(), [])

    # -- actors --------------------------------------------------------------------------

    def _construct(
        self,
        token: int,
        name: str,
        cls: type,
        args: Any,
        kwargs: Any,
        runner: LaneThread | None,
        origin: str = "",
    ) -> None:
        """Runs the constructor: on the asyncio thread for async actors, else on
        ``runner``; then hands the actor to the routing thread."""
        ctx = Context(
            Instance(self.point, name=name, class_name=f"{cls.__module__}.{cls.__qualname__}"),
            message_rank=self.point,
        )
        reset = _current.set(ctx)
        reset_origin = _origin.set_context(origin)
        try:
            instance = cls(*args, **kwargs)
        except BaseException as e:  # DISPATCH-2
            if runner is not None:
                self._close_runner(runner)
            self._reply_exception(token, e, None)
            return
        finally:
            _origin.reset(reset_origin)
            _current.reset(reset)
        eps = endpoints_of(cls)
        a = _Actor(
            name,
            instance,
            runner is None,
            frozenset(eps),
            ctx,
            runner=runner,
            concurrent=frozenset(n for n, e in eps.items() if e._concurrent),
        )
        if a.is_async:
            import asyncio

            a.inbox = asyncio.Queue()
            a.task = asyncio.get_running_loop().create_task(self._consume(a))
        self.router.submit(lambda: self._install(token, a))

    def _install(self, token: int, a: _Actor) -> None:
        """Makes ``a`` the actor of its name (routing thread), replacing any old one."""
        old = self.actors.get(a.name)
        self.actors[a.name] = a
        self._failed.pop(a.name, None)
        self._supervisors.pop(a.name, None)
        self.server.route(a.name, a.runner.lane if a.runner is not None else None)
        if old is not None:
            self._cleanup(old)
        self._reply(token, None, f"spawn of {a.name}")

    def _stop_actor(self, token: int, name: str) -> None:
        a = self.actors.pop(name, None)
        self.server.route(name, None)
        if a is None:
            self._reply(token, None, f"stop of {name}")
        else:  # the stop is answered once the actor has ended (its __cleanup__ ran), as in Monarch
            self._cleanup(a, lambda: self._reply(token, None, f"stop of {name}"))

    def _close_runner(self, runner: LaneThread) -> None:
        """Ends ``runner``'s thread (on it); calls still queued for it are rejected."""
        runner.stopped = True
        lane_threads.discard(runner)
        for item in self.server.close_lane(runner.lane):
            self._reject(item.token, f"actor {item.actor!r} was stopped")

    def _cleanup(self, a: _Actor, then: Callable[[], Any] | None = None) -> None:
        """Runs ``a``'s ``__cleanup__`` after what it has queued, then ends it; then
        ``then()``."""
        hook = getattr(a.instance, "__cleanup__", None)
        if a.is_async:
            self._async().call_soon_threadsafe(self._cleanup_async, a, hook, then)
            return
        runner = a.runner
        assert runner is not None
        if hook is not None:
            runner.submit(lambda: self._guarded_sync(hook, f"{a.name}.__cleanup__"))
        runner.submit(lambda: _control.stop_owned(a.name))  # OWN-1
        if then is not None:
            runner.submit(then)
        runner.submit(lambda: self._close_runner(runner))

    def _cleanup_async(
        self, a: _Actor, hook: Callable[[Any], Any] | None, then: Callable[[], Any] | None = None
    ) -> None:
        import asyncio

        if a.task is not None:
            a.task.cancel()
        task = asyncio.get_running_loop().create_task(self._end_async(a, hook))
        if then is not None:
            task.add_done_callback(lambda _t: then())
        self._async_cleanups = [t for t in self._async_cleanups if not t.done()] + [task]

    async def _end_async(self, a: _Actor, hook: Callable[[Any], Any] | None) -> None:
        """ENDPOINT-2: the actor's concurrent tasks are cancelled and awaited, then its
        ``__cleanup__`` runs. Calls still queued for it are refused (never left
        without a reply), as a sync actor's are."""
        import asyncio

        while a.inbox is not None and not a.inbox.empty():
            item = a.inbox.get_nowait()
            failed = self._failed.get(a.name)
            self._reject(item.token, ACTOR_FAILED + failed if failed else f"actor {a.name!r} was stopped")

        while a.tasks:
            tasks = list(a.tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            a.tasks.difference_update(tasks)
        if hook is not None:
            await self._guard(hook(None), f"{a.name}.__cleanup__")
        if _control.owns(a.name):  # OWN-1 (stopping waits for the agent: off the loop)
            await asyncio.get_running_loop().run_in_executor(None, _control.stop_owned, a.name)

    def exit_cleanly(self, grace: float = 1.5) -> None:
        """STOP-1: the agent stops a worker with SIGTERM (the mesh stopped, its idle
        timeout passed), then SIGKILL 2 s later. Meanwhile every actor's
        ``__cleanup__`` runs, on its own thread or event loop after the message it
        is handling, as when it is stopped or replaced; then the worker exits."""
        deadline = time.monotonic() + grace
        ended = threading.Event()

        def stop_all() -> None:  # on the routing thread, which owns the table
            for name in list(self.actors):
                self._stop_actor(0, name)  # (token 0: nobody to reply to)
            ended.set()

        self.router.submit(stop_all)
        ended.wait(grace)
        for runner in list(lane_threads):
            if runner is not self.router and runner.thread.ident is not None:
                runner.thread.join(max(0.0, deadline - time.monotonic()))
        if self._aloop is not None:  # the cleanups scheduled above come first in its queue
            scheduled = threading.Event()
            self._aloop.call_soon_threadsafe(scheduled.set)
            scheduled.wait(max(0.0, deadline - time.monotonic()))
        while any(not t.done() for t in self._async_cleanups) and time.monotonic() < deadline:
            time.sleep(0.01)
        import gc

        gc.collect()  # the actors are gone from the table: their finalizers (__del__) run now
        _output.end_lines()
        # Ends as SIGTERM would have, so that the agent reports the signal: the C
        # handler goes back to the default (signal.signal works only on the main thread).
        libc = ctypes.CDLL(None)
        libc.signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
        os._exit(128 + signal.SIGTERM)

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
    def _message_context(a: _Actor, item: _native.Incoming) -> Context:
        return Context(a.context.actor_instance, message_rank=Point(item.rank, Extent(item.dims, item.sizes)))

    def _run_sync_item(self, runner: LaneThread, item: _native.Incoming) -> None:
        token, call_id, method = item.token, item.call_id, item.method
        a = self._callee(token, item.actor, method, runner)
        if a is None:
            return
        reset = _current.set(self._message_context(a, item))
        reset_origin = _origin.set_context(item.origin)
        try:
            runner.running_what = f"{a.name}.{method}"
            runner.running_call = call_id  # in the try: a cancel from now on gets a reply
            if self._early_cancels.pop(call_id, False):
                raise KeyboardInterrupt("the call was interrupted before it started")
            args, kwargs = loads(item.payload, item.buffers, self.token)
            _display.ensure_if_imported()  # DISPLAY-1
            result = getattr(a.instance, method)(*args, **kwargs)
        except BaseException as e:  # DISPATCH-2, KeyboardInterrupt from a cancel included
            runner.running_call = None
            if _fails_actor(e) and getattr(a.instance, "_base_exceptions_end_it", True):
                self._fail_actor(a, e, token, f"{a.name}.{method}")
            else:
                self._reply_exception(token, e, f"{a.name}.{method}")
            return
        finally:
            runner.running_call = None
            _origin.reset(reset_origin)
            _current.reset(reset)
        # XFER-2: the actor's next message may change what it returned; the caller
        # pulls it as the reply arrives, and this waits for that.
        wait_read(self._reply(token, result, f"{a.name}.{method}"), limit=REPLY_WAIT_S)

    @staticmethod
    def _enqueue(a: _Actor, msg: _native.Incoming) -> None:
        assert a.inbox is not None
        a.inbox.put_nowait(msg)

    async def _consume(self, a: _Actor) -> None:
        import asyncio

        assert a.inbox is not None
        while True:
            item = await a.inbox.get()
            call_id = item.call_id
            task = asyncio.ensure_future(self._run_async_call(a, item))
            a.running[call_id] = task
            if item.method in a.concurrent:  # ENDPOINT-2: the next message goes on now
                a.tasks.add(task)
                task.add_done_callback(a.tasks.discard)
                task.add_done_callback(functools.partial(_forget, a.running, call_id))
                await asyncio.sleep(0)  # it starts before the next message's task
                continue
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if not task.done() or (me is not None and me.cancelling()):
                    # the consumer itself was cancelled (the actor stopped), perhaps
                    # just as its call ended: it ends too
                    task.cancel()
                    raise
            finally:
                a.running.pop(call_id, None)

    async def _run_async_call(self, a: _Actor, item: _native.Incoming) -> None:
        import asyncio

        token, call_id, method = item.token, item.call_id, item.method
        failed = self._failed.get(a.name)
        if failed is not None and self.actors.get(a.name) in (a, None):  # DISPATCH-4
            self._reject(token, ACTOR_FAILED + failed)
            return
        _current.set(self._message_context(a, item))
        _origin.set_context(item.origin)  # this task's own context
        try:
            args, kwargs = loads(item.payload, item.buffers, self.token)
            _display.ensure_if_imported()  # DISPLAY-1
            result = getattr(a.instance, method)(*args, **kwargs)
            if inspect.isawaitable(result):  # (a sync method through as_endpoint: not)
                result = await result
        except BaseException as e:  # DISPATCH-2, CancelledError from a cancel included
            if _fails_actor(e) and getattr(a.instance, "_base_exceptions_end_it", True):
                self._fail_actor(a, e, token, f"{a.name}.{method}")
            else:
                self._reply_exception(token, e, f"{a.name}.{method}")
            return
        a.running.pop(call_id, None)  # replying: an interrupt must not cut into that
        live = self._reply(token, result, f"{a.name}.{method}")
        if live:  # as for sync actors (XFER-2), without holding up the event loop
            await asyncio.get_running_loop().run_in_executor(None, wait_read, live, None, REPLY_WAIT_S)

    def _cancel(self, call_id: int) -> None:
        running = self._running(call_id) is not None  # only these count (INTERRUPT-2)
        for a in self.actors.values():
            if a.runner is not None:
                a.runner.interrupt(call_id)
        if self._aloop is not None:
            actors = list(self.actors.values())
            self._aloop.call_soon_threadsafe(self._cancel_async, actors, call_id)
            if any(call_id in a.running for a in actors):
                threading.Thread(
                    target=self._break_async, args=(actors, call_id), name="monarch-cancel", daemon=True
                ).start()
        if not running:  # queued behind another call (or not here yet): it will not run
            self._early_cancels[call_id] = True
            while len(self._early_cancels) > 1000:
                self._early_cancels.popitem(last=False)
            return
        n = self._cancels.pop(call_id, 0) + 1
        self._cancels[call_id] = n
        while len(self._cancels) > 1000:
            self._cancels.popitem(last=False)
        if n >= 2:
            threading.Thread(
                target=self._escalate, args=(call_id,), name="monarch-escalate", daemon=True
            ).start()

    def _running(self, call_id: int) -> str | None:
        """``actor.method``-ish name of what runs call ``call_id`` here, if anything does."""
        for a in list(self.actors.values()):
            if (a.runner is not None and a.runner.running_call == call_id) or call_id in a.running:
                return a.name
        return None

    def _escalate(self, call_id: int, grace: float = 1.0) -> None:
        """INTERRUPT-2: a second interrupt of a call that still runs ``grace`` s later
        ends this worker (a thread stuck in C code cannot be stopped otherwise); the
        controller reports it dead, and ``procs.respawn()`` starts it again."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self._running(call_id) is None:
                return
            time.sleep(0.02)
        actor = self._running(call_id)
        if actor is None:
            return
        sys.stderr.write(
            f"monarch: interrupted twice, actor {actor!r} of rank {self.point.rank} still ran its call: "
            "this worker exits to stop it (procs.respawn() starts it again)\n"
        )
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    def _break_async(self, actors: list[_Actor], call_id: int, grace: float = 0.2) -> None:
        """A cancelled async call whose code does not await (a Python loop) holds the
        event loop, so ``task.cancel()`` never runs. If it still runs ``grace`` s later
        and is the loop's current task, CancelledError is raised in it, as the stop
        button raises KeyboardInterrupt in a sync endpoint (a KeyboardInterrupt would
        end the event loop itself)."""
        import asyncio

        time.sleep(grace)
        loop, thread = self._aloop, self._aloop_thread
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

    @staticmethod
    def _cancel_async(actors: list[_Actor], call_id: int) -> None:
        for a in actors:
            task = a.running.get(call_id)
            if task is not None:
                task.cancel()
                return

    # -- actor failure (DISPATCH-4) -----------------------------------------------------

    def _fail_actor(self, a: _Actor, exc: BaseException, token: int, what: str) -> None:
        """DISPATCH-4: ``exc`` (a BaseException that is no Exception, and no interrupt)
        ends actor ``a``: the call that raised fails with a SupervisionError, later
        calls to it are refused saying why, its ``__cleanup__`` runs, and supervision
        hears of it (the actor's controller, as an ``actor_failed`` failure)."""
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        formatted = "".join(traceback.format_exception(type(exc), exc, tb))
        self._end_actor(a, f"{what} raised\n{formatted}", token)

    def _end_actor(self, a: _Actor, why: str, token: int = 0) -> None:
        """DISPATCH-4: actor ``a`` failed (``why``), and ends; see ``_fail_actor``."""
        reason = f"actor {a.context.actor_instance} exited because of the following reason: {why}"
        self._failed[a.name] = reason
        self._actor_failed(a.name, reason)  # (first: its supervisor hears before its caller)
        if token:
            self.server.reply(token, _native.REPLY_REJECTED, (ACTOR_FAILED + reason).encode(), [])
        self._stop_later(a)

    def _stop_later(self, a: _Actor) -> None:
        """Stops ``a`` on the routing thread, if it is still the actor of its name then
        (not replaced meanwhile)."""

        def stop() -> None:
            if self.actors.get(a.name) is a:
                self._stop_actor(0, a.name)

        self.router.submit(stop)

    def _actor_failed(self, actor: str, message: str) -> None:
        """Supervision of a failure of ``actor`` (OWN-1): to the actor that spawned it
        (the port it gave, ``supervise``), else to this worker's controller, else (the
        controller's own ``this_proc()``) on stderr."""
        sup = self._supervisors.get(actor)
        if sup is not None:
            owner, port = sup
            rank = self.point.rank if len(self.point) else None
            try:
                port.send((owner, MeshFailure(_MESH, "actor_failed", message, rank)))
                return
            except Exception as e:  # its owner is gone: the controller hears of it instead
                print(f"monarch: the owner of actor {actor!r} did not get its failure: {e}", file=sys.stderr)
        if _control.escalates():
            self.report_failure(actor, message)
        else:
            print(f"monarch: {message}", file=sys.stderr, flush=True)

    def _instance_ends(self, name: str, reason: str | None, failed: bool) -> None:
        """``context().actor_instance.abort(reason)`` (``failed``) or ``.stop(reason)``:
        the running actor ends once its current message is done."""
        a = self.actors.get(name)
        if a is None:
            return

        def end() -> None:
            if failed:
                self._end_actor(a, f"aborted: {reason or 'no reason provided'}")
            else:
                self._stop_later(a)

        # After the message that asked: it completes as usual.
        if a.runner is not None:
            a.runner.submit(end)
            return
        import asyncio

        try:
            task = asyncio.current_task()
        except RuntimeError:  # (another thread)
            task = None
        if task is None:
            end()
        else:
            task.add_done_callback(lambda _t: end())

    # -- the supervision tree (OWN-1) ----------------------------------------------------

    def _supervise_owner(self, actor: str, failure: Any, limit: float = 60.0) -> bool:
        """Runs ``actor.__supervise__(failure)`` in order with its messages (on its
        thread, or its event loop); whether it handled the failure (returned true)."""
        a = self.actors.get(actor)
        hook = getattr(a.instance, "__supervise__", None) if a is not None else None
        if a is None or hook is None:
            return False
        done = threading.Event()
        out: list[Any] = [False]

        def raised() -> None:
            traceback.print_exc()
            print(f"monarch: {actor}.__supervise__ raised (above): the failure is unhandled", file=sys.stderr)

        def run() -> None:
            reset = _current.set(a.context)
            try:
                out[0] = hook(failure)
            except BaseException:
                raised()
            finally:
                _current.reset(reset)
                done.set()

        async def run_async() -> None:
            try:
                result = hook(failure)
                out[0] = (await result) if inspect.isawaitable(result) else result
            except BaseException:
                raised()
            finally:
                done.set()

        if a.runner is not None:
            a.runner.submit(run)
        else:
            import asyncio

            asyncio.run_coroutine_threadsafe(run_async(), self._async())
        if not done.wait(limit):
            print(
                f"monarch: {actor}.__supervise__ did not run within {limit:.0f} s: the failure is unhandled",
                file=sys.stderr,
            )
            return False
        return bool(out[0])

    def send_up(self, owner: str, mesh: str, failure: Any) -> None:
        """OWN-1: a failure of mesh ``mesh`` that its owner ``owner`` did not handle
        fails the owner, as in Monarch (DISPATCH-4: later calls to it say why), and goes
        up to its own supervisor as a failure of the owner."""
        a = self.actors.get(owner)
        what = mesh if mesh.startswith("actors it spawned") else f"its mesh {mesh!r}"
        why = f"{what} had a failure it did not handle:\n{failure.message}"
        if a is not None:
            self._end_actor(a, why)
        else:
            self._actor_failed(owner, f"actor {owner} failed: {why}")

    @staticmethod
    def report_failure(actor: str, message: str) -> None:
        """Tells this worker's controller (by a line its agent forwards) that an actor failed."""
        import json

        line = ACTOR_FAILURE_MARK + json.dumps({"actor": actor, "message": message[:16384]})
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    # -- replies -------------------------------------------------------------------------

    def _reply(self, token: int, value: Any, what: str) -> list[int]:
        """Sends ``value`` back; the registrations of its large buffers that are this
        process's own memory, which the actor should not change before the caller
        has pulled them (XFER-2: see ``wait_read``)."""
        if not token:
            return []
        live: list[int] = []
        try:
            data, raws = dumps(value, f"return value of {what}", self.token, 1, live=live)
        except BaseException as e:  # a reply always goes out (an interrupt landing here too)
            self._reply_exception(token, e, what)
            return []
        self.server.reply(token, _native.REPLY_RESULT, data, raws)
        return live

    def _reply_exception(self, token: int, exc: BaseException | None, what: str | None) -> None:
        assert exc is not None
        tb = exc.__traceback__
        # Drop the dispatcher's own frame: the user's code starts at the next one,
        # unless the code that raised said where it starts (REMOTE_TB).
        # (None there: no frame of it is the user's, as for a SyntaxError in a cell.)
        start = exc.__monarch_tb__ if hasattr(exc, "__monarch_tb__") else (tb.tb_next if tb else None)
        if hasattr(exc, "__monarch_tb__"):
            del exc.__monarch_tb__  # a traceback does not pickle
        if start is not None and not isinstance(exc, KeyboardInterrupt):
            _debug.last_traceback[0] = start  # for %mesh debug --post-mortem
        formatted = "".join(traceback.format_exception(type(exc), exc, start))
        if not token and what:  # a broadcast: nobody waits for it (OWN-1)
            actor = what.split(".", 1)[0]
            a = self.actors.get(actor)
            who = str(a.context.actor_instance) if a is not None else actor
            self._actor_failed(
                actor,
                f"actor {who} failed: {what} raised, in a message nobody waited for the answer of "
                f"(a broadcast). This occurred because the actor itself failed.\n{formatted}",
            )
            return
        if not token:
            print(f"monarch: {what or 'a message'} raised:\n{formatted}", file=sys.stderr, flush=True)
            return
        data, raws = dumps_exception(exc, formatted)
        self.server.reply(token, _native.REPLY_EXCEPTION, data, raws)
