"""SLURM in a cluster: munged (with a key and socket of the cluster's own) and
slurmctld in the login host, one slurmd per host, and a slurm.conf with no
accounting and no cgroups, every host in one shareable partition."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from tools.testcluster._programs import tool
from tools.testcluster._registry import munge_dir

if TYPE_CHECKING:
    from tools.testcluster._cluster import Cluster


def start_slurm(c: Cluster) -> None:
    """munged and slurmctld in the login host, one slurmd per host."""
    d = c.dir / "slurm"
    d.mkdir(mode=0o700)
    for sub in ["state", *(f"spool-{h.name}" for h in c.hosts)]:
        (d / sub).mkdir()
    c.slurm_conf.write_text(_slurm_conf(c))
    (d / "cgroup.conf").write_text(
        "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n"
        "ConstrainCores=no\nConstrainRAMSpace=no\n"
    )
    _start_munged(c)
    env = {**os.environ, **c.env()}
    c.daemons.start("slurmctld", c.login, [tool("slurmctld"), "-D"], d / "slurmctld.log", env)
    for h in c.hosts:
        c.daemons.start(
            f"slurmd of {h.name}", h, [tool("slurmd"), "-D", "-N", h.name], d / f"{h.name}.log", env
        )


def _start_munged(c: Cluster) -> None:
    """munged, as user munge, with a key and socket of the cluster's own; waits for
    its socket."""
    m = munge_dir(c.name)
    m.mkdir()
    m.chmod(0o711)  # munged wants its socket's folder searchable by all
    key, log = m / "munge.key", m / "munged.log"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    log.touch()
    for path in (m, key, log):
        shutil.chown(path, "munge", "munge")
    munged = [tool("munged"), "--foreground", f"--socket={m / 'socket'}", f"--key-file={key}"]
    munged += [f"--log-file={log}", f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}"]
    user = [tool("setpriv"), "--reuid=munge", "--regid=munge", "--clear-groups"]
    c.daemons.start("munged", c.login, [*user, *munged], log)
    c.daemons.wait("munged", (m / "socket").exists, log)


def _slurm_conf(c: Cluster) -> str:
    """slurm.conf: no accounting, no cgroups, every node in one shareable partition;
    the daemons run in the foreground and log to their stderr."""
    d = c.dir / "slurm"
    nodes = "".join(
        f"NodeName={h.name} NodeAddr={h.addr} CPUs={os.cpu_count()} State=UNKNOWN\n" for h in c.hosts
    )
    return (
        f"ClusterName={c.name}\nSlurmctldHost=login({c.login.addr})\n"
        f"AuthType=auth/munge\nAuthInfo=socket={munge_dir(c.name) / 'socket'}\n"
        "SlurmUser=root\nSlurmdUser=root\nMpiDefault=none\nReturnToService=2\nMailProg=/bin/true\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        f"StateSaveLocation={d / 'state'}\nSlurmctldPidFile={d / 'slurmctld.pid'}\n"
        f"SlurmdSpoolDir={d / 'spool-%n'}\nSlurmdPidFile={d / '%n.pid'}\n"
        f"{nodes}PartitionName={c.partition} Nodes={','.join(h.name for h in c.hosts)} "
        "Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP\n"
    )


def wait_slurm(c: Cluster) -> None:
    """Until ``sinfo`` shows every node idle."""

    def idle() -> bool:
        out = c.run_in_login([tool("sinfo"), "-h", "-N", "-o", "%N %t"], capture_output=True, text=True)
        return sorted(out.stdout.splitlines()) == sorted(f"{h.name} idle" for h in c.hosts)

    daemons = ["slurmctld", *(h.name for h in c.hosts)]
    c.daemons.wait("SLURM (every node idle in sinfo)", idle, *(c.dir / "slurm" / f"{n}.log" for n in daemons))


__all__ = ["start_slurm", "wait_slurm"]
