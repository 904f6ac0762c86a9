"""``Dispatcher``: runs the actors of one process for its native ``Worker`` server.

Threads:
- the *routing thread* waits on the server's loop lane (LANE_LOOP, INBOX-1): spawns,
  stops, cancels, async actors' calls, calls to the built-in actor (``_builtin``)
  and port messages (``KIND_PORT``: ``mesh.deliver_port_message``). It owns the table of
  actors;
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
(DISPATCH-3, in ``_lanes``: no lane thread is left waiting in native code at exit.
DISPATCH-4, in ``_actor_failure``: a BaseException that is no Exception ends the actor.)

This file holds the dispatcher's state and its routing; each other concern is a
file of functions that take the dispatcher first, bound below as its methods (so
a call between them costs what a method call costs). Those files type the
dispatcher by ``_state.DispatcherLike``, what they use of it, never by
``Dispatcher``: this file imports them, none imports it, and the imports go one
way (mypy checks, at the end of this file, that ``Dispatcher`` is ``DispatcherLike``):

- ``_state``: ``DispatcherLike``, and ``ActorEntry``, the record of an actor;
- ``_actor_table``: which actor a call is for, spawning, replacing and stopping
  actors, and the worker's exit (STOP-1);
- ``_sync_actors``: a sync actor's calls, on its lane thread;
- ``_async_actors``: the asyncio thread and the async actors' calls;
- ``_interrupts``: cancels, and a second one ending the worker (INTERRUPT-2);
- ``_actor_failure``: an actor failing, or stopping itself (DISPATCH-4);
- ``_supervision``: where failures go, and owners' ``__supervise__`` (OWN-1);
- ``_replies``: results, exceptions and refusals back to the callers.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native
from monarch_kernel._wire import BUILTIN
from monarch_kernel.actor import Context, Instance, is_async_actor
from monarch_kernel.mesh import Point, deliver_port_message, install_actors, loads
from monarch_kernel.worker import (
    _actor_failure,
    _actor_table,
    _async_actors,
    _interrupts,
    _replies,
    _supervision,
    _sync_actors,
)
from monarch_kernel.worker._async_actors import enqueue
from monarch_kernel.worker._builtin import WorkerBuiltin, serve_builtin
from monarch_kernel.worker._lanes import LaneThread
from monarch_kernel.worker._state import ActorEntry

if TYPE_CHECKING:
    import asyncio

    from monarch_kernel.worker._state import DispatcherLike

_SPAWN, _STOP, _CALL, _CANCEL = _native.KIND_SPAWN, _native.KIND_STOP, _native.KIND_CALL, _native.KIND_CANCEL
_PORT = _native.KIND_PORT
_LANE_LOOP = _native.LANE_LOOP


class Dispatcher:
    """Runs actors for ``server`` (a ``_native.WorkerServer``)."""

    def __init__(self, server: Any, point: Point, token: str) -> None:
        self.server = server
        self.point = point
        self.token = token  # the mesh's: transfers in and out use it
        # Owned by the routing thread (_actor_table).
        self.actors: dict[str, ActorEntry] = {}
        self.router = LaneThread(server, "monarch-dispatch", self._route_guarded, lane=_LANE_LOOP)
        # The asyncio thread (_async_actors), started with the first async actor.
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._aloop_thread: threading.Thread | None = None
        self._async_cleanups: list[asyncio.Task[None]] = []  # __cleanup__ of async actors
        #: How many cancels each recent call got (INTERRUPT-2), oldest first.
        self._cancels: collections.OrderedDict[int, int] = collections.OrderedDict()
        #: Cancels of sync calls that had not started: they end without running.
        self._early_cancels: collections.OrderedDict[int, bool] = collections.OrderedDict()
        #: DISPATCH-4: why each failed actor ended (calls to it are refused with it).
        self._failed: dict[str, str] = {}
        #: OWN-1: actors spawned by an actor: (that actor's name, the port its
        #: process hears failures on), set by the built-in ``supervise``.
        self._supervisors: dict[str, tuple[str, Any]] = {}
        install_actors(self, (server.addr, token), Context(Instance(point, name="root"), message_rank=point))
        #: The built-in actor (``BUILTIN``), served on the routing thread.
        self.builtin = WorkerBuiltin(self)

    def start(self) -> None:
        """Starts the routing thread."""
        self.router.thread.start()

    # -- the other parts, as methods -------------------------------------------------

    _callee = _actor_table.callee
    _construct = _actor_table.construct
    _stop_actor = _actor_table.stop_actor
    exit_cleanly = _actor_table.exit_cleanly
    _run_sync_item = _sync_actors.run_sync_item
    _cleanup_sync = _sync_actors.cleanup_sync
    _close_runner = _sync_actors.close_runner
    _async = _async_actors.event_loop
    _consume = _async_actors.consume
    _cleanup_async = _async_actors.cleanup_async
    _cancel = _interrupts.cancel
    _fail_actor = _actor_failure.fail_actor
    _end_actor = _actor_failure.end_actor
    instance_ends = _actor_failure.instance_ends
    _actor_failed = _supervision.actor_failed
    supervise_owner = _supervision.supervise_owner

    def instance_of(self, name: str) -> Any:
        a = self.actors.get(name)
        return None if a is None else a.instance

    send_up = _supervision.send_up
    _reply = _replies.reply
    _reply_exception = _replies.reply_exception
    _reject = _replies.reject

    # -- routing (routing thread) ----------------------------------------------------

    def _route_guarded(self, _router: LaneThread, item: _native.Incoming) -> None:
        try:
            self._route(item)
        except Exception:  # DISPATCH-2: report, never stop dispatching
            self._reply_exception(item.token, sys.exc_info()[1], None)

    def _route(self, item: _native.Incoming) -> None:
        token, kind, actor, method = item.token, item.kind, item.actor, item.method
        if kind == _CALL and actor == BUILTIN:
            serve_builtin(self, item)
        elif kind == _PORT:
            refused = deliver_port_message(item, self.token)
            if refused is None:
                self._reply(token, None, "port message")
            else:
                self._reject(token, refused)
        elif kind == _CALL:
            a = self._callee(token, actor, method)
            if a is None:
                return
            if a.is_async:
                self._async().call_soon_threadsafe(enqueue, a, item)
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
                runner.plain = _sync_actors.plain_calls(self, runner)
                runner.submit(lambda: self._construct(token, actor, cls, args, kwargs, runner, origin))
                runner.thread.start()
        elif kind == _STOP:
            self._stop_actor(token, actor)
        elif kind == _CANCEL:
            self._cancel(item.call_id)


if TYPE_CHECKING:
    # The parts are typed by DispatcherLike: mypy fails here if Dispatcher, with
    # their functions as its methods, is not that (a field renamed, a signature changed).
    _is_dispatcher_like: type[DispatcherLike] = Dispatcher

__all__ = ["Dispatcher"]
