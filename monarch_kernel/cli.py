"""The ``monarch-kernel`` command: ``ls``, ``respawn`` and ``down`` for persistent
meshes, ``debug`` for ranks waiting in pdb, and ``install`` for the Jupyter
kernelspec.

``monarch-kernel ls`` lists the running meshes of this user (from their state files,
checked against their host agents); ``monarch-kernel respawn NAME`` restarts the
dead ranks of a mesh no controller holds; ``monarch-kernel down NAME...`` or
``--all`` stops meshes as an administrator, whichever controller holds them.
``monarch-kernel debug`` lists the ranks waiting in pdb (a ``breakpoint()`` in a
script's call); ``debug NAME --rank R`` debugs one from this terminal, and
``debug NAME --ranks 0-3 --cmd c`` sends one pdb command to many (DEBUG-3).
``monarch-kernel k8s-pool NAME --replicas N --image I`` prints the Kubernetes objects
of a pool of standing pods (``kubectl apply -f -``) that
``KubernetesJob(...).add_mesh(NAME, N)`` attaches meshes to.
"""

from __future__ import annotations

import argparse
import sys
import warnings


def _ls(_args: argparse.Namespace) -> int:
    from monarch_kernel.controller import mesh_table

    for line in mesh_table():
        print(line)
    return 0


def _down(args: argparse.Namespace) -> int:
    from monarch_kernel.controller import down, left_running, plan_down_all

    if args.all == bool(args.names):
        print("monarch-kernel down: give mesh names, or --all (not both)", file=sys.stderr)
        return 2
    names = args.names
    if args.all:
        names, keep = plan_down_all(args.force)
        for line in left_running(keep):
            print(line, file=sys.stderr)
        if names and not args.yes and not _confirm(f"stop {len(names)} meshes ({', '.join(names)})?"):
            print(
                f"monarch-kernel down --all: nothing stopped; it would stop {', '.join(names)}. "
                "Add --yes to stop them without asking.",
                file=sys.stderr,
            )
            return 2
    status = 0
    for ok, text in down(names):
        if ok:
            print(text)
        else:
            print(f"monarch-kernel down: {text}", file=sys.stderr)
            status = 1
    return status


def _respawn(args: argparse.Namespace) -> int:
    import json

    from monarch_kernel.controller import respawn
    from monarch_kernel.errors import MonarchKernelError

    try:
        ranks = respawn(args.name)
    except MonarchKernelError as e:
        if args.json:  # what failed, for a program (the server extension)
            print(json.dumps({"mesh": args.name, "error": str(e), "kind": type(e).__name__}))
        else:
            print(f"monarch-kernel respawn: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"mesh": args.name, "ranks": ranks}))
    else:
        print(f"{args.name}: " + (f"restarted rank(s) {ranks}" if ranks else "no rank is dead"))
    return 0


def _debug(args: argparse.Namespace) -> int:
    from monarch_kernel.controller import attach_debugger, cast_to_debuggers, mesh_size, parked, parse_ranks
    from monarch_kernel.errors import MonarchKernelError

    try:
        if args.rank is not None:
            attach_debugger(args.name, args.rank, input, print)
            return 0
        if args.cmd:
            if args.name is None:
                print("monarch-kernel debug: name the mesh to send a command to", file=sys.stderr)
                return 2
            ranks = None if args.ranks is None else parse_ranks(args.ranks, mesh_size(args.name))
            took = cast_to_debuggers(args.name, ranks, " ".join(args.cmd))
            print(f"{args.name}: sent to rank(s) {took}" if took else f"{args.name}: no rank took it")
            return 0 if took else 1
        waiting = parked(args.name)
    except MonarchKernelError as e:
        print(f"monarch-kernel debug: {e}", file=sys.stderr)
        return 1
    if not waiting:
        print("no rank is waiting in pdb")
    for mesh, rank, where in waiting:
        print(
            f"[{mesh} {rank}] waiting in pdb at {where}; monarch-kernel debug {mesh} --rank {rank} attaches"
        )
    return 0


def _confirm(question: str) -> bool:
    """Asks on a terminal; never where no one can answer (a script, CI)."""
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _install(args: argparse.Namespace) -> int:
    from monarch_kernel.kernel import install

    if args.user and (args.sys_prefix or args.prefix):
        print("monarch-kernel install: give one of --user, --sys-prefix, --prefix", file=sys.stderr)
        return 2
    where = install(user=args.user, prefix=args.prefix)
    print(f"installed kernelspec 'monarch' (Python 3 (monarch mesh)) in {where}")
    return 0


def _k8s_pool(args: argparse.Namespace) -> int:
    import json

    from monarch_kernel.hosts import pool_manifests

    items = pool_manifests(
        args.name, args.replicas, args.image, args.python, args.gpus, args.port, args.idle_timeout
    )
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monarch-kernel", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ls", help="list running meshes").set_defaults(run=_ls)
    respawn = sub.add_parser("respawn", help="restart the dead ranks of a mesh no controller holds")
    respawn.add_argument("name", metavar="NAME")
    respawn.add_argument(
        "--json", action="store_true", help="print the ranks restarted (or what failed) as JSON"
    )
    respawn.set_defaults(run=_respawn)
    down = sub.add_parser("down", help="stop meshes (as an administrator)")
    down.add_argument("names", nargs="*", metavar="NAME")
    down.add_argument(
        "--all",
        action="store_true",
        help="stop every running mesh nobody is attached to (asks first; --yes does not)",
    )
    down.add_argument("--force", action="store_true", help="with --all: also meshes a controller uses")
    down.add_argument("--yes", action="store_true", help="with --all: do not ask")
    down.set_defaults(run=_down)
    dbg = sub.add_parser("debug", help="ranks waiting in pdb: list them, debug one, or send them a command")
    dbg.add_argument("name", metavar="NAME", nargs="?", help="the mesh (default: every mesh)")
    dbg.add_argument(
        "--cmd", nargs="+", metavar="COMMAND", help="a pdb command for every waiting rank (e.g. c)"
    )
    dbg.add_argument("--rank", type=int, help="debug this rank from this terminal")
    dbg.add_argument("--ranks", help="with --cmd: only these ranks, e.g. 0,2-3 (default: every waiting rank)")
    dbg.set_defaults(run=_debug)
    pool = sub.add_parser(
        "k8s-pool",
        help="print a Secret and a StatefulSet of standing pods for meshes to attach to (kubectl apply -f -)",
    )
    pool.add_argument(
        "name", metavar="NAME", help="the pool: KubernetesJob(...).add_mesh(NAME, N) finds its pods"
    )
    pool.add_argument("--replicas", type=int, required=True, help="pods (hosts)")
    pool.add_argument("--image", required=True, help="an image with monarch-kernel installed")
    pool.add_argument("--gpus", type=int, help="GPUs of each pod (nvidia.com/gpu)")
    pool.add_argument("--python", default="python", help="the image's Python that has monarch-kernel")
    pool.add_argument("--port", type=int, default=26600, help="the port each pod's agent listens on")
    pool.add_argument(
        "--idle-timeout",
        type=float,
        default=24 * 3600.0,
        help="seconds an agent keeps a mesh nobody controls",
    )
    pool.set_defaults(run=_k8s_pool)
    inst = sub.add_parser("install", help="install the Jupyter kernelspec 'monarch'")
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (~/.local/share/jupyter)")
    where.add_argument("--sys-prefix", action="store_true", help="in this Python environment (the default)")
    where.add_argument("--prefix", help="under this prefix")
    inst.set_defaults(run=_install)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda msg, *a, **k: print(f"monarch-kernel: {msg}", file=sys.stderr)
        return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
