"""Worker lines merged over a window (``logging_option(aggregate_window_sec=)``, as
Monarch's log aggregation): the text lines that arrive within the window are held,
then each distinct line (same cell, stream and text) is let out once, with every
rank that wrote it and how many times, in the order the lines first came. Nothing is
dropped: a line written once by one rank comes out as it was, only later."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monarch_kernel._ranks import rank_runs
from monarch_kernel.control._events import LineKind


def ranks_label(ranks: tuple[int, ...]) -> str:
    """``3``, or ``ranks 0-3,8`` for several."""
    return str(ranks[0]) if len(ranks) == 1 else "ranks " + ",".join(rank_runs(ranks))


@dataclass(frozen=True, slots=True)
class MergedLine:
    """Lines of one text from one or more ranks, read like the agent's ``LogLine``
    (``rank``: the first rank that wrote it)."""

    rank: int
    ranks: tuple[int, ...]
    count: int
    stream: str
    text: str
    origin: str
    pid: int = 0
    kind: int = LineKind.TEXT

    @property
    def label(self) -> str:
        """Who wrote it: ``3``, or ``ranks 0-7``."""
        return ranks_label(self.ranks)

    @property
    def shown(self) -> str:
        """Its text, with Monarch's count when it stands for several lines."""
        return self.text if self.count == 1 else f"[{self.count} similar log lines] {self.text}"


class LineWindow:
    """Holds text lines for ``window`` seconds from the first of a batch, then hands
    each distinct line to ``emit`` as a ``MergedLine`` (on a timer thread)."""

    def __init__(self, window: float, emit: Callable[[MergedLine], None]) -> None:
        self.window = window
        self._emit = emit
        self._lock = threading.Lock()
        #: (origin, stream, text) -> [ranks in order, count, pid of the first].
        self._held: dict[tuple[str, str, str], list[Any]] = {}
        self._timer: threading.Timer | None = None

    def add(self, line: Any) -> None:
        """Holds ``line`` (a ``LogLine`` of kind TEXT)."""
        key = (line.origin, line.stream, line.text)
        with self._lock:
            held = self._held.get(key)
            if held is None:
                self._held[key] = [[line.rank], 1, line.pid]
            else:
                if line.rank not in held[0]:
                    held[0].append(line.rank)
                held[1] += 1
            if self._timer is None:
                self._timer = threading.Timer(self.window, self.flush)
                self._timer.name, self._timer.daemon = "monarch-log-window", True
                self._timer.start()

    def flush(self) -> None:
        """Lets out every line held now."""
        with self._lock:
            held, self._held = self._held, {}
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for (origin, stream, text), (ranks, count, pid) in held.items():
            ordered = tuple(sorted(ranks))
            self._emit(MergedLine(ordered[0], ordered, count, stream, text, origin, pid))


__all__ = ["LineWindow", "MergedLine", "ranks_label"]
