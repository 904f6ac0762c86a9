"""Where calls come from, for output routing.

Every call and spawn carries an *origin* (``Call.origin``): in a notebook kernel, the
message id of the cell that made it. A worker tags what an endpoint prints while
serving the call with that origin (``\\x1e ORIGIN \\x1f`` at the start of each line,
stripped by the host agent), so the kernel can show it in that cell whenever it
arrives. Calls that actors make carry the origin of the call they serve.

ORIGIN-1: the origin of code running here is the context's (set by the worker's
dispatcher for the call it serves), else this process's default (set by the kernel
for the cell it runs), else empty.
"""

from __future__ import annotations

from contextvars import ContextVar

_var: ContextVar[str] = ContextVar("monarch_origin", default="")
#: The variable itself, for a worker's call path (it sets and resets it per call,
#: without a function around it).
var = _var
_default = [""]
#: Proc meshes (by name) that calls with the current default origin went to; the
#: kernel flushes their output at the end of the cell.
touched: set[str] = set()


def current() -> str:
    """The origin that calls made here carry (ORIGIN-1)."""
    return _var.get() or _default[0]


def set_default(origin: str) -> None:
    _default[0] = origin
    touched.clear()


def set_context(origin: str) -> object:
    """Sets the origin of the running call; returns the token for :func:`reset`."""
    return _var.set(origin)


def reset(token: object) -> None:
    _var.reset(token)  # type: ignore[arg-type]
