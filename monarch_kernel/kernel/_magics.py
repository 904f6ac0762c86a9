"""``%mesh`` and ``%%mesh``: the notebook's handle on meshes.

Line magic, one subcommand each (``%mesh?`` shows this text):

    procs = %mesh up NAME [--procs N | --gpus N] [--env K=V ...] [--idle-timeout S]
                     [--torch-dist gloo|nccl|auto]
        Create the mesh NAME, or reattach to it if it runs; it becomes the default.
        --gpus N: one proc per GPU (on the CPU, with a warning, where there is none).
        --torch-dist: set up torch.distributed on every proc (a no-op if it is).
    procs = %mesh attach NAME      Reattach to a running mesh (another kernel's, or
                                   this one's before a restart); it becomes the default.
    %mesh ls                       Running meshes.
    %mesh down NAME | --all        Stop meshes.
    %mesh use NAME                 The default mesh of %%mesh and the other subcommands.
    %mesh status [NAME]            Each proc's state.
    %mesh logs [NAME] [--rank R] [-n N]
                                   The last N lines the workers printed.
    %mesh stacks [NAME] [--rank R] The Python stack of every thread of the workers,
                                   even while they are busy.
    %mesh debug [--rank R | --post-mortem R]
                                   Ranks waiting in pdb (breakpoint() in a call nobody
                                   waits for); attach to one; or debug a rank's last
                                   exception.
    %mesh push NAME=EXPR ...       Evaluate EXPR here, set NAME in every worker's
                                   %%mesh namespace.
    values = %mesh pull NAME       NAME from every worker's namespace, as a ValueMesh.

Cell magic: run the cell on every worker (SPMD), in its persistent namespace:

    %%mesh [NAME] [--ranks SPEC | --slice DIM=I] [--noblock]
           [--group-outputs rank|order] [--timeout S]

Output streams live, one block per rank (``--group-outputs order``: one stream,
lines prefixed with their rank). The last expression's value is shown per rank.
If ranks raise, their remote tracebacks are shown (the first few in full).
``--noblock`` returns at once; the run is in ``_mesh_run`` (``.wait()``,
``.results()``). The stop button interrupts the cell on every worker.
"""

from __future__ import annotations

import hashlib
import io
import keyword
import shlex
import time
import tokenize
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from monarch_kernel import _origin
from monarch_kernel.errors import ActorError, MeshNotFoundError, MeshSpecError, MonarchKernelError
from monarch_kernel.mesh._distributed import BACKENDS

_HELP = __doc__
CELLS_ACTOR = "__mesh_cells__"
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

    def __init__(self, mesh: str, ranks: list[int], futures: list[Any]) -> None:
        self.mesh = mesh
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
        from monarch_kernel.mesh._future import cancel_calls

        cancel_calls([c for f in self.futures for c in f._calls])  # one interrupt for all ranks

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


@magics_class
class MeshMagics(Magics):
    """``%mesh`` and ``%%mesh`` (see the module docstring)."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.default: str | None = None

    # -- helpers -----------------------------------------------------------------------

    def _procs(self, name: str | None) -> Any:
        """The ProcMesh of ``name`` (or the default) that this kernel controls."""
        from monarch_kernel.mesh._proc_mesh import ProcMesh
        from monarch_kernel.mesh._session import _sessions
        from monarch_kernel.mesh._shape import Shape

        name = name or self.default
        if name is None:
            raise UsageError(
                "no mesh selected: bring one up with  %mesh up NAME --procs N  or  %mesh use NAME"
            )
        s = _sessions.get(name)
        if s is None or s.closed:
            raise UsageError(f"this kernel does not control mesh {name!r}: run  %mesh attach {name}  first")
        return ProcMesh(s.ref, Shape.of(s.sizes))

    def _cells(self, procs: Any) -> Any:
        """The MeshCells actor mesh on ``procs``, spawned on first use."""
        from monarch_kernel.worker._spmd import MeshCells

        session = procs._session("%%mesh")
        if CELLS_ACTOR in session.records:
            return procs.actors[CELLS_ACTOR]
        return procs.spawn(CELLS_ACTOR, MeshCells)

    # -- %mesh -------------------------------------------------------------------------

    @line_magic
    def mesh(self, line: str) -> Any:
        """Manage meshes; see the module docstring (``%mesh?``)."""
        try:
            words = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%mesh: {e}") from None
        if not words:
            raise UsageError(
                "%mesh needs a subcommand: up, attach, ls, down, use, status, logs, stacks, debug, push, pull"
            )
        sub, rest = words[0], line.split(None, 1)[1] if len(words) > 1 else ""
        fn = getattr(self, f"_mesh_{sub}", None)
        if fn is None:
            raise UsageError(
                f"%mesh {sub}: unknown subcommand; use one of up, attach, ls, down, use, status, logs, stacks, debug, push, pull"
            )
        return fn(rest)

    mesh.__doc__ = _HELP

    @magic_arguments()
    @argument("name", help="the mesh's name")
    @argument("--procs", type=int, help="number of processes")
    @argument("--gpus", type=int, help="one process per GPU")
    @argument("--env", action="append", default=[], metavar="K=V", help="environment of the workers")
    @argument("--idle-timeout", type=float, help="seconds the mesh waits for a controller (default 24 h)")
    @argument(
        "--replace", action="store_true", help="stop a running mesh of this name with another size first"
    )
    @argument(
        "--torch-dist",
        metavar="BACKEND",
        help="set up torch.distributed on the procs: gloo, nccl or auto (nccl where they have GPUs)",
    )
    def _mesh_up(self, rest: str) -> Any:
        """Create the mesh NAME, or reattach to it."""
        from monarch_kernel import this_host
        from monarch_kernel.mesh._session import _sessions

        args = parse_argstring(self._mesh_up, rest)
        if args.procs is not None and args.gpus is not None:
            raise UsageError("%mesh up: give --procs N or --gpus N, not both")
        env = {}
        for kv in args.env:
            if "=" not in kv:
                raise UsageError(f"%mesh up: --env {kv!r} must be KEY=VALUE")
            k, v = kv.split("=", 1)
            env[k] = v
        if args.torch_dist is not None and args.torch_dist not in BACKENDS:
            raise UsageError(
                f"%mesh up: --torch-dist must be one of {', '.join(BACKENDS)}, not {args.torch_dist!r}"
            )
        if args.procs is None and args.gpus is None:
            try:
                procs = self._attach(args.name)
                print(f"attached to running mesh {args.name!r}")
                return _torch_dist(procs, args.torch_dist)
            except MeshNotFoundError:
                raise UsageError(
                    f"%mesh up {args.name}: no such mesh is running; give its size: --procs N (or --gpus N)"
                ) from None
        per_host = {"gpus": args.gpus} if args.gpus is not None else {"procs": args.procs}
        if min(per_host.values()) < 1:
            raise UsageError("%mesh up: --procs / --gpus must be at least 1")
        existed = args.name in _sessions
        t = time.perf_counter()
        try:
            procs = this_host().spawn_procs(
                per_host=per_host,
                name=args.name,
                env=env or None,
                idle_timeout=args.idle_timeout,
                replace=args.replace,
            )
        except MeshSpecError as e:
            raise UsageError(
                f"%mesh up {args.name}: {e}".replace("Pass replace=True", "Add --replace").replace(
                    f"attach({args.name!r})", f"%mesh up {args.name} (no size)"
                )
            ) from None
        self.default = args.name
        n = len(procs._proc.state().ref.addrs)
        verb = "using" if existed else "up"
        print(
            f"mesh {args.name!r} {verb}: {n} procs {per_host} ({time.perf_counter() - t:.2f} s); default for %%mesh"
        )
        _show(procs)
        return _torch_dist(procs, args.torch_dist)

    def _attach(self, name: str) -> Any:
        from monarch_kernel import attach

        procs = attach(name)
        self.default = name
        return procs

    @magic_arguments()
    @argument("name")
    def _mesh_attach(self, rest: str) -> Any:
        """Reattach to a running mesh."""
        args = parse_argstring(self._mesh_attach, rest)
        try:
            procs = self._attach(args.name)
        except MeshNotFoundError as e:
            raise UsageError(str(e)) from None
        s = procs._session("attach")
        actors = ", ".join(a for a in s.records if not a.startswith("__")) or "none"
        print(f"attached to mesh {args.name!r} (epoch {s.epoch}): {procs.status()}; actor meshes: {actors}")
        return procs

    def _mesh_ls(self, rest: str) -> None:
        """List running meshes."""
        from monarch_kernel.cli import main

        if rest.strip():
            raise UsageError("%mesh ls takes no arguments")
        main(["ls"])

    @magic_arguments()
    @argument("names", nargs="*")
    @argument("--all", action="store_true")
    def _mesh_down(self, rest: str) -> None:
        """Stop meshes."""
        from monarch_kernel.cli import main

        args = parse_argstring(self._mesh_down, rest)
        if args.all == bool(args.names):
            raise UsageError("%mesh down NAME ... | --all")
        main(["down", *(["--all"] if args.all else args.names)])
        if args.all or self.default in args.names:
            self.default = None

    @magic_arguments()
    @argument("name")
    def _mesh_use(self, rest: str) -> None:
        """Make NAME the default mesh."""
        args = parse_argstring(self._mesh_use, rest)
        self._procs(args.name)
        self.default = args.name
        print(f"default mesh: {args.name!r}")

    @magic_arguments()
    @argument("name", nargs="?")
    def _mesh_status(self, rest: str) -> Any:
        """Each proc's state."""
        args = parse_argstring(self._mesh_status, rest)
        procs = self._procs(args.name)
        s = procs._session("status")
        workers = {w["rank"]: w for w in s.client.list_workers()}
        states = procs.status()
        print(f"mesh {s.name!r} (epoch {s.epoch}), {len(states)} procs:")
        for r, st in enumerate(states):
            w = workers.get(r, {})
            print(f"  rank {r}: {st:<12} pid {w.get('pid', '?')}  restarts {w.get('restarts', 0)}")
        _show(procs)
        return None

    @magic_arguments()
    @argument("name", nargs="?")
    @argument("--rank", type=int)
    @argument("-n", type=int, default=20)
    def _mesh_logs(self, rest: str) -> None:
        """The last lines the workers printed."""
        args = parse_argstring(self._mesh_logs, rest)
        try:
            lines = self._procs(args.name).logs(rank=args.rank, tail=args.n)
        except (ValueError, IndexError) as e:
            raise UsageError(f"%mesh logs: {e}".replace("tail=", "-n ")) from None
        for line in lines:
            print(line)

    @magic_arguments()
    @argument("name", nargs="?")
    @argument("--rank", type=int)
    def _mesh_stacks(self, rest: str) -> None:
        """The current Python stack of every thread of every worker (or one rank)."""
        args = parse_argstring(self._mesh_stacks, rest)
        procs = self._procs(args.name)
        s = procs._session("stacks")
        n = len(s.state.ref.addrs)
        ranks = [args.rank] if args.rank is not None else list(range(n))
        if any(not 0 <= r < n for r in ranks):
            raise UsageError(f"%mesh stacks --rank: the mesh has ranks 0 to {n - 1}")
        for r, text in zip(ranks, s.stacks(ranks)):
            print(f"=== rank {r} ===")
            print(text)

    @magic_arguments()
    @argument("name", nargs="?")
    @argument("--rank", type=int, help="attach to the debugger waiting on this rank")
    @argument("--post-mortem", type=int, metavar="RANK", help="debug the last exception of RANK")
    def _mesh_debug(self, rest: str) -> None:
        """List ranks waiting in pdb; attach to one; or debug a rank's last exception."""
        from monarch_kernel.mesh._future import Future

        args = parse_argstring(self._mesh_debug, rest)
        router = getattr(getattr(self.shell, "kernel", None), "router", None)
        if args.post_mortem is not None:
            s = self._procs(args.name)._session("debug")
            call = s.post_mortem(args.post_mortem)
            Future(_calls=[call], _finish=lambda r: None).get()
            return
        if router is None:
            raise UsageError("%mesh debug needs the monarch kernel")
        parked = router.parked()
        if args.rank is None:
            if not parked:
                print("no rank is waiting in pdb")
            for mesh, rank in parked:
                print(f"[{mesh} {rank}] waiting in pdb; %mesh debug --rank {rank} attaches")
            return
        if all(r != args.rank for _m, r in parked):
            raise UsageError(
                f"%mesh debug: rank {args.rank} is not waiting in pdb (waiting: {parked or 'none'})"
            )
        router.attach(args.rank, input)

    def _mesh_push(self, rest: str) -> None:
        """%mesh push NAME=EXPR ...: evaluate here, set in every worker's namespace."""
        pairs = _assignments(rest)
        if not pairs:
            raise UsageError("%mesh push NAME=EXPR [NAME=EXPR ...] (EXPR is evaluated in this notebook)")
        values = {}
        for name, expr in pairs:
            values[name] = self.shell.ev(expr)  # type: ignore[union-attr]
        cells = self._cells(self._procs(None))
        cells.push.call(values).get()
        print(f"pushed {', '.join(values)} to every rank of {self.default!r}")

    @magic_arguments()
    @argument("name")
    def _mesh_pull(self, rest: str) -> Any:
        """NAME from every worker's namespace, as a ValueMesh."""
        args = parse_argstring(self._mesh_pull, rest)
        return self._cells(self._procs(None)).pull.call(args.name).get()

    # -- %%mesh ------------------------------------------------------------------------

    @magic_arguments()
    @argument("name", nargs="?", help="the mesh (default: the one %%mesh up/use/attach chose)")
    @argument("--ranks", help="only these ranks, e.g. 0,2-3")
    @argument("--slice", help="only DIM=I, e.g. procs=1")
    @argument("--noblock", action="store_true", help="return at once; the run is in _mesh_run")
    @argument("--group-outputs", choices=["rank", "order"], default="rank")
    @argument("--timeout", type=float, help="seconds before the cell is interrupted on the workers")
    @cell_magic("mesh")  # type: ignore[arg-type]
    def mesh_cell(self, line: str, cell: str) -> Any:
        """Run the cell on every selected worker (see ``%mesh?``)."""
        args = parse_argstring(self.mesh_cell, line)
        if args.ranks and args.slice:
            raise UsageError("%%mesh: give --ranks or --slice, not both")
        procs = self._procs(args.name)
        cells = self._cells(procs)
        n = len(procs._proc.state().ref.addrs)
        ranks = list(range(n))
        if args.ranks:
            ranks = _parse_ranks(args.ranks, n)
        elif args.slice:
            dim, _, idx = args.slice.partition("=")
            try:
                ranks = list(procs.slice(**{dim: int(idx)})._shape.ranks)
            except (ValueError, TypeError, IndexError) as e:
                raise UsageError(f"%%mesh --slice {args.slice!r}: {e}") from None
        dead = [r for r in ranks if procs.status()[r] != "alive"]
        if dead:
            raise UsageError(
                f"%%mesh: rank(s) {dead} of {procs.name!r} are not alive ({procs.status()}); run "
                "procs.respawn(), or pick live ranks with --ranks"
            )
        origin = _origin.current()
        kernel = getattr(self.shell, "kernel", None)
        router = getattr(kernel, "router", None)
        q = router.capture(origin) if router is not None and origin else None
        # Named by its content, as ipykernel names cells: one name per source, so a
        # function from an earlier cell keeps its own lines in tracebacks and pdb.
        filename = f"<%%mesh cell {hashlib.sha1(cell.encode()).hexdigest()[:8]}>"
        try:
            futures = [cells.slice(**_point(cells, r)).run.call_one(cell, filename) for r in ranks]
            run = MeshCellRun(procs.name, ranks, futures)
            if args.noblock:
                self.shell.user_ns["_mesh_run"] = run  # type: ignore[union-attr]
                print(f"running on ranks {ranks} of {procs.name!r}; _mesh_run.wait() for the results")
                return None
            return self._follow(run, q, procs, origin, router, args.group_outputs, args.timeout)
        finally:
            if router is not None and origin:
                router.release(origin)

    def _follow(
        self,
        run: MeshCellRun,
        q: Any,
        procs: Any,
        origin: str,
        router: Any,
        group: str,
        timeout: float | None,
    ) -> None:
        from monarch_kernel.kernel._progress import Bar, answer_prompts

        blocks = _Blocks(run.ranks, group)
        deadline = None if timeout is None else time.monotonic() + timeout
        started, bar = time.monotonic(), None
        try:
            while not run.done():
                blocks.drain(q)
                if bar is None and time.monotonic() - started > 1.0:
                    bar = Bar(len(run.ranks), f"%%mesh on {procs.name}")
                if bar is not None:
                    bar.update(sum(f.done() for f in run.futures))
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
                ranks = procs._session("%%mesh").flush(origin, timeout=2.0)
                # Until the flush marks came: as long as output still arrives (a cell
                # that printed a lot), then at most 2 s more.
                quiet_since = until = time.monotonic()
                until += 60.0  # a task that prints on and on does not hold the cell forever
                while not router.wait_marks(origin, procs.name, ranks, 0.1):
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


def _torch_dist(procs: Any, backend: str | None) -> Any:
    """``%mesh up --torch-dist BACKEND``: torch.distributed on ``procs``, said in a line."""
    if backend is not None:
        t = time.perf_counter()
        info = procs.setup_torch_distributed(backend)
        how = "set up" if info["new"] else "already set up"
        print(
            f"torch.distributed {how}: {info['backend']}, world size {info['world_size']}, "
            f"master {info['master']} ({time.perf_counter() - t:.2f} s)"
        )
    return procs


def _show(procs: Any) -> None:
    """Displays the live inspector of ``procs`` (its static table where widgets are
    not available)."""
    try:
        from monarch_kernel.kernel._inspector import MeshInspector

        display(MeshInspector(procs))
    except ImportError:
        display(procs)


def _assignments(text: str) -> list[tuple[str, str]]:
    """``a=1 b='x y' c={'k': [1, 2]}`` as [(name, expression source)]: a new pair
    starts at each ``NAME=`` outside brackets, so expressions keep their quotes,
    spaces and commas (Python's own tokenizer reads them)."""
    try:
        toks = [t for t in tokenize.generate_tokens(io.StringIO(text.strip()).readline)]
    except (tokenize.TokenError, SyntaxError) as e:
        raise UsageError(f"%mesh push: cannot read {text!r}: {e}") from None
    depth, starts, in_lambda = 0, [], False  # (start of NAME, end of "=", NAME)
    for i, t in enumerate(toks):
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
        elif depth == 0 and t.string == "lambda":
            in_lambda = True  # its parameters' defaults are not new pairs
        elif depth == 0 and in_lambda and t.type == tokenize.OP and t.string == ":":
            in_lambda = False
        elif t.type == tokenize.NAME and depth == 0 and not in_lambda and i + 1 < len(toks):
            nxt = toks[i + 1]
            if nxt.type == tokenize.OP and nxt.string == "=":
                starts.append((t.start[1], nxt.end[1], t.string))
    line = text.strip()
    if not starts or starts[0][0] != 0:
        return []
    pairs = []
    for k, (_begin, eq_end, name) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(line)
        expr = line[eq_end:end].strip().rstrip(",").strip()
        if not expr or keyword.iskeyword(name):
            raise UsageError(f"%mesh push: {name}= needs a value (NAME=EXPR)")
        pairs.append((name, expr))
    return pairs


def _point(cells: Any, rank: int) -> dict[str, int]:
    """The slice keywords that select proc ``rank`` of ``cells``' (whole) mesh."""
    from monarch_kernel.mesh._shape import Point

    return dict(Point(rank, cells._shape.extent))


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


__all__ = ["MeshCellError", "MeshCellRun", "MeshMagics"]
