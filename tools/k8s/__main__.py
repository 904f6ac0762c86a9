"""``python -m tools.k8s up [--pods N] [--name NAME]``: a k8s test bed that stays until
``python -m tools.testcluster down NAME`` (building its binaries first if needed)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from tools.k8s._bed import BUILD, KubeBed, missing
from tools.testcluster import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.k8s", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make a bed that stays until `python -m tools.testcluster down NAME`")
    up.add_argument("--pods", type=int, default=4, help="network namespaces for pods")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--name")
    args = parser.parse_args(argv)
    if missing():
        subprocess.run([str(BUILD)], check=True)
    started = time.monotonic()
    try:
        bed = KubeBed.up(args.pods, args.nodes, name=args.name, keep=True)
    except ClusterError as e:
        print(f"k8s bed: {e}", file=sys.stderr)
        return 1
    name = bed.cluster.name
    print(f"k8s bed {name} up in {time.monotonic() - started:.1f} s; kubeconfig {bed.kubeconfig}")
    print(f"  {sys.executable} -m tools.testcluster run --name {name} -- env KUBECONFIG={bed.kubeconfig} sh")
    print(f"  {sys.executable} -m tools.testcluster down {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
