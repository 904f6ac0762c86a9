"""Routing of worker output and mesh failures into the notebook.

Worker output reaches the kernel on the sessions' watch threads, each line with the
origin of the call that printed it (the message id of the cell that made the call,
see ``monarch_kernel._origin``). ROUTE-1: a line goes to the cell its origin names,
as a stream message with that cell's request as parent. ROUTE-4: once that cell has
ended (front ends drop output sent to a finished request), and for a line without
an origin, it goes to the cell running now, or, while the kernel is idle, waits for
the next cell. ROUTE-2: a ``%%mesh`` cell *captures* its
origin: its lines are queued for the cell's own display (one block per rank) instead.
ROUTE-3: flush markers are never shown; they let a cell wait until it has seen all
that its calls printed.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections import OrderedDict
from typing import Any

from monarch_kernel.controller import DisplayMessage, LineKind, MergedLine, MeshSession, Prompt

# Cells of this kernel, remembered: output of another origin is not ours (ROUTE-4).
_MAX_PARENTS = 1000
# Lines kept for the next cell while the kernel is idle.
_MAX_PENDING = 1000
#: pdb commands after which a rank leaves the debugger (or may: `c`, `q`).
_LEAVES_PDB = frozenset({"c", "cont", "continue", "q", "quit", "exit"})


#: Comms a worker opened through the bridge (DISPLAY-2), by id: their widgets render.
bridged: set[str] = set()

#: What a captured line is: (mesh, rank, stream, its text or its display message).
Captured = tuple[str, int, str, "str | DisplayMessage"]


class Router:
    """One per kernel; ``send(parent, stream, text)`` writes a stream message."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self._lock = threading.Condition()
        self._parents: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.current: str = ""  # the origin (msg id) of the cell running now, if any
        self._captures: dict[str, queue.SimpleQueue[Captured]] = {}
        self._marks: collections.defaultdict[str, set[tuple[str, int, str]]] = collections.defaultdict(set)
        #: Captured lines so far (a cell waiting for its marks wakes on each).
        self._lines_seen = 0
        self._pending: list[tuple[str, str | DisplayMessage]] = []  # (stream, text) while idle
        self._failures: list[Any] = []
        #: (mesh, rank) whose output goes to the running cell (`%mesh debug --rank`).
        self._attached: set[tuple[str, int]] = set()
        #: The question of a rank waiting in input() (not pdb), by (mesh, rank).
        self._questions: dict[tuple[str, int], str] = {}
        #: Debuggers waiting for a line: (session, rank, origin), oldest first (DEBUG-1).
        self.prompts: queue.SimpleQueue[tuple[Any, int, str]] = queue.SimpleQueue()

    # -- cells (main thread) -----------------------------------------------------------

    def cell_started(
        self, origin: str, parent: dict[str, Any]
    ) -> tuple[list[tuple[str, str | DisplayMessage]], list[Any]]:
        """Remembers the cell; returns what waited for it (output, failures)."""
        with self._lock:
            self._parents[origin] = parent
            while len(self._parents) > _MAX_PARENTS:
                self._parents.popitem(last=False)
            self.current = origin
            pending, self._pending = self._pending, []
            failures, self._failures = self._failures, []
        return pending, failures

    def cell_finished(self) -> None:
        """From now on, lines wait for the next cell (ROUTE-4). A line routed to this
        cell was handed to ``send`` under the same lock, so once this returns every
        one of them is in the kernel's stream batch, which the cell's end flushes
        next: none is sent after the cell's end (a front end drops it)."""
        with self._lock:
            self.current = ""

    def capture(self, origin: str) -> queue.SimpleQueue[Captured]:
        """ROUTE-2: lines of ``origin`` go to the returned queue as (mesh, rank, stream,
        text), a display message in place of the text (DISPLAY-1)."""
        q: queue.SimpleQueue[Captured] = queue.SimpleQueue()
        with self._lock:
            self._captures[origin] = q
        return q

    def release(self, origin: str) -> None:
        with self._lock:
            self._captures.pop(origin, None)

    def wait_marks(self, origin: str, mesh: str, ranks: list[int], timeout: float, drain: Any = None) -> bool:
        """Waits until every rank's flush marker of ``origin`` came on both streams;
        ``drain()``, if given, runs (without the lock) whenever a captured line came
        meanwhile, so that a cell's output shows while it waits."""
        want = {(mesh, r, s) for r in ranks for s in ("stdout", "stderr")}
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                seen = self._lines_seen
                while not want <= self._marks[origin] and self._lines_seen == seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._lock.wait(left)
                if want <= self._marks[origin]:
                    self._marks[origin] -= want
                    if not self._marks[origin]:
                        del self._marks[origin]
                    return True
            if drain is not None:
                drain()

    def wait_output(
        self, origin: str, mesh: str, ranks: list[int], quiet: float, limit: float, drain: Any = None
    ) -> bool:
        """Waits for the flush marks of ``origin`` from ``ranks`` as long as output still
        comes (a worker that printed much), until ``quiet`` s pass with none, or
        ``limit`` s in all (a task that prints on and on does not hold a cell forever);
        whether the marks came. ``drain``: as for ``wait_marks``."""
        deadline = time.monotonic() + limit
        seen, quiet_since = self._lines_seen, time.monotonic()
        while not self.wait_marks(origin, mesh, ranks, min(quiet, 0.2), drain):
            now = time.monotonic()
            if self._lines_seen != seen:
                seen, quiet_since = self._lines_seen, now
            if now - quiet_since > quiet or now > deadline:
                return False
        return True

    # -- watch threads -----------------------------------------------------------------

    def on_line(self, session: MeshSession, line: Any) -> None:
        """A line of a worker's output, of any kind but an actor's failure (the
        session's own), as the agent classified it (``control.LineKind``)."""
        mesh, origin, kind = session.name, line.origin, line.kind
        if kind == LineKind.PROMPT or kind == LineKind.INPUT:
            prompt = Prompt.of(line)
            if prompt.question is not None:  # input(): its own question instead of pdb's
                with self._lock:
                    self._questions[(mesh, prompt.rank)] = prompt.question
            self.prompts.put((session, prompt.rank, prompt.origin))
            return
        if kind == LineKind.END_MARK:
            with self._lock:
                self._marks[origin].add((mesh, line.rank, line.stream))
                self._lock.notify_all()
            return
        text: str | DisplayMessage = line.text
        if kind == LineKind.DISPLAY:  # DISPLAY-1: a bundle, decoded once, shown as one
            text = DisplayMessage.of(mesh, line, session.token)
        with self._lock:
            q = self._captures.get(origin)
            if q is not None:
                q.put((mesh, line.rank, line.stream, text))
                self._lines_seen += 1
                self._lock.notify_all()  # (a cell waiting for its marks shows it meanwhile)
                return
            # (`%mesh debug --rank R`: the attached rank's output comes to the running cell.)
            if (mesh, line.rank) not in self._attached and origin and origin not in self._parents:
                return  # another controller's call (or a cell long gone): not ours to show
            window = session.window
            if window is not None and kind == LineKind.TEXT and (mesh, line.rank) not in self._attached:
                window.add(line)  # shown once the window ends (on_merged)
                return
            # To the running cell: its own output, output with no origin or whose cell has
            # ended (ROUTE-4).
            self._lines_seen += 1  # (a flush waiting for its marks sees output still comes)
            if isinstance(text, DisplayMessage):
                stream: str = "display"
            else:
                stream, text = line.stream, f"[{mesh} {line.rank}] {text}\n"
            parent = self._running_or_keep(stream, text)
            if parent is not None:  # (under the lock: see cell_finished)
                self._send(parent, stream, text)

    def on_merged(self, session: MeshSession, merged: MergedLine) -> None:
        """Lines merged over ``logging_option``'s window, from the ranks that wrote
        them: to the running cell, as any call's output (ROUTE-4)."""
        text = f"[{session.name} {merged.label}] {merged.shown}\n"
        with self._lock:
            self._lines_seen += 1
            parent = self._running_or_keep(merged.stream, text)
            if parent is not None:  # (under the lock: see cell_finished)
                self._send(parent, merged.stream, text)

    def _running_or_keep(self, stream: str, text: str | DisplayMessage) -> dict[str, Any] | None:
        """The request of the cell running now; while none runs, ``text`` waits for
        the next one (up to ``_MAX_PENDING`` lines) and this returns None. Called
        with the lock held."""
        parent = self._parents.get(self.current) if self.current else None
        if parent is None:
            if len(self._pending) < _MAX_PENDING:
                self._pending.append((stream, text))
            elif len(self._pending) == _MAX_PENDING:
                self._pending.append(
                    ("stderr", "monarch: more worker output came while idle; see %mesh logs\n")
                )
        return parent

    def answer_prompts(self, ask: Any, stay: float = 2.0, drain: Any = None) -> None:
        """Asks the user (``ask(prompt) -> line``, the kernel's stdin) for every
        debugger waiting now, and sends each answer to its worker.

        DEBUG-2: one rank at a time. After an answer that keeps its rank in pdb
        (anything but continue or quit), that rank's next prompt is waited for up to
        ``stay`` s before another rank is asked, so ranks stopping together are debugged
        one after the other instead of in alternation. ``drain()``, if given, shows
        what the debugger printed (a ``%%mesh`` cell's captured output) before each
        question."""
        focus: tuple[str, int] | None = None
        while True:
            item = self._next_prompt(focus, stay, drain)
            if item is None:
                return
            session, rank, _origin = item
            if drain is not None:
                drain()
            question, label = self._question(session.name, rank)
            line = ask(label)
            session.pdb_input(rank, line)
            leaves = question is not None or line.strip().split(" ")[0] in _LEAVES_PDB
            focus = None if leaves else (session.name, rank)

    def _question(self, mesh: str, rank: int) -> tuple[str | None, str]:
        """(The input() question ``rank`` waits with, None if it waits in pdb; the
        label its input request shows)."""
        with self._lock:
            question = self._questions.pop((mesh, rank), None)
        return question, f"[{mesh} {rank}] {question or '(Pdb) '}"

    def _next_prompt(
        self, focus: tuple[str, int] | None, stay: float, drain: Any = None
    ) -> tuple[Any, int, str] | None:
        """The focused rank's prompt (waiting up to ``stay`` s for it), else the oldest."""
        deadline = time.monotonic() + (stay if focus else 0.0)
        while True:
            waiting = self._take_all()
            for i, (s, r, _o) in enumerate(waiting):
                if focus is None or (s.name, r) == focus:
                    item = waiting.pop(i)
                    for other in waiting:
                        self.prompts.put(other)
                    return item
            for other in waiting:
                self.prompts.put(other)
            if time.monotonic() >= deadline:
                if focus is None or not waiting:
                    return None
                focus = None  # the focused rank went on running: take the oldest
                continue
            if drain is not None:
                drain()
            time.sleep(0.02)

    def _take_all(self) -> list[tuple[Any, int, str]]:
        items = []
        while True:
            try:
                items.append(self.prompts.get_nowait())
            except queue.Empty:
                return items

    def _peek(self) -> list[tuple[Any, int, str]]:
        items = self._take_all()
        for it in items:
            self.prompts.put(it)
        return items

    def cast(self, mesh: str | None, ranks: list[int] | None, line: str) -> list[tuple[str, int]]:
        """Sends pdb command ``line`` to every rank waiting in pdb that no cell answers
        (of ``mesh`` and in ``ranks`` when given: Monarch's ``cast``); the (mesh,
        rank) that took it. A rank that stops again is parked again."""
        sent = []
        for session, rank, origin in self._take_all():
            if (mesh is None or session.name == mesh) and (ranks is None or rank in ranks):
                session.pdb_input(rank, line)
                sent.append((session.name, rank))
            else:
                self.prompts.put((session, rank, origin))
        return sent

    def parked(self) -> list[tuple[str, int]]:
        """(mesh, rank) of the debuggers waiting for a line that no cell answers."""
        return [(s.name, r) for s, r, _o in self._peek()]

    def attach(self, rank: int, ask: Any, quiet: float = 1.0) -> None:
        """Answers the debugger of ``rank`` until it stops asking for ``quiet`` s; its
        output shows in the running cell meanwhile."""
        meshes = {s.name for s, r, _o in self._peek() if r == rank}
        with self._lock:
            self._attached |= {(m, rank) for m in meshes}
        try:
            deadline = time.monotonic() + quiet
            while time.monotonic() < deadline:
                try:
                    session, r, origin = self.prompts.get(timeout=0.05)
                except queue.Empty:
                    continue
                if r != rank:
                    self.prompts.put((session, r, origin))
                    continue
                session.pdb_input(rank, ask(self._question(session.name, rank)[1]))
                deadline = time.monotonic() + quiet
        finally:
            with self._lock:
                self._attached -= {(m, rank) for m in meshes}

    def on_notice(self, text: str) -> None:
        """A line from monarch itself: to the cell running now, or the next one."""
        with self._lock:
            parent = self._running_or_keep("stderr", text)
        if parent is not None:
            self._send(parent, "stderr", text)

    def on_failure(self, failure: Any) -> None:
        with self._lock:
            parent = self._parents.get(self.current)
            if parent is None:
                self._failures.append(failure)
                return
        self._send(parent, "stderr", format_failure(failure))


def format_failure(failure: Any) -> str:
    """A failure as the notebook shows it (its message names the mesh already)."""
    return f"monarch: {failure.message}\n"


__all__ = ["Router", "format_failure"]
