"""The test cluster itself (tools/testcluster): each host answers ssh under its own name,
SLURM spans the hosts, nothing outside the cluster can be reached from it, and its
removal leaves nothing, also of a cluster whose creator died."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

from tools.testcluster import REGISTRY, Cluster


def _login(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return cluster.run_in_login(list(argv), capture_output=True, text=True, timeout=60)


def _live(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True).stdout


def _root(what: str) -> list[dict]:
    """``ip -j WHAT`` (addr, route, link) of the root namespace."""
    return json.loads(_ip("-j", what))


def _processes_in(namespaces: list[str]) -> set[int]:
    return {int(pid) for ns in namespaces for pid in _ip("netns", "pids", ns).split()}


def _assert_gone(record: dict, pids: set[int]) -> None:
    """Nothing ``record`` lists, and none of ``pids``, remains."""
    assert not set(record["namespaces"]) & set(_ip("netns", "list").split())
    assert not [p for p in record["paths"] if Path(p).exists()]
    assert not (REGISTRY / f"{record['name']}.json").exists()
    assert not [pid for pid in pids if _live(pid)]


def test_ssh_from_the_login_host_reaches_each_host_under_its_own_name(cluster):
    for host in cluster.hosts:
        done = _login(cluster, "ssh", "-F", str(cluster.ssh_config), host.name, "hostname")
        assert done.stdout.strip() == host.name, done.stderr


def test_srun_runs_on_every_host(cluster):
    done = _login(cluster, "srun", "-N2", "hostname")
    assert sorted(done.stdout.split()) == ["h1", "h2"], done.stderr
    done = _login(cluster, "srun", "-N2", "--ntasks-per-node=2", "hostname")
    assert sorted(done.stdout.split()) == ["h1", "h1", "h2", "h2"], done.stderr


def test_the_login_host_has_no_route_out_of_the_cluster(cluster):
    assert _login(cluster, "hostname").stdout.strip() == "login"
    assert _login(cluster, "ip", "route", "show", "default").stdout == ""
    assert _login(cluster, "ip", "-6", "route", "show", "default").stdout == ""
    subnet = ipaddress.ip_network(f"{cluster.login.addr}/24", strict=False)
    assert _login(cluster, "ip", "-o", "route").stdout.split()[0] == str(subnet)
    root = _root("addr")
    outside = [a["local"] for link in root for a in link["addr_info"] if link["ifname"] != "lo"]
    for addr in [*outside, "1.1.1.1", "2606:4700::1111"]:
        done = _login(cluster, "ip", "route", "get", addr)
        assert done.returncode != 0 and "unreachable" in done.stderr, (addr, done.stdout)


def test_the_root_namespace_gets_no_address_route_or_link_of_the_cluster(cluster):
    ours = ipaddress.ip_network(f"{cluster.login.addr}/24", strict=False)
    addrs = [ipaddress.ip_address(a["local"]) for link in _root("addr") for a in link["addr_info"]]
    assert not [a for a in addrs if a in ours]
    routes = [ipaddress.ip_network(r["dst"]) for r in _root("route") if r["dst"] != "default"]
    assert not [r for r in routes if r.overlaps(ours)]
    assert not {link["ifname"] for link in _root("link")} & {"br0", "login", *(h.name for h in cluster.hosts)}


def test_down_leaves_nothing_behind(can_make_clusters):
    with Cluster.up(hosts=1, slurm=False) as small:  # leaving it: down() again, which has nothing to do
        pids = _processes_in(small.record["namespaces"])
        assert pids  # its sshd
        small.down()
        _assert_gone(small.record, pids)


def test_reap_stale_removes_a_cluster_whose_creator_died(can_make_clusters, cluster):
    with Cluster.up(hosts=1, slurm=False) as stale:  # leaving it reaps its daemons, children of this process
        creator = subprocess.Popen(["true"])
        creator.wait()
        (REGISTRY / f"{stale.name}.json").write_text(json.dumps({**stale.record, "owner": [creator.pid, 0]}))
        pids = _processes_in(stale.record["namespaces"])
        reaped = Cluster.reap_stale()
        assert stale.name in reaped and cluster.name not in reaped
        _assert_gone(stale.record, pids)
