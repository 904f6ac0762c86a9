"""Where the user's code is, seen from inside the package: for warnings that point at
the user's line."""

from __future__ import annotations

import os
import sys

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the user's line: the first
    frame outside this package, counted from the function that calls
    ``warnings.warn`` (the caller of this). A fixed number breaks as soon as one more
    function of the package comes between the user and the warning."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


__all__ = ["user_stacklevel"]
