"""``%mesh`` and ``%%mesh``: the notebook's handle on meshes.

Line magic, one subcommand each (``%mesh?`` shows this text):

    procs = %mesh up NAME [--procs N | --gpus N] [--env K=V ...] [--idle-timeout S]
                     [--torch-dist gloo|nccl|auto]
                     [--hosts H1,H2 [--ssh-args ARGS] | --slurm nodes=N,... | --k8s pods=N,...]
                     [--python PATH]
        Create the mesh NAME, or reattach to it if it runs; it becomes the default.
        --gpus N: one proc per GPU (on the CPU, with a warning, where there is none).
        --torch-dist: set up torch.distributed on every proc (a no-op if it is).
        --hosts: N procs on each of these hosts, started over ssh.
        --slurm: on nodes from SLURM: nodes=N[,partition=P][,time=T][,gpus_per_node=G].
        --k8s: on pods from Kubernetes: pods=N,image=I[,namespace=NS][,kubeconfig=PATH]
               (--gpus N asks each pod for N GPUs).
        --python: the interpreter on those hosts (default: this one's path).
    procs = %mesh attach NAME      Reattach to a running mesh (another kernel's, or
                                   this one's before a restart); it becomes the default.
    %mesh ls                       Running meshes.
    %mesh down NAME | --all        Stop meshes.
    %mesh use NAME                 The default mesh of %%mesh and the other subcommands.
    %mesh status [NAME]            Each proc's state.
    %mesh respawn [NAME]           Restart the dead ranks (and their actors); the
                                   ranks restarted. The Meshes panel's Respawn.
    %mesh logs [NAME] [--rank R] [-n N]
                                   The last N lines the workers printed (of each
                                   rank: in the order printed, labelled [rank N]).
    %mesh stacks [NAME] [--rank R] The Python stack of every thread of the workers,
                                   even while they are busy.
    %mesh debug [--rank R | --post-mortem R | [--ranks SPEC] --cmd COMMAND]
                                   Ranks waiting in pdb (breakpoint() in a call nobody
                                   waits for); attach to one; send one pdb command to
                                   many (--cmd c); or debug a rank's last exception.
    %mesh activate [NAME]          Run the torch code of the following cells on the
                                   mesh (distributed tensors), as inside
                                   ``with procs.activate():``, until
    %mesh deactivate               runs torch locally again.
    %mesh push NAME=EXPR ...       Evaluate EXPR here, set NAME in every worker's
                                   %%mesh namespace.
    values = %mesh pull NAME       NAME from every worker's namespace, as a ValueMesh.
    %mesh run [--mesh NAME] SCRIPT.py [ARGS ...] | -m MODULE [ARGS ...]
                                   Run a torchrun-style script on every proc (RANK,
                                   WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ... set); its
                                   output shows under each rank. Again after an edit,
                                   on the same procs (monarch_kernel.spmd).
    %mesh sync [--mesh NAME] [PATH ...] [--no-reload]
                                   Send the files of this folder (or PATHs) that
                                   changed to every host (once per host); the workers
                                   import from that copy and reload the modules that
                                   changed (ProcMesh.sync_workspace).

Cell magic: run the cell on every worker (SPMD), in its persistent namespace:

    %%mesh [NAME] [--ranks SPEC | --slice DIM=I] [--noblock]
           [--group-outputs auto|rank|order|merge] [--timeout S]

Output streams live, one block per rank up to 8 ranks (``rank``), beyond that each
line once with the ranks that printed it, ``[ranks 0-1023] loss 0.31`` (``merge``;
each rank's own output folded below when the cell ends); ``order``: one stream,
lines prefixed with their rank. The last expression's value is shown per rank.
If ranks raise, their remote tracebacks are shown (the first few in full).
``--noblock`` returns at once; the run is in ``_mesh_run`` (``.wait()``,
``.results()``). The stop button interrupts the cell on every worker.
"""

from __future__ import annotations

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

from monarch_kernel import controller
from monarch_kernel.errors import MeshIndexError, MeshNotFoundError, MeshSpecError
from monarch_kernel.kernel._cells import run_cell, select_ranks

_HELP = __doc__
_SUBCOMMANDS = (
    "up, attach, ls, down, use, status, respawn, logs, stacks, debug, activate, deactivate, "
    "push, pull, run, sync"
)


@magics_class
class MeshMagics(Magics):
    """``%mesh`` and ``%%mesh`` (see the module docstring)."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.default: str | None = None
        #: ``%mesh activate``: the mesh whose activation spans cells, and its context.
        self.active: tuple[str, Any] | None = None

    # -- helpers -----------------------------------------------------------------------

    def _session(self, name: str | None) -> controller.MeshSession:
        """This kernel's session of mesh ``name`` (or of the default)."""
        name = name or self.default
        if name is None:
            raise UsageError(
                "no mesh selected: bring one up with  %mesh up NAME --procs N  or  %mesh use NAME"
            )
        s = controller.session(name)
        if s is None:
            raise UsageError(f"this kernel does not control mesh {name!r}: run  %mesh attach {name}  first")
        return s

    def _procs(self, name: str | None) -> Any:
        """The ProcMesh of ``name`` (or the default) that this kernel controls."""
        return self._session(name).procs()

    # -- %mesh -------------------------------------------------------------------------

    @line_magic
    def mesh(self, line: str) -> Any:
        """Manage meshes; see the module docstring (``%mesh?``)."""
        try:
            words = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%mesh: {e}") from None
        if not words:
            raise UsageError(f"%mesh needs a subcommand: {_SUBCOMMANDS}")
        sub, rest = words[0], line.split(None, 1)[1] if len(words) > 1 else ""
        fn = getattr(self, f"_mesh_{sub}", None)
        if fn is None:
            raise UsageError(f"%mesh {sub}: unknown subcommand; use one of {_SUBCOMMANDS}")
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
    @argument("--hosts", metavar="H1,H2", help="hosts to run on, reached over ssh (one agent each)")
    @argument(
        "--ssh-args", metavar="ARGS", help="ssh options before each host, e.g. '-F ~/cluster_ssh_config'"
    )
    @argument(
        "--slurm",
        metavar="K=V,...",
        help="nodes from SLURM: nodes=N[,partition=P][,time=T][,gpus_per_node=G]",
    )
    @argument(
        "--k8s",
        metavar="K=V,...",
        help="pods from Kubernetes: pods=N,image=I[,namespace=NS][,kubeconfig=PATH]",
    )
    @argument("--python", metavar="PATH", help="the Python of the agents and workers on those hosts")
    def _mesh_up(self, rest: str) -> Any:
        """Create the mesh NAME, or reattach to it."""
        args = parse_argstring(self._mesh_up, rest)
        if args.procs is not None and args.gpus is not None:
            raise UsageError("%mesh up: give --procs N or --gpus N, not both")
        env = {}
        for kv in args.env:
            if "=" not in kv:
                raise UsageError(f"%mesh up: --env {kv!r} must be KEY=VALUE")
            k, v = kv.split("=", 1)
            env[k] = v
        if args.torch_dist is not None and args.torch_dist not in controller.TORCH_BACKENDS:
            raise UsageError(
                f"%mesh up: --torch-dist must be one of {', '.join(controller.TORCH_BACKENDS)}, not {args.torch_dist!r}"
            )
        if args.procs is None and args.gpus is None:
            try:
                procs = self._attach(args.name)
            except MeshNotFoundError:
                raise UsageError(
                    f"%mesh up {args.name}: no such mesh is running; give its size: --procs N (or --gpus N)"
                ) from None
            print(self._attached_line(args.name, procs))
            _show(procs)  # (as a new mesh's: the live inspector)
            return _torch_dist(procs, args.torch_dist)
        per_host = {"gpus": args.gpus} if args.gpus is not None else {"procs": args.procs}
        if min(per_host.values()) < 1:
            raise UsageError("%mesh up: --procs / --gpus must be at least 1")
        existed = controller.session(args.name) is not None
        t = time.perf_counter()
        hosts = _host_mesh(args, per_host)
        try:
            procs = hosts.spawn_procs(
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
        n = len(procs.status())
        verb = "using" if existed else "up"
        print(
            f"mesh {args.name!r} {verb}: {n} procs {per_host} ({time.perf_counter() - t:.2f} s); default for %%mesh"
        )
        _show(procs)
        return _torch_dist(procs, args.torch_dist)

    def _attach(self, name: str) -> Any:
        procs = controller.attach(name)
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
        print(self._attached_line(args.name, procs))
        return procs

    def _attached_line(self, name: str, procs: Any) -> str:
        """What a reattach says: the mesh, its epoch, its procs' states, its actors."""
        s = self._session(name)
        actors = ", ".join(a for a in s.records if not a.startswith("__")) or "none"
        return f"attached to mesh {name!r} (epoch {s.epoch}), {controller.states_count(procs.status())}; actor meshes: {actors}"

    def _mesh_ls(self, rest: str) -> None:
        """List running meshes."""
        if rest.strip():
            raise UsageError("%mesh ls takes no arguments")
        for line in controller.mesh_table():
            print(line)

    @magic_arguments()
    @argument("names", nargs="*")
    @argument("--all", action="store_true", help="this kernel's meshes and those nobody is attached to")
    @argument("--force", action="store_true", help="with --all: also meshes other controllers use")
    def _mesh_down(self, rest: str) -> None:
        """Stop meshes."""
        args = parse_argstring(self._mesh_down, rest)
        if args.all == bool(args.names):
            raise UsageError("%mesh down NAME ... | --all [--force]")
        keep: list[tuple[str, str]] = []
        names = args.names
        if args.all:
            names, keep = controller.plan_down_all(args.force)
        missing = []
        for ok, text in controller.down(names):
            if ok:
                print(text)
            else:
                missing.append(text)
        for line in controller.left_running(keep):
            print(line)
        if args.all or self.default in args.names:
            self.default = None
        if missing:
            raise UsageError("%mesh down: " + "; ".join(missing))

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
    def _mesh_activate(self, rest: str) -> None:
        """Activate a mesh for the following cells (until %mesh deactivate)."""
        args = parse_argstring(self._mesh_activate, rest)
        procs = self._procs(args.name)
        if self.active is not None:
            self._mesh_deactivate("")
        ctx = procs.activate()
        ctx.__enter__()
        self.active = (procs.name, ctx)
        print(
            f"mesh {procs.name!r} is active: torch code runs on its {len(procs)} procs until %mesh deactivate"
        )

    @magic_arguments()
    def _mesh_deactivate(self, rest: str) -> None:
        """Run torch locally again."""
        parse_argstring(self._mesh_deactivate, rest)
        if self.active is None:
            raise UsageError("%mesh deactivate: no mesh is active (%mesh activate NAME activates one)")
        name, ctx = self.active
        self.active = None
        ctx.__exit__(None, None, None)
        print(f"mesh {name!r} is no longer active: torch runs locally")

    @magic_arguments()
    @argument("name", nargs="?")
    def _mesh_status(self, rest: str) -> Any:
        """Each proc's state."""
        args = parse_argstring(self._mesh_status, rest)
        s = self._session(args.name)
        procs = s.procs()
        rows = procs.proc_rows()
        print(controller.status_text(f"mesh {s.name!r} (epoch {s.epoch})", rows))
        _show(procs)
        return None

    @magic_arguments()
    @argument("--mesh", metavar="NAME", help="the mesh (default: the default mesh)")
    @argument("--no-reload", action="store_true", help="do not reload the modules that changed")
    @argument("paths", nargs="*", help="folders to send (default: the working directory)")
    def _mesh_sync(self, rest: str) -> Any:
        """Send the changed local files to every host of the mesh; reload what changed."""
        args = parse_argstring(self._mesh_sync, rest)
        procs = self._session(args.mesh).procs()
        paths = [_unquote(p) for p in args.paths] or None
        result = procs.sync_workspace(paths, auto_reload=not args.no_reload).get()
        print(f"mesh {procs.name!r}: {result!r}")
        return None

    @magic_arguments()
    @argument("name", nargs="?")
    def _mesh_respawn(self, rest: str) -> list[int]:
        """Restart the dead ranks of the mesh; the ranks restarted."""
        args = parse_argstring(self._mesh_respawn, rest)
        s = self._session(args.name)
        ranks = s.procs().respawn()
        print(f"mesh {s.name!r}: " + (f"restarted rank(s) {ranks}" if ranks else "no rank is dead"))
        return ranks

    @magic_arguments()
    @argument("name", nargs="?")
    @argument("--rank", type=int)
    @argument("-n", type=int, default=20)
    def _mesh_logs(self, rest: str) -> None:
        """The last lines the workers printed."""
        args = parse_argstring(self._mesh_logs, rest)
        try:
            lines = self._procs(args.name).logs(rank=args.rank, tail=args.n, labelled=args.rank is None)
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
        s = self._session(args.name)
        n = s.nprocs
        ranks = [args.rank] if args.rank is not None else list(range(n))
        if any(not 0 <= r < n for r in ranks):
            raise UsageError(f"%mesh stacks --rank: the mesh has ranks 0 to {n - 1}")
        for r, text in zip(ranks, s.stacks(ranks)):
            print(f"=== rank {r} ===")
            print(text)

    @magic_arguments()
    @argument("name", nargs="?")
    @argument("--rank", type=int, help="attach to the debugger waiting on this rank")
    @argument("--ranks", help="with COMMAND: only these ranks, e.g. 0,2-3 (default: every waiting rank)")
    @argument("--post-mortem", type=int, metavar="RANK", help="debug the last exception of RANK")
    @argument("--cmd", nargs="+", metavar="COMMAND", help="a pdb command for every waiting rank (e.g. c)")
    def _mesh_debug(self, rest: str) -> None:
        """List ranks waiting in pdb; attach to one; send one pdb command to many
        (``--cmd c``, with ``--ranks``: Monarch's ``cast``); or debug a rank's last
        exception."""
        args = parse_argstring(self._mesh_debug, rest)
        router = getattr(getattr(self.shell, "kernel", None), "router", None)
        if args.post_mortem is not None:
            try:
                pending = self._session(args.name).post_mortem(args.post_mortem)
            except MeshIndexError as e:
                raise UsageError(f"%mesh debug --post-mortem: {e}") from None
            pending.get()
            return
        if router is None:
            raise UsageError("%mesh debug needs the monarch kernel")
        if args.cmd:
            ranks = None
            if args.ranks is not None:
                try:
                    ranks = controller.parse_ranks(args.ranks, self._session(args.name).nprocs)
                except MeshSpecError as e:
                    raise UsageError(f"%mesh debug --ranks: {e}") from None
            sent = router.cast(args.name or self.default, ranks, " ".join(args.cmd))
            if not sent:
                print("no rank took it: none of them waits in pdb")
            for mesh, rank in sent:
                print(f"[{mesh} {rank}] {' '.join(args.cmd)}")
            return
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
        controller.spmd_actors(self._session(None)).push.call(values).get()
        print(f"pushed {', '.join(values)} to every rank of {self.default!r}")

    @magic_arguments()
    @argument("name")
    def _mesh_pull(self, rest: str) -> Any:
        """NAME from every worker's namespace, as a ValueMesh."""
        args = parse_argstring(self._mesh_pull, rest)
        return controller.spmd_actors(self._session(None)).pull.call(args.name).get()

    def _mesh_run(self, rest: str) -> None:
        """A torchrun-style script on every proc of the mesh (``run_spmd``)."""
        usage = (
            "%mesh run [--mesh NAME] SCRIPT.py [ARGS ...]  or  %mesh run [--mesh NAME] -m MODULE [ARGS ...]"
        )
        words, name = shlex.split(rest), None
        if words[:1] == ["--mesh"]:
            if len(words) < 2:
                raise UsageError(f"--mesh needs a name: {usage}")
            name, words = words[1], words[2:]
        if not words or (words[0] == "-m" and len(words) < 2):
            raise UsageError(f"%mesh run needs a script or a module: {usage}")
        from monarch_kernel.spmd import run_spmd

        run_spmd(self._procs(name), words).get()

    # -- %%mesh ------------------------------------------------------------------------

    @magic_arguments()
    @argument("name", nargs="?", help="the mesh (default: the one %%mesh up/use/attach chose)")
    @argument("--ranks", help="only these ranks, e.g. 0,2-3")
    @argument("--slice", help="only DIM=I, e.g. procs=1")
    @argument("--noblock", action="store_true", help="return at once; the run is in _mesh_run")
    @argument("--group-outputs", choices=["auto", "rank", "order", "merge"], default="auto")
    @argument("--timeout", type=float, help="seconds before the cell is interrupted on the workers")
    @cell_magic("mesh")  # type: ignore[arg-type]
    def mesh_cell(self, line: str, cell: str) -> Any:
        """Run the cell on every selected worker (see ``%mesh?``)."""
        args = parse_argstring(self.mesh_cell, line)
        session = self._session(args.name)
        ranks = select_ranks(session, args.ranks, args.slice)
        controller.spmd_actors(session)  # spawned on first use (before the cell's clock starts)
        return run_cell(self.shell, session, ranks, cell, args.noblock, args.group_outputs, args.timeout)


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


def _unquote(value: str) -> str:
    """A magic's option value without the quotes IPython keeps (``--ssh-args "-F x"``)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _host_mesh(args: Any, per_host: dict[str, int]) -> Any:
    """The hosts ``%mesh up`` runs on: this one, ssh hosts (``--hosts``), SLURM nodes
    (``--slurm``) or Kubernetes pods (``--k8s``)."""
    from monarch_kernel.job import KubernetesJob, SlurmJob, SSHJob

    if sum(map(bool, (args.hosts, args.slurm, args.k8s))) > 1:
        raise UsageError("%mesh up: give one of --hosts, --slurm and --k8s")
    if args.k8s:
        opts = _options("--k8s", args.k8s, ("pods", "image", "namespace", "kubeconfig"))
        if not opts.get("pods", "").isdigit() or int(opts["pods"]) < 1 or not opts.get("image"):
            raise UsageError("%mesh up: --k8s needs pods=N (a positive number) and image=IMAGE")
        k8s = KubernetesJob(
            namespace=opts.get("namespace", "default"),
            kubeconfig=opts.get("kubeconfig"),
            meshes={"hosts": int(opts["pods"])},
            image=opts["image"],
            gpus_per_pod=per_host.get("gpus"),
            python=_unquote(args.python) if args.python else "python",
        )
        return k8s.state(cached_path=None).hosts
    if args.hosts:
        targets = [h for h in args.hosts.split(",") if h]
        ssh_args = shlex.split(_unquote(args.ssh_args or ""))
        return (
            SSHJob(hosts=targets, python=_unquote(args.python) if args.python else None, ssh_args=ssh_args)
            .state(cached_path=None)
            .hosts
        )
    if args.slurm:
        opts = _options("--slurm", args.slurm, ("nodes", "partition", "time", "gpus_per_node"))
        if not opts.get("nodes", "").isdigit() or int(opts["nodes"]) < 1:
            raise UsageError("%mesh up: --slurm needs nodes=N (a positive number)")
        gpus = opts.get("gpus_per_node") or (str(per_host["gpus"]) if "gpus" in per_host else None)
        job = SlurmJob(
            meshes={"hosts": int(opts["nodes"])},
            python=_unquote(args.python) if args.python else None,
            partition=opts.get("partition"),
            time_limit=opts.get("time"),
            gpus_per_node=int(gpus) if gpus else None,
        )
        return job.state(cached_path=None).hosts
    return controller.this_host()


def _options(flag: str, text: str, known: tuple[str, ...]) -> dict[str, str]:
    """``k=v,k=v`` of ``%mesh up FLAG``, each key one of ``known``."""
    opts = {}
    for kv in _unquote(text).split(","):
        k, eq, v = kv.partition("=")
        if not eq or k not in known:
            keys = ", ".join(f"{k}=..." for k in known)
            raise UsageError(f"%mesh up: {flag} {kv!r}: use {keys}, comma-separated")
        opts[k] = v
    return opts


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


__all__ = ["MeshMagics"]
