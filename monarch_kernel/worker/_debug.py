"""``breakpoint()`` in a worker: a pdb session whose prompt appears in the notebook
cell that made the call; in a call no cell made (a script's), the rank waits in pdb
for ``monarch-kernel debug`` to attach from a terminal (DEBUG-3).

The debugger writes to the worker's stdout, tagged with the call's origin like any
output (so it lands in that cell). When it needs a line, it writes ``PROMPT_MARK``
on a line of its own and waits; the kernel, seeing the marker, asks the user
(``input_request``, labelled with mesh and rank) and sends the answer back with the
built-in actor's ``pdb_input``. DEBUG-1: several threads (or ranks) may wait at
once; answers go to the one that asked first.
"""

from __future__ import annotations

import os
import pdb
import queue
import sys
from typing import Any

from monarch_kernel import _origin
from monarch_kernel._wire import INPUT_MARK, PROMPT_MARK

#: Threads waiting for a line, in order: (where the answer goes, where the code stands).
_waiting: queue.Queue[tuple[queue.Queue[str], str]] = queue.Queue()


def _ask(mark: str, where: str = "") -> str:
    """Writes ``mark`` on a line of its own and waits for the line the controller
    sends back (through ``feed``)."""
    answer: queue.Queue[str] = queue.Queue(maxsize=1)
    _waiting.put((answer, where))
    at_line_start = getattr(sys.stdout, "at_line_start", False)
    sys.stdout.write(f"{mark}\n" if at_line_start else f"\n{mark}\n")
    sys.stdout.flush()
    return answer.get()


def waiting() -> list[str]:
    """Where each debugger waiting for a line stands (``file:line``), longest first."""
    return [where for _answer, where in list(_waiting.queue)]


class _Input:
    """pdb's stdin: each readline() asks the controller for a line."""

    def __init__(self) -> None:
        self.pdb: pdb.Pdb | None = None

    def readline(self) -> str:
        frame = getattr(self.pdb, "curframe", None)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        return _ask(PROMPT_MARK, where)


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
        answer, _where = _waiting.get_nowait()
    except queue.Empty:
        return False
    answer.put(line if line.endswith("\n") else line + "\n")
    return True


class RemotePdb(pdb.Pdb):
    def __init__(self) -> None:
        stdin = _Input()
        super().__init__(stdin=stdin, stdout=sys.stdout)  # type: ignore[arg-type]
        stdin.pdb = self
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
    """``sys.breakpointhook`` of a worker. DEBUG-3: in a call no notebook cell made
    (a script's), the rank waits in pdb, and says how to reach it."""
    frame = sys._getframe(1)
    if not _origin.current():
        mesh, rank = os.environ.get("MONARCH_MESH", "mesh"), os.environ.get("MONARCH_RANK", "?")
        print(
            f"monarch: rank {rank} of mesh {mesh!r} waits in pdb at breakpoint() "
            f"({frame.f_code.co_filename}:{frame.f_lineno}); from a terminal: "
            f"monarch-kernel debug {mesh} --rank {rank}",
            file=sys.stderr,
            flush=True,
        )
    RemotePdb().set_trace(frame)


def install() -> None:
    import builtins

    sys.breakpointhook = breakpointhook
    builtins.input = remote_input


__all__ = [
    "INPUT_MARK",
    "PROMPT_MARK",
    "RemotePdb",
    "breakpointhook",
    "feed",
    "install",
    "remote_input",
    "waiting",
]
