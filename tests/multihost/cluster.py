"""A small cluster on this one machine, for multi-host tests: hosts h1..hN and a
"login" host, each in a network namespace of its own; each host runs its own sshd and
slurmd, the login host runs munged and slurmctld, and the tests' clients.

    python tests/multihost/cluster.py up [--hosts N] [--no-slurm] [--no-ssh] [--name NAME]
    python tests/multihost/cluster.py run [--name NAME] -- srun -N2 hostname
    python tests/multihost/cluster.py down [NAME ... | --all]
    python tests/multihost/cluster.py status

Network rule: traffic goes only to loopback or to addresses inside the namespaces made
here. The bridge has a namespace of its own; each host's namespace is joined to it by
a veth pair and has an address of 10.250.INDEX.0/24, its cluster's own; nothing is
added to the root namespace, and no host has a route anywhere else.

Everything a cluster makes (namespaces, folders) is written to REGISTRY/NAME.json
before it is made, and every process of a cluster runs in one of its namespaces, so
`down` (also of a cluster whose creator crashed) kills whatever runs there and removes
the rest. Needs root, iproute2, openssh-server, munge and SLURM (`make
.venv/.stamps/cluster`). More in docs/testing-multihost.md.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

REGISTRY = Path("/tmp/monarch-testclusters")
TOOLS = "ip unshare setpriv ssh ssh-keygen sshd munged slurmctld slurmd srun sinfo".split()
PACKAGES = "slurmctld slurmd slurm-client munge openssh-server openssh-client iproute2"
UP_TIMEOUT = 30.0  # seconds for every daemon to answer
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
NAME = re.compile(r"[a-z][a-z0-9]{0,7}")  # short: namespace names are NAME-login


class ClusterError(RuntimeError):
    """A cluster could not be made, or a command to make it failed."""


@dataclass(frozen=True)
class Host:
    """One host of a cluster: its hostname, network namespace and address."""

    name: str
    ns: str
    addr: str


@dataclass(frozen=True)
class _Daemon:
    """A daemon this process started (in the foreground, so that it can reap it)."""

    what: str
    proc: subprocess.Popen[bytes]
    log: Path


class Cluster:
    """A cluster made by :meth:`up`; :meth:`down` (or leaving its ``with``) removes it."""

    def __init__(self, record: dict[str, Any]) -> None:
        """The cluster a registry record describes (:meth:`up` makes new ones)."""
        self.record = record
        self.name: str = record["name"]
        net = f"10.250.{record['index']}"
        self.login = Host("login", f"{self.name}-login", f"{net}.1")
        self.hosts = [
            Host(f"h{i}", f"{self.name}-h{i}", f"{net}.{i + 1}") for i in range(1, record["hosts"] + 1)
        ]
        self.dir = REGISTRY / self.name
        self.ssh_config = self.dir / "ssh" / "config"
        self.slurm_conf = self.dir / "slurm" / "slurm.conf"
        self.partition = "debug"
        self._munge = REGISTRY / f"{self.name}.munge"  # munged's folder: it cannot enter self.dir
        self._daemons: list[_Daemon] = []

    # -- making and removing -----------------------------------------------------------

    @classmethod
    def up(
        cls,
        hosts: int = 2,
        slurm: bool = True,
        ssh: bool = True,
        name: str | None = None,
        *,
        keep: bool = False,
    ) -> Cluster:
        """Make a cluster of ``hosts`` hosts and a login host, start sshd on each host
        (``ssh``) and SLURM (``slurm``), and wait until they answer. The cluster is
        stale once this process is gone (:meth:`reap_stale`), unless ``keep``. A failure
        removes what was made, then raises :class:`ClusterError`."""
        if reason := unavailable():
            raise ClusterError(reason)
        cluster = cls(_claim(hosts, name, owner=None if keep else _identity(os.getpid())))
        try:
            cluster._make_network()
            if ssh:
                cluster._start_ssh()
            if slurm:
                cluster._start_slurm()
            if ssh:
                cluster._wait_ssh()
            if slurm:
                cluster._wait_slurm()
        except BaseException:
            cluster.down()
            raise
        return cluster

    def down(self) -> None:
        """Kill every process in the cluster's namespaces, delete the namespaces and
        folders, then its record. Safe to call again, and on a half-made cluster."""
        _teardown(self.record)
        for d in self._daemons:  # dead by now, unless it never reached its namespace
            d.proc.kill()
            d.proc.wait()
        self._daemons.clear()

    @staticmethod
    def reap_stale() -> list[str]:
        """Remove every cluster whose creating process is gone; their names."""
        stale = [r for r in _records() if r["owner"] is not None and not _alive(r["owner"])]
        for record in stale:
            _teardown(record)
        return [r["name"] for r in stale]

    @classmethod
    def load(cls, name: str) -> Cluster:
        """The recorded cluster ``name``."""
        try:
            return cls(json.loads((REGISTRY / f"{name}.json").read_text()))
        except FileNotFoundError:
            raise ClusterError(f"no cluster {name!r} in {REGISTRY}") from None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- running commands --------------------------------------------------------------

    def login_cmd(self, argv: list[str]) -> list[str]:
        """``argv`` made to run in the login host (its namespace, hostname "login")."""
        return _in_host(self.login, argv)

    def env(self) -> dict[str, str]:
        """Environment additions for commands run in the login host."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def run_in_login(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` of ``argv`` in the login host, with :meth:`env` added to
        the environment (to ``env=`` of ``kwargs``, else to this process's)."""
        env = {**kwargs.pop("env", os.environ), **self.env()}
        return subprocess.run(self.login_cmd(argv), env=env, **kwargs)

    # -- network -----------------------------------------------------------------------

    def _make_network(self) -> None:
        """The bridge's namespace, and one per host joined to it by a veth pair."""
        bridge = self.record["namespaces"][0]
        _new_namespace(bridge)
        _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge, "link", "set", "br0", "up")
        hosts_file = "".join(f"{h.addr}\t{h.name}\n" for h in [self.login, *self.hosts])
        for host in [self.login, *self.hosts]:
            etc = Path("/etc/netns") / host.ns  # `ip netns exec` mounts these over /etc's files
            etc.mkdir(parents=True)
            (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{hosts_file}")
            _new_namespace(host.ns)
            veth = ["link", "add", host.name, "type", "veth", "peer", "name", "eth0", "netns", host.ns]
            _ip("-n", bridge, *veth)
            _ip("-n", bridge, "link", "set", host.name, "master", "br0", "up")
            _ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
            _ip("-n", host.ns, "link", "set", "eth0", "up")

    # -- daemons -----------------------------------------------------------------------

    def _start(
        self, what: str, host: Host, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        """Start a daemon (staying in the foreground) in ``host``; its output goes to ``log``."""
        with open(log, "ab") as out:
            argv = _in_host(host, argv)
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True
            )
        self._daemons.append(_Daemon(what, proc, log))

    def _wait(self, what: str, ready: Callable[[], bool], *logs: Path) -> None:
        """Until ``ready()``. A daemon that exits meanwhile, or UP_TIMEOUT, raises a
        ClusterError with the end of the logs (which the cluster's removal removes)."""
        deadline = time.monotonic() + UP_TIMEOUT
        while not ready():
            for d in self._daemons:
                if d.proc.poll() is not None:
                    raise ClusterError(f"{d.what} exited (status {d.proc.returncode}){_tail(d.log)}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{what} did not come up within {UP_TIMEOUT:.0f} s{''.join(map(_tail, logs))}"
                )
            time.sleep(0.05)

    # -- ssh ---------------------------------------------------------------------------

    def _start_ssh(self) -> None:
        """A client key, a host key, the sshd and ssh configs; one sshd per host."""
        d = self.dir / "ssh"
        d.mkdir(mode=0o700)
        for key in ("id_ed25519", "host_ed25519_key"):
            _run([_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", str(d / key)])
        shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
        (d / "sshd_config").write_text(
            f"Port 22\nHostKey {d / 'host_ed25519_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
            "UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        )
        self.ssh_config.write_text("".join(self._ssh_entry(h) for h in self.hosts))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        for h in self.hosts:
            log = d / f"{h.name}.log"
            sshd = [_tool("sshd"), "-D", "-f", str(d / "sshd_config"), "-E", str(log)]
            options = ["-o", f"ListenAddress={h.addr}", "-o", f"PidFile={d / h.name}.pid"]
            self._start(f"sshd of {h.name}", h, [*sshd, *options], log)

    def _ssh_entry(self, host: Host) -> str:
        """The ssh_config entry of ``host``."""
        d = self.dir / "ssh"
        return (
            f"Host {host.name}\n  HostName {host.addr}\n  User root\n  IdentityFile {d / 'id_ed25519'}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking accept-new\n"
            "  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 5\n"
        )

    def _wait_ssh(self) -> None:
        """Until ``ssh HOST true`` from the login host works for every host."""
        for h in self.hosts:
            ssh = self.login_cmd([_tool("ssh"), "-F", str(self.ssh_config), h.name, "true"])
            self._wait(f"sshd of {h.name}", partial(_succeeds, ssh), self.dir / "ssh" / f"{h.name}.log")

    # -- SLURM -------------------------------------------------------------------------

    def _start_slurm(self) -> None:
        """munged and slurmctld in the login host, one slurmd per host."""
        d = self.dir / "slurm"
        d.mkdir(mode=0o700)
        for sub in ["state", *(f"spool-{h.name}" for h in self.hosts)]:
            (d / sub).mkdir()
        self.slurm_conf.write_text(self._slurm_conf())
        (d / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n"
            "ConstrainCores=no\nConstrainRAMSpace=no\n"
        )
        self._start_munged()
        env = {**os.environ, **self.env()}
        self._start("slurmctld", self.login, [_tool("slurmctld"), "-D"], d / "slurmctld.log", env)
        for h in self.hosts:
            self._start(
                f"slurmd of {h.name}", h, [_tool("slurmd"), "-D", "-N", h.name], d / f"{h.name}.log", env
            )

    def _start_munged(self) -> None:
        """munged, as user munge, with a key and socket of the cluster's own; waits for
        its socket."""
        m = self._munge
        m.mkdir()
        m.chmod(0o711)  # munged wants its socket's folder searchable by all
        key, log = m / "munge.key", m / "munged.log"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        log.touch()
        for path in (m, key, log):
            shutil.chown(path, "munge", "munge")
        munged = [_tool("munged"), "--foreground", f"--socket={m / 'socket'}", f"--key-file={key}"]
        munged += [f"--log-file={log}", f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}"]
        user = [_tool("setpriv"), "--reuid=munge", "--regid=munge", "--clear-groups"]
        self._start("munged", self.login, [*user, *munged], log)
        self._wait("munged", (m / "socket").exists, log)

    def _slurm_conf(self) -> str:
        """slurm.conf: no accounting, no cgroups, every node in one shareable partition;
        the daemons run in the foreground and log to their stderr."""
        d = self.dir / "slurm"
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.addr} CPUs={os.cpu_count()} State=UNKNOWN\n" for h in self.hosts
        )
        return (
            f"ClusterName={self.name}\nSlurmctldHost=login({self.login.addr})\n"
            f"AuthType=auth/munge\nAuthInfo=socket={self._munge / 'socket'}\n"
            "SlurmUser=root\nSlurmdUser=root\nMpiDefault=none\nReturnToService=2\nMailProg=/bin/true\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            f"StateSaveLocation={d / 'state'}\nSlurmctldPidFile={d / 'slurmctld.pid'}\n"
            f"SlurmdSpoolDir={d / 'spool-%n'}\nSlurmdPidFile={d / '%n.pid'}\n"
            f"{nodes}PartitionName={self.partition} Nodes={','.join(h.name for h in self.hosts)} "
            "Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP\n"
        )

    def _wait_slurm(self) -> None:
        """Until ``sinfo`` shows every node idle."""

        def idle() -> bool:
            out = self.run_in_login(
                [_tool("sinfo"), "-h", "-N", "-o", "%N %t"], capture_output=True, text=True
            )
            return sorted(out.stdout.splitlines()) == sorted(f"{h.name} idle" for h in self.hosts)

        daemons = ["slurmctld", *(h.name for h in self.hosts)]
        self._wait(
            "SLURM (every node idle in sinfo)", idle, *(self.dir / "slurm" / f"{n}.log" for n in daemons)
        )


def unavailable() -> str | None:
    """Why this machine cannot make a cluster (not root, a program missing, no network
    namespaces), or None when it can."""
    if os.geteuid() != 0:
        return "making a cluster needs root"
    try:
        for tool in TOOLS:
            _tool(tool)
    except ClusterError as e:
        return str(e)
    if not _succeeds([_tool("unshare"), "--net", "true"]):
        return "this machine cannot make network namespaces (`unshare --net true` failed)"
    return None


# -- registry ----------------------------------------------------------------------------


def _claim(hosts: int, name: str | None, owner: list[int] | None) -> dict[str, Any]:
    """Pick a free subnet index (and name), write the record of everything the cluster
    will make, make its folder; under the registry's lock."""
    if hosts < 1:
        raise ClusterError("a cluster needs at least one host")
    REGISTRY.mkdir(exist_ok=True)
    REGISTRY.chmod(0o755)  # munged refuses a socket below a folder others may write
    with open(REGISTRY / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = min(set(range(1, 255)) - {r["index"] for r in _records()}, default=None)
        if index is None:
            raise ClusterError(f"254 clusters are recorded in {REGISTRY}")
        name = name or f"mkc{index}"
        if not NAME.fullmatch(name):
            raise ClusterError(f"cluster name {name!r}: a lower-case letter, then up to 7 letters or digits")
        if (REGISTRY / f"{name}.json").exists():
            raise ClusterError(f"a cluster {name!r} is recorded; `cluster.py down {name}` removes it")
        hostnames = ["login", *(f"h{i}" for i in range(1, hosts + 1))]
        record = {
            "name": name,
            "index": index,
            "hosts": hosts,
            "owner": owner,
            "namespaces": [f"{name}-net", *(f"{name}-{h}" for h in hostnames)],
            "paths": [
                str(REGISTRY / name),
                str(REGISTRY / f"{name}.munge"),
                *(f"/etc/netns/{name}-{h}" for h in hostnames),
            ],
        }
        tmp = REGISTRY / f"{name}.json.tmp"  # not matched by _records' glob
        tmp.write_text(json.dumps(record, indent=1))
        tmp.rename(REGISTRY / f"{name}.json")
    (REGISTRY / name).mkdir(mode=0o700)
    return record


def _records() -> list[dict[str, Any]]:
    """Every recorded cluster."""
    return [json.loads(p.read_text()) for p in sorted(REGISTRY.glob("*.json"))]


def _teardown(record: dict[str, Any]) -> None:
    """Remove what ``record`` lists: processes in its namespaces, the namespaces, its
    folders; the record last, so that an interrupted teardown can run again."""
    _kill(lambda: _pids_in(record["namespaces"]))
    for ns in record["namespaces"]:
        subprocess.run([_tool("ip"), "netns", "delete", ns], capture_output=True)
    for path in record["paths"]:
        shutil.rmtree(path, ignore_errors=True)
    with suppress(OSError):
        Path("/etc/netns").rmdir()  # only when no other namespace has files there
    (REGISTRY / f"{record['name']}.json").unlink(missing_ok=True)


# -- processes ---------------------------------------------------------------------------


def _identity(pid: int) -> list[int] | None:
    """``[pid, start time]`` of a live process (a pair a reused pid does not match)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else [pid, int(fields[19])]


def _alive(identity: list[int]) -> bool:
    """Whether the process ``identity`` (from :func:`_identity`) still runs."""
    return _identity(identity[0]) == identity


def _pids_in(namespaces: list[str]) -> set[int]:
    """Pids of the live processes in these network namespaces (a missing one has none)."""
    pids: set[int] = set()
    for ns in namespaces:
        out = subprocess.run([_tool("ip"), "netns", "pids", ns], capture_output=True, text=True).stdout
        pids.update(int(p) for p in out.split())
    return pids


def _kill(pids: Callable[[], set[int]]) -> None:
    """SIGTERM what ``pids()`` gives until it gives nothing; SIGKILL after STOP_GRACE."""
    deadline = time.monotonic() + STOP_GRACE
    while left := pids():
        sig = signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.05)


# -- commands ----------------------------------------------------------------------------


def _tool(name: str) -> str:
    """The absolute path of a program (sshd insists on one), from PATH or /usr/sbin."""
    path = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if path is None:
        raise ClusterError(f"{name} is missing: `make .venv/.stamps/cluster`, or apt-get install {PACKAGES}")
    return path


def _in_host(host: Host, argv: list[str]) -> list[str]:
    """``argv`` made to run in ``host``'s namespace, with its hostname."""
    enter = [_tool("ip"), "netns", "exec", host.ns, _tool("unshare"), "--uts"]
    return [*enter, "sh", "-c", 'hostname "$0" && exec "$@"', host.name, *argv]


def _new_namespace(ns: str) -> None:
    """A network namespace with loopback up, whose links made later have no IPv6 (their
    link-local addresses would route to anything on the link)."""
    _ip("netns", "add", ns)
    _ip("-n", ns, "link", "set", "lo", "up")
    no_ipv6 = "f=/proc/sys/net/ipv6/conf/default/disable_ipv6; [ ! -e $f ] || echo 1 >$f"
    _run([_tool("ip"), "netns", "exec", ns, "sh", "-c", no_ipv6])


def _succeeds(argv: list[str]) -> bool:
    """Whether ``argv`` exits with status 0."""
    return subprocess.run(argv, capture_output=True).returncode == 0


def _ip(*args: str) -> None:
    _run([_tool("ip"), *args])


def _run(argv: list[str]) -> None:
    """Run ``argv``; a failure raises ClusterError with its output."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise ClusterError(
            f"{shlex.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}"
        )


def _tail(log: Path, lines: int = 15) -> str:
    """The end of a log file, for an error message."""
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        text = ["(not written)"]
    return f"\n--- the end of {log}:\n" + "\n".join(text)


# -- command line ------------------------------------------------------------------------


def _only(name: str | None) -> Cluster:
    """The cluster ``name``, or without one the only recorded cluster."""
    if name:
        return Cluster.load(name)
    names = [r["name"] for r in _records()]
    if len(names) != 1:
        raise ClusterError(f"clusters recorded: {', '.join(names) or 'none'}; name one")
    return Cluster.load(names[0])


def _cli_up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    c = Cluster.up(args.hosts, slurm=args.slurm, ssh=args.ssh, name=args.name, keep=True)
    hosts = ", ".join(f"{h.name} {h.addr}" for h in [c.login, *c.hosts])
    print(f"cluster {c.name} up in {time.monotonic() - started:.1f} s: {hosts}; folder {c.dir}")
    me = f"{sys.executable} {__file__}"
    if args.ssh:
        print(f"  {me} run --name {c.name} -- ssh -F {c.ssh_config} h1 hostname")
    if args.slurm:
        print(f"  {me} run --name {c.name} -- srun -N{len(c.hosts)} hostname")
    print(f"  {me} down {c.name}")
    return 0


def _cli_run(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return _only(args.name).run_in_login(argv or ["sh"]).returncode


def _cli_down(args: argparse.Namespace) -> int:
    for name in [r["name"] for r in _records()] if args.all else args.names or [_only(None).name]:
        Cluster.load(name).down()
        print(f"cluster {name} removed")
    return 0


def _cli_status(args: argparse.Namespace) -> int:
    present = subprocess.run([_tool("ip"), "netns", "list"], capture_output=True, text=True).stdout.split()
    records = _records()
    if not records:
        print(f"no cluster is recorded in {REGISTRY}")
    for r in records:
        owner = "kept until down" if r["owner"] is None else f"owner pid {r['owner'][0]}"
        stale = " (gone: stale)" if r["owner"] is not None and not _alive(r["owner"]) else ""
        made = [ns for ns in r["namespaces"] if ns in present]
        print(
            f"{r['name']}: login + {r['hosts']} hosts on 10.250.{r['index']}.0/24, {owner}{stale}, "
            f"{len(made)}/{len(r['namespaces'])} namespaces, {len(_pids_in(made))} processes, folder {REGISTRY / r['name']}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description="A test cluster of hosts in network namespaces.")
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
        print(f"cluster.py: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
