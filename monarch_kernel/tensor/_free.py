"""Free remote functions with adverbs: Monarch's ``remote`` functions used as
endpoints (``check_memory.call()``, ``send(check_memory, ...)``). The function runs
on every proc of the active mesh, in an actor of its own there, and answers as an
endpoint does: a ``ValueMesh`` from ``call``, one value from ``call_one``, nothing
from ``broadcast``. (Called plainly, a ``remote`` function is a tensor op instead:
its results stay on the procs as mesh tensors.)"""

from __future__ import annotations

import importlib
from typing import Any

from monarch_kernel.actor import Actor, endpoint
from monarch_kernel.mesh import ProcMesh

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


__all__ = ["FREE_FUNCTIONS", "FreeFunctions", "run_endpoint"]
