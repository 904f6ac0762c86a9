"""Fan-out across hosts (RELAY-1): a call to procs of a mesh across hosts goes as
one message per host to that host's agent, which delivers it to the host's workers
and sends back their replies. Every call from this process to a worker of such a
mesh takes that one path, a call to one proc too: two paths to one worker (direct
and through its agent) would not keep the order in which calls were sent.
``MONARCH_FANOUT=0`` sends every call directly (one message per proc)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from monarch_kernel import _native
from monarch_kernel.mesh._proc_ref import ProcRef

FAN_OUT = os.environ.get("MONARCH_FANOUT", "1") != "0"


def fan_out(
    target: Any,
    ref: ProcRef,
    procs: Sequence[int],
    local: Sequence[int],
    payload: bytes,
    buffers: list[Any],
    oneway: bool,
    origin: str,
) -> list[Any]:
    """Sends one call to procs ``procs`` (``local[i]``: index of ``procs[i]`` within
    the called mesh) through their hosts' agents; the pending calls in the same order
    (none if ``oneway``)."""
    by_host: dict[int, list[int]] = {}
    for i, p in enumerate(procs):
        by_host.setdefault(ref.host_of(p), []).append(i)
    out: list[Any] = [None] * len(procs)
    for host, idx in by_host.items():
        relay = _native.WorkerConn(ref.hosts[host][0], ref.token)
        sent = _native.call_fanned(
            target,
            relay,
            [procs[i] for i in idx],
            [local[i] for i in idx],
            [ref.addrs[procs[i]] for i in idx],
            payload,
            buffers,
            oneway=oneway,
            origin=origin,
        )
        for i, c in zip(idx, sent):
            out[i] = c
    return [] if oneway else out
