"""This process's exit, in one explicit order.

Each part of the package that must do something as the process exits adds a step
to a *stage*; at exit the stages run in the order below, whatever order their
modules were imported in (``atexit`` alone runs handlers in the reverse order of
their registration, which is import order: moving an import would reorder the
exit). A step that raises does not stop the others.
"""

from __future__ import annotations

import atexit
import enum
import sys
import threading
from collections.abc import Callable


class Stage(enum.IntEnum):
    """The stages of exit, in the order they run."""

    #: The controller: ephemeral meshes stop, persistent ones are let go.
    MESHES = 1
    #: A worker: every thread's unfinished line reaches its log.
    OUTPUT = 2
    #: Lane threads leave native code before the interpreter finalizes (DISPATCH-3).
    LANES = 3
    #: The native runtime, last: every step above may still use it.
    RUNTIME = 4


class Shutdown:
    """The steps of exit, by stage (``shutdown``: this process's one)."""

    def __init__(self) -> None:
        self._steps: dict[Stage, list[Callable[[], None]]] = {s: [] for s in Stage}
        self._lock = threading.Lock()
        self._ran = False

    def at(self, stage: Stage, step: Callable[[], None]) -> None:
        """Runs ``step`` at exit, in ``stage`` (once, however often it is added)."""
        with self._lock:
            if step not in self._steps[stage]:
                self._steps[stage].append(step)

    def run(self) -> None:
        """Runs every stage's steps, in stage order (once)."""
        with self._lock:
            if self._ran:
                return
            self._ran = True
            steps = [step for stage in Stage for step in self._steps[stage]]
        for step in steps:
            try:
                step()
            except Exception as e:  # the next steps still run
                print(f"monarch: at exit, {getattr(step, '__qualname__', step)} failed: {e}", file=sys.stderr)


shutdown = Shutdown()
atexit.register(shutdown.run)

__all__ = ["Shutdown", "Stage", "shutdown"]
