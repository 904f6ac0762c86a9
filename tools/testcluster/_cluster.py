"""``Cluster``: making a cluster (its network, then sshd and SLURM, waiting until they
answer), running commands in its login host, and removing it, also a stale one."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from tools.testcluster._daemons import Daemons
from tools.testcluster._netns import Host, in_host, make_network
from tools.testcluster._programs import ClusterError, unavailable
from tools.testcluster._registry import alive, claim, cluster_dir, identity, read, records, teardown
from tools.testcluster._slurm import start_slurm, wait_slurm
from tools.testcluster._ssh import start_ssh, wait_ssh


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
        self.dir = cluster_dir(self.name)
        self.ssh_config = self.dir / "ssh" / "config"
        self.slurm_conf = self.dir / "slurm" / "slurm.conf"
        self.partition = "debug"
        #: The daemons this process started for the cluster, reaped by :meth:`down`.
        self.daemons = Daemons()

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
        cluster = cls(claim(hosts, name, owner=None if keep else identity(os.getpid())))
        try:
            make_network(cluster.record["namespaces"][0], [cluster.login, *cluster.hosts])
            if ssh:
                start_ssh(cluster)
            if slurm:
                start_slurm(cluster)
            if ssh:
                wait_ssh(cluster)
            if slurm:
                wait_slurm(cluster)
        except BaseException:
            cluster.down()
            raise
        return cluster

    def down(self) -> None:
        """Kill every process in the cluster's namespaces, delete the namespaces and
        folders, then its record. Safe to call again, and on a half-made cluster."""
        teardown(self.record)
        self.daemons.reap()

    @staticmethod
    def reap_stale() -> list[str]:
        """Remove every cluster whose creating process is gone; their names."""
        stale = [r for r in records() if r["owner"] is not None and not alive(r["owner"])]
        for record in stale:
            teardown(record)
        return [r["name"] for r in stale]

    @classmethod
    def load(cls, name: str) -> Cluster:
        """The recorded cluster ``name``."""
        return cls(read(name))

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- running commands --------------------------------------------------------------

    def login_cmd(self, argv: list[str]) -> list[str]:
        """``argv`` made to run in the login host (its namespace, hostname "login")."""
        return in_host(self.login, argv)

    def env(self) -> dict[str, str]:
        """Environment additions for commands run in the login host."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def run_in_login(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` of ``argv`` in the login host, with :meth:`env` added to
        the environment (to ``env=`` of ``kwargs``, else to this process's)."""
        env = {**kwargs.pop("env", os.environ), **self.env()}
        return subprocess.run(self.login_cmd(argv), env=env, **kwargs)


__all__ = ["Cluster"]
