"""A worker's stdout and stderr: lines written while serving a call start with the
call's origin tag (see ``monarch_kernel._origin``), which the host agent strips and
reports beside the line; everything else passes through unchanged."""

from __future__ import annotations

import io
import sys
import threading
from typing import Any

from monarch_kernel import _origin

TAG_START, TAG_END = "\x1e", "\x1f"


class TaggedStream(io.TextIOBase):
    """Wraps a text stream; prefixes each line started while an origin is set."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._at_line_start = True
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        origin = _origin.current()
        with self._lock:
            if not origin or not s:
                if s:
                    self._raw.write(s)
                    self._at_line_start = s.endswith("\n")
                return len(s)
            tag = f"{TAG_START}{origin}{TAG_END}"
            out = []
            for piece in s.splitlines(keepends=True):
                if self._at_line_start:
                    out.append(tag)
                out.append(piece)
                self._at_line_start = piece.endswith("\n")
            self._raw.write("".join(out))
        return len(s)

    @property
    def at_line_start(self) -> bool:
        return self._at_line_start

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
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
