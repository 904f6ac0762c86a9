"""Sync actors of the ``Dispatcher``: each has a thread of its own, waiting on a lane
of its own where the native server puts that actor's calls (INBOX-3, ``_lanes``); it
runs the constructor and the endpoints one at a time, with no event loop (as
Monarch does), so a sync endpoint may wait on another actor in the same process.

A part of ``Dispatcher`` (see ``_dispatcher``): the functions that take it are its
methods."""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native, _origin
from monarch_kernel.mesh import actor_context, loads, stop_owned, wait_read
from monarch_kernel.worker import _display
from monarch_kernel.worker._actor_failure import fails_actor
from monarch_kernel.worker._actor_table import message_context
from monarch_kernel.worker._lanes import LaneThread, lane_threads
from monarch_kernel.worker._replies import REPLY_WAIT_S

if TYPE_CHECKING:
    from monarch_kernel.worker._state import ActorEntry, DispatcherLike


#: Results that pickle small and the same with the C pickler, whatever their value: a
#: call's hot path replies with them without ``dumps`` (the reply's size cannot pass
#: the control plane's limit).
_SCALARS = frozenset({type(None), bool, int, float})
_ORIGIN = _origin.var
#: What a message whose buffers went through the transfer engine starts with.
_HEADER = _native.MESSAGE_HEADER
#: DISPLAY-1's test (``_display.ensure_if_imported``) on a plain call's hot path, inline
#: (a frame fewer per call): the shell list is appended to, never rebound.
_SHELL = _display._shell
_MODULES = sys.modules


def run_sync_item(d: DispatcherLike, runner: LaneThread, item: _native.Incoming) -> None:
    """Runs one call on its actor's thread ``runner`` and replies (DISPATCH-1, DISPATCH-2).

    A call's hot path, run once per call by every worker of a mesh, each with cold
    caches (1,024 of them share a host's CPUs in the scale bench): what a plain call
    needs is inline here, and the general cases (a rejected call, a new message rank,
    buffers, a result that needs ``dumps``) call out."""
    token, call_id, method, actor = item.token, item.call_id, item.method, item.actor
    a = d.actors.get(actor)
    if a is None or a.runner is not runner or actor in d._failed:
        a = d._callee(token, actor, method, runner)  # (rejects the call, saying why)
        if a is None:
            return
    last = a.last_context
    place = item.place  # (the last message's object while it is the same)
    context = last[1] if last is not None and last[0] is place else message_context(a, item)
    runner.plain_table[actor] = (a.instance, place, context, a)  # FAST-1: its next calls
    reset = actor_context.set(context)
    reset_origin = _ORIGIN.set(item.origin)
    what = f"{a.name}.{method}"
    try:
        runner.running_what = what
        runner.running_call = call_id  # in the try: a cancel from now on gets a reply
        if d._early_cancels and d._early_cancels.pop(call_id, False):
            raise KeyboardInterrupt("the call was interrupted before it started")
        payload, buffers = item.payload, item.buffers
        if buffers or type(payload) is not bytes or payload.startswith(_HEADER):
            args, kwargs = loads(payload, buffers, d.token)
        else:
            args, kwargs = pickle.loads(payload)
        _display.ensure_if_imported()  # DISPLAY-1
        result = getattr(a.instance, method)(*args, **kwargs)
    except BaseException as e:  # DISPATCH-2, KeyboardInterrupt from a cancel included
        runner.running_call = None
        _raised(d, a, token, e, what)
        return
    finally:
        runner.running_call = None
        _ORIGIN.reset(reset_origin)
        actor_context.reset(reset)
    if type(result) in _SCALARS:
        if token:  # (none: a broadcast)
            d.server.reply(token, _native.REPLY_RESULT, pickle.dumps(result, protocol=5), [])
        return
    _reply_waiting(d, token, result, what)


def _raised(d: DispatcherLike, a: ActorEntry, token: int, e: BaseException, what: str) -> None:
    """A call to ``a`` raised ``e``: the actor ends (DISPATCH-4), or the caller gets
    the exception (DISPATCH-2)."""
    if fails_actor(e) and getattr(a.instance, "_base_exceptions_end_it", True):
        d._fail_actor(a, e, token, what)
    else:
        d._reply_exception(token, e, what)


def _reply_waiting(d: DispatcherLike, token: int, result: Any, what: str) -> None:
    """Replies with ``result``. XFER-2: the actor's next message may change what it
    returned; the caller pulls it as the reply arrives, and this waits for that."""
    wait_read(d._reply(token, result, what), limit=REPLY_WAIT_S)


def plain_calls(d: DispatcherLike, runner: LaneThread) -> _native.PlainCalls | None:
    """FAST-1: what lets ``runner``'s native server run a plain call to its actor as
    ``run_sync_item`` would, without it (None where ``MONARCH_PLAIN_CALLS=0``)."""
    if os.environ.get("MONARCH_PLAIN_CALLS", "1") == "0":
        return None

    def failed(entry: tuple[Any, Any, Any, ActorEntry], token: int, e: BaseException, what: str) -> None:
        _raised(d, entry[3], token, e, what)

    def finish(token: int, result: Any, what: str) -> None:
        _reply_waiting(d, token, result, what)

    return _native.PlainCalls(
        runner.plain_table, d._early_cancels, actor_context, _ORIGIN, _call, failed, finish, pickle.dumps
    )


def _call(instance: Any, method: str, payload: bytes) -> Any:
    """FAST-1: a plain call's arguments unpickled, and the call (the frame an
    exception's traceback starts at, as ``run_sync_item``'s: ``_replies`` drops it)."""
    args, kwargs = pickle.loads(payload)
    if not _SHELL and "IPython" in _MODULES:  # DISPLAY-1, as ensure_if_imported
        _display.ensure()
    return getattr(instance, method)(*args, **kwargs)


def cleanup_sync(
    d: DispatcherLike, a: ActorEntry, hook: Callable[[Any], Any] | None, then: Callable[[], Any] | None = None
) -> None:
    """Ends sync actor ``a`` on its thread, after what it has queued: its
    ``__cleanup__``, the meshes it owns (OWN-1), ``then()``, its thread."""
    runner = a.runner
    assert runner is not None
    if hook is not None:
        runner.submit(lambda: _guarded(hook, f"{a.name}.__cleanup__"))
    runner.submit(lambda: stop_owned(a.name))  # OWN-1
    if then is not None:
        runner.submit(then)
    runner.submit(lambda: close_runner(d, runner))


def close_runner(d: DispatcherLike, runner: LaneThread) -> None:
    """Ends ``runner``'s thread (on it); calls still queued for it are rejected."""
    runner.stopped = True
    lane_threads.discard(runner)
    for item in d.server.close_lane(runner.lane):
        d._reject(item.token, f"actor {item.actor!r} was stopped")


def _guarded(fn: Callable[[Any], Any], what: str) -> None:
    try:
        fn(None)
    except BaseException:
        traceback.print_exc()
        print(f"monarch: {what} raised (above); ignored", file=sys.stderr)


__all__ = ["cleanup_sync", "close_runner", "plain_calls", "run_sync_item"]
