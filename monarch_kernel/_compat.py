"""The rest of Monarch's ``monarch.actor`` names: those that work here with the same
meaning, and those that raise ``NotImplementedError`` naming what to use instead
(docs/monarch-compat.md lists which)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from monarch_kernel.controller import this_proc
from monarch_kernel.mesh._actor_mesh import Endpoint
from monarch_kernel.mesh._future import Future

A = TypeVar("A")
R = TypeVar("R")


class Accumulator(Generic[R, A]):
    """Folds the results of ``endpoint.stream()``: ``Accumulator(ep, 0, operator.add).accumulate()``."""

    def __init__(self, endpoint: Endpoint[R], identity: A, combine: Callable[[A, R], A]) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        futures = list(self._endpoint.stream(*args, **kwargs))
        calls = [c for f in futures for c in f._calls]

        def finish(_: list[Any]) -> A:
            value = self._identity
            for f in futures:
                value = self._combine(value, f.get())
            return value

        return Future(_calls=calls, _finish=finish)


def send(
    endpoint: Endpoint[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Any = None,
    selection: str = "all",
) -> None:
    """Fire-and-forget ``endpoint(*args, **kwargs)`` to every actor (``"all"``) or one (``"choose"``)."""
    if port is not None:
        raise NotImplementedError(
            "send(port=...) is not supported: use endpoint.call() and its Future instead"
        )
    if selection == "all":
        endpoint.broadcast(*args, **kwargs)
    elif selection == "choose":
        endpoint.choose(*args, **kwargs)
    else:
        raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")


_controllers: dict[str, Any] = {}
_controllers_lock = threading.Lock()


def get_or_spawn_controller(name: str, cls: type, *args: Any, **kwargs: Any) -> Future[Any]:
    """A per-process singleton actor named ``name``, spawned on ``this_proc()`` on first use."""
    with _controllers_lock:
        mesh = _controllers.get(name)
        if mesh is None:
            mesh = _controllers[name] = this_proc().spawn(name, cls, *args, **kwargs)
    return Future._resolved(mesh)


def unhandled_fault_hook(failure: Any) -> None:
    """Called with failures no one handled. Reassign it to change what happens."""
    print(f"monarch_kernel: unhandled fault: {failure}")


def _missing(name: str, instead: str) -> Any:
    message = f"monarch_kernel does not implement {name} yet; {instead}"

    class _Missing:
        __qualname__ = __name__ = name

        def __init__(self, *a: Any, **k: Any) -> None:
            raise NotImplementedError(message)

        def __class_getitem__(cls, item: Any) -> Any:
            return cls

        @classmethod
        def open(cls, *a: Any, **k: Any) -> Any:
            raise NotImplementedError(message)

        open_ranked = open

    return _Missing


Channel = _missing("Channel", "return values from endpoints and use call()/stream() instead")
Port = _missing("Port", "return values from endpoints and use call()/stream() instead")
PortReceiver = _missing("PortReceiver", "return values from endpoints and use call()/stream() instead")


def concurrent_endpoint(*a: Any, **k: Any) -> Any:
    raise NotImplementedError(
        "concurrent_endpoint is not implemented yet; use @endpoint (one message at a time per actor) and "
        "spawn more actors for concurrency"
    )


def as_endpoint(*a: Any, **k: Any) -> Any:
    raise NotImplementedError("as_endpoint is not implemented; mark the method with @endpoint instead")


def returns_future(*a: Any, **k: Any) -> Any:
    raise NotImplementedError("returns_future is not implemented; await the coroutine directly instead")
