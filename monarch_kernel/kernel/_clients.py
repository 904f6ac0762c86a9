"""What the client that asked for a cell shows of output that changes: a display
updated in place, or each output once, as it comes (CLIENTS-1).

The Jupyter protocol does not say what a client can show, and clients differ where
it matters here. JupyterLab, Notebook 7 and nbclient (so papermill and nbconvert)
keep each cell's outputs and apply ``update_display_data`` to the output it names.
``jupyter console`` (and terminal clients like it) prints each ``display_data``'s
``text/plain`` once, as it comes, and ignores ``update_display_data``: a ``%%mesh``
block updated in place shows there with its first lines only.

CLIENTS-1: output is updated in place only for a request from a client that shows it
keeps a cell's outputs: its ``execute_request`` names the cell (``metadata.cellId``,
which JupyterLab and Notebook 7 send) or takes no input (``allow_stdin`` false, as
nbclient sends). Any other request (``jupyter console``, with or without its simple
prompt, sends neither and looks on the wire like any ``jupyter_client`` script) gets
each output once, as it comes: a ``%%mesh`` cell's lines as one stream prefixed with
their rank (merged lines once, as the cell ends), a worker's display update as a new
display, a progress bar once, never redrawn. A client judged wrongly loses the
grouping, never output. Every display the kernel makes also carries a ``text/plain``
that reads as the display does, for the clients that show only that.
"""

from __future__ import annotations

from typing import Any


def updates_in_place(request: dict[str, Any] | None) -> bool:
    """CLIENTS-1: whether the client that sent ``request`` (an ``execute_request``
    message) shows a display updated in place. True without a request (no client
    to judge: outside a cell, or outside a kernel)."""
    if not request or not request.get("header"):
        return True
    metadata = request.get("metadata") or {}
    content = request.get("content") or {}
    return bool(metadata.get("cellId")) or content.get("allow_stdin") is False


def updates_here() -> bool:
    """``updates_in_place`` for the request of the cell running now (on the kernel's
    main thread); True outside a kernel."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return True
    try:
        request = kernel.get_parent("shell")
    except Exception:  # an ipykernel without get_parent: keep the live view
        return True
    return updates_in_place(request)


__all__ = ["updates_here", "updates_in_place"]
