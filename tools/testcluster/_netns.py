"""The cluster's network: a namespace per host, joined by veth pairs to a bridge in
a namespace of its own; running a command in a host; the processes in namespaces,
and ending them.

Network rule: traffic goes only to loopback or to addresses inside the namespaces
made here. Each host's namespace has an address of 10.250.INDEX.0/24, its cluster's
own; nothing is added to the root namespace, no host has a route anywhere else, and
no link has IPv6."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from tools.testcluster._programs import run, tool

STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


@dataclass(frozen=True)
class Host:
    """One host of a cluster: its hostname, network namespace and address."""

    name: str
    ns: str
    addr: str


def make_network(bridge: str, hosts: list[Host]) -> None:
    """The bridge's namespace ``bridge``, and one per host joined to it by a veth pair;
    each host's /etc/hosts names them all."""
    new_namespace(bridge)
    ip("-n", bridge, "link", "add", "br0", "type", "bridge")
    ip("-n", bridge, "link", "set", "br0", "up")
    hosts_file = "".join(f"{h.addr}\t{h.name}\n" for h in hosts)
    for host in hosts:
        etc = Path("/etc/netns") / host.ns  # `ip netns exec` mounts these over /etc's files
        etc.mkdir(parents=True)
        (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{hosts_file}")
        new_namespace(host.ns)
        veth = ["link", "add", host.name, "type", "veth", "peer", "name", "eth0", "netns", host.ns]
        ip("-n", bridge, *veth)
        ip("-n", bridge, "link", "set", host.name, "master", "br0", "up")
        ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        ip("-n", host.ns, "link", "set", "eth0", "up")


def new_namespace(ns: str) -> None:
    """A network namespace with loopback up, whose links made later have no IPv6 (their
    link-local addresses would route to anything on the link)."""
    ip("netns", "add", ns)
    ip("-n", ns, "link", "set", "lo", "up")
    no_ipv6 = "f=/proc/sys/net/ipv6/conf/default/disable_ipv6; [ ! -e $f ] || echo 1 >$f"
    run([tool("ip"), "netns", "exec", ns, "sh", "-c", no_ipv6])


def in_host(host: Host, argv: list[str]) -> list[str]:
    """``argv`` made to run in ``host``'s namespace, with its hostname."""
    enter = [tool("ip"), "netns", "exec", host.ns, tool("unshare"), "--uts"]
    return [*enter, "sh", "-c", 'hostname "$0" && exec "$@"', host.name, *argv]


def pids_in(namespaces: list[str]) -> set[int]:
    """Pids of the live processes in these network namespaces (a missing one has none)."""
    pids: set[int] = set()
    for ns in namespaces:
        out = subprocess.run([tool("ip"), "netns", "pids", ns], capture_output=True, text=True).stdout
        pids.update(int(p) for p in out.split())
    return pids


def kill(pids: Callable[[], set[int]]) -> None:
    """SIGTERM what ``pids()`` gives until it gives nothing; SIGKILL after STOP_GRACE."""
    deadline = time.monotonic() + STOP_GRACE
    while left := pids():
        sig = signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.05)


def delete_namespaces(namespaces: list[str]) -> None:
    """Deletes these namespaces (a missing one is no error)."""
    for ns in namespaces:
        subprocess.run([tool("ip"), "netns", "delete", ns], capture_output=True)


def ip(*args: str) -> None:
    run([tool("ip"), *args])


__all__ = ["Host", "delete_namespaces", "in_host", "kill", "make_network", "new_namespace", "pids_in"]
