"""One picture of the running meshes, for every place that shows them.

VIEW-1: the Meshes side panel (through the Jupyter server extension) and the
inspector widget in notebooks read a mesh through ``mesh_view`` and nothing else, so
they never disagree: the agents' listing of the workers (pid, host, exit), what
each live worker measures of itself on its own host (CPU, memory, GPU: INSPECT-2),
and the mesh's owner and idle clock as its agents keep them (OWNER-1, AGENT-2). A
rank is

- ``alive``: its worker runs and answered within ``ANSWER_WAIT_S``;
- ``unresponsive``: its worker runs but did not answer (or its host's agent does
  not), the same wait as the controller's heartbeat (SUPERVISE-2);
- ``dead``: its worker exited (``why``: the signal, or the exit code);
- ``lost``: its host's agent is gone.

A mesh whose agents cannot be reached from this process (another host, another
network namespace: REGISTRY-3) is pictured from its state file: state
``unreachable``, its hosts, ``why`` (where it runs and what to do), and no ranks.

It needs no controller: an administrator's reading, for a mesh nobody holds too.
"""

from __future__ import annotations

import time
from typing import Any

from monarch_kernel import _native
from monarch_kernel.controller._supervision import HEARTBEAT_S
from monarch_kernel.hosts import MeshInfo, MeshRecord, list_meshes, mesh_info
from monarch_kernel.mesh import call_builtin, loads

#: How long a live worker has to say what it uses before it is shown unresponsive.
ANSWER_WAIT_S = HEARTBEAT_S
#: VIEW-2: up to this many live workers, each is asked what it uses (its GPU and the
#: tensors it holds too); beyond, the agents read CPU and memory from /proc and ping
#: their workers, one message per host, and no worker runs any Python for a view.
WORKERS_ASKED_UP_TO = 64
_KEEP = ("rank", "pid", "host", "restarts")


def _answer(call: Any) -> Any:
    """A call's reply if it has one now; None otherwise (and the call is cancelled)."""
    try:
        if call.done():
            return call.wait(0)
    except Exception:
        return None
    call.cancel()
    return None


def ask_workers(
    rec: MeshRecord, workers: list[dict[str, Any]], method: str, timeout: float, *args: Any
) -> list[Any]:
    """What the built-in actor of each of ``workers`` (running, as the agents list
    them) answers to ``method(*args)``, as an administrator (no controller needed;
    nothing is fenced); None for a worker that does not answer within ``timeout``."""
    if rec.ca:
        _native.set_mesh_ca(rec.token, rec.ca)
    if not workers:
        return []
    try:
        conns = [_native.WorkerConn(w["addr"], rec.token) for w in workers]
        if rec.hosts:  # through the hosts' relays, one message per host (START-1)
            hosts = tuple((h["agent_addr"], h["first_rank"], h["procs"]) for h in rec.hosts)
            ranks = [int(w["rank"]) for w in workers]
            calls = call_builtin(conns, ranks, method, *args, fan=_native.Fanout(rec.token, hosts))
        else:
            calls = call_builtin(conns, list(range(len(conns))), method, *args)
    except Exception:
        return [None] * len(workers)
    try:
        replies = _native.wait_all(calls, timeout)
    except Exception:  # some did not answer in time: those that did still count
        replies = [_answer(c) for c in calls]
    return [
        loads(r.payload, list(r.buffers))
        if isinstance(r, _native.Reply) and r.kind == _native.REPLY_RESULT
        else None
        for r in replies
    ]


def _why(w: dict[str, Any]) -> str:
    return str(w["signal_name"]) if w.get("signal_name") else f"exit {w['exit_code']}"


def mesh_view(info: MeshInfo) -> dict[str, Any]:
    """The picture of one mesh (see the module docstring), as JSON-ready data."""
    if info.unreachable is not None:
        return _unreachable_view(info)
    rec = info.record
    states = {r: h["state"] for h in info.hosts for r in h.get("ranks", ())}

    def host_state(w: dict[str, Any]) -> str:
        return str(states.get(w["rank"], "alive"))

    live = [w for w in info.workers if w["state"] == "running" and host_state(w) == "alive"]
    if info.usage is not None:  # read by the agents: more than WORKERS_ASKED_UP_TO run
        usage = info.usage
    elif rec:
        usage = dict(zip((w["rank"] for w in live), ask_workers(rec, live, "usage", ANSWER_WAIT_S)))
    else:
        usage = {}
    ranks = []
    for w in sorted(info.workers, key=lambda w: int(w["rank"])):
        host = host_state(w)
        u = usage.get(w["rank"])
        if w["state"] != "running":
            state, why = "dead", _why(w)
        elif host == "gone":
            state, why = "lost", f"the agent of host {w['host']} is gone"
        elif u is None:
            state, why = "unresponsive", "does not answer" if host == "alive" else f"host {w['host']} {host}"
        else:
            state, why = "alive", None
        ranks.append({**{k: w[k] for k in _KEEP}, "state": state, "why": why, "usage": u})
    gone = [h for h in info.hosts if h["state"] == "gone"]
    alive = sum(r["state"] == "alive" for r in ranks)
    state = (
        "lost"
        if info.hosts and len(gone) == len(info.hosts)
        else "alive"
        if ranks and alive == len(ranks)
        else "degraded"
    )
    return {
        "name": info.name,
        "state": state,
        "why": None,
        "procs": info.procs,
        "alive": alive,
        "unresponsive": sum(r["state"] == "unresponsive" for r in ranks),
        "hosts": info.hosts,
        "epoch": info.owner_epoch,
        "attached": info.attached,
        "owner": info.owner if info.attached else None,  # (the last one, gone)
        "ephemeral": info.ephemeral,
        "idle_timeout": info.idle_timeout,
        # an absolute time, so the picture does not change while nothing does
        "idle_deadline": None if info.idle_left is None else round(time.time() + info.idle_left),
        "created": info.created,
        "ranks": ranks,
    }


def _unreachable_view(info: MeshInfo) -> dict[str, Any]:
    """A mesh whose agents do not answer here: what its state file says, and why."""
    return {
        "name": info.name,
        "state": "unreachable",
        "why": info.unreachable,
        "procs": info.procs,
        "alive": 0,
        "unresponsive": 0,
        "hosts": info.hosts,
        "epoch": info.owner_epoch,
        "attached": False,
        "owner": None,
        "ephemeral": info.ephemeral,
        "idle_timeout": info.idle_timeout,
        "idle_deadline": None,
        "created": info.created,
        "ranks": [],
    }


def meshes_view() -> list[dict[str, Any]]:
    """Every running mesh of this user (what ``monarch-kernel ls`` lists), pictured."""
    return [mesh_view(info) for info in list_meshes(ANSWER_WAIT_S, WORKERS_ASKED_UP_TO)]


def view_of(name: str) -> dict[str, Any] | None:
    """The running mesh ``name`` pictured, or None when it does not run."""
    info = mesh_info(name, ANSWER_WAIT_S, WORKERS_ASKED_UP_TO)
    return None if info is None else mesh_view(info)


__all__ = ["ANSWER_WAIT_S", "WORKERS_ASKED_UP_TO", "ask_workers", "mesh_view", "meshes_view", "view_of"]
