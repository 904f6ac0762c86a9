"""The ssh allocator: a host agent on each host, started with ``ssh HOST PYTHON -m
monarch_kernel.hosts._agent_main --detach``, in parallel. The agent gets its
configuration on its stdin through ssh's own channel (TLS-3) and leaves the ssh
session once it listens (it prints its ``READY`` line first), so nothing here holds a
connection to it; the user's ssh configuration, keys and ProxyJump apply."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from monarch_kernel.errors import MeshSpecError, MeshStartError
from monarch_kernel.hosts._allocator import AGENT_ARGS, AgentConfig, AgentInfo, Allocation, stop_started


@dataclass(frozen=True)
class SSHHosts:
    """Hosts reached with ``ssh`` (``ssh_args`` before the host, e.g. ``["-F", cfg]``)."""

    targets: list[str]
    python: str
    ssh_args: list[str] = field(default_factory=list)
    #: The job these hosts come from (``monarch_kernel.job``), kept in the state file.
    tag: str = ""

    kind = "ssh"

    remote = True
    shares_files = True

    @property
    def nhosts(self) -> int:
        return len(self.targets)

    def worker_env(self, per_host: dict[str, int]) -> dict[str, str]:
        return {}  # (each host's workers place themselves on its GPUs)

    def picked(self, indices: Sequence[int]) -> SSHHosts:
        return replace(self, targets=[self.targets[i] for i in indices])

    def with_python(self, python: str) -> SSHHosts:
        return replace(self, python=python)

    def describe(self) -> str:
        return f"{len(self.targets)} hosts over ssh: {', '.join(self.targets)}"

    def allocate(self, cfg: AgentConfig, timeout: float = 60.0) -> Allocation:
        """Starts an agent on every host (in parallel)."""
        if shutil.which("ssh") is None:
            raise MeshSpecError(
                "ssh is not installed here; install an OpenSSH client to start meshes on other hosts"
            )
        line = cfg.to_line().decode()

        def one(target: str) -> AgentInfo:
            remote = " ".join(shlex.quote(a) for a in [self.python, *AGENT_ARGS, "--detach"])
            argv = ["ssh", "-T", "-o", "BatchMode=yes", *self.ssh_args, target, remote]
            try:
                done = subprocess.run(argv, input=line, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise MeshStartError(
                    f"ssh {target}: the host agent did not start within {timeout:g} s",
                    host=target,
                    mesh=cfg.name,
                ) from None
            agent = next((a for a in map(AgentInfo.parse_ready, done.stdout.splitlines()) if a), None)
            if agent is None:
                by_hand = " ".join(shlex.quote(a) for a in ["ssh", *self.ssh_args, target])
                raise MeshStartError(
                    f"ssh {target}: the host agent did not start (exit status {done.returncode}): "
                    f"{(done.stderr or done.stdout).strip()[-1500:] or 'no output'}. Check that `{by_hand}` "
                    f"works without a password and that {self.python} has monarch-kernel installed there.",
                    host=target,
                    mesh=cfg.name,
                )
            return agent

        with ThreadPoolExecutor(max_workers=min(16, len(self.targets))) as pool:
            futures = [pool.submit(one, t) for t in self.targets]
        agents, errors = [], []
        for f in futures:
            try:
                agents.append(f.result())
            except MeshStartError as e:
                errors.append(e)
        if errors:
            raise stop_started(errors[0], agents, cfg)
        job = {"kind": "ssh", "targets": list(self.targets), "ssh_args": list(self.ssh_args), "tag": self.tag}
        return Allocation(agents, job)


__all__ = ["SSHHosts"]
