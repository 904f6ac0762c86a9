"""SPMD cells: the actor behind ``%%mesh``, ``%mesh push`` and ``%mesh pull``.

Each worker has one persistent namespace (``NAMESPACE``, module state: it outlives
the actor, the controller and kernel restarts, as long as the process lives). A cell
runs on the worker's main thread (MAIN-1), so the stop button reaches it with a real
SIGINT. The last expression's value comes back as a MIME bundle, as IPython shows it.

CELL-1: a cell ends by writing a flush marker on stdout and stderr, tagged with the
cell's origin, before its value goes back: the kernel shows everything the cell
printed before it returned, then its value, with no round trip of its own.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import io
import linecache
import os
import tokenize
from typing import Any

from monarch_kernel.actor import Actor, endpoint, process_context
from monarch_kernel.mesh import actor_context
from monarch_kernel.worker import _display, _main_thread, _output

#: The persistent namespace of ``%%mesh`` cells in this worker.
NAMESPACE: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
#: Longest repr sent back for a cell's value.
MAX_REPR = 10_000
#: Where a cell's last expression puts its value (taken out again at once).
_VALUE = "__monarch_cell_value__"
#: The event loop of cells with top-level await (made on first use).
_LOOP: list[Any] = [None]
_NOT_CODE = frozenset(
    {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
)


def _register_source(filename: str, source: str) -> None:
    """Remote tracebacks show the cell's lines (linecache is what traceback reads)."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def _quiet(source: str) -> bool:
    """IPython's rule: a cell whose last token is ``;`` shows no value."""
    last = ""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type not in _NOT_CODE:
                last = tok.string
    except (tokenize.TokenError, SyntaxError):
        return False
    return last == ";"


def _run_coroutine(coro: Any) -> Any:
    """Runs a cell with top-level ``await`` in the worker's own event loop (one per
    worker, kept between cells, as IPython keeps one); an interrupt cancels it."""
    import asyncio

    if _LOOP[0] is None:
        _LOOP[0] = asyncio.new_event_loop()
    loop = _LOOP[0]
    task = loop.create_task(coro)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
        raise


def run_cell(source: str, filename: str) -> dict[str, Any] | None:
    """Runs ``source`` in ``NAMESPACE``; the MIME bundle of its last expression, if
    any, as IPython formats a cell's value (DISPLAY-1: ``_repr_html_``, images...).

    The cell compiles to one code object: a last expression becomes an assignment to
    a hidden name, so pdb's ``n`` on the line before steps onto it (a separate
    ``eval`` ran in another frame, and ``n`` ended at ``--Return--``)."""
    _register_source(filename, source)
    _display.ensure()  # display(), plt.show() and rich values reach the cell (DISPLAY-1)
    try:
        tree = ast.parse(source, filename, "exec")
        last = tree.body[-1] if tree.body else None
        has_value = isinstance(last, ast.Expr) and not _quiet(source)
        if isinstance(last, ast.Expr) and has_value:
            target = ast.Name(id=_VALUE, ctx=ast.Store())
            tree.body[-1] = ast.copy_location(ast.Assign(targets=[target], value=last.value), last)
            ast.fix_missing_locations(tree)
        # Top-level await is allowed, as in IPython: such a cell compiles to a coroutine.
        code = compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as e:
        e.__monarch_tb__ = None  # type: ignore[attr-defined]  # the cell's error, not this code's
        raise

    def go() -> Any:
        NAMESPACE.pop(_VALUE, None)
        if code.co_flags & inspect.CO_COROUTINE:
            _run_coroutine(eval(code, NAMESPACE))
        else:
            exec(code, NAMESPACE)
        return NAMESPACE.pop(_VALUE, None) if has_value else None

    try:
        value = _main_thread.run(go)
        _display.flush_figures()  # figures the cell drew and left open, as IPython shows them
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
    out = _display.bundle(value)
    text = str(out["data"].get("text/plain", ""))
    if len(text) > MAX_REPR:
        out["data"]["text/plain"] = text[:MAX_REPR] + f"... ({len(text):,} characters)"
    return out


class MeshCells(Actor):
    """Spawned by the kernel on a mesh under the name ``__mesh_cells__``."""

    #: A cell that raises SystemExit (``sys.exit()``) is an error in that cell, as in
    #: IPython, not the end of the actor that runs every cell (DISPATCH-4).
    _base_exceptions_end_it = False

    @endpoint
    def run(self, source: str, filename: str) -> dict[str, Any] | None:
        # SPMD code asks where it runs: current_rank() is this proc's rank in the
        # whole mesh, as outside any actor (the message itself went to one proc).
        reset = actor_context.set(process_context())
        try:
            return run_cell(source, filename)
        finally:
            actor_context.reset(reset)
            # CELL-1: what the cell printed is on its way before its value is.
            _output.mark_end()

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
