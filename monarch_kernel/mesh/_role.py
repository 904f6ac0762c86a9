"""This process's part in the meshes, in one object (``here``).

The mesh API runs in every process; what differs between a controller, a worker and
a controller that also hosts actors (``this_proc()``) is filled in here, once, at
start, by the part that knows: the controller package as it is imported
(``install_controller``, CONTROL-1), a worker's main (``install_worker``) and a
dispatcher as it starts (``install_actors``). Before that the process is bare: no
session, no actors, no server. The mesh layer reads it, and never imports the
layers that fill it in.

This module imports nothing of the package: the parts are typed by the protocols
below, whose arguments are the mesh layer's own objects (``ProcRef``, ``MeshFailure``,
``Context``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Controller(Protocol):
    """The controller of meshes in this process (``controller/__init__``)."""

    def session_for(self, ref: Any) -> Any:
        """This process's session (``MeshControl``) of the mesh ``ref`` names, if it controls it."""

    def start_server(self) -> Any:
        """Starts this process's own worker server and dispatcher (``this_proc()``),
        where the ports it opens receive."""


class ActorHost(Protocol):
    """What runs actors in this process (the worker's ``Dispatcher``)."""

    def supervise_owner(self, owner: str, failure: Any) -> bool:
        """OWN-1: runs ``owner``'s ``__supervise__(failure)`` in order with its
        messages; whether it handled the failure."""

    def instance_ends(self, name: str, reason: str | None, failed: bool) -> None:
        """``Instance.abort(reason)`` (``failed``) or ``.stop(reason)`` of actor ``name``."""

    def instance_of(self, name: str) -> Any:
        """The instance of actor ``name`` in this process (None if none has that name)."""


@dataclass
class Here:
    """This process's part in the meshes (see the module docstring)."""

    controller: Controller | None = None
    actors: ActorHost | None = None
    #: A worker's: how an unhandled failure of a mesh one of its actors owns goes up
    #: to its own controller (OWN-1): ``up(owner actor, mesh, failure)``.
    up: Any = None
    #: This process's worker server, ``(address, mesh token)``, once it has one: the
    #: ports this process opens receive there.
    server: tuple[str, str] | None = None
    #: A worker's mesh token (large buffers it sends are registered with it).
    token: str | None = None
    #: ``this_proc()``: the proc mesh of this process alone, once known.
    this_proc: Any = None
    #: The context of code that no actor runs (a worker's own proc rank); None: the root.
    default_context: Any = None


#: The one object: read it, and fill it in only through the functions below.
here = Here()


def install_controller(controller: Controller) -> None:
    """The controller package, as it is imported (CONTROL-1)."""
    here.controller = controller


def install_worker(token: str, this_proc: Any, up: Any) -> None:
    """A worker's main, at start: its mesh token, its ``this_proc()``, and where its
    unhandled failures go (its controller)."""
    here.token, here.this_proc, here.up = token, this_proc, up


def install_actors(actors: ActorHost, server: tuple[str, str], default_context: Any) -> None:
    """A dispatcher, as it starts: it runs this process's actors, its server
    receives this process's ports (the first server set stays), and
    ``default_context`` is the context of code no actor runs."""
    here.actors = actors
    if here.server is None:
        here.server = server
    here.default_context = default_context


def set_this_proc(mesh: Any) -> None:
    """The controller's own in-process proc (``this_proc()``), once made."""
    here.this_proc = mesh


__all__ = [
    "ActorHost",
    "Controller",
    "Here",
    "here",
    "install_actors",
    "install_controller",
    "install_worker",
    "set_this_proc",
]
