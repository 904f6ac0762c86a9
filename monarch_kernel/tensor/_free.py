"""Free remote functions with adverbs: Monarch's ``remote`` functions used as
endpoints (``check_memory.call()``, ``send(check_memory, ...)``). The function runs
on every proc of the active mesh, in an actor of its own there, and answers as an
endpoint does: a ``ValueMesh`` from ``call``, one value from ``call_one``, nothing
from ``broadcast``. (Called plainly, a ``remote`` function is a tensor op instead:
its results stay on the procs as mesh tensors.)"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from monarch_kernel.actor import Actor, endpoint
from monarch_kernel.errors import MeshTensorError
from monarch_kernel.mesh import ProcMesh, here

#: The name of the actor mesh that runs free functions on a mesh's procs.
FREE_FUNCTIONS = "__monarch_remote_functions__"
#: Its actors, by (mesh, token, ranks): spawned on a mesh's first use.
_spawned: dict[tuple[str, str, tuple[int, ...]], Any] = {}


class FreeFunctions(Actor):
    """Runs free remote functions on its proc."""

    @endpoint
    def run(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)``; ``fn`` may be ``"module.function"``."""
        if isinstance(fn, str):
            module, _, name = fn.rpartition(".")
            fn = getattr(importlib.import_module(module), name)
        return fn(*args, **kwargs)


def run_endpoint(mesh: ProcMesh) -> Any:
    """The ``run`` endpoint of the free-function actors on ``mesh`` (spawned once)."""
    key = (mesh._proc.name, mesh._proc.token, tuple(mesh._shape.ranks))
    actors = _spawned.get(key)
    if actors is None:
        actors = _spawned[key] = mesh.spawn(FREE_FUNCTIONS, FreeFunctions)
    return actors.run


def invoke_local_actor(actor: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """Runs endpoint ``method`` of this proc's actor ``actor`` here, on the tensor
    engine's stream (``Endpoint.rref``); what it returns stays on the proc."""
    host = here.actors
    instance = host.instance_of(actor) if host is not None else None
    if instance is None:
        raise MeshTensorError(f"rref(): there is no actor {actor!r} on this proc")
    result = getattr(instance, method)(*args, **kwargs)
    if inspect.iscoroutine(result):
        result.close()
        raise MeshTensorError(
            f"rref() of {actor}.{method}: an async endpoint cannot run on the tensor stream"
        )
    return result


__all__ = ["FREE_FUNCTIONS", "FreeFunctions", "invoke_local_actor", "run_endpoint"]
