"""The registry of clusters: REGISTRY/NAME.json records everything a cluster will
make (its namespaces and folders) before it is made, and who made it, so that
``teardown`` can remove a cluster from its record alone: also one whose creator
crashed (a stale one), and one half made."""

from __future__ import annotations

import fcntl
import json
import re
import shutil
from contextlib import suppress
from pathlib import Path
from typing import Any

from tools.testcluster._netns import delete_namespaces, kill, pids_in
from tools.testcluster._programs import ClusterError

REGISTRY = Path("/tmp/monarch-testclusters")
NAME = re.compile(r"[a-z][a-z0-9]{0,7}")  # short: namespace names are NAME-login


def cluster_dir(name: str) -> Path:
    """The folder of cluster ``name``: its configuration, keys and logs."""
    return REGISTRY / name


def munge_dir(name: str) -> Path:
    """munged's folder of cluster ``name`` (munged, as user munge, cannot enter the
    cluster's folder)."""
    return REGISTRY / f"{name}.munge"


def claim(hosts: int, name: str | None, owner: list[int] | None) -> dict[str, Any]:
    """Pick a free subnet index (and name), write the record of everything the cluster
    will make, make its folder; under the registry's lock."""
    if hosts < 1:
        raise ClusterError("a cluster needs at least one host")
    REGISTRY.mkdir(exist_ok=True)
    REGISTRY.chmod(0o755)  # munged refuses a socket below a folder others may write
    with open(REGISTRY / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = min(set(range(1, 255)) - {r["index"] for r in records()}, default=None)
        if index is None:
            raise ClusterError(f"254 clusters are recorded in {REGISTRY}")
        name = name or f"mkc{index}"
        if not NAME.fullmatch(name):
            raise ClusterError(f"cluster name {name!r}: a lower-case letter, then up to 7 letters or digits")
        if (REGISTRY / f"{name}.json").exists():
            raise ClusterError(
                f"a cluster {name!r} is recorded; `python -m tools.testcluster down {name}` removes it"
            )
        hostnames = ["login", *(f"h{i}" for i in range(1, hosts + 1))]
        record = {
            "name": name,
            "index": index,
            "hosts": hosts,
            "owner": owner,
            "namespaces": [f"{name}-net", *(f"{name}-{h}" for h in hostnames)],
            "paths": [
                str(cluster_dir(name)),
                str(munge_dir(name)),
                *(f"/etc/netns/{name}-{h}" for h in hostnames),
            ],
        }
        tmp = REGISTRY / f"{name}.json.tmp"  # not matched by records' glob
        tmp.write_text(json.dumps(record, indent=1))
        tmp.rename(REGISTRY / f"{name}.json")
    cluster_dir(name).mkdir(mode=0o700)
    return record


def records() -> list[dict[str, Any]]:
    """Every recorded cluster."""
    return [json.loads(p.read_text()) for p in sorted(REGISTRY.glob("*.json"))]


def read(name: str) -> dict[str, Any]:
    """The record of cluster ``name``."""
    try:
        return json.loads((REGISTRY / f"{name}.json").read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster {name!r} in {REGISTRY}") from None


def teardown(record: dict[str, Any]) -> None:
    """Remove what ``record`` lists: processes in its namespaces, the namespaces, its
    folders; the record last, so that an interrupted teardown can run again."""
    kill(lambda: pids_in(record["namespaces"]))
    delete_namespaces(record["namespaces"])
    for path in record["paths"]:
        shutil.rmtree(path, ignore_errors=True)
    with suppress(OSError):
        Path("/etc/netns").rmdir()  # only when no other namespace has files there
    (REGISTRY / f"{record['name']}.json").unlink(missing_ok=True)


def identity(pid: int) -> list[int] | None:
    """``[pid, start time]`` of a live process (a pair a reused pid does not match)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else [pid, int(fields[19])]


def alive(owner: list[int]) -> bool:
    """Whether the process ``owner`` (from :func:`identity`) still runs."""
    return identity(owner[0]) == owner


__all__ = [
    "NAME",
    "REGISTRY",
    "alive",
    "claim",
    "cluster_dir",
    "identity",
    "munge_dir",
    "read",
    "records",
    "teardown",
]
