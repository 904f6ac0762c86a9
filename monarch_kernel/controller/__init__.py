"""The controller: this process's hold on the meshes it created or attached to.

A mesh's *session* (``_session.Session``) holds its lease, its epoch (fencing), its
supervision (deaths, heartbeats, failure hooks) and the commands a controller sends.
This package is the controller's public face, for the Jupyter kernel and other
front ends (which see a session only as a ``MeshSession``):

- ``this_host()``, ``attach()``, ``list_meshes()``, ``this_proc()``: where proc
  meshes come from (also exported by ``monarch_kernel``);
- ``session(name)`` / ``sessions()``: the sessions of this process (``MeshSession``);
- ``set_frontend(Frontend(...))``: where worker output, failures, notices and slow
  waits go (the kernel shows them in the notebook); the lines a front end gets are
  typed by ``LineKind``, a display's payload decoded once as a ``DisplayMessage``;
- ``run_cell(...)``: a ``%%mesh`` cell on ranks of a mesh, one native call;
- ``interrupt(futures)``, ``escalate_interrupted()``: the stop button;
- ``describe_wait(calls)``: what a long wait waits behind (a busy or silent rank);
- ``mesh_table()``, ``down(names)``, ``plan_down_all(force)``, ``left_running(keep)``:
  ``ls`` and ``down``; ``status_text(title, rows)``, ``states_count(states)``: a mesh's procs
  for ``status`` and ``attach`` (a summary beyond 32 procs);
- ``TORCH_BACKENDS``, ``prefer_huge_pages()``.

CONTROL-1: importing this package installs it as this process's controller
(``mesh._role.here``), where the mesh API, which never imports it, finds its sessions.
"""

from __future__ import annotations

from monarch_kernel.control import DisplayMessage, LineKind, MergedLine, Prompt
from monarch_kernel.controller._admin import (
    all_names,
    down,
    down_one,
    left_running,
    mesh_table,
    owner_text,
    plan_down_all,
    respawn,
    running_meshes,
)
from monarch_kernel.controller._cells import CELLS_ACTOR, run_cell, spmd_actors
from monarch_kernel.controller._debugger import attach as attach_debugger
from monarch_kernel.controller._debugger import cast as cast_to_debuggers
from monarch_kernel.controller._debugger import mesh_size, parked, parse_ranks
from monarch_kernel.controller._frontend import Frontend, frontend, set_frontend
from monarch_kernel.controller._host_mesh import HostMesh, attach, list_meshes, this_host, this_proc
from monarch_kernel.controller._lifecycle import session_for, stop_all_ephemeral, stop_record
from monarch_kernel.controller._mesh_session import MeshSession
from monarch_kernel.controller._session import sessions as _by_name
from monarch_kernel.controller._session import sessions_lock
from monarch_kernel.controller._singletons import get_or_spawn as get_or_spawn_singleton
from monarch_kernel.controller._supervision import MeshFailure
from monarch_kernel.controller._view import ask_workers, meshes_view, view_of
from monarch_kernel.controller._waits import calls_of, describe_wait
from monarch_kernel.hosts import MeshInfo
from monarch_kernel.mesh import (
    escalate_interrupted,
    install_controller,
    interrupt,
    prefer_huge_pages,
    states_count,
    status_text,
)
from monarch_kernel.torch import BACKENDS as TORCH_BACKENDS


class _Controller:
    """This process's part as a controller (``mesh._role.Controller``; CONTROL-1)."""

    session_for = staticmethod(session_for)
    start_server = staticmethod(this_proc)


install_controller(_Controller())


def session(name: str) -> MeshSession | None:
    """This process's live session of mesh ``name``, if it controls it."""
    s = _by_name.get(name)
    return s if s is not None and not s.closed else None


def sessions() -> list[MeshSession]:
    """This process's sessions, live or closed, oldest first."""
    return list(_by_name.values())


__all__ = [
    "CELLS_ACTOR",
    "DisplayMessage",
    "MergedLine",
    "Frontend",
    "HostMesh",
    "LineKind",
    "MeshFailure",
    "MeshInfo",
    "MeshSession",
    "Prompt",
    "TORCH_BACKENDS",
    "all_names",
    "ask_workers",
    "attach",
    "attach_debugger",
    "cast_to_debuggers",
    "calls_of",
    "describe_wait",
    "down",
    "down_one",
    "escalate_interrupted",
    "frontend",
    "get_or_spawn_singleton",
    "interrupt",
    "left_running",
    "list_meshes",
    "mesh_size",
    "parked",
    "parse_ranks",
    "mesh_table",
    "meshes_view",
    "owner_text",
    "plan_down_all",
    "prefer_huge_pages",
    "respawn",
    "run_cell",
    "running_meshes",
    "session",
    "session_for",
    "sessions",
    "sessions_lock",
    "set_frontend",
    "spmd_actors",
    "states_count",
    "status_text",
    "stop_all_ephemeral",
    "stop_record",
    "this_host",
    "this_proc",
    "view_of",
]
