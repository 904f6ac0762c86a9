"""The front end of this controller: where what meshes say goes when it is not a
call's reply. The Jupyter kernel installs one (``set_frontend``) so that worker
output, failures and notices show in the notebook and long waits show progress; a
plain script has none, and these go to stdout and stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monarch_kernel.control import set_kernel_id
from monarch_kernel.mesh import MeshFailure, set_slow_wait

if TYPE_CHECKING:
    from monarch_kernel.controller._mesh_session import MeshSession


@dataclass(frozen=True)
class Frontend:
    """What a front end receives. Each hook is called on a background thread, except
    ``slow_wait``, which runs where the wait is."""

    #: A line of worker output: ``(session, line)``, the line being the agent's
    #: ``LogLine`` (rank, stream, text, origin). None: printed as ``[mesh rank] text``.
    on_line: Callable[[MeshSession, Any], None] | None = None
    #: Lines merged over ``logging_option``'s window: ``(session, MergedLine)``.
    #: None: printed as ``[mesh ranks 0-7] [8 similar log lines] text``.
    on_merged: Callable[[MeshSession, Any], None] | None = None
    #: A failure that no ``on_failure`` callback or ``__supervise__`` hook handled.
    #: None: one line on stderr.
    on_failure: Callable[[MeshFailure], None] | None = None
    #: monarch's own notices about a mesh's output (lines dropped). None: stderr.
    on_notice: Callable[[str], None] | None = None
    #: ``wait(calls, timeout, what)`` for waits that last more than a second (it shows
    #: progress); it returns what ``_native.wait_all(..., fail_fast=True)`` does.
    #: None: plain waits.
    slow_wait: Callable[[Sequence[Any], float | None, str], list[Any]] | None = None
    #: ``progress(total, what)`` for a start that lasts more than a second (many procs):
    #: an object with ``update(done)`` and ``close()`` shown where the start runs, or
    #: None to show nothing. None: a line on stderr, redrawn, when it is a terminal.
    progress: Callable[[int, str], Any] | None = None
    #: The Jupyter kernel id of this controller, told to the agents it attaches to
    #: (OWNER-1). None: a script.
    kernel_id: str | None = None


_current = [Frontend()]


class _TerminalLine:
    """Progress as one line on a terminal's stderr, redrawn in place."""

    def __init__(self, total: int, what: str) -> None:
        self.total, self.what = total, what

    def update(self, done: int) -> None:
        sys.stderr.write(f"\rmonarch: {self.what}: {done}/{self.total}")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def progress(total: int, what: str) -> Any:
    """A progress display of ``total`` steps (``update(done)``, ``close()``) from the
    front end, or None where there is nowhere to show one."""
    make = _current[0].progress
    if make is not None:
        return make(total, what)
    return _TerminalLine(total, what) if sys.stderr.isatty() else None


def set_frontend(frontend: Frontend) -> None:
    """Installs ``frontend`` for every mesh of this process (replacing any before)."""
    _current[0] = frontend
    set_slow_wait(frontend.slow_wait)
    set_kernel_id(frontend.kernel_id)


def frontend() -> Frontend:
    """The front end installed now (one with no hooks if none was)."""
    return _current[0]


__all__ = ["Frontend", "frontend", "progress", "set_frontend"]
