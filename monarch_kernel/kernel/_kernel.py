"""``MonarchKernel``: the IPython kernel, plus being the controller of meshes.

On top of IPython it:
- loads the ``%mesh`` / ``%%mesh`` magics;
- names the running meshes it can attach to, once, in its banner and in the first
  cell it runs (KERNEL-1);
- marks each cell as the origin of the calls it makes, so that what workers print
  shows in that cell (see ``_router``), and before a cell shows its value (ORDER-2)
  or ends, waits for the output of the meshes it called, as long as it still comes
  (ROUTE-3);
- shows mesh failures that happened while no cell ran when the next cell starts.
"""

from __future__ import annotations

import base64
import os
import signal
import sys
import threading
import time
from typing import Any

from ipykernel.ipkernel import IPythonKernel

from monarch_kernel import _origin, controller
from monarch_kernel.controller import DisplayMessage
from monarch_kernel.kernel._clients import updates_in_place
from monarch_kernel.kernel._magics import MeshMagics
from monarch_kernel.kernel._progress import bar_here, slow_wait
from monarch_kernel.kernel._router import Router, bridged, format_failure

#: How long a cell waits, at its end, for output of the calls it made.
FLUSH_S = 1.0
#: Longest a cell waits for the output of its calls while it still comes.
FLUSH_LIMIT_S = 60.0


#: KERNEL-1's line when nothing runs: a hint that a first cell which already makes or
#: attaches a mesh does not need.
NO_MESHES = "monarch: no running meshes; create one with  procs = %mesh up NAME --procs N"


#: KERNEL-1: how long a kernel's start waits for the look at the meshes in its state
#: files (REGISTRY-4); those it has not seen by then are named as not checked.
START_LOOK_S = 5.0


def _meshes_line() -> str:
    try:
        meshes, unchecked = controller.running_meshes(START_LOOK_S)
    except Exception as e:  # never fail a kernel start over this
        return f"monarch: cannot list running meshes ({e})"
    if not meshes and not unchecked:
        return NO_MESHES
    names = ", ".join(
        [
            f"{m.name} ({m.alive}/{m.procs} procs)"
            if m.unreachable is None
            else f"{m.name} (unreachable from here)"
            for m in meshes
        ]
        + [f"{n} (not checked in {START_LOOK_S:g} s: %mesh ls tells)" for n in unchecked]
    )
    return f"monarch: running meshes you can attach to: {names}; use  procs = %mesh attach NAME"


def _idle_interrupt(signum: int, frame: Any) -> None:
    threading.Thread(target=controller.escalate_interrupted, name="monarch-escalate", daemon=True).start()


def _flushing_first(hook: Any, flush: Any) -> Any:
    """``hook`` (IPython's display hook, which shows a cell's value), after ``flush()``
    when there is a value to show: worker output the cell's calls made is shown before
    it (ORDER-2)."""

    def show(value: Any) -> Any:
        if value is not None:
            try:
                flush()
            except Exception:  # a mesh that cannot flush still lets the value show
                pass
        return hook(value)

    return show


def _kernel_id() -> str | None:
    """This kernel's id, as a Jupyter server names its connection file
    (``kernel-ID.json``); another launcher's file name without its suffix."""
    try:
        from ipykernel.kernelapp import IPKernelApp

        name = os.path.basename(IPKernelApp.instance().connection_file or "")
    except Exception:
        return None
    return name.removeprefix("kernel-").removesuffix(".json") or None


#: ROUTE-5: how long workers' lines bound for a cell's stream wait to go as one message.
BATCH_S = 0.05
#: ROUTE-5: the most text one such message carries.
BATCH_BYTES = 64 * 1024


class _StreamBatch:
    """ROUTE-5: workers' lines for a cell's stream, sent as one iopub message per
    ``BATCH_S`` (or per ``BATCH_BYTES``) rather than one each: the iopub socket drops
    what exceeds its high-water mark (1,000 messages) for a client that reads slowly,
    and a worker's 3,000 lines, one message each, lost a run of them in the middle for
    a client on a loaded machine. ``flush()`` sends what waits now: before anything
    else the kernel sends for a cell (a display, its value, its end), so the order
    stays the order of arrival."""

    def __init__(self, send: Any) -> None:
        self._send = send  # send(parent, name, text)
        self._cond = threading.Condition()
        self._parent: dict[str, Any] | None = None
        self._name = ""
        self._texts: list[str] = []
        self._size = 0
        self._thread: threading.Thread | None = None

    def add(self, parent: dict[str, Any], name: str, text: str) -> None:
        with self._cond:
            if self._texts and (parent is not self._parent or name != self._name):
                self._send_now()
            self._parent, self._name = parent, name
            self._texts.append(text)
            self._size += len(text)
            if self._size >= BATCH_BYTES:
                self._send_now()
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="monarch-stream-batch", daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self) -> None:
        with self._cond:
            self._send_now()

    def _send_now(self) -> None:  # (lock held: sends keep the order they were added in)
        if self._texts and self._parent is not None:
            text, self._texts, self._size = "".join(self._texts), [], 0
            self._send(self._parent, self._name, text)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._texts:
                    self._cond.wait()
            time.sleep(BATCH_S)  # (unlocked: lines keep coming meanwhile)
            self.flush()


class MonarchKernel(IPythonKernel):
    implementation = "monarch-kernel"
    implementation_version = "0.1.0"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._batch = _StreamBatch(self._send_text)
        self.router = Router(self._send_stream)
        controller.set_frontend(
            controller.Frontend(
                on_line=self.router.on_line,
                on_merged=self.router.on_merged,
                on_failure=self.router.on_failure,
                on_notice=self.router.on_notice,
                slow_wait=slow_wait,
                progress=bar_here,
                kernel_id=_kernel_id(),
            )
        )
        self.shell.register_magics(MeshMagics)  # type: ignore[union-attr]
        # ORDER-2: a cell's value (Out[]) comes after what the calls it made printed.
        trap = self.shell.display_trap  # type: ignore[union-attr]
        trap.hook = _flushing_first(trap.hook, lambda: self._flush(_origin.current()))
        self._start_line: str | None = _meshes_line()
        self._banner_line = self._start_line

    def post_handler_hook(self) -> None:
        """While idle, an interrupt (ignored by ipykernel) still escalates remote calls
        that an earlier interrupt did not stop (INTERRUPT-2)."""
        super().post_handler_hook()
        signal.signal(signal.SIGINT, _idle_interrupt)

    @property
    def banner(self) -> str:  # type: ignore[override]
        return f"{super().banner}\n{self._banner_line}\n"

    def _send_stream(self, parent: dict[str, Any], stream: str, text: str | DisplayMessage) -> None:
        """Writes ``text`` as output of the cell whose request is ``parent`` (any thread);
        a worker's display message (DISPLAY-1) as a display message."""
        if isinstance(text, DisplayMessage):
            self._send_display(parent, text)
            return
        self._batch.add(parent, "stderr" if stream == "stderr" else "stdout", text)

    def _send_text(self, parent: dict[str, Any], name: str, text: str) -> None:
        assert self.session is not None
        self.session.send(
            self.iopub_socket,
            "stream",
            {"name": name, "text": text},
            parent=parent,
            ident=self._topic("stream"),
        )

    def _send_display(self, parent: dict[str, Any], msg: DisplayMessage) -> None:
        """A worker's bundle as a display message of the cell ``parent`` (DISPLAY-1):
        its updates update it (or, for a client that shows no display updated in
        place, show as a new display: CLIENTS-1); a clear is not passed on (it would
        clear the cell's other output too)."""
        assert self.session is not None
        self._batch.flush()  # ROUTE-5: the lines before it go first
        if msg.comm is not None:
            self.send_bridged(parent, msg)
            return
        if msg.clear:
            return
        transient = {}
        wid = msg.display_id
        if wid:
            transient["display_id"] = f"{msg.label}{wid}"
        live = updates_in_place(parent)
        kind = "update_display_data" if msg.update and wid and live else "display_data"
        content = {"data": msg.data(bridged), "metadata": msg.metadata, "transient": transient}
        self.session.send(self.iopub_socket, kind, content, parent=parent, ident=self._topic(kind))

    def send_bridged(self, parent: dict[str, Any], display: DisplayMessage) -> None:
        """DISPLAY-2: a comm message of a worker (its widget's model opening, updating,
        closing) as the kernel's own, to the front end, under the cell ``parent``."""
        assert self.session is not None
        self._batch.flush()  # ROUTE-5: the lines before it go first
        kind, msg = display.comm, display.body
        if kind not in ("comm_open", "comm_msg", "comm_close"):
            return
        content: dict[str, Any] = {"comm_id": msg["comm_id"], "data": msg.get("data") or {}}
        if kind == "comm_open":
            content["target_name"] = msg.get("target_name", "")
            if msg.get("target_module"):
                content["target_module"] = msg["target_module"]
            bridged.add(str(msg["comm_id"]))
            self._proxy_comm(display)
        buffers: list[Any] = [base64.b64decode(b) for b in msg.get("buffers") or []]
        self.session.send(
            self.iopub_socket,
            kind,
            content,
            parent=parent,
            metadata=msg.get("metadata") or {},
            buffers=buffers,
            ident=self._topic(kind),
        )

    def _proxy_comm(self, display: DisplayMessage) -> None:
        """DISPLAY-2, the way back: a comm of this kernel stands for the worker's, and
        what the front end sends to it (a slider dragged) goes to that worker's comm
        (the built-in ``comm_msg``), without waiting."""
        name, rank, msg = display.mesh, display.rank, display.body
        import comm
        from ipykernel.comm import Comm

        proxy = Comm(comm_id=str(msg["comm_id"]), primary=False, target_name=str(msg.get("target_name", "")))

        def forward(m: dict[str, Any]) -> None:
            session = controller.session(name)
            if session is None:
                return
            body = {
                "comm_id": m["content"]["comm_id"],
                "data": m["content"].get("data", {}),
                "buffers": [base64.b64encode(bytes(b)).decode("ascii") for b in m.get("buffers") or []],
            }
            session.send_builtin(rank, "comm_msg", body)

        proxy.on_msg(forward)
        comm.get_comm_manager().register_comm(proxy)

    async def do_execute(self, code: str, silent: bool, *args: Any, **kwargs: Any) -> Any:
        if silent:  # front-end machinery (inspectors, completion helpers): not a cell
            return await super().do_execute(code, silent, *args, **kwargs)
        parent = self.get_parent("shell")
        origin = str(parent.get("header", {}).get("msg_id", ""))
        pending, failures = self.router.cell_started(origin, parent)
        _origin.set_default(origin)
        #: TB-1: the number the cell gets (``In[n]``), read before IPython counts it.
        self.cell_number = getattr(self.shell, "execution_count", None)
        if self._start_line is not None:  # KERNEL-1
            if not (self._start_line == NO_MESHES and "%mesh " in code):
                print(self._start_line)
            self._start_line = None
        for stream, text in pending:
            if isinstance(text, DisplayMessage):
                self._send_display(parent, text)
            else:
                (sys.stderr if stream == "stderr" else sys.stdout).write(text)
        for f in failures:
            sys.stderr.write(format_failure(f))
        try:
            return await super().do_execute(code, silent, *args, **kwargs)
        finally:
            self._end_cell(origin)

    def _end_cell(self, origin: str) -> None:
        """ROUTE-3, then the cell ends for the router before the stream batch is sent
        (ROUTE-4, ROUTE-5): a line routed to the cell is in the batch by then, and
        later ones wait for the next cell; none goes out after the cell's end."""
        try:
            self._flush_meshes(origin)
        except BaseException:  # a second stop press: the cell still gets its reply
            pass
        self.router.cell_finished()
        try:
            self._batch.flush()
        except BaseException:
            pass
        _origin.set_default("")

    def _flush(self, origin: str) -> None:
        """ROUTE-3: waits until the meshes this cell called have delivered its output,
        and sends what waits in the stream batch (ROUTE-5)."""
        try:
            self._flush_meshes(origin)
        finally:
            self._batch.flush()

    def _flush_meshes(self, origin: str) -> None:
        for name in list(_origin.touched):
            session = controller.session(name)
            if session is None:
                continue
            try:
                ranks = session.flush(origin, timeout=FLUSH_S)
                self.router.wait_output(origin, name, ranks, quiet=FLUSH_S, limit=FLUSH_LIMIT_S)
            except Exception:  # a dead or lost mesh has nothing more to say
                pass
        _origin.touched.clear()


__all__ = ["MonarchKernel"]
