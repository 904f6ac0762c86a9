"""What the ``Dispatcher``'s parts see of it: ``DispatcherLike``, the state and the
methods they use on the dispatcher ``d`` they take first, and ``ActorEntry``, a
record of its table of actors.

The parts (``_actor_table``, ``_sync_actors``, ``_async_actors``, ``_interrupts``,
``_actor_failure``, ``_supervision``, ``_replies``, ``_builtin``) are typed by these,
never by ``Dispatcher`` itself, so no part imports ``_dispatcher``: it imports them
(its methods are their functions), and the imports go one way. This module imports
no other part of the worker (``_lanes`` only for a type), so it closes no loop.

``Dispatcher`` satisfies ``DispatcherLike`` as it binds the parts' functions as its
methods; mypy checks that (in ``_dispatcher``), and nothing here runs per call:
``d`` is the dispatcher itself, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio
    import collections
    import threading

    from monarch_kernel import _native
    from monarch_kernel.actor import Actor, Context
    from monarch_kernel.mesh import Point
    from monarch_kernel.worker._lanes import LaneThread


@dataclass
class ActorEntry:
    """An actor of this process, as the table keeps it."""

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
    #: ``message_context``'s last: (rank, dims, sizes) of a message, and its context.
    last_context: tuple[tuple[int, tuple[str, ...], tuple[int, ...]], Context] | None = None


class DispatcherLike(Protocol):
    """The ``Dispatcher`` as its parts use it: exactly what they read, change and call
    on ``d`` (see ``Dispatcher.__init__`` for what each field is for)."""

    # -- state -----------------------------------------------------------------------

    server: _native.WorkerServer
    point: Point
    token: str
    actors: dict[str, ActorEntry]
    router: LaneThread
    _aloop: asyncio.AbstractEventLoop | None
    _aloop_thread: threading.Thread | None
    _async_cleanups: list[asyncio.Task[None]]
    _cancels: collections.OrderedDict[int, int]
    _early_cancels: collections.OrderedDict[int, bool]
    _failed: dict[str, str]
    _supervisors: dict[str, tuple[str, Any]]

    @property
    def builtin(self) -> Actor:
        """The built-in actor (a ``_builtin.WorkerBuiltin``: read-only here, so that
        this module need not import the part that defines it)."""

    # -- the parts' functions, as the dispatcher's methods -----------------------------

    def _callee(
        self, token: int, actor: str, method: str, runner: LaneThread | None = None
    ) -> ActorEntry | None:
        """``_actor_table.callee``."""

    def _stop_actor(self, token: int, name: str) -> None:
        """``_actor_table.stop_actor``."""

    def _cleanup_sync(
        self, a: ActorEntry, hook: Callable[[Any], Any] | None, then: Callable[[], Any] | None = None
    ) -> None:
        """``_sync_actors.cleanup_sync``."""

    def _close_runner(self, runner: LaneThread) -> None:
        """``_sync_actors.close_runner``."""

    def _async(self) -> asyncio.AbstractEventLoop:
        """``_async_actors.event_loop``."""

    async def _consume(self, a: ActorEntry) -> None:
        """``_async_actors.consume``."""

    def _cleanup_async(
        self, a: ActorEntry, hook: Callable[[Any], Any] | None, then: Callable[[], Any] | None = None
    ) -> None:
        """``_async_actors.cleanup_async``."""

    def _fail_actor(self, a: ActorEntry, exc: BaseException, token: int, what: str) -> None:
        """``_actor_failure.fail_actor``."""

    def _end_actor(self, a: ActorEntry, why: str, token: int = 0) -> None:
        """``_actor_failure.end_actor``."""

    def _actor_failed(self, actor: str, message: str) -> None:
        """``_supervision.actor_failed``."""

    def _reply(self, token: int, value: Any, what: str) -> list[int]:
        """``_replies.reply``."""

    def _reply_exception(self, token: int, exc: BaseException | None, what: str | None) -> None:
        """``_replies.reply_exception``."""

    def _reject(self, token: int, message: str) -> None:
        """``_replies.reject``."""


__all__ = ["ActorEntry", "DispatcherLike"]
