"""The asyncio thread of the ``Dispatcher``: async actors share one event loop,
started with the first async actor (a worker that has none never imports asyncio: a
faster cold start). Their constructors, endpoints and ``__cleanup__`` run in it.

Each async actor has a consumer task that takes its messages one at a time
(DISPATCH-1), except those of its ``@concurrent_endpoint``s, which start as tasks of
their own and run beside the others (ENDPOINT-2).

A part of ``Dispatcher`` (see ``_dispatcher``): the functions that take it are its
methods."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native, _origin
from monarch_kernel._wire import ACTOR_FAILED
from monarch_kernel.mesh import actor_context, loads, owns, stop_owned, wait_read
from monarch_kernel.worker import _display
from monarch_kernel.worker._actor_failure import fails_actor
from monarch_kernel.worker._actor_table import message_context
from monarch_kernel.worker._replies import REPLY_WAIT_S

if TYPE_CHECKING:
    import asyncio

    from monarch_kernel.worker._state import ActorEntry, DispatcherLike


def event_loop(d: DispatcherLike) -> asyncio.AbstractEventLoop:
    """The event loop of async actors, started on first use (routing thread)."""
    if d._aloop is None:
        import asyncio

        loop = d._aloop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            while True:  # a break-in (_interrupts._break_async) that missed its task must not end the loop
                try:
                    loop.run_forever()
                    return
                except BaseException:
                    traceback.print_exc()

        d._aloop_thread = threading.Thread(target=run, name="monarch-asyncio", daemon=True)
        d._aloop_thread.start()
    return d._aloop


def enqueue(a: ActorEntry, msg: _native.Incoming) -> None:
    """Queues a message for ``a``'s consumer task (on the asyncio thread)."""
    assert a.inbox is not None
    a.inbox.put_nowait(msg)


def _forget(running: dict[int, Any], call_id: int, _task: Any) -> None:
    running.pop(call_id, None)


async def consume(d: DispatcherLike, a: ActorEntry) -> None:
    """``a``'s consumer task: runs its messages one at a time (DISPATCH-1)."""
    import asyncio

    assert a.inbox is not None
    while True:
        item = await a.inbox.get()
        call_id = item.call_id
        task = asyncio.ensure_future(_run_call(d, a, item))
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


async def _run_call(d: DispatcherLike, a: ActorEntry, item: _native.Incoming) -> None:
    import asyncio

    token, call_id, method = item.token, item.call_id, item.method
    failed = d._failed.get(a.name)
    if failed is not None and d.actors.get(a.name) in (a, None):  # DISPATCH-4
        d._reject(token, ACTOR_FAILED + failed)
        return
    actor_context.set(message_context(a, item))
    _origin.set_context(item.origin)  # this task's own context
    try:
        args, kwargs = loads(item.payload, item.buffers, d.token)
        _display.ensure_if_imported()  # DISPLAY-1
        result = getattr(a.instance, method)(*args, **kwargs)
        if inspect.isawaitable(result):  # (a sync method through as_endpoint: not)
            result = await result
    except BaseException as e:  # DISPATCH-2, CancelledError from a cancel included
        if fails_actor(e) and getattr(a.instance, "_base_exceptions_end_it", True):
            d._fail_actor(a, e, token, f"{a.name}.{method}")
        else:
            d._reply_exception(token, e, f"{a.name}.{method}")
        return
    a.running.pop(call_id, None)  # replying: an interrupt must not cut into that
    live = d._reply(token, result, f"{a.name}.{method}")
    if live:  # as for sync actors (XFER-2), without holding up the event loop
        await asyncio.get_running_loop().run_in_executor(None, wait_read, live, None, REPLY_WAIT_S)


def cleanup_async(
    d: DispatcherLike, a: ActorEntry, hook: Callable[[Any], Any] | None, then: Callable[[], Any] | None = None
) -> None:
    """Ends async actor ``a`` (on the asyncio thread): see ``_end``; then ``then()``."""
    import asyncio

    if a.task is not None:
        a.task.cancel()
    task = asyncio.get_running_loop().create_task(_end(d, a, hook))
    if then is not None:
        task.add_done_callback(lambda _t: then())
    d._async_cleanups = [t for t in d._async_cleanups if not t.done()] + [task]


async def _end(d: DispatcherLike, a: ActorEntry, hook: Callable[[Any], Any] | None) -> None:
    """ENDPOINT-2: the actor's concurrent tasks are cancelled and awaited, then its
    ``__cleanup__`` runs. Calls still queued for it are refused (never left
    without a reply), as a sync actor's are."""
    import asyncio

    while a.inbox is not None and not a.inbox.empty():
        item = a.inbox.get_nowait()
        failed = d._failed.get(a.name)
        d._reject(item.token, ACTOR_FAILED + failed if failed else f"actor {a.name!r} was stopped")

    while a.tasks:
        tasks = list(a.tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        a.tasks.difference_update(tasks)
    if hook is not None:
        await _guard(hook(None), f"{a.name}.__cleanup__")
    if owns(a.name):  # OWN-1 (stopping waits for the agent: off the loop)
        await asyncio.get_running_loop().run_in_executor(None, stop_owned, a.name)


async def _guard(coro: Any, what: str) -> None:
    try:
        await coro
    except BaseException:
        traceback.print_exc()
        print(f"monarch: {what} raised (above); ignored", file=sys.stderr)


__all__ = ["cleanup_async", "consume", "enqueue", "event_loop"]
