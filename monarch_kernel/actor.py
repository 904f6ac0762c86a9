"""What actor code uses: ``Actor``, ``endpoint``, ``concurrent_endpoint``,
``context``, ``current_rank``, ``current_size``. Works in the controller, in workers
and in plain scripts.

ENDPOINT-1: an endpoint with ``explicit_response_port=True`` gets a ``Port`` as its
first argument (after ``self``) and answers through it, now or later, from any thread
or process; what it returns is dropped. ``call``/``call_one``/``choose``/``stream``
give the caller what arrives on that port.
ENDPOINT-2: a ``@concurrent_endpoint`` (async actors only) starts its message as a
task of the actor's event loop and takes the next message at once; the tasks still
running when the actor stops are cancelled before its ``__cleanup__``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from monarch_kernel.errors import MeshSpecError

# (the mesh package's own modules: this module is of the mesh layer, and importing
# the package's facade here would import it back through _actor_mesh)
from monarch_kernel.mesh._role import here
from monarch_kernel.mesh._shape import Extent, Point

R = TypeVar("R")

_ENDPOINT_OPTIONS = ("propagate", "explicit_response_port", "instrument")


class EndpointProperty(Generic[R]):
    """An ``@endpoint`` method. On an actor instance it is the plain method; on an
    actor mesh it becomes an ``Endpoint`` with the adverbs."""

    def __init__(
        self,
        method: Callable[..., Any],
        propagate: Any = None,
        explicit_response_port: bool = False,
        instrument: bool = True,
    ) -> None:
        self._method = method
        self._propagator = propagate
        self._explicit_response_port = explicit_response_port
        self._instrument = instrument
        #: ENDPOINT-2: runs as a task of the actor's event loop, beside its other messages.
        self._concurrent = False
        self.is_async = inspect.iscoroutinefunction(method)
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return self._method.__get__(instance, owner)


@overload
def endpoint(method: Callable[..., Any]) -> EndpointProperty[Any]: ...
@overload
def endpoint(
    method: None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Callable[[Callable[..., Any]], EndpointProperty[Any]]: ...
def endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Marks an ``Actor`` method as callable from other processes.

    Used bare (``@endpoint``) or with Monarch's options (``@endpoint(instrument=False)``).
    """
    if method is None:
        return functools.partial(
            endpoint,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )
    return EndpointProperty(method, propagate, explicit_response_port, instrument)


def concurrent_endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Marks an ``async def`` method of an actor as an endpoint whose messages run
    concurrently (ENDPOINT-2): each starts as a task of the actor's event loop, in
    arrival order, and the actor takes its next message at once, instead of after the
    previous one has finished. Takes ``@endpoint``'s options. Tasks still running when
    the actor stops are cancelled before its ``__cleanup__`` runs.
    """
    if method is None:
        return functools.partial(
            concurrent_endpoint,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )
    if isinstance(method, EndpointProperty):
        raise ValueError(
            "concurrent_endpoint does not wrap @endpoint; pass endpoint options to @concurrent_endpoint"
        )
    if not inspect.iscoroutinefunction(method):
        raise ValueError("concurrent_endpoint can only wrap async endpoints")
    prop: EndpointProperty[Any] = EndpointProperty(method, propagate, explicit_response_port, instrument)
    prop._concurrent = True
    return prop


class Actor:
    """Base class of actors. Subclass it, mark methods with ``@endpoint``, and
    ``ProcMesh.spawn`` it. An actor's endpoints are all ``def`` or all ``async def``.

    Optional hooks: ``__cleanup__(self, exc)`` runs when the actor is stopped or replaced.
    """

    @property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class (Monarch's ``Actor.logger``)."""
        return logging.getLogger(f"{type(self).__module__}.{type(self).__qualname__}")


def endpoints_of(cls: type) -> dict[str, EndpointProperty[Any]]:
    out: dict[str, EndpointProperty[Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                out[name] = value
    return out


def is_async_actor(cls: type) -> bool:
    """Checks that ``cls`` can be spawned, and tells its kind: True if its endpoints are
    ``async def`` (it runs on the worker's event loop), False if they are ``def``."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise MeshSpecError(f"{cls!r} must subclass monarch_kernel.Actor to spawn it.")
    eps = endpoints_of(cls)
    gens = sorted(n for n, e in eps.items() if inspect.isasyncgenfunction(e._method))
    if gens:
        raise MeshSpecError(
            f"{cls}: endpoint(s) {gens} are async generators, which an endpoint cannot be. Return a "
            "list instead, or call the endpoint once per item (the adverb stream() yields one "
            "Future per actor)."
        )
    sync = sorted(n for n, e in eps.items() if not e.is_async)
    asyn = sorted(n for n, e in eps.items() if e.is_async)
    if sync and asyn:
        raise MeshSpecError(
            f"{cls} mixes both async and sync endpoints. Synchronous endpoints cannot be mixed "
            "with async endpoints because they can cause the asyncio loop to deadlock if they "
            f"wait. sync: {sync} async: {asyn}. Make them all `def` or all `async def`."
        )
    cleanup = getattr(cls, "__cleanup__", None)
    if cleanup is not None and sync and inspect.iscoroutinefunction(cleanup):
        raise MeshSpecError(f"{cls} has sync endpoints, but an async __cleanup__; make __cleanup__ a def.")
    if cleanup is not None and asyn and not inspect.iscoroutinefunction(cleanup):
        raise MeshSpecError(
            f"{cls} has async endpoints, but a synchronous __cleanup__; make __cleanup__ an async def."
        )
    return bool(asyn) or not eps


# -- context ---------------------------------------------------------------------------

_ROOT_EXTENT = Extent([], [])
#: Who made this process's mesh: an actor that owns it (OWN-1; its name, as
#: ``str(instance)`` gives it, comes in the worker's environment), else the controller.
CREATOR_ENV = "MONARCH_CREATOR"
_CREATOR = os.environ.get(CREATOR_ENV, "<root>")
#: The suffix that makes the name of actors an actor spawned unique (``name-<id>``):
#: names show without it, as Monarch shows its actors' given names.
_UNIQUE = re.compile(r"-[0-9a-f]{12}$")


@dataclass
class Instance:
    """The actor (or controller, ``<root>``) that is running."""

    rank: Point
    name: str = "root"
    class_name: str = ""
    proc_mesh: Any = None

    @property
    def creator(self) -> Instance | None:
        """Who spawned this actor's procs: the controller (``name == "root"``), or the
        actor that owns them (OWN-1); None for the controller itself."""
        if self.name == "root":
            return None
        if _CREATOR == "<root>":
            return Instance(Point(0, _ROOT_EXTENT))
        last = _CREATOR.rsplit(".<", 1)[-1].rstrip(">")  # "module.Class name{rank}"
        return Instance(Point(0, _ROOT_EXTENT), name=last.split(" ")[-1].split("{")[0])

    def abort(self, reason: str | None = None) -> None:
        """Ends this actor with a failure once its current message is done: later calls
        to it fail, and supervision hears of it (DISPATCH-4)."""
        self._end(reason, failed=True)

    def stop(self, reason: str | None = None) -> None:
        """Stops this actor once its current message is done (its ``__cleanup__`` runs)."""
        self._end(reason, failed=False)

    def _end(self, reason: str | None, failed: bool) -> None:
        actors = here.actors
        if self.name == "root" or actors is None:
            raise RuntimeError("abort() and stop() end an actor: call them from an actor's endpoint")
        actors.instance_ends(self.name, reason, failed)

    @property
    def actor_id(self) -> str:
        return "<root>" if self.name == "root" else f"{self.name}{self.rank}"

    def __str__(self) -> str:
        if self.name == "root":
            return "<root>"
        rank = str(self.rank) if len(self.rank) else ""
        return f"{_CREATOR}.<{self.class_name} {_UNIQUE.sub('', self.name)}{rank}>"


@dataclass
class Context:
    """What ``context()`` returns: the running actor, and where the current message was sent."""

    actor_instance: Instance
    message_rank: Point = field(default_factory=lambda: Point(0, _ROOT_EXTENT))


_ROOT = Context(Instance(Point(0, _ROOT_EXTENT)))
_current: contextvars.ContextVar[Context] = contextvars.ContextVar("monarch_kernel_context", default=_ROOT)


def process_context() -> Context:
    """The context of code that no actor runs: a worker's own proc rank, else the
    controller's root (``mesh._role.here.default_context``)."""
    return here.default_context or _ROOT


def context() -> Context:
    """The current context: the actor being run, or the controller (``<root>``)."""
    ctx = _current.get()
    return (here.default_context or _ROOT) if ctx is _ROOT else ctx


def current_rank() -> Point:
    """Where the current message was sent, e.g. ``{'procs': 1/4}``."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """The sizes of the mesh the current message was sent to."""
    return dict(context().message_rank.extent)


def current_actor_name() -> str:
    return str(context().actor_instance.actor_id)
