"""The rest of Monarch's ``monarch.actor`` names (docs/monarch-compat.md lists every
name and how it compares)."""

from __future__ import annotations

import enum
import functools
import random
import threading
from collections.abc import Callable, Coroutine
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
    rank: a ranked receiver tells them apart); without, an exception goes to supervision."""
    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")
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


def get_or_spawn_controller(name: str, cls: type, *args: Any, **kwargs: Any) -> Future[Any]:
    """The one actor named ``name`` of this tree of meshes (SINGLE-1), spawned as
    ``cls(*args, **kwargs)`` on the root controller's ``this_proc()`` on first use;
    from any actor on any proc, the same one. The spawn never blocks an event loop
    that awaits it."""
    from monarch_kernel.controller import get_or_spawn_singleton

    async def spawn() -> Any:
        import asyncio

        call = functools.partial(get_or_spawn_singleton, name, cls, args, kwargs)
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


def shutdown_context() -> Future[None]:
    """Stops what this process started for its actors: its unnamed (ephemeral) meshes,
    as at exit. Named meshes keep running (``monarch-kernel down NAME`` stops them)."""
    from monarch_kernel.controller import stop_all_ephemeral

    stop_all_ephemeral()
    return Future._resolved(None)


__all__ = [
    "Accumulator",
    "Channel",
    "ChannelTransport",
    "attach_to_workers",
    "config",
    "debug_controller",
    "enable_transport",
    "gpu_direct_rdma_supported",
    "hosts_from_config",
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


class _Config:
    """Monarch's ``monarch.actor.config``: the settings Monarch code reads or sets.
    Those that have no meaning here are kept, and change nothing."""

    prefix_python_logs_with_actor = False

    def __repr__(self) -> str:
        return f"<monarch_kernel config: {vars(self)}>"


config = _Config()


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
hosts_from_config = _unsupported(
    "hosts_from_config",
    "describe the hosts with a job: monarch_kernel.job.SSHJob or SlurmJob, then job.state()",
)
run_worker_loop_forever = _unsupported(
    "run_worker_loop_forever",
    "workers are started by host agents: SSHJob / SlurmJob start them on each host (docs/multihost.md)",
)
attach_to_workers = _unsupported(
    "attach_to_workers", "use a job (monarch_kernel.job.SSHJob / SlurmJob) or attach(name) for a named mesh"
)
