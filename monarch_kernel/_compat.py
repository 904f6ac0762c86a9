"""The rest of Monarch's ``monarch.actor`` names (docs/monarch-compat.md lists every
name and how it compares)."""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Generic, ParamSpec, TypeVar

from monarch_kernel.actor import concurrent_endpoint
from monarch_kernel.mesh import (
    Channel,
    Endpoint,
    Future,
    Port,
    PortReceiver,
    RankedPortReceiver,
    unhandled_fault_hook,
)

A = TypeVar("A")
R = TypeVar("R")
T = TypeVar("T")
P = ParamSpec("P")


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
    port: Port[Any] | None = None,
    selection: str = "all",
) -> None:
    """Fire-and-forget ``endpoint(*args, **kwargs)`` to every actor (``"all"``) or one
    (``"choose"``). With ``port``, each actor's answer is sent on it (from the actor's
    rank: a ranked receiver tells them apart); without, an exception goes to supervision.
    ``endpoint`` may be a ``remote`` function: it runs on every proc of the active mesh."""
    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")
    free = getattr(endpoint, "free_function_endpoint", None)
    if free is not None:  # a remote function: on every proc of the active mesh
        fn = getattr(endpoint, "fn")  # noqa: B009 (a Remote's function)
        endpoint, args, kwargs = free("send"), (fn, tuple(args), dict(kwargs)), {}
    if port is None:
        if selection == "all":
            endpoint.broadcast(*args, **kwargs)
        else:
            endpoint._send(args, kwargs, [random.randrange(len(endpoint._mesh._shape))], True)
        return
    if not isinstance(port, Port):
        raise TypeError(f"port must be a Port (from Channel.open()), not {type(port).__name__}")
    n = len(endpoint._mesh._shape)
    local = list(range(n)) if selection == "all" else [random.randrange(n)]
    if endpoint._explicit:  # the endpoint answers on the port itself
        endpoint._send((port, *args), kwargs, local, True)
        return
    calls = endpoint._send(args, kwargs, local, False)
    decode = endpoint._decoder(local)
    threading.Thread(
        target=_forward, args=(calls, local, decode, port), name="monarch-send-port", daemon=True
    ).start()


def _forward(calls: list[Any], local: list[int], decode: Callable[[Any, int], Any], port: Port[Any]) -> None:
    """``send(..., port=...)`` of a returning endpoint: each answer goes on ``port``
    as it comes, as its actor's rank."""
    from monarch_kernel.mesh import wait_calls

    for i, c in enumerate(calls):
        ranked: Port[Any] = Port(port._addr, port._token, port._id, port._once, local[i])
        try:
            (reply,) = wait_calls([c], None)
            value = decode(reply, i)
        except BaseException as e:
            ranked.exception(e)
        else:
            ranked.send(value)


def get_or_spawn_controller(name: str, Class: type, *args: Any, **kwargs: Any) -> Future[Any]:  # noqa: N803 (Monarch's name)
    """The one actor named ``name`` of this tree of meshes (SINGLE-1), spawned as
    ``Class(*args, **kwargs)`` on the root controller's ``this_proc()`` on first use;
    from any actor on any proc, the same one. The spawn never blocks an event loop
    that awaits it."""
    from monarch_kernel.controller import get_or_spawn_singleton

    async def spawn() -> Any:
        import asyncio

        call = functools.partial(get_or_spawn_singleton, name, Class, args, kwargs)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    return Future(coro=spawn())


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> Endpoint[Any]:
    """An endpoint of a method of a spawned actor that is not marked ``@endpoint``:
    ``as_endpoint(mesh.method).call(...)``."""
    from monarch_kernel.actor import EndpointProperty
    from monarch_kernel.mesh import NotAnEndpoint

    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError("expected an method of a spawned actor")
    mesh, name = not_an_endpoint._mesh, not_an_endpoint._name
    prop: EndpointProperty[Any] = EndpointProperty(
        getattr(mesh._class, name), propagate, explicit_response_port
    )
    return Endpoint(mesh, name, prop)


def returns_future(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Future[T]]:
    """Makes an async function return a ``Future``: calling it does not start the body;
    ``await`` runs it in the awaiting loop, ``.get()`` on a background loop."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return Future(coro=function(*args, **kwargs))

    return wrapper


def shutdown_context(host_timeout: float | None = None) -> Future[None]:
    """Stops what this process started for its actors: its unnamed (ephemeral) meshes,
    as at exit, each given ``host_timeout`` s (default 5) to stop. Named meshes keep
    running (``monarch-kernel down NAME`` stops them)."""
    from monarch_kernel.controller import stop_all_ephemeral

    stop_all_ephemeral(5.0 if host_timeout is None else host_timeout)
    return Future._resolved(None)


__all__ = [
    "Accumulator",
    "Channel",
    "ChannelTransport",
    "attach_to_workers",
    "debug_controller",
    "enable_transport",
    "gpu_direct_rdma_supported",
    "local_proc_mesh",
    "proc_mesh",
    "run_worker_loop_forever",
    "sim_proc_mesh",
    "Port",
    "PortReceiver",
    "RankedPortReceiver",
    "as_endpoint",
    "concurrent_endpoint",
    "get_or_spawn_controller",
    "returns_future",
    "send",
    "shutdown_context",
    "unhandled_fault_hook",
]


# -- Monarch's other names --------------------------------------------------------------


def proc_mesh(*, gpus: int | None = None, hosts: int = 1, env: dict[str, str] | None = None) -> Any:
    """Monarch's older way to make procs: ``this_host().spawn_procs(per_host={"gpus": gpus})``."""
    from monarch_kernel.controller import this_host

    if hosts != 1:
        raise ValueError(
            f"proc_mesh(hosts={hosts}): this host is one host; for several, use a job "
            "(monarch_kernel.job.SSHJob / SlurmJob) and its host mesh's spawn_procs"
        )
    return this_host().spawn_procs(per_host={"gpus": gpus} if gpus else None, env=env)


local_proc_mesh = proc_mesh


class ChannelTransport(enum.Enum):
    """Monarch's transports. Here every connection is TCP (TLS across hosts), so the
    choice changes nothing; ``enable_transport`` accepts them all."""

    Unix = "ipc"
    TcpWithHostname = "tcp"
    TcpWithLocalhost = "tcp-localhost"
    MetaTlsWithIpV6 = "metatls"
    MetaTlsWithHostname = "metatls-hostname"
    Tls = "tls"
    Local = "local"


def enable_transport(transport: ChannelTransport | str) -> None:
    """Accepted for Monarch code: connections here are TCP, with TLS across hosts
    (docs/multihost.md), whatever is asked."""
    if isinstance(transport, ChannelTransport):
        return
    known = {t.value for t in ChannelTransport}
    if not isinstance(transport, str) or not (transport in known or "://" in transport):
        raise ValueError(
            f"unknown transport {transport!r}; one of {sorted(known)} or a URL like tcp://host:port"
        )


def gpu_direct_rdma_supported() -> bool:
    """False: transfers here go through the native TCP engine, not GPU-direct RDMA."""
    return False


def _unsupported(name: str, instead: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"monarch_kernel has no {name}: {instead}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not in monarch_kernel: {instead}"
    return refuse


sim_proc_mesh = _unsupported(
    "sim_proc_mesh", "there is no simulator; this_host().spawn_procs(...) runs real procs on this machine"
)
debug_controller = _unsupported(
    "debug_controller",
    "debug remote actors from the notebook with breakpoint() in an endpoint and %mesh debug (see the README)",
)
_AGENTS_RUN_WORKERS = (
    "workers are started by host agents: SSHJob / SlurmJob start them on each host (docs/multihost.md)"
)
run_worker_loop_forever = _unsupported("run_worker_loop_forever", _AGENTS_RUN_WORKERS)
run_worker_loop_until_shutdown = _unsupported("run_worker_loop_until_shutdown", _AGENTS_RUN_WORKERS)
start_worker_loop_forever = _unsupported("start_worker_loop_forever", _AGENTS_RUN_WORKERS)
default_bootstrap_cmd = _unsupported(
    "default_bootstrap_cmd",
    "host agents start the workers with the mesh's Python (HostMesh.with_python_executable) and "
    "spawn_procs(env=...); code to run first goes in spawn_procs(bootstrap=...)",
)
ProcId = _unsupported(
    "ProcId", "procs are addressed by mesh and rank (ProcMesh.slice, current_rank()), not by hyperactor ids"
)
Uid = _unsupported(
    "Uid", "procs are addressed by mesh and rank (ProcMesh.slice, current_rank()), not by hyperactor ids"
)


# -- telemetry: spans go to the ``monarch_kernel.telemetry`` logger -----------------

_telemetry = logging.getLogger("monarch_kernel.telemetry")


@contextlib.contextmanager
def span(name: str) -> Iterator[None]:
    """Marks a piece of work: its start and its duration are logged (at DEBUG, with
    the actor that ran it) to the ``monarch_kernel.telemetry`` logger, from which any
    logging handler (OpenTelemetry's too) can take them."""
    from monarch_kernel.actor import current_actor_name

    who = current_actor_name()
    start = time.perf_counter()
    _telemetry.debug("span %s started (%s)", name, who)
    try:
        yield
    finally:
        _telemetry.debug("span %s took %.6f s (%s)", name, time.perf_counter() - start, who)


def traced(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """``@traced`` or ``@traced(name=...)``: runs each call of a function (sync or
    async) in a ``span`` named after it."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        label = name or f.__name__
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                with span(label):
                    return await f(*args, **kwargs)

            return traced_async

        @functools.wraps(f)
        def traced_sync(*args: Any, **kwargs: Any) -> Any:
            with span(label):
                return f(*args, **kwargs)

        return traced_sync

    return wrap(fn) if fn is not None else wrap


def get_meter() -> Any:
    """OpenTelemetry's meter for monarch (``opentelemetry-api``, where installed):
    counters and histograms made from it go wherever the process's OpenTelemetry
    setup sends them."""
    try:
        from opentelemetry import metrics
    except ImportError:
        raise ModuleNotFoundError(
            "get_meter() gives OpenTelemetry's meter: pip install opentelemetry-api "
            "(and an exporter) in the procs' environment"
        ) from None
    return metrics.get_meter("monarch")


attach_to_workers = _unsupported(
    "attach_to_workers", "use a job (monarch_kernel.job.SSHJob / SlurmJob) or attach(name) for a named mesh"
)
