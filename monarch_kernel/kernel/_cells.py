"""``%%mesh``: a cell run on ranks of a mesh (SPMD), its output shown live, one block
per rank (``--group-outputs order``: one stream of lines prefixed with their rank),
then each rank's value or the ranks' remote tracebacks."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from monarch_kernel import Shape, _origin, controller
from monarch_kernel.errors import ActorError, MonarchKernelError
from monarch_kernel.kernel._progress import Bar, answer_prompts, say_what_it_waits_for

#: Remote tracebacks shown in full when many ranks fail.
SHOW_TRACEBACKS = 3


class MeshCellError(MonarchKernelError):
    """Ranks raised in a ``%%mesh`` cell; shows their remote tracebacks."""

    def __init__(self, failures: list[tuple[int, ActorError]], total: int) -> None:
        self.failures = failures
        first = failures[0][1]
        exc = first.exception
        what = f"{type(exc).__name__}: {exc}" if exc is not None else first.message
        super().__init__(f"{len(failures)} of {total} ranks failed; rank {failures[0][0]}: {what}")

    def _render_traceback_(self) -> list[str]:
        lines = []
        for rank, err in self.failures[:SHOW_TRACEBACKS]:
            lines.append(f"--- rank {rank} ---")
            lines.extend(err.exception_formatted.rstrip("\n").splitlines())
        more = len(self.failures) - SHOW_TRACEBACKS
        if more > 0:
            ranks = ", ".join(str(r) for r, _ in self.failures[SHOW_TRACEBACKS:])
            lines.append(f"... and {more} more ranks failed the same way or otherwise (ranks {ranks})")
        lines.append(str(self))
        return lines


class MeshCellRun:
    """A ``%%mesh`` cell running on ranks: per-rank futures of the last value's repr."""

    def __init__(self, session: controller.Session, ranks: list[int], futures: list[Any]) -> None:
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
            out[r] = f.exception(left) or f.get()
        return out

    results = wait

    def cancel(self) -> None:
        controller.interrupt(self.futures)  # one interrupt for all ranks

    def follow(self, q: Any, origin: str, router: Any, group: str, timeout: float | None) -> None:
        """Shows the cell's output live until every rank is done, then its values (or
        raises ``MeshCellError`` with the ranks' tracebacks)."""
        run, session = self, self.session
        blocks = _Blocks(run.ranks, group)
        deadline = None if timeout is None else time.monotonic() + timeout
        started, bar, said = time.monotonic(), None, False
        try:
            while not run.done():
                blocks.drain(q)
                if bar is None and time.monotonic() - started > 1.0:
                    bar = Bar(len(run.ranks), f"%%mesh on {run.mesh}")
                if bar is not None:
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
                time.sleep(0.05)
        except KeyboardInterrupt:
            run.cancel()
            blocks.drain(q)
            raise
        finally:
            if bar is not None:
                bar.close()
        if q is not None:
            try:
                ranks = session.flush(origin, timeout=2.0)
                # Until the flush marks came: as long as output still arrives (a cell
                # that printed a lot), then at most 2 s more.
                quiet_since = until = time.monotonic()
                until += 60.0  # a task that prints on and on does not hold the cell forever
                while not router.wait_marks(origin, run.mesh, ranks, 0.1):
                    if blocks.drain(q):
                        quiet_since = time.monotonic()
                    if time.monotonic() - quiet_since > 2.0 or time.monotonic() > until:
                        break
            except (MonarchKernelError, TimeoutError):
                pass  # show what came; the results below are what matter
            blocks.drain(q)
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

    def __repr__(self) -> str:
        return f"<%%mesh run on {self.mesh!r} ranks {self.ranks}: {'done' if self.done() else 'running'}>"


def _parse_ranks(spec: str, n: int) -> list[int]:
    ranks: list[int] = []
    try:
        for part in spec.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                ranks.extend(range(int(lo), int(hi) + 1))
            elif part:
                ranks.append(int(part))
    except ValueError:
        raise UsageError(f"--ranks {spec!r}: give ranks like 0,2-3") from None
    bad = [r for r in ranks if not 0 <= r < n]
    if bad or not ranks:
        raise UsageError(f"--ranks {spec!r}: the mesh has ranks 0 to {n - 1}")
    return sorted(set(ranks))


def select_ranks(session: controller.Session, ranks: str | None, slice_: str | None) -> list[int]:
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
    session: controller.Session,
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
    # Named by its content, as ipykernel names cells: one name per source, so a
    # function from an earlier cell keeps its own lines in tracebacks and pdb.
    filename = f"<%%mesh cell {hashlib.sha1(cell.encode()).hexdigest()[:8]}>"
    try:
        run = MeshCellRun(session, ranks, controller.run_cell(session, ranks, cell, filename))
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

    An update sends the whole block again, so a rank's block that reaches
    ``BLOCK_CHARS`` is left as it is and its output goes on in a new block
    ("[rank R] (continued)"): what a cell sends stays proportional to what it prints,
    and every line is kept."""

    BLOCK_CHARS = 16 * 1024

    def __init__(self, ranks: list[int], group: str) -> None:
        self.group = group
        self.text: dict[int, list[str]] = {r: [] for r in ranks}
        self.size: dict[int, int] = {r: 0 for r in ranks}
        self.parts: dict[int, int] = {r: 0 for r in ranks}  # blocks a rank has filled
        self.handles: dict[int, Any] = {}
        self.values: dict[int, str] = {}

    def drain(self, q: Any) -> int:
        """Shows what came on ``q``; how many lines that was."""
        if q is None:
            return 0
        changed: set[int] = set()
        count = 0
        while True:
            try:
                _mesh, rank, stream, text = q.get_nowait()
            except Exception:
                break
            count += 1
            if self.group == "order":
                print(f"[rank {rank}] {text}")
                continue
            if self.size.get(rank, 0) + len(text) > self.BLOCK_CHARS and self.text.get(rank):
                if rank in changed:
                    self._show(rank)  # the full block, as it stays
                    changed.discard(rank)
                self.handles.pop(rank, None)
                self.text[rank], self.size[rank] = [], 0
                self.parts[rank] = self.parts.get(rank, 0) + 1
            self.text.setdefault(rank, []).append(text)
            self.size[rank] = self.size.get(rank, 0) + len(text) + 1
            changed.add(rank)
        for r in sorted(changed):
            self._show(r)
        return count

    def _render(self, rank: int) -> _Text:
        body = "\n".join(self.text.get(rank, []))
        value = self.values.get(rank)
        if value is not None:
            body = f"{body}\n{value}" if body else value
        head = f"[rank {rank}]" + (" (continued)" if self.parts.get(rank) else "")
        return _Text(f"{head}\n{body}" if body else head)

    def _show(self, rank: int) -> None:
        h = self.handles.get(rank)
        if h is None:
            self.handles[rank] = display(self._render(rank), display_id=True)
        else:
            h.update(self._render(rank))

    def value(self, rank: int, value: str | None) -> None:
        if value is None:
            return
        self.values[rank] = f"Out: {value}"
        if self.group == "order":
            print(f"[rank {rank}] Out: {value}")
        else:
            self._show(rank)

    def finish(self) -> None:
        pass


class _Text:
    """A text block for display()."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


__all__ = ["MeshCellError", "MeshCellRun", "run_cell", "select_ranks"]
