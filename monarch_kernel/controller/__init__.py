"""The controller: this process's hold on the meshes it created or attached to.

A mesh's *session* (``Session``) holds its lease, its epoch (fencing), its
supervision (deaths, heartbeats, failure hooks) and the commands a controller sends.
This package is the controller's public face, for the Jupyter kernel and other
front ends:

- ``this_host()``, ``attach()``, ``list_meshes()``, ``this_proc()``: where proc
  meshes come from (also exported by ``monarch_kernel``);
- ``session(name)`` / ``sessions()``: the sessions of this process;
- ``set_frontend(Frontend(...))``: where worker output, failures, notices and slow
  waits go (the kernel shows them in the notebook); the lines a front end gets are
  typed by ``LineKind``, a display's payload decoded once as a ``DisplayMessage``;
- ``run_cell(...)``: a ``%%mesh`` cell on ranks of a mesh, one native call;
- ``interrupt(futures)``, ``escalate_interrupted()``: the stop button;
- ``describe_wait(calls)``: what a long wait waits behind (a busy or silent rank);
- ``mesh_table()``, ``down(names)``, ``plan_down_all(force)``, ``left_running(keep)``:
  ``ls`` and ``down``;
- ``TORCH_BACKENDS``, ``prefer_huge_pages()``.

CONTROL-1: importing this package installs it as this process's controller
(``mesh._role.here``), where the mesh API, which never imports it, finds its sessions.
"""

from __future__ import annotations

from monarch_kernel.control import DisplayMessage, LineKind, Prompt
from monarch_kernel.controller._admin import all_names, down, left_running, mesh_table, plan_down_all
from monarch_kernel.controller._cells import CELLS_ACTOR, run_cell, spmd_actors
from monarch_kernel.controller._frontend import Frontend, frontend, set_frontend
from monarch_kernel.controller._host_mesh import HostMesh, attach, list_meshes, this_host, this_proc
from monarch_kernel.controller._lifecycle import session_for, stop_record
from monarch_kernel.controller._session import Session, sessions_lock
from monarch_kernel.controller._session import sessions as _by_name
from monarch_kernel.controller._supervision import MeshFailure
from monarch_kernel.controller._view import view_of
from monarch_kernel.controller._waits import calls_of, describe_wait
from monarch_kernel.hosts._admin import MeshInfo
from monarch_kernel.mesh._buffers import prefer_huge_pages
from monarch_kernel.mesh._future import escalate_interrupted, interrupt
from monarch_kernel.mesh._role import install_controller
from monarch_kernel.torch import BACKENDS as TORCH_BACKENDS


class _Controller:
    """This process's part as a controller (``mesh._role.Controller``; CONTROL-1)."""

    session_for = staticmethod(session_for)
    start_server = staticmethod(this_proc)


install_controller(_Controller())


def session(name: str) -> Session | None:
    """This process's live session of mesh ``name``, if it controls it."""
    s = _by_name.get(name)
    return s if s is not None and not s.closed else None


def sessions() -> list[Session]:
    """This process's sessions, live or closed, oldest first."""
    return list(_by_name.values())


__all__ = [
    "CELLS_ACTOR",
    "DisplayMessage",
    "LineKind",
    "Prompt",
    "TORCH_BACKENDS",
    "Frontend",
    "HostMesh",
    "MeshFailure",
    "MeshInfo",
    "Session",
    "all_names",
    "attach",
    "calls_of",
    "describe_wait",
    "down",
    "escalate_interrupted",
    "frontend",
    "interrupt",
    "left_running",
    "list_meshes",
    "mesh_table",
    "plan_down_all",
    "prefer_huge_pages",
    "run_cell",
    "session",
    "session_for",
    "sessions",
    "sessions_lock",
    "set_frontend",
    "spmd_actors",
    "stop_record",
    "this_host",
    "this_proc",
    "view_of",
]
