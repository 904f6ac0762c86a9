"""Calls to the built-in actor every worker has (``_wire.BUILTIN``, the class
``worker._builtin.WorkerBuiltin``): the one place that encodes them, for the
controller's session, an administrator's view and the mesh layer alike.

Its endpoints take their arguments as every actor call does (``dumps((args,
kwargs))``, unpickled by the worker with ``loads``), and answer as every endpoint
does: a pickled return value, an exception with its remote traceback, or a refusal
(no such method). They run on the worker's routing thread, not on an actor's, so
they answer while every actor of the worker is busy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monarch_kernel import _native
from monarch_kernel._wire import BUILTIN
from monarch_kernel.mesh._serial import dumps

#: One ``_native.Endpoint`` per method, made on first use.
_endpoints: dict[str, Any] = {}


def call_builtin(
    conns: list[Any], ranks: list[int], method: str, *args: Any, origin: str = "", fan: Any = None
) -> Sequence[Any]:
    """Calls ``method(*args)`` of the built-in actor of each worker in ``conns``
    (``ranks[i]`` is the rank of ``conns[i]``); what the worker prints while it runs
    is tagged with ``origin``. With ``fan`` (``ProcRef.fanout()``, a mesh across
    hosts) they go through the hosts' relays as actor calls do, one message per host
    (RELAY-1, ORDER-1); without, to each worker. Returns the calls, one per worker in
    order (with ``fan``, one ``_native.Calls``; without, a list of
    ``_native.PendingCall``), whose replies ``decode_reply`` (or ``loads``) reads."""
    endpoint = _endpoints.get(method)
    if endpoint is None:
        endpoint = _endpoints[method] = _native.Endpoint(BUILTIN, method)
    payload, buffers = dumps((args, {}), f"arguments of {BUILTIN}.{method}")
    return send_calls(fan, endpoint, conns, ranks, ranks, payload, buffers, False, origin)


def send_calls(
    fan: Any,
    target: Any,
    conns: list[Any],
    procs: Sequence[int],
    local: Sequence[int],
    payload: bytes,
    buffers: list[Any],
    oneway: bool,
    origin: str,
) -> Sequence[Any]:
    """The calls of ``target`` (a ``_native.Endpoint``) to procs ``procs`` on ``conns``
    (``local``: their indices in the called mesh): through the hosts' relays with
    ``fan`` (``ProcRef.fanout()``: a mesh across hosts, RELAY-1), as one
    ``_native.Calls``, else to each worker, as a list of ``_native.PendingCall``: one
    call per proc, in order."""
    if fan is not None:
        return fan.call(target, conns, procs, local, payload, buffers, oneway, origin)
    # (positional: pyo3 parses keyword arguments on every call)
    return _native.call(target, conns, local, payload, buffers, oneway, origin)


__all__ = ["call_builtin", "send_calls"]
