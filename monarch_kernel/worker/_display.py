"""Rich output of a worker: IPython's display machinery, its bundles sent to the cell
that called (``display()``, ``_repr_*_`` values, ``plt.show()`` and inline figures,
``update_display``, ``clear_output``).

DISPLAY-1: a worker's shell is IPython's own, with a display publisher that writes
each bundle as one marked line on stdout (``DISPLAY_MARK`` + JSON, tagged with the
call's origin like any line), so it reaches the same cell as the worker's text, in
order with it. A bundle larger than ``INLINE_MAX`` goes through the transfer engine:
the line carries its descriptor, and the kernel pulls it. The shell starts with the
first ``%%mesh`` cell, or before an endpoint once IPython is imported here; workers
that never display pay nothing.

DISPLAY-2: comms made in a worker (widgets) are bridged through the same lines: the
kernel opens them with the front end and passes on their messages; what the front
end sends back comes to the worker's comm as a call to its built-in actor.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
from typing import Any

from monarch_kernel._wire import DISPLAY_MARK
from monarch_kernel.mesh import here

#: Bundles larger than this (bytes of JSON) travel through the transfer engine.
INLINE_MAX = 64 * 1024
#: How long the kernel has to pull a large bundle.
PULL_TTL_S = 120.0

_shell: list[Any] = []
_lock = threading.Lock()


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not part of a display bundle")


def send(message: dict[str, Any]) -> None:
    """Writes one display message as a marked line on stdout (DISPLAY-1)."""
    text = json.dumps(message, default=_jsonable)
    if len(text) > INLINE_MAX:
        from monarch_kernel import _native

        token = here.token
        if token is not None:
            data = text.encode()
            desc = _native.xfer_register(data, token, 1, PULL_TTL_S)
            text = json.dumps({"pull": base64.b64encode(bytes(desc)).decode("ascii"), "size": len(data)})
    out = sys.stdout
    at_start = getattr(out, "at_line_start", True)
    out.write(("" if at_start else "\n") + DISPLAY_MARK + text + "\n")
    out.flush()


def _publisher_class() -> type:
    from IPython.core.displaypub import DisplayPublisher

    class WorkerDisplayPublisher(DisplayPublisher):  # type: ignore[misc]
        """Sends bundles to the calling cell (DISPLAY-1)."""

        def publish(
            self,
            data: dict[str, Any],
            metadata: dict[str, Any] | None = None,
            source: Any = None,
            *,
            transient: dict[str, Any] | None = None,
            update: bool = False,
            **kwargs: Any,
        ) -> None:
            send({"data": data, "metadata": metadata or {}, "transient": transient or {}, "update": update})

        def clear_output(self, wait: bool = False) -> None:
            send({"clear": True, "wait": wait})

    return WorkerDisplayPublisher


def ensure() -> Any:
    """This worker's IPython shell, made on first use (about 0.1 s, once)."""
    if _shell:
        return _shell[0]
    with _lock:
        if not _shell:
            from IPython.core.interactiveshell import InteractiveShell
            from traitlets.config import Config

            config = Config()
            config.HistoryManager.enabled = False  # no history database per worker
            hooks = (sys.excepthook, sys.displayhook)
            shell = InteractiveShell.instance(config=config, display_pub_class=_publisher_class())
            sys.excepthook, sys.displayhook = hooks  # the worker's own, as they were
            _bridge_comms()
            _shell.append(shell)
    return _shell[0]


def _bridge_comms() -> None:
    """DISPLAY-2: comms made here (ipywidgets' models) send what they publish to the
    calling cell as display messages; the kernel opens them with the front end, so
    a worker's widget renders (``tqdm.auto`` picks its notebook form, as in a
    kernel). What the front end sends back comes through the built-in ``comm_msg``."""
    try:
        import comm
        from comm.base_comm import BaseComm
    except ImportError:  # no comm package: widgets show as text
        return

    class BridgedComm(BaseComm):  # type: ignore[misc]
        def publish_msg(
            self,
            msg_type: str,
            data: Any = None,
            metadata: Any = None,
            buffers: Any = None,
            **keys: Any,
        ) -> None:
            send(
                {
                    "comm": msg_type,
                    "comm_id": self.comm_id,
                    "target_name": self.target_name,
                    "target_module": self.target_module,
                    "data": data or {},
                    "metadata": metadata or {},
                    "buffers": [base64.b64encode(bytes(b)).decode("ascii") for b in buffers or []],
                }
            )

    comm.create_comm = BridgedComm
    # tqdm.auto (and other code) takes the notebook form where ipykernel's shell module
    # is loaded: with the bridge, it renders in the notebook.
    import importlib

    try:
        importlib.import_module("ipykernel.zmqshell")
    except ImportError:
        pass


def ensure_if_imported() -> None:
    """Before an endpoint: the shell, if the worker has IPython loaded (code that
    displays imports it) and has none yet. A dictionary lookup otherwise."""
    if not _shell and "IPython" in sys.modules:
        ensure()


def bundle(value: Any) -> dict[str, Any]:
    """``value`` as a MIME bundle, as IPython formats a cell's value (``_repr_*_``)."""
    data, metadata = ensure().display_formatter.format(value)
    return {"data": data, "metadata": metadata}


def flush_figures() -> None:
    """Shows the matplotlib figures a cell left open, as IPython's inline backend does
    after each cell, if matplotlib is in use here with that backend."""
    if "matplotlib.pyplot" not in sys.modules:
        return
    import matplotlib

    if "inline" not in str(matplotlib.get_backend()):
        return
    from matplotlib_inline.backend_inline import flush_figures as flush

    ensure()
    flush()


__all__ = ["INLINE_MAX", "bundle", "ensure", "ensure_if_imported", "flush_figures", "send"]
