"""Debugging ranks that wait in pdb from outside their controller (DEBUG-3): what
``monarch-kernel debug`` does from a terminal, for a script's mesh (Monarch's
``monarch debug``).

A rank whose ``breakpoint()`` no notebook cell answers waits in pdb. From any process
of the same user, ``parked()`` lists such ranks (the workers' built-in actor says
where each debugger stands), ``cast()`` sends one pdb command to many, and
``attach()`` debugs one rank interactively: pdb's output comes through the host
agent's ``Watch`` (this process is one more watcher) and each line typed goes to the
rank's debugger. All of this is done as a peer of the mesh (epoch 0): the controller
that holds the mesh keeps it (nothing is fenced).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from monarch_kernel.control import LineKind
from monarch_kernel.controller._admin import running_record
from monarch_kernel.controller._session import sizes_of
from monarch_kernel.controller._view import ask_workers
from monarch_kernel.errors import MeshSpecError
from monarch_kernel.hosts import MeshRecord, group_of, registry

#: pdb commands after which the rank runs on (it may stop again at another breakpoint).
LEAVES_PDB = frozenset({"c", "cont", "continue", "q", "quit", "exit"})
#: How long, after a command that lets the rank run on, a new prompt is waited for.
STAY_S = 2.0
#: How long the workers have to say where their debuggers stand.
ANSWER_S = 10.0


def parse_ranks(spec: str, n: int) -> list[int]:
    """The ranks ``spec`` names (``0,2-3``), each below ``n``; a ``MeshSpecError``
    that says how to write them."""
    ranks: list[int] = []
    try:
        for part in (p.strip() for p in spec.split(",")):
            if "-" in part:
                lo, hi = part.split("-", 1)
                ranks.extend(range(int(lo), int(hi) + 1))
            elif part:
                ranks.append(int(part))
    except ValueError:
        raise MeshSpecError(f"ranks {spec!r}: give ranks like 0,2-3") from None
    if not ranks or any(not 0 <= r < n for r in ranks):
        raise MeshSpecError(f"ranks {spec!r}: the mesh has ranks 0 to {n - 1}")
    return sorted(set(ranks))


def mesh_size(name: str) -> int:
    """How many procs the running mesh ``name`` has."""
    return math.prod(sizes_of(running_record(name).spec).values())


def _running(rec: MeshRecord) -> list[dict[str, Any]]:
    return [w for w in group_of(rec).list_workers() if w["state"] == "running"]


def waiting_in(rec: MeshRecord) -> dict[int, list[str]]:
    """The ranks of ``rec``'s mesh whose debuggers wait for a line: where each stands."""
    workers = _running(rec)
    answers = ask_workers(rec, workers, "debug_waiting", ANSWER_S)
    return {int(w["rank"]): where for w, where in zip(workers, answers) if where}


def parked(name: str | None = None) -> list[tuple[str, int, str]]:
    """(mesh, rank, where) of every rank waiting in pdb, of mesh ``name`` or of every
    mesh this user runs."""
    names = [name] if name is not None else registry.names()
    out = []
    for n in names:
        rec = registry.read(n)
        if rec is None:
            continue
        try:
            waiting = waiting_in(rec)
        except Exception:  # a mesh that does not answer has nothing to debug from here
            continue
        out += [(n, rank, where[0]) for rank, where in sorted(waiting.items())]
    return out


def cast(name: str, ranks: list[int] | None, line: str) -> list[int]:
    """Sends pdb command ``line`` to the debugger waiting longest on each of ``ranks``
    (every waiting rank when None) of mesh ``name``; the ranks that took it."""
    rec = running_record(name)
    workers = {int(w["rank"]): w for w in _running(rec)}
    picked = [workers[r] for r in (sorted(workers) if ranks is None else ranks) if r in workers]
    took = ask_workers(rec, picked, "pdb_input", ANSWER_S, line)
    return [int(w["rank"]) for w, ok in zip(picked, took) if ok]


def attach(name: str, rank: int, ask: Callable[[str], str], show: Callable[[str], None]) -> None:
    """Debugs rank ``rank`` of mesh ``name``: shows pdb's output (``show``), asks for
    each line (``ask(label)``; ``EOFError`` detaches, leaving the rank waiting) and
    sends it, until a command lets the rank run on and it does not stop again within
    ``STAY_S``."""
    rec = running_record(name)
    waiting = waiting_in(rec)
    if rank not in waiting:
        raise MeshSpecError(
            f"rank {rank} of mesh {name!r} is not waiting in pdb (waiting: {sorted(waiting) or 'none'})"
        )
    group = group_of(rec)
    link = group.link_of(rank)
    prompted, ended = threading.Event(), threading.Event()

    def on_event(ev: Any) -> None:
        if not ev.HasField("log") or ev.log.rank != rank:
            return
        if ev.log.kind == LineKind.TEXT:
            show(ev.log.text)
        elif ev.log.kind == LineKind.PROMPT:
            prompted.set()

    def on_end(_err: BaseException | None, _link: Any) -> None:
        ended.set()  # the mesh stopped, or its host went
        prompted.set()

    stop = group.watch_link(link, on_event, on_end)
    try:
        show(f"[{name} {rank}] attached: waiting in pdb at {waiting[rank][0]}")
        while True:
            prompted.clear()
            try:
                line = ask(f"[{name} {rank}] (Pdb) ")
            except EOFError:
                show(f"[{name} {rank}] detached; it still waits in pdb")
                return
            if not cast(name, [rank], line):
                show(f"[{name} {rank}] no longer waits in pdb")
                return
            leaves = line.strip().split(" ")[0] in LEAVES_PDB
            if not prompted.wait(STAY_S if leaves else None) and leaves:
                show(f"[{name} {rank}] runs on")
                return
            if ended.is_set():
                show(f"[{name} {rank}] runs on" if leaves else f"[{name} {rank}] its mesh stopped")
                return
    finally:
        stop()


__all__ = ["LEAVES_PDB", "attach", "cast", "mesh_size", "parked", "parse_ranks", "waiting_in"]
