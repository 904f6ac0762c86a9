"""``breakpoint()`` in a worker: a pdb session whose prompt appears in the notebook
cell that made the call.

The debugger writes to the worker's stdout, tagged with the call's origin like any
output (so it lands in that cell). When it needs a line, it writes ``PROMPT_MARK``
on a line of its own and waits; the kernel, seeing the marker, asks the user
(``input_request``, labelled with mesh and rank) and sends the answer back with the
built-in actor's ``pdb_input``. DEBUG-1: several threads (or ranks) may wait at
once; answers go to the one that asked first.
"""

from __future__ import annotations

import pdb
import queue
import sys
from typing import Any

from monarch_kernel import _origin
from monarch_kernel._wire import INPUT_MARK, PROMPT_MARK

_waiting: queue.Queue[queue.Queue[str]] = queue.Queue()  # threads waiting for a line, in order


def _ask(mark: str) -> str:
    """Writes ``mark`` on a line of its own and waits for the line the controller
    sends back (through ``feed``)."""
    answer: queue.Queue[str] = queue.Queue(maxsize=1)
    _waiting.put(answer)
    at_line_start = getattr(sys.stdout, "at_line_start", False)
    sys.stdout.write(f"{mark}\n" if at_line_start else f"\n{mark}\n")
    sys.stdout.flush()
    return answer.get()


class _Input:
    """pdb's stdin: each readline() asks the controller for a line."""

    def readline(self) -> str:
        return _ask(PROMPT_MARK)


def remote_input(prompt: object = "") -> str:
    """``input()`` of a worker: the question goes to the notebook cell that made the
    call (an ``input_request`` labelled with mesh and rank, as pdb's), and the answer
    comes back through the same path as pdb's."""
    if not _origin.current():  # nobody to ask: do not block a call no one watches
        raise EOFError("input() in a worker needs a notebook cell to answer it; no cell made this call")
    text = " ".join(str(prompt).splitlines())
    return _ask(f"{INPUT_MARK}{text}").removesuffix("\n")


def feed(line: str) -> bool:
    """Hands ``line`` to the debugger waiting longest; False if none waits."""
    try:
        answer = _waiting.get_nowait()
    except queue.Empty:
        return False
    answer.put(line if line.endswith("\n") else line + "\n")
    return True


class RemotePdb(pdb.Pdb):
    def __init__(self) -> None:
        super().__init__(stdin=_Input(), stdout=sys.stdout)  # type: ignore[arg-type]
        self.use_rawinput = False
        self.prompt = ""  # the kernel's input request shows "[mesh rank] (Pdb) " instead


#: The traceback of the last exception an endpoint or a %%mesh cell raised here.
last_traceback: list[Any] = [None]


def post_mortem() -> bool:
    """A pdb session on the last remote exception (False if there was none)."""
    tb = last_traceback[0]
    if tb is None:
        print("monarch: no exception to debug on this rank")
        return False
    p = RemotePdb()
    p.reset()
    p.interaction(None, tb)
    return True


def breakpointhook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of a worker."""
    if not _origin.current():  # nobody to ask: do not block a call no one watches
        print(
            f"monarch: breakpoint() at {sys._getframe(1).f_code.co_filename}:{sys._getframe(1).f_lineno} "
            "skipped: no notebook cell made this call",
            file=sys.stderr,
        )
        return
    RemotePdb().set_trace(sys._getframe(1))


def install() -> None:
    import builtins

    sys.breakpointhook = breakpointhook
    builtins.input = remote_input


__all__ = ["INPUT_MARK", "PROMPT_MARK", "RemotePdb", "breakpointhook", "feed", "install", "remote_input"]
