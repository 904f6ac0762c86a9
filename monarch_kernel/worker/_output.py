"""A worker's stdout and stderr: lines written while serving a call start with the
call's origin tag (see ``monarch_kernel._origin``), which the host agent strips and
reports beside the line; everything else passes through unchanged."""

from __future__ import annotations

import io
import sys
import threading
from typing import Any

from monarch_kernel import _origin
from monarch_kernel._shutdown import Stage, shutdown
from monarch_kernel._wire import ORIGIN_END as TAG_END
from monarch_kernel._wire import ORIGIN_START as TAG_START

#: An unfinished line of more pieces, or a piece longer, than this is written
#: through as it is (OUTPUT-1), so a long run of writes without a newline stays cheap.
_HOLD_PIECES = 256
_HOLD_MAX = 8192


class TaggedStream(io.TextIOBase):
    """Wraps a text stream; prefixes each line started while an origin is set.

    OUTPUT-1: lines are assembled per thread and written whole, so a line printed in
    pieces (``print`` writes its arguments one by one) is never mixed with another
    thread's, and each line keeps its own thread's origin. ``flush()`` writes the
    calling thread's unfinished line as it is; if another thread then writes, that
    line is ended first.

    OUTPUT-2: a piece with ``\\r`` (a progress bar's update) goes out at once as a
    whole line, so the notebook shows it live; what the thread writes next starts
    with ``\\r`` (it overwrites, as on a terminal) unless it is the newline that ends
    that line, which is dropped (the line went out ended)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._lock = threading.Lock()
        self._partial: dict[
            threading.Thread, tuple[str, list[str]]
        ] = {}  # thread -> (origin, unfinished line)
        self._open: tuple[threading.Thread, str] | None = None  # (thread, origin) of a line left open in raw
        #: Threads whose last piece was a \r line, sent whole (OUTPUT-2).
        self._cr: dict[threading.Thread, bool] = {}

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        if not s:
            return 0
        origin = _origin.current()
        me = threading.current_thread()  # (not its id: a new thread may reuse that)
        with self._lock:
            if self._cr.pop(me, False):  # OUTPUT-2: after a \r line this thread left open
                s = s[1:] if s.startswith("\n") else "\r" + s
                if not s:
                    return 1
            held_origin, held = self._partial.pop(me, (origin, []))
            if held and held_origin != origin:  # the call changed mid-line: end it
                self._put(me, held_origin, "".join(held) + "\n")
                held = []
            cut = s.rfind("\n") + 1
            if cut:
                self._put(me, origin, "".join(held) + s[:cut])
                held = []
            if cut < len(s):
                held.append(s[cut:])
                if "\r" in s:  # OUTPUT-2: a progress line goes as a line, now
                    self._put(me, origin, "".join(held) + "\n")
                    self._cr[me] = True
                    held = []
                elif len(held) > _HOLD_PIECES or len(s) > _HOLD_MAX:  # a long one goes as it is
                    self._put(me, origin, "".join(held))
                    held = []
            if held:
                self._partial[me] = (origin, held)
        return len(s)

    def _put(self, me: threading.Thread, origin: str, text: str) -> None:
        """Writes ``text`` (thread ``me``'s) to the raw stream, each line tagged."""
        tag = f"{TAG_START}{origin}{TAG_END}" if origin else ""
        out = []
        continues = self._open == (me, origin)  # its own line, left open by flush()
        if self._open is not None and not continues:
            out.append("\n")  # another thread's open line ends here
        lines = text.split("\n")  # only \n ends a line (splitlines would also cut at \x1d, \x1e)
        pieces = [ln + "\n" for ln in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
        for i, piece in enumerate(pieces):
            if tag and not (i == 0 and continues):
                out.append(tag)
            out.append(piece)
        self._open = None if text.endswith("\n") else (me, origin)
        self._raw.write("".join(out))

    def end_lines(self) -> None:
        """Ends every unfinished line, every thread's (before a marker line)."""
        with self._lock:
            self._cr.clear()
            for t, (origin, held) in list(self._partial.items()):
                self._put(t, origin, "".join(held) + "\n")
            self._partial.clear()
            if self._open is not None:
                self._raw.write("\n")
                self._open = None

    @property
    def at_line_start(self) -> bool:
        """Whether this thread's next write starts a line."""
        me = threading.current_thread()  # (not its id: a new thread may reuse that)
        with self._lock:
            return me not in self._partial and (self._open is None or self._open[0] != me)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        me = threading.current_thread()  # (not its id: a new thread may reuse that)
        with self._lock:
            held = self._partial.pop(me, None)
            if held is not None:
                self._put(me, held[0], "".join(held[1]))
        self._raw.flush()

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(self._raw.encoding)

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self._raw.errors  # type: ignore[no-any-return]

    @property
    def buffer(self) -> Any:
        return self._raw.buffer


def install() -> None:
    """Makes ``sys.stdout`` and ``sys.stderr`` tag lines with their origin."""
    if not isinstance(sys.stdout, TaggedStream):
        sys.stdout = TaggedStream(sys.stdout)
    if not isinstance(sys.stderr, TaggedStream):
        sys.stderr = TaggedStream(sys.stderr)
    shutdown.at(Stage.OUTPUT, end_lines)  # every thread's unfinished line reaches the log


def mark_end() -> None:
    """Ends every unfinished line, then writes a flush marker on stdout and stderr,
    tagged with the current origin: once a reader has seen both, it has seen all that
    was printed here for that origin before (the pipes keep their order; ROUTE-3)."""
    from monarch_kernel._wire import FLUSH_MARK

    end_lines()  # the marker goes on a line of its own
    for stream in (sys.stdout, sys.stderr):
        stream.write(f"{FLUSH_MARK}\n")
        stream.flush()


def end_lines() -> None:
    """Ends every thread's unfinished line on stdout and stderr, and flushes them
    (before a marker line, or before the worker exits)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, TaggedStream):
            stream.end_lines()
        stream.flush()
