"""How an actor ends from the inside: by failing, and by its own ``stop()`` or
``abort()``.

DISPATCH-4: a BaseException that is no Exception (and no interrupt) ends the actor,
as in Monarch: its call fails with a SupervisionError, later calls are refused with
the reason, its ``__cleanup__`` runs, and its controller hears of it.

A part of ``Dispatcher`` (see ``_dispatcher``): the functions that take it are its
methods."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

from monarch_kernel import _native
from monarch_kernel._wire import ACTOR_FAILED
from monarch_kernel.worker._actor_table import forget_plain

if TYPE_CHECKING:
    from monarch_kernel.worker._state import ActorEntry, DispatcherLike


def fails_actor(e: BaseException) -> bool:
    """DISPATCH-4: whether ``e`` ends the actor: a BaseException that is no Exception
    (Monarch's meaning), except the interrupts the stop button sends."""
    import asyncio

    return not isinstance(e, (Exception, KeyboardInterrupt, asyncio.CancelledError))


def fail_actor(d: DispatcherLike, a: ActorEntry, exc: BaseException, token: int, what: str) -> None:
    """DISPATCH-4: ``exc`` (a BaseException that is no Exception, and no interrupt)
    ends actor ``a``: the call that raised fails with a SupervisionError, later
    calls to it are refused saying why, its ``__cleanup__`` runs, and supervision
    hears of it (the actor's controller, as an ``actor_failed`` failure)."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ else None
    formatted = "".join(traceback.format_exception(type(exc), exc, tb))
    end_actor(d, a, f"{what} raised\n{formatted}", token)


def end_actor(d: DispatcherLike, a: ActorEntry, why: str, token: int = 0) -> None:
    """DISPATCH-4: actor ``a`` failed (``why``), and ends; see ``fail_actor``."""
    reason = f"actor {a.context.actor_instance} exited because of the following reason: {why}"
    d._failed[a.name] = reason
    forget_plain(a)  # (FAST-1: later calls take the dispatcher, which refuses them)
    d._actor_failed(a.name, reason)  # (first: its supervisor hears before its caller)
    if token:
        d.server.reply(token, _native.REPLY_REJECTED, (ACTOR_FAILED + reason).encode(), [])
    stop_later(d, a)


def stop_later(d: DispatcherLike, a: ActorEntry) -> None:
    """Stops ``a`` on the routing thread, if it is still the actor of its name then
    (not replaced meanwhile)."""

    def stop() -> None:
        if d.actors.get(a.name) is a:
            d._stop_actor(0, a.name)

    d.router.submit(stop)


def instance_ends(d: DispatcherLike, name: str, reason: str | None, failed: bool) -> None:
    """``context().actor_instance.abort(reason)`` (``failed``) or ``.stop(reason)``:
    the running actor ends once its current message is done."""
    a = d.actors.get(name)
    if a is None:
        return

    def end() -> None:
        if failed:
            end_actor(d, a, f"aborted: {reason or 'no reason provided'}")
        else:
            stop_later(d, a)

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


__all__ = ["end_actor", "fail_actor", "fails_actor", "instance_ends", "stop_later"]
