"""SPMD cells: the actor behind ``%%mesh``, ``%mesh push`` and ``%mesh pull``.

Each worker has one persistent namespace (``NAMESPACE``, module state: it outlives
the actor, the controller and kernel restarts, as long as the process lives). A cell
runs on the worker's main thread (MAIN-1), so the stop button reaches it with a real
SIGINT. The last expression's value comes back as its ``repr``, as IPython shows it.
"""

from __future__ import annotations

import ast
import builtins
import linecache
import os
from typing import Any

from monarch_kernel.actor import Actor, endpoint
from monarch_kernel.worker import _main_thread

#: The persistent namespace of ``%%mesh`` cells in this worker.
NAMESPACE: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
#: Longest repr sent back for a cell's value.
MAX_REPR = 10_000


def _register_source(filename: str, source: str) -> None:
    """Remote tracebacks show the cell's lines (linecache is what traceback reads)."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def run_cell(source: str, filename: str) -> str | None:
    """Runs ``source`` in ``NAMESPACE``; the repr of its last expression, if any."""
    tree = ast.parse(source, filename, "exec")
    last: ast.expr | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1].value
        tree.body.pop()
    _register_source(filename, source)
    code = compile(tree, filename, "exec")
    expr = compile(ast.Expression(last), filename, "eval") if last is not None else None

    def go() -> Any:
        exec(code, NAMESPACE)
        return eval(expr, NAMESPACE) if expr is not None else None

    try:
        value = _main_thread.run(go)
    except BaseException as e:
        # The remote traceback starts at the cell's own first line (REMOTE_TB).
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        if tb is not None:
            e.__monarch_tb__ = tb  # type: ignore[attr-defined]
        raise
    if value is None:
        return None
    NAMESPACE["_"] = value
    text = repr(value)
    return text if len(text) <= MAX_REPR else text[:MAX_REPR] + f"... ({len(text):,} characters)"


class MeshCells(Actor):
    """Spawned by the kernel on a mesh under the name ``__mesh_cells__``."""

    @endpoint
    def run(self, source: str, filename: str) -> str | None:
        return run_cell(source, filename)

    @endpoint
    def push(self, values: dict[str, Any]) -> list[str]:
        NAMESPACE.update(values)
        return sorted(values)

    @endpoint
    def pull(self, name: str) -> Any:
        if name not in NAMESPACE:
            raise NameError(f"name {name!r} is not defined in the %%mesh namespace of pid {os.getpid()}")
        return NAMESPACE[name]

    @endpoint
    def names(self) -> list[str]:
        return sorted(k for k in NAMESPACE if not k.startswith("_"))


__all__ = ["NAMESPACE", "MeshCells", "run_cell"]
