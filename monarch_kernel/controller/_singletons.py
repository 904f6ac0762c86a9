"""``get_or_spawn_controller``: one actor per name for a whole tree of meshes.

SINGLE-1: the singletons live in the root controller (the process that made the
first mesh of the tree), on its ``this_proc()``. A worker finds the root through
``MONARCH_ROOT`` (its server's address and token, JSON), which every mesh's workers
get at start (inherited down the tree) and again when a controller attaches; it asks
the root's registry actor, which spawns the singleton on first use and returns it.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from monarch_kernel.actor import Actor, endpoint
from monarch_kernel.controller._this_proc import this_proc
from monarch_kernel.errors import MeshStoppedError, SupervisionError
from monarch_kernel.mesh import ActorMesh, Extent, ProcRef, Shape, actor_context, local_address, root_context

#: The environment variable that tells a worker where the root controller is.
ROOT_ENV = "MONARCH_ROOT"
#: The registry actor's name on the root's ``this_proc()``.
REGISTRY = "__monarch_controllers__"
#: Longest a worker waits for the root to spawn a singleton.
SPAWN_WAIT_S = 300.0

_singletons: dict[str, ActorMesh[Any]] = {}
_lock = threading.Lock()
_registry_up: list[bool] = []


class _Registry(Actor):
    """The root's registry of singletons (SINGLE-1)."""

    @endpoint
    def get_or_spawn(self, name: str, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _here(name, cls, args, kwargs)


def _here(name: str, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorMesh[Any]:
    with _lock:
        mesh = _singletons.get(name)
        if mesh is None:
            reset = actor_context.set(root_context)  # a singleton belongs to no actor (OWN-1)
            try:
                mesh = _singletons[name] = this_proc().spawn(name, cls, *args, **kwargs)
            finally:
                actor_context.reset(reset)
        return mesh


def root_address() -> str:
    """What ``MONARCH_ROOT`` says for the workers of a mesh made here: the root this
    process knows (it is a worker), else this process, whose registry starts now."""
    inherited = os.environ.get(ROOT_ENV)
    if inherited:
        return inherited
    with _lock:
        if not _registry_up:
            this_proc().spawn(REGISTRY, _Registry)
            _registry_up.append(True)
    addr, token = local_address()
    return json.dumps([addr, token])


def get_or_spawn(name: str, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorMesh[Any]:
    """The singleton ``name`` of this tree (SINGLE-1), spawned with ``cls(*args,
    **kwargs)`` on the root controller's ``this_proc()`` on first use."""
    root = os.environ.get(ROOT_ENV)
    if not root:
        return _here(name, cls, args, kwargs)
    addr, token = json.loads(root)
    ref = ProcRef("the root controller", token, (addr,))
    registry: ActorMesh[Any] = ActorMesh(REGISTRY, _Registry, ref, Shape(Extent([], [])))
    try:
        return registry.get_or_spawn.call_one(name, cls, args, kwargs).get(timeout=SPAWN_WAIT_S)  # type: ignore[no-any-return]
    except (SupervisionError, MeshStoppedError) as e:
        raise SupervisionError(
            f"get_or_spawn_controller({name!r}): the root controller at {addr}, where the singletons "
            f"live, does not answer ({e}). attach() the mesh from a running controller to make it "
            "the root again."
        ) from None


__all__ = ["REGISTRY", "ROOT_ENV", "get_or_spawn", "root_address"]
