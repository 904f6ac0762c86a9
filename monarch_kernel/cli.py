"""The ``monarch-kernel`` command: ``ls`` and ``down`` for persistent meshes, and
``install`` for the Jupyter kernelspec.

``monarch-kernel ls`` lists the running meshes of this user (from their state files,
checked against their host agents); ``monarch-kernel down NAME...`` or ``--all``
stops meshes as an administrator, whichever controller holds them.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _ls(_args: argparse.Namespace) -> int:
    from monarch_kernel.mesh._session import list_meshes

    meshes = list_meshes()
    if not meshes:
        print("no running meshes")
        return 0
    rows = [("NAME", "PROCS", "ALIVE", "CONTROLLER", "EPOCH", "IDLE TIMEOUT", "AGE", "AGENT PID")]
    now = time.time()
    for m in meshes:
        idle = "ephemeral" if m.ephemeral else _age(m.idle_timeout)
        owner = "attached" if m.attached else "none"
        rows.append(
            (
                m.name,
                str(m.procs),
                str(m.alive),
                owner,
                str(m.owner_epoch),
                idle,
                _age(now - m.created),
                str(m.agent_pid),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def _down(args: argparse.Namespace) -> int:
    from monarch_kernel.mesh import _registry
    from monarch_kernel.mesh._session import stop_record

    if args.all == bool(args.names):
        print("monarch-kernel down: give mesh names, or --all (not both)", file=sys.stderr)
        return 2
    names = _registry.names() if args.all else args.names
    status = 0
    for name in names:
        rec = _registry.read(name)
        if rec is None:
            print(
                f"monarch-kernel down: no mesh named {name!r} is running (see monarch-kernel ls)",
                file=sys.stderr,
            )
            status = 1
            continue
        if stop_record(rec):
            print(f"stopped {name}")
        else:
            print(f"{name} was not running (its host agent was gone); removed its state file")
    return status


def _install(args: argparse.Namespace) -> int:
    from monarch_kernel.kernel._install import install

    if args.user and (args.sys_prefix or args.prefix):
        print("monarch-kernel install: give one of --user, --sys-prefix, --prefix", file=sys.stderr)
        return 2
    where = install(user=args.user, prefix=args.prefix)
    print(f"installed kernelspec 'monarch' (Python 3 (monarch mesh)) in {where}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monarch-kernel", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ls", help="list running meshes").set_defaults(run=_ls)
    down = sub.add_parser("down", help="stop meshes (as an administrator)")
    down.add_argument("names", nargs="*", metavar="NAME")
    down.add_argument("--all", action="store_true", help="stop every running mesh")
    down.set_defaults(run=_down)
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
