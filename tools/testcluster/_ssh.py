"""ssh in a cluster: a client key and a host key of the cluster's own, one sshd per
host, and an ssh_config with an entry per host, for clients in the login host."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from tools.testcluster._netns import Host
from tools.testcluster._programs import run, succeeds, tool

if TYPE_CHECKING:
    from tools.testcluster._cluster import Cluster


def start_ssh(c: Cluster) -> None:
    """A client key, a host key, the sshd and ssh configs; one sshd per host."""
    d = c.dir / "ssh"
    d.mkdir(mode=0o700)
    for key in ("id_ed25519", "host_ed25519_key"):
        run([tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", c.name, "-f", str(d / key)])
    shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
    (d / "sshd_config").write_text(
        f"Port 22\nHostKey {d / 'host_ed25519_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        "UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
    )
    c.ssh_config.write_text("".join(_ssh_entry(d, h) for h in c.hosts))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    for h in c.hosts:
        log = d / f"{h.name}.log"
        sshd = [tool("sshd"), "-D", "-f", str(d / "sshd_config"), "-E", str(log)]
        options = ["-o", f"ListenAddress={h.addr}", "-o", f"PidFile={d / h.name}.pid"]
        c.daemons.start(f"sshd of {h.name}", h, [*sshd, *options], log)


def _ssh_entry(d: Path, host: Host) -> str:
    """The ssh_config entry of ``host``, with the keys and known_hosts of folder ``d``."""
    return (
        f"Host {host.name}\n  HostName {host.addr}\n  User root\n  IdentityFile {d / 'id_ed25519'}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking accept-new\n"
        "  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 5\n"
    )


#: How many hosts are tried at once: one ``ssh HOST true`` takes about 0.3 s here, so
#: 64 hosts one by one took 20 s.
WAIT_AT_ONCE = 16


def wait_ssh(c: Cluster) -> None:
    """Until ``ssh HOST true`` from the login host works for every host (several at once)."""

    def one(h: Host) -> None:
        ssh = c.login_cmd([tool("ssh"), "-F", str(c.ssh_config), h.name, "true"])
        c.daemons.wait(f"sshd of {h.name}", partial(succeeds, ssh), c.dir / "ssh" / f"{h.name}.log")

    with ThreadPoolExecutor(max_workers=min(WAIT_AT_ONCE, len(c.hosts) or 1)) as pool:
        for done in [pool.submit(one, h) for h in c.hosts]:
            done.result()  # (the first host that did not come up raises)


__all__ = ["start_ssh", "wait_ssh"]
