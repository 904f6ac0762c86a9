"""Replies of the ``Dispatcher``: a result, an exception (with the remote traceback)
or a refusal, back to the caller of a message; an exception of a message nobody
waits for (a broadcast) goes to supervision instead (OWN-1).

A part of ``Dispatcher`` (see ``_dispatcher``): these functions are its methods."""

from __future__ import annotations

import sys
import traceback
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native
from monarch_kernel.mesh import dumps, dumps_exception
from monarch_kernel.worker import _debug

if TYPE_CHECKING:
    from monarch_kernel.worker._state import DispatcherLike

#: Longest an actor waits for its caller to pull a large return value (XFER-2).
REPLY_WAIT_S = 10.0


def reply(d: DispatcherLike, token: int, value: Any, what: str) -> list[int]:
    """Sends ``value`` back; the registrations of its large buffers that are this
    process's own memory, which the actor should not change before the caller
    has pulled them (XFER-2: see ``wait_read``)."""
    if not token:
        return []
    live: list[int] = []
    try:
        data, raws = dumps(value, f"return value of {what}", d.token, 1, live=live)
    except BaseException as e:  # a reply always goes out (an interrupt landing here too)
        d._reply_exception(token, e, what)
        return []
    d.server.reply(token, _native.REPLY_RESULT, data, raws)
    return live


def reply_exception(d: DispatcherLike, token: int, exc: BaseException | None, what: str | None) -> None:
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
        a = d.actors.get(actor)
        who = str(a.context.actor_instance) if a is not None else actor
        d._actor_failed(
            actor,
            f"actor {who} failed: {what} raised, in a message nobody waited for the answer of "
            f"(a broadcast). This occurred because the actor itself failed.\n{formatted}",
        )
        return
    if not token:
        print(f"monarch: {what or 'a message'} raised:\n{formatted}", file=sys.stderr, flush=True)
        return
    data, raws = dumps_exception(exc, formatted)
    d.server.reply(token, _native.REPLY_EXCEPTION, data, raws)


def reject(d: DispatcherLike, token: int, message: str) -> None:
    if token:
        d.server.reply(token, _native.REPLY_REJECTED, message.encode(), [])


__all__ = ["REPLY_WAIT_S", "reject", "reply", "reply_exception"]
