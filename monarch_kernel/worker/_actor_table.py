"""The ``Dispatcher``'s table of actors (of ``_state.ActorEntry`` records): which
actor a call is for, spawning one (the constructor), replacing and stopping it (its
``__cleanup__``), and stopping them all when the worker is stopped (STOP-1). The
table is owned by the routing thread.

A part of ``Dispatcher`` (see ``_dispatcher``): the functions that take it are its
methods."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native, _origin
from monarch_kernel._wire import ACTOR_FAILED
from monarch_kernel.actor import Context, Instance, endpoints_of
from monarch_kernel.mesh import Extent, Point, actor_context
from monarch_kernel.worker import _output
from monarch_kernel.worker._lanes import LaneThread, lane_threads
from monarch_kernel.worker._state import ActorEntry

if TYPE_CHECKING:
    from monarch_kernel.worker._state import DispatcherLike

# Methods the controller may call on an actor that defines them, endpoints or not.
_HOOKS = frozenset({"__supervise__"})


def message_context(a: ActorEntry, item: _native.Incoming) -> Context:
    """The context a message runs in: its actor, and the rank it was sent to. An
    actor's messages are mostly sent to the same rank of the same mesh: the context of
    its last one is kept and used again while they are (a call's hot path)."""
    key = item.place
    last = a.last_context
    if last is not None and last[0] == key:
        return last[1]
    ctx = Context(a.context.actor_instance, message_rank=Point(key[0], Extent(key[1], key[2])))
    a.last_context = (key, ctx)
    return ctx


def forget_plain(a: ActorEntry) -> None:
    """FAST-1: ``a`` is no longer the actor of its name (stopped, replaced, failed):
    its thread runs no call of it natively (the dispatcher rejects them, saying why)."""
    if a.runner is not None:
        a.runner.plain_table.pop(a.name, None)


def callee(
    d: DispatcherLike, token: int, actor: str, method: str, runner: LaneThread | None = None
) -> ActorEntry | None:
    """The actor a call is for, or None after rejecting the call. With ``runner``,
    the actor must still be the one that runner serves (not stopped or replaced)."""
    a = d.actors.get(actor)
    failed = d._failed.get(actor)
    if failed is not None:  # DISPATCH-4 (also while its stop is on its way)
        d._reject(token, ACTOR_FAILED + failed)
        return None
    if a is None or (runner is not None and a.runner is not runner):
        d._reject(token, f"no actor named {actor!r} on {d.point} (stopped, or never spawned)")
        return None
    if (
        method not in a.endpoints
        and not (method in _HOOKS and hasattr(a.instance, method))
        and (method.startswith("_") or not callable(getattr(type(a.instance), method, None)))
    ):  # (a public method that is not an endpoint: as_endpoint(mesh.method))
        d._reject(token, f"actor {actor!r} has no endpoint {method!r}")
        return None
    return a


def construct(
    d: DispatcherLike,
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
        Instance(d.point, name=name, class_name=f"{cls.__module__}.{cls.__qualname__}"),
        message_rank=d.point,
    )
    reset = actor_context.set(ctx)
    reset_origin = _origin.set_context(origin)
    try:
        instance = cls(*args, **kwargs)
    except BaseException as e:  # DISPATCH-2
        if runner is not None:
            d._close_runner(runner)
        d._reply_exception(token, e, None)
        return
    finally:
        _origin.reset(reset_origin)
        actor_context.reset(reset)
    eps = endpoints_of(cls)
    a = ActorEntry(
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
        a.task = asyncio.get_running_loop().create_task(d._consume(a))
    d.router.submit(lambda: _install(d, token, a))


def _install(d: DispatcherLike, token: int, a: ActorEntry) -> None:
    """Makes ``a`` the actor of its name (routing thread), replacing any old one."""
    old = d.actors.get(a.name)
    if old is not None:
        forget_plain(old)
    d.actors[a.name] = a
    d._failed.pop(a.name, None)
    d._supervisors.pop(a.name, None)
    d.server.route(a.name, a.runner.lane if a.runner is not None else None)
    if old is None:
        d._reply(token, None, f"spawn of {a.name}")
    else:  # answered once the actor it replaces has ended (its __cleanup__ ran), as a stop is
        _cleanup(d, old, lambda: d._reply(token, None, f"spawn of {a.name}"))


def stop_actor(d: DispatcherLike, token: int, name: str) -> None:
    """Stops actor ``name`` (routing thread)."""
    a = d.actors.pop(name, None)
    d.server.route(name, None)
    if a is None:
        d._reply(token, None, f"stop of {name}")
    else:  # the stop is answered once the actor has ended (its __cleanup__ ran), as in Monarch
        forget_plain(a)
        _cleanup(d, a, lambda: d._reply(token, None, f"stop of {name}"))


def _cleanup(d: DispatcherLike, a: ActorEntry, then: Callable[[], Any] | None = None) -> None:
    """Runs ``a``'s ``__cleanup__`` after what it has queued, then ends it; then
    ``then()``."""
    hook = getattr(a.instance, "__cleanup__", None)
    if a.is_async:
        d._async().call_soon_threadsafe(d._cleanup_async, a, hook, then)
    else:
        d._cleanup_sync(a, hook, then)


def exit_cleanly(d: DispatcherLike, grace: float = 1.5) -> None:
    """STOP-1: the agent stops a worker with SIGTERM (the mesh stopped, its idle
    timeout passed), then SIGKILL 2 s later. Meanwhile every actor's
    ``__cleanup__`` runs, on its own thread or event loop after the message it
    is handling, as when it is stopped or replaced; then the worker exits."""
    deadline = time.monotonic() + grace
    ended = threading.Event()

    def stop_all() -> None:  # on the routing thread, which owns the table
        for name in list(d.actors):
            stop_actor(d, 0, name)  # (token 0: nobody to reply to)
        ended.set()

    d.router.submit(stop_all)
    ended.wait(grace)
    for runner in list(lane_threads):
        if runner is not d.router and runner.thread.ident is not None:
            runner.thread.join(max(0.0, deadline - time.monotonic()))
    if d._aloop is not None:  # the cleanups scheduled above come first in its queue
        scheduled = threading.Event()
        d._aloop.call_soon_threadsafe(scheduled.set)
        scheduled.wait(max(0.0, deadline - time.monotonic()))
    while any(not t.done() for t in d._async_cleanups) and time.monotonic() < deadline:
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


__all__ = ["callee", "construct", "exit_cleanly", "forget_plain", "message_context", "stop_actor"]
