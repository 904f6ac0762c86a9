"""``%%mesh``: a cell run on ranks of a mesh (SPMD), its output shown live, one block
per rank (``--group-outputs order``: one stream of lines prefixed with their rank;
``merge``, the default beyond ``BLOCKS_UP_TO`` ranks: each line once, with the ranks
that printed it), then each rank's value or the ranks' remote tracebacks. A client that
shows no display updated in place (``jupyter console``; CLIENTS-1) gets ``order``'s
stream for ``rank``, and ``merge``'s lines once, as the cell ends."""

from __future__ import annotations

import hashlib
import os
import queue
import time
import uuid
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display, update_display

from monarch_kernel import Shape, _origin, controller
from monarch_kernel._ranks import ranks_span
from monarch_kernel.controller import DisplayMessage
from monarch_kernel.errors import (
    FULL_TRACEBACK_ENV,
    ActorError,
    MeshSpecError,
    MonarchKernelError,
    SupervisionError,
)
from monarch_kernel.kernel._clients import updates_here
from monarch_kernel.kernel._progress import EVERY, Bar, answer_prompts, say_what_it_waits_for
from monarch_kernel.kernel._router import Captured, bridged

#: Remote tracebacks shown in full when many ranks fail.
SHOW_TRACEBACKS = 3
#: How long a cell waits for its ranks' end marks (CELL-1) after their replies.
MARKS_WAIT_S = 2.0
#: Put on a cell's queue when one of its calls ends.
_DONE = object()
#: ``--group-outputs auto``: one block per rank up to this many ranks, merged beyond.
BLOCKS_UP_TO = 8


def output_mode(group: str, nranks: int, live: bool = True) -> str:
    """The output mode of a cell on ``nranks`` ranks asked for ``group``, for a client
    that shows displays updated in place (``live``) or not (CLIENTS-1: one block per
    rank would show its first lines only; its lines go as ``order``'s stream)."""
    if group == "auto":
        group = "rank" if nranks <= BLOCKS_UP_TO else "merge"
    return "order" if group == "rank" and not live else group


class MeshCellError(MonarchKernelError):
    """Ranks raised in a ``%%mesh`` cell; shows their remote tracebacks (the first
    ``SHOW_TRACEBACKS``), as a cell's error and as its text (``print(e)`` of an error
    caught from ``run_cell_magic``, which is how a notebook shows one and runs on)."""

    def __init__(self, failures: list[tuple[int, ActorError]], total: int) -> None:
        self.failures = failures
        first = failures[0][1]
        exc = first.exception
        what = f"{type(exc).__name__}: {exc}" if exc is not None else first.message
        #: One line: how many ranks failed, and the first one's error.
        self.summary = f"{len(failures)} of {total} ranks failed; rank {failures[0][0]}: {what}"
        super().__init__(self.summary)

    def __str__(self) -> str:
        return "\n".join([self.summary, *self._tracebacks()])

    def _tracebacks(self) -> list[str]:
        lines = []
        for rank, err in self.failures[:SHOW_TRACEBACKS]:
            lines.append(f"--- rank {rank} ---")
            lines.extend(err.exception_formatted.rstrip("\n").splitlines())
        more = len(self.failures) - SHOW_TRACEBACKS
        if more > 0:
            ranks = ", ".join(str(r) for r, _ in self.failures[SHOW_TRACEBACKS:])
            lines.append(f"... and {more} more ranks failed the same way or otherwise (ranks {ranks})")
        return lines

    def _render_traceback_(self) -> list[str]:
        return [*self._tracebacks(), self.summary]


class MeshCellRun:
    """A ``%%mesh`` cell running on ranks: per-rank futures of the last value's repr."""

    def __init__(self, session: controller.MeshSession, ranks: list[int], futures: list[Any]) -> None:
        self.session = session
        self.mesh = session.name
        self.ranks = ranks
        self.futures = futures

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def wait(self, timeout: float | None = None) -> dict[int, Any]:
        """Waits; returns {rank: value repr or the exception}."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: dict[int, Any] = {}
        for r, f in zip(self.ranks, self.futures):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            value = f.exception(left) or f.get()
            if isinstance(value, dict):  # a value's bundle: its text, as before
                value = value.get("data", {}).get("text/plain")
            out[r] = value
        return out

    results = wait

    def cancel(self) -> None:
        controller.interrupt(self.futures)  # one interrupt for all ranks

    def interrupted(self) -> KeyboardInterrupt:
        """What an interrupted cell raises (after ``cancel``): one line naming the ranks
        and whether their code stopped, not a traceback through the kernel's code."""
        running = [r for r, f in zip(self.ranks, self.futures) if not f.done()]
        stopped = [r for r in self.ranks if r not in running]
        where = f"{_ranks_text(self.ranks)} of mesh {self.mesh!r}"
        if not running:
            what = "the remote code stopped"
        elif not stopped:
            what = "the remote code still runs (see above)"
        else:
            what = (
                f"the remote code stopped on {_ranks_text(stopped)} and still runs on {_ranks_text(running)}"
            )
        exc = KeyboardInterrupt(f"%%mesh cell interrupted on {where}; {what}")
        if os.environ.get(FULL_TRACEBACK_ENV) != "1":
            # (IPython asks the exception how to show itself; an attribute keeps the type
            # KeyboardInterrupt, which front ends and tools look for.)
            exc._render_traceback_ = lambda: [f"KeyboardInterrupt: {exc}"]  # type: ignore[attr-defined]
        return exc

    def follow(self, q: Any, origin: str, router: Any, group: str, timeout: float | None) -> None:
        """Shows the cell's output live until every rank is done, then its values (or
        raises ``MeshCellError`` with the ranks' tracebacks).

        Event driven: the wait wakes when a line arrives or a rank's call ends (its
        done callback puts ``_DONE`` on the same queue), never on a timer while the
        cell is quick; a second into the wait, the progress bar and the debugger
        prompts are looked at every ``Bar`` step."""
        run = self
        live = updates_here()  # CLIENTS-1
        mode = output_mode(group, len(run.ranks), live)
        kind = _Merged if mode == "merge" else _Blocks
        blocks = kind(run.ranks, mode, self.session.token, self.mesh, live)
        wake: Any = q if q is not None else queue.SimpleQueue()
        for f in run.futures:
            for c in f._calls:
                c.add_done_callback(lambda: wake.put(_DONE))
        deadline = None if timeout is None else time.monotonic() + timeout
        started, bar, said = time.monotonic(), None, False
        try:
            while not run.done():
                elapsed = time.monotonic() - started
                wait = 1.0 - elapsed if elapsed < 1.0 else EVERY
                if blocks.behind:  # lines to show: soon, batched
                    wait = min(wait, _Blocks.SHOW_EVERY_S)
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                try:
                    item = wake.get(timeout=max(wait, 0.0))
                except queue.Empty:
                    item = None
                if item is not None and item is not _DONE:
                    blocks.add(item)
                blocks.drain(q)
                if time.monotonic() - started < 1.0:
                    continue
                if bar is None:
                    bar = Bar(len(run.ranks), f"%%mesh on {run.mesh}", live)
                bar.update(sum(f.done() for f in run.futures))
                if not said and time.monotonic() - started > 2.0:
                    said = True
                    say_what_it_waits_for(controller.calls_of(run.futures))
                answer_prompts(drain=lambda: blocks.drain(q))
                if deadline is not None and time.monotonic() > deadline:
                    run.cancel()
                    raise TimeoutError(
                        f"%%mesh: the cell ran over {timeout} s; it was interrupted on the workers"
                    )
        except KeyboardInterrupt:
            run.cancel()
            blocks.drain(q, force=True)
            blocks.finish()  # (merged lines: shown however the cell ends)
            raise run.interrupted() from None
        except TimeoutError:
            blocks.drain(q, force=True)
            blocks.finish()
            raise
        finally:
            if bar is not None:
                bar.close()
        if q is not None:
            self._wait_output(q, origin, router, blocks)
        failures: list[tuple[int, ActorError]] = []
        for r, f in zip(run.ranks, run.futures):
            e = f.exception()
            if isinstance(e, ActorError):
                failures.append((r, e))
            elif e is not None:
                raise e
            else:
                blocks.value(r, f.get())
        blocks.finish()
        if failures:
            raise MeshCellError(failures, len(run.ranks))

    def _wait_output(self, q: Any, origin: str, router: Any, blocks: Any) -> None:
        """CELL-1: each rank that ran the cell wrote its end marks before replying;
        once they are here, so is everything it printed before. A rank whose marks do
        not come (its worker died) is asked to flush, as output of other threads may
        still be on its way; at most a few seconds, never a cell held forever."""
        answered = [
            r for r, f in zip(self.ranks, self.futures) if not isinstance(f.exception(), SupervisionError)
        ]
        if router.wait_marks(origin, self.mesh, answered, MARKS_WAIT_S, drain=lambda: blocks.drain(q)):
            blocks.drain(q, force=True)
            if set(answered) == set(range(self.session.nprocs)):
                _origin.touched.discard(self.mesh)  # all its output is in: no flush after the cell
            return
        try:
            ranks = self.session.flush(origin, timeout=2.0)
            router.wait_output(origin, self.mesh, ranks, quiet=2.0, limit=60.0, drain=lambda: blocks.drain(q))
        except (MonarchKernelError, TimeoutError):
            pass  # show what came; the results are what matter
        blocks.drain(q, force=True)

    def __repr__(self) -> str:
        return f"<%%mesh run on {self.mesh!r} ranks {self.ranks}: {'done' if self.done() else 'running'}>"


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _parse_ranks(spec: str, n: int) -> list[int]:
    try:
        return controller.parse_ranks(spec, n)
    except MeshSpecError as e:
        raise UsageError(f"--{e}") from None


def select_ranks(session: controller.MeshSession, ranks: str | None, slice_: str | None) -> list[int]:
    """The ranks ``--ranks SPEC`` or ``--slice DIM=I`` pick (every rank without them);
    each must be alive."""
    if ranks and slice_:
        raise UsageError("%%mesh: give --ranks or --slice, not both")
    n = session.nprocs
    picked = list(range(n))
    if ranks:
        picked = _parse_ranks(ranks, n)
    elif slice_:
        dim, _, idx = slice_.partition("=")
        try:
            picked = list(Shape.of(session.sizes).slice(**{dim: int(idx)}).ranks)
        except (ValueError, TypeError, IndexError) as e:
            raise UsageError(f"%%mesh --slice {slice_!r}: {e}") from None
    status = session.procs().status()
    dead = [r for r in picked if status[r] != "alive"]
    if dead:
        raise UsageError(
            f"%%mesh: rank(s) {dead} of {session.name!r} are not alive ({status}); run "
            "procs.respawn(), or pick live ranks with --ranks"
        )
    return picked


def run_cell(
    shell: Any,
    session: controller.MeshSession,
    ranks: list[int],
    cell: str,
    noblock: bool,
    group: str,
    timeout: float | None,
) -> None:
    """Runs ``cell`` on ``ranks`` and follows it (``noblock``: puts the run in
    ``_mesh_run`` and returns)."""
    origin = _origin.current()
    router = getattr(getattr(shell, "kernel", None), "router", None)
    q = router.capture(origin) if router is not None and origin else None
    # TB-1: named by the cell's execution count, as IPython names cells (``Cell In[n]``
    # in tracebacks), so a function from an earlier cell keeps its own cell and lines;
    # the source goes with an empty first line where the ``%%mesh`` line stands, so
    # line numbers are the editor's.
    count = getattr(getattr(shell, "kernel", None), "cell_number", None)
    tag = str(count) if isinstance(count, int) else hashlib.sha1(cell.encode()).hexdigest()[:8]
    filename = f"<%%mesh cell {tag}>"
    try:
        run = MeshCellRun(session, ranks, controller.run_cell(session, ranks, "\n" + cell, filename))
        if noblock:
            shell.user_ns["_mesh_run"] = run
            print(f"running on ranks {ranks} of {session.name!r}; _mesh_run.wait() for the results")
            return None
        return run.follow(q, origin, router, group, timeout)
    finally:
        if router is not None and origin:
            router.release(origin)


class _Blocks:
    """Live output of a ``%%mesh`` cell: one display per rank, updated in place, or
    (``order``) lines as they come, prefixed with their rank.

    An update sends the whole block again, so what a block costs is kept near what
    it holds (BLOCKS-1): while the cell runs, a block is shown again only while all
    its showings so far and this one come to at most ``RESEND`` times its size, plus
    ``ALLOW_BPS`` for each second it has been open (so a rank that prints slowly
    still sees each line soon, in long blocks). Lines that wait ``MAX_WAIT_S`` for
    that go on in a new block ("[rank R] (continued)"), and the old block stays as it
    was last shown; so does a block that reaches ``BLOCK_CHARS``. What a cell sends
    is then about what it prints, however few lines each tick of the kernel brings
    (a loaded machine wakes it for a few at a time), and every line is kept, once.

    Not ``live`` (CLIENTS-1: a client that shows each display once, as it comes), a
    worker's display update shows as a new display and nothing is cleared."""

    BLOCK_CHARS = 16 * 1024
    #: Blocks that change are shown again at most this often (and at the end).
    SHOW_EVERY_S = 0.05
    #: A block's showings cost at most this many times its size ...
    RESEND = 1.5
    #: ... plus this many characters per second since it opened.
    ALLOW_BPS = 2048
    #: Lines that waited this long for their block to be shown go on in a new one.
    MAX_WAIT_S = 1.0

    def __init__(
        self, ranks: list[int], group: str, token: str | None = None, mesh: str = "", live: bool = True
    ) -> None:
        self.group = group
        self.mesh = mesh
        #: Whether the client shows a display updated in place (CLIENTS-1).
        self.live = live
        #: The mesh's token: large display bundles are pulled with it (DISPLAY-1).
        self.token = token
        #: Kernel display ids of each rank's rich outputs, and its display ids by the
        #: worker's (``update_display``).
        self.rich: dict[int, list[str]] = {}
        self.ids: dict[tuple[int, str], str] = {}
        self.clear_on_next: set[int] = set()
        #: Each rank's earlier blocks (left as they were when rich output came between).
        self.past: dict[int, list[Any]] = {}
        self.text: dict[int, list[str]] = {r: [] for r in ranks}
        self.size: dict[int, int] = {r: 0 for r in ranks}
        self.parts: dict[int, int] = {r: 0 for r in ranks}  # blocks a rank has filled
        self.handles: dict[int, Any] = {}
        self.values: dict[int, str] = {}
        #: Ranks whose last line came with ``\r``: the next such line rewrites it.
        self.open_cr: dict[int, bool] = {}
        self._changed: set[int] = set()
        self._shown_at = 0.0
        #: BLOCKS-1, per rank's current block: the index of its first line not shown as
        #: it is now, when its oldest change came, when the block opened and what its
        #: showings cost so far (characters).
        self._dirty: dict[int, int] = {}
        self._waiting: dict[int, float] = {}
        self._opened: dict[int, float] = {}
        self._spent: dict[int, int] = {}

    def drain(self, q: Any, force: bool = False) -> int:
        """Takes what came on ``q`` and shows the blocks that changed, at most every
        ``SHOW_EVERY_S`` and as BLOCKS-1 allows (``force``: now and whole, as the cell
        ends: once per block); how many lines that was."""
        count = self._take(q)
        now = time.monotonic()
        if self._changed and (force or now - self._shown_at >= self.SHOW_EVERY_S):
            for r in sorted(self._changed):
                if force:
                    self._show(r)
                elif self._affordable(r, now) or now - self._waiting.get(r, now) >= self.MAX_WAIT_S:
                    self._settle(r, now)
            self._shown_at = now
        return count

    def _take(self, q: Any) -> int:
        """Adds every line waiting on ``q``; how many."""
        count = 0
        while q is not None:
            try:
                item = q.get_nowait()
            except Exception:
                break
            if item is not _DONE:
                self.add(item)
                count += 1
        return count

    @property
    def behind(self) -> bool:
        """Whether some block changed and is not shown yet."""
        return bool(self._changed)

    def _mark(self, rank: int, line: int | None = None) -> None:
        """The rank's block changed (from line ``line`` on, if lines changed)."""
        self._changed.add(rank)
        self._waiting.setdefault(rank, time.monotonic())
        if line is not None:
            self._dirty[rank] = min(self._dirty.get(rank, line), line)

    def _affordable(self, rank: int, now: float) -> bool:
        """BLOCKS-1: whether showing the rank's block again keeps it within its budget."""
        size = len(self._render(rank).text)
        age = now - self._opened.setdefault(rank, now)
        budget = self.RESEND * size + self.ALLOW_BPS * age
        return self._spent.get(rank, 0) + size <= budget

    def _settle(self, rank: int, now: float) -> None:
        """Shows what changed in the rank's block: the block again if BLOCKS-1 allows,
        else its unshown lines in a new block (the old one stays as it was shown)."""
        if rank in self.handles and rank in self._dirty and not self._affordable(rank, now):
            self._continue(rank)
        self._show(rank)

    def _continue(self, rank: int) -> None:
        """The rank's current block stays as it was last shown; the lines it has not
        shown (as they are now) open its next block."""
        lines = self.text.get(rank, [])
        moved = lines[self._dirty.get(rank, len(lines)) :]
        self._retire(rank)
        self._next_block(rank, moved)
        if moved:
            self._mark(rank, 0)

    def _next_block(self, rank: int, lines: list[str]) -> None:
        """The rank's lines from now on go in a new block, starting with ``lines``."""
        self.text[rank] = lines
        self.size[rank] = sum(len(t) + 1 for t in lines)
        self.parts[rank] = self.parts.get(rank, 0) + 1
        self._dirty.pop(rank, None)
        self._spent.pop(rank, None)
        if lines:
            self._opened[rank] = time.monotonic()
        else:
            self._opened.pop(rank, None)

    def add(self, item: Captured) -> None:
        """Takes one line of a rank (shown by the next ``drain``). A line with ``\r``
        is what a terminal would show of it: the text after its last ``\r``, and it
        rewrites the rank's last line if that one was such a line too (a progress bar
        updating in place)."""
        _mesh, rank, _stream, text = item
        if rank in self.clear_on_next:
            self.clear_on_next.discard(rank)
            self._clear(rank)
        if isinstance(text, DisplayMessage):
            self._display(rank, text)
            return
        rewrite = "\r" in text
        if rewrite:
            text = text.rsplit("\r", 1)[1] or text.rstrip("\r").rsplit("\r", 1)[-1]
        if self.group == "order":
            print(f"[rank {rank}] {text}")
            return
        lines = self.text.setdefault(rank, [])
        if rewrite and self.open_cr.get(rank) and lines:
            self.size[rank] -= len(lines[-1]) + 1
            lines[-1] = text
            self.size[rank] += len(text) + 1
            self._mark(rank, len(lines) - 1)
            return
        self.open_cr[rank] = rewrite
        if self.size.get(rank, 0) + len(text) > self.BLOCK_CHARS and lines:
            if rank not in self.handles or (
                rank in self._changed and self._affordable(rank, time.monotonic())
            ):
                self._show(rank)  # the whole block, as it stays
            self._continue(rank)
            lines = self.text[rank]
        self._opened.setdefault(rank, time.monotonic())
        lines.append(text)
        self.size[rank] = self.size.get(rank, 0) + len(text) + 1
        self._mark(rank, len(lines) - 1)

    def _render(self, rank: int) -> _Text:
        body = "\n".join(self.text.get(rank, []))
        value = self.values.get(rank)
        if value is not None:
            body = f"{body}\n{value}" if body else value
        head = f"[rank {rank}]" + (" (continued)" if self.parts.get(rank) else "")
        return _Text(f"{head}\n{body}" if body else head)

    def _show(self, rank: int) -> None:
        shown = self._render(rank)
        h = self.handles.get(rank)
        if h is None:
            self.handles[rank] = display(shown, display_id=True)
        else:
            h.update(shown)
        self._spent[rank] = self._spent.get(rank, 0) + len(shown.text)
        self._changed.discard(rank)
        self._dirty.pop(rank, None)
        self._waiting.pop(rank, None)

    def value(self, rank: int, value: Any) -> None:
        """A rank's cell value: a MIME bundle (DISPLAY-1), shown as IPython shows a
        value: in the rank's block as ``Out:`` when it is text only, else rich, after
        the block."""
        if value is None:
            return
        data = value.get("data", {}) if isinstance(value, dict) else {"text/plain": str(value)}
        if set(data) <= {"text/plain"}:
            text = str(data.get("text/plain", ""))
            self.values[rank] = f"Out: {text}"
            if self.group == "order":
                print(f"[rank {rank}] Out: {text}")
            else:
                self._show(rank)  # (once, as the cell ends)
            return
        body = {"data": data, "metadata": value.get("metadata", {})}
        self._rich_output(rank, DisplayMessage(self.mesh, rank, body))

    # -- rich output (DISPLAY-1) ------------------------------------------------------------

    def _display(self, rank: int, msg: DisplayMessage) -> None:
        """A display message from ``rank``: a bundle, an update of one, or a clear."""
        if msg.comm is not None:  # DISPLAY-2: a widget's model, bridged to the front end
            kernel = _kernel()
            if kernel is not None:
                kernel.send_bridged(kernel.get_parent("shell"), msg)
            return
        if msg.clear:
            if msg.wait:
                self.clear_on_next.add(rank)
            else:
                self._clear(rank)
            return
        self._rich_output(rank, msg)

    def _rich_output(self, rank: int, msg: DisplayMessage) -> None:
        """Shows a bundle as its own output, after what the rank printed before it;
        the rank's later lines go on in a new block."""
        wid = msg.display_id
        kid = self.ids.get((rank, wid)) if wid else None
        data, metadata = msg.data(bridged), msg.metadata
        if msg.update and (kid is None or self.live):
            if kid is not None:
                update_display(data, display_id=kid, metadata=metadata, raw=True)
            return
        if msg.update:  # CLIENTS-1: a client that shows no update gets the new state anew
            kid = None
        if self.group == "order":
            print(f"[rank {rank}]")
        else:
            if rank in self._changed or rank not in self.handles:
                self._settle(rank, time.monotonic())  # what came before, or the rank's label
            self._retire(rank)  # later lines: a block after this output
            self._next_block(rank, [])
        kid = kid or uuid.uuid4().hex
        if wid:
            self.ids[(rank, wid)] = kid
        display(data, raw=True, metadata=metadata, display_id=kid)
        self.rich.setdefault(rank, []).append(kid)

    def _retire(self, rank: int) -> None:
        """The rank's current block stays as it is; its next lines start a new one."""
        h = self.handles.pop(rank, None)
        if h is not None:
            self.past.setdefault(rank, []).append(h)

    def _clear_rich(self, rank: int) -> None:
        """Empties ``rank``'s rich outputs (where the client shows a display updated
        in place: CLIENTS-1) and forgets them."""
        for kid in self.rich.pop(rank, []):
            if self.live:
                update_display({"text/plain": ""}, display_id=kid, raw=True)

    def _clear(self, rank: int) -> None:
        """``clear_output()`` on ``rank``: its blocks and its rich outputs, only its
        (where the client shows a display updated in place: CLIENTS-1)."""
        self._clear_rich(rank)
        for h in self.past.pop(rank, []):
            h.update(_Text(""))
        self.text[rank], self.size[rank] = [], 0
        self.open_cr.pop(rank, None)
        self._dirty.pop(rank, None)
        if rank in self.handles:
            self._show(rank)

    def finish(self) -> None:
        pass


class _Merged(_Blocks):
    """``--group-outputs merge``: the cell's text output as one display, each line
    once with the ranks that printed it (``[ranks 0-1023] loss 0.31``), ordered by
    where it stands in its ranks' own output (then by arrival), so the merged lines
    read as one rank's would; a line a rank prints again is another line (its k-th
    copy is merged with the other ranks' k-th copies), and a line with ``\r`` replaces the
    rank's last such line, as a terminal shows it. Values merge the same way. When
    the cell ends, the display also holds each rank's own output, folded (HTML
    ``<details>``; plain-text clients get the merged lines). Rich outputs are shown
    as ``order`` shows them: the rank's label, then the output. Not ``live``
    (CLIENTS-1), the merged display is shown once, as the cell ends."""

    #: The merged display is shown again at most this often while the cell runs.
    MERGED_EVERY_S = 0.25

    def __init__(
        self, ranks: list[int], group: str, token: str | None = None, mesh: str = "", live: bool = True
    ) -> None:
        super().__init__(ranks, "order", token, mesh, live)  # (rich outputs: as ``order``)
        self.ranks = ranks
        #: Each distinct (text, copy) in the order it first came, with its ranks.
        self.merged: dict[tuple[str, int], set[int]] = {}
        #: Each merged line's earliest place in a rank's own output.
        self.place: dict[tuple[str, int], int] = {}
        self.copies: dict[tuple[int, str], int] = {}
        self.own: dict[int, list[str]] = {r: [] for r in ranks}
        self.last_cr: dict[int, tuple[str, int]] = {}
        self.handle: Any = None
        self.dirty = False
        self.merged_at = 0.0

    def add(self, item: Captured) -> None:
        _mesh, rank, _stream, text = item
        if isinstance(text, DisplayMessage):
            if rank in self.clear_on_next:
                self.clear_on_next.discard(rank)
                self._clear(rank)
            self._display(rank, text)
            return
        rewrite = "\r" in text
        if rewrite:
            text = text.rsplit("\r", 1)[1] or text.rstrip("\r").rsplit("\r", 1)[-1]
        own = self.own.setdefault(rank, [])
        if rewrite and rank in self.last_cr:
            self._drop(rank, self.last_cr.pop(rank))
            if own:
                own.pop()
        n = self.copies.get((rank, text), 0)
        self.copies[(rank, text)] = n + 1
        key = (text, n)
        self.merged.setdefault(key, set()).add(rank)
        self.place[key] = min(self.place.get(key, len(own)), len(own))
        own.append(text)
        if rewrite:
            self.last_cr[rank] = key
        else:
            self.last_cr.pop(rank, None)
        self.dirty = True

    def _drop(self, rank: int, key: tuple[str, int]) -> None:
        ranks = self.merged.get(key)
        if ranks is not None:
            ranks.discard(rank)
            if not ranks:
                del self.merged[key]
                self.place.pop(key, None)
        self.copies[(rank, key[0])] = key[1]

    def _clear(self, rank: int) -> None:
        """``clear_output()`` on ``rank``: its lines leave the merged display."""
        for key in [k for k, v in self.merged.items() if rank in v]:
            self._drop(rank, key)
        self.own[rank] = []
        self.last_cr.pop(rank, None)
        self._clear_rich(rank)
        self.dirty = True

    @property
    def behind(self) -> bool:
        return self.dirty and self.live

    def drain(self, q: Any, force: bool = False) -> int:
        count = self._take(q)
        now = time.monotonic()
        if self.live and self.dirty and (force or now - self.merged_at >= self.MERGED_EVERY_S):
            self._show_merged(final=False)
            self.merged_at = now
        return count

    def value(self, rank: int, value: Any) -> None:
        if value is None:
            return
        data = value.get("data", {}) if isinstance(value, dict) else {"text/plain": str(value)}
        if set(data) <= {"text/plain"}:
            self.values[rank] = f"Out: {data.get('text/plain', '')}"
            self.dirty = True
            return
        body = {"data": data, "metadata": value.get("metadata", {})}
        self._rich_output(rank, DisplayMessage(self.mesh, rank, body))

    def merged_text(self) -> str:
        """The merged lines, then the merged values."""
        order = sorted(enumerate(self.merged), key=lambda e: (self.place.get(e[1], 0), e[0]))
        lines = [f"[{ranks_span(self.merged[key])}] {key[0]}" for _i, key in order]
        by_value: dict[str, set[int]] = {}
        for rank, text in self.values.items():
            by_value.setdefault(text, set()).add(rank)
        lines += [f"[{ranks_span(ranks)}] {text}" for text, ranks in by_value.items()]
        return "\n".join(lines) or f"[{ranks_span(self.ranks)}] (no output)"

    def _show_merged(self, final: bool) -> None:
        import html

        text = self.merged_text()
        data = {"text/plain": text}
        if final:
            parts = [
                f"<b>[rank {r}]</b>\n"
                + html.escape("\n".join([*self.own.get(r, []), self.values.get(r, "")]))
                for r in self.ranks
            ]
            data["text/html"] = (
                f"<pre>{html.escape(text)}</pre><details><summary>each rank's output "
                f"({len(self.ranks)} ranks)</summary><pre>{chr(10).join(parts)}</pre></details>"
            )
        if self.handle is None:
            self.handle = uuid.uuid4().hex
            display(data, raw=True, display_id=self.handle)
        else:
            update_display(data, display_id=self.handle, raw=True)
        self.dirty = False

    def finish(self) -> None:
        self._show_merged(final=True)


def _kernel() -> Any:
    """The running monarch kernel (None outside one)."""
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None)


class _Text:
    """A text block for display()."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


__all__ = ["MeshCellError", "MeshCellRun", "run_cell", "select_ranks"]
