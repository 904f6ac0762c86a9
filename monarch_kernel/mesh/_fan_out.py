"""Fan-out across hosts (RELAY-1): a call to procs of a mesh across hosts goes as
one message per host to that host's agent, which delivers it to the host's workers
and sends back their replies.

Two paths lead to such a worker (direct, and through its agent), and calls from this
process to one worker must arrive in the order they were sent. ORDER-1: a call
switches a worker to the other path only when nothing sent on the first can still
arrive after it: every call sent there has been answered (and so has run), and a
broadcast sent through the agent has been followed there by an answered call (the
agent delivers in order). Within that rule, a call to one proc of a host goes direct
(one hop, the latency of a local call) and a call to several procs of a host goes
through its agent (one message per host); a broadcast always goes through the agents.
``MONARCH_FANOUT=0`` sends every call directly (one message per proc)."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from monarch_kernel import _native
from monarch_kernel.mesh._proc_ref import ProcRef

FAN_OUT = os.environ.get("MONARCH_FANOUT", "1") != "0"

#: Calls still unanswered, by (mesh token, proc) and path (ORDER-1).
_direct: dict[tuple[str, int], list[Any]] = {}
_relayed: dict[tuple[str, int], list[Any]] = {}
#: Workers that got a broadcast through their agent: the relayed call after it whose
#: answer proves it has run (None until one is sent).
_broadcast: dict[tuple[str, int], Any] = {}
_lock = threading.Lock()


def _unanswered(table: dict[tuple[str, int], list[Any]], key: tuple[str, int]) -> bool:
    calls = table.get(key)
    if not calls:
        return False
    calls[:] = [c for c in calls if not c.done()]
    if not calls:
        del table[key]
    return bool(calls)


def _relay_busy(key: tuple[str, int]) -> bool:
    if key in _broadcast:
        after = _broadcast[key]
        if after is None or not after.done():
            return True
        del _broadcast[key]
    return _unanswered(_relayed, key)


def fan_out(
    target: Any,
    ref: ProcRef,
    conns: Sequence[Any],
    procs: Sequence[int],
    local: Sequence[int],
    payload: bytes,
    buffers: list[Any],
    oneway: bool,
    origin: str,
) -> list[Any]:
    """Sends one call to procs ``procs`` (``local[i]``: index of ``procs[i]`` within
    the called mesh; ``conns[i]``: its direct connection), each by the path ORDER-1
    allows; the pending calls in the same order (none if ``oneway``)."""
    token = ref.token
    by_host: dict[int, list[int]] = {}
    for i, p in enumerate(procs):
        by_host.setdefault(ref.host_of(p), []).append(i)
    out: list[Any] = [None] * len(procs)
    with _lock:
        for host, idx in by_host.items():
            direct: list[int] = []
            relayed: list[int] = []
            for i in idx:
                key = (token, procs[i])
                if oneway:
                    goes_direct = False
                elif _relay_busy(key):
                    goes_direct = False
                elif _unanswered(_direct, key):
                    goes_direct = True
                else:
                    goes_direct = len(idx) == 1
                (direct if goes_direct else relayed).append(i)
            if direct:
                sent = _native.call(
                    target,
                    [conns[i] for i in direct],
                    [local[i] for i in direct],
                    payload,
                    buffers,
                    origin=origin,
                )
                for i, c in zip(direct, sent):
                    out[i] = c
                    _direct.setdefault((token, procs[i]), []).append(c)
            if relayed:
                relay = _native.WorkerConn.relay(ref.hosts[host][0], token)
                sent = _native.call_fanned(
                    target,
                    relay,
                    [procs[i] for i in relayed],
                    [local[i] for i in relayed],
                    [ref.addrs[procs[i]] for i in relayed],
                    payload,
                    buffers,
                    oneway=oneway,
                    origin=origin,
                )
                for i in relayed:
                    key = (token, procs[i])
                    if oneway:
                        _broadcast[key] = None
                for i, c in zip(relayed, sent):
                    key = (token, procs[i])
                    out[i] = c
                    _relayed.setdefault(key, []).append(c)
                    if key in _broadcast and _broadcast[key] is None:
                        _broadcast[key] = c
    return [] if oneway else out
