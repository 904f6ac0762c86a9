"""The command line of the test cluster: ``python -m tools.testcluster
up|run|down|status`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from tools.testcluster._cluster import Cluster
from tools.testcluster._netns import pids_in
from tools.testcluster._programs import ClusterError, tool
from tools.testcluster._registry import REGISTRY, alive, records

#: How to run this command line again, for the hints ``up`` prints.
ME = f"{sys.executable} -m tools.testcluster"


def _only(name: str | None) -> Cluster:
    """The cluster ``name``, or without one the only recorded cluster."""
    if name:
        return Cluster.load(name)
    names = [r["name"] for r in records()]
    if len(names) != 1:
        raise ClusterError(f"clusters recorded: {', '.join(names) or 'none'}; name one")
    return Cluster.load(names[0])


def _cli_up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    c = Cluster.up(args.hosts, slurm=args.slurm, ssh=args.ssh, name=args.name, keep=True)
    hosts = ", ".join(f"{h.name} {h.addr}" for h in [c.login, *c.hosts])
    print(f"cluster {c.name} up in {time.monotonic() - started:.1f} s: {hosts}; folder {c.dir}")
    if args.ssh:
        print(f"  {ME} run --name {c.name} -- ssh -F {c.ssh_config} h1 hostname")
    if args.slurm:
        print(f"  {ME} run --name {c.name} -- srun -N{len(c.hosts)} hostname")
    print(f"  {ME} down {c.name}")
    return 0


def _cli_run(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return _only(args.name).run_in_login(argv or ["sh"]).returncode


def _cli_down(args: argparse.Namespace) -> int:
    for name in [r["name"] for r in records()] if args.all else args.names or [_only(None).name]:
        Cluster.load(name).down()
        print(f"cluster {name} removed")
    return 0


def _cli_status(args: argparse.Namespace) -> int:
    present = subprocess.run([tool("ip"), "netns", "list"], capture_output=True, text=True).stdout.split()
    recorded = records()
    if not recorded:
        print(f"no cluster is recorded in {REGISTRY}")
    for r in recorded:
        owner = "kept until down" if r["owner"] is None else f"owner pid {r['owner'][0]}"
        stale = " (gone: stale)" if r["owner"] is not None and not alive(r["owner"]) else ""
        made = [ns for ns in r["namespaces"] if ns in present]
        print(
            f"{r['name']}: login + {r['hosts']} hosts on 10.250.{r['index']}.0/24, {owner}{stale}, "
            f"{len(made)}/{len(r['namespaces'])} namespaces, {len(pids_in(made))} processes, folder {REGISTRY / r['name']}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line (see the package's docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.testcluster", description="A test cluster of hosts in network namespaces."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make a cluster that stays until `down`")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--no-slurm", dest="slurm", action="store_false")
    up.add_argument("--no-ssh", dest="ssh", action="store_false")
    up.add_argument("--name")
    run = sub.add_parser("run", help="run a command (default: sh) in a cluster's login host")
    run.add_argument("--name")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    down = sub.add_parser("down", help="remove clusters (default: the only one)")
    down.add_argument("names", nargs="*")
    down.add_argument("--all", action="store_true", help="every recorded cluster")
    sub.add_parser("status", help="list the recorded clusters")
    args = parser.parse_args(argv)
    command = {"up": _cli_up, "run": _cli_run, "down": _cli_down, "status": _cli_status}[args.command]
    try:
        return command(args)
    except ClusterError as e:
        print(f"testcluster: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
