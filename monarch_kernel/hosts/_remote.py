"""Allocators for other hosts: host agents started over ``ssh`` or with ``srun`` in a
SLURM allocation, one per host and mesh.

Each agent gets its configuration (the mesh token and the mesh's TLS identity
included) as one JSON line on its stdin, through the allocator's own channel (never
argv, the environment or a file: TLS-3),
and answers ``MONARCH_AGENT_READY <addr> <pid> <hostname> [<job>] id=<host id>`` on its
stdout once it listens on the address of its host that faces this controller.

- ssh: ``ssh HOST PYTHON -m monarch_kernel.hosts._agent_main --detach``, one per host
  in parallel; the agent leaves the ssh session once it listens, so nothing here
  holds a connection to it (the user's ssh configuration, keys and ProxyJump apply).
- SLURM: one ``srun`` makes the mesh's job and runs an agent per node as its step
  (``--input=all`` hands every task the configuration). The job lasts as long as its
  ``srun``, which runs detached from this process (its own session), so that the mesh
  outlives the kernel; ``scancel`` ends it all, and so does the end of the agents.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monarch_kernel.errors import MeshSpecError, MeshStartError
from monarch_kernel.hosts._local import READY, private_dir, state_dir

#: How the agent module is run on a host.
AGENT_ARGS = ["-m", "monarch_kernel.hosts._agent_main"]


@dataclass(frozen=True)
class RemoteAgent:
    """An agent started on a host: where it listens, its pid and host name there, the
    SLURM job it runs in (srun), and its host's ``host_id()`` ("" from an older agent)."""

    addr: str
    pid: int
    host: str
    job_id: str = ""
    host_id: str = ""


def _parse_ready(line: str) -> RemoteAgent | None:
    parts = line.split()
    if len(parts) >= 4 and parts[0] == READY:
        rest = parts[4:]  # the job id (absent outside SLURM), then id=HOST_ID
        job = next((p for p in rest if not p.startswith("id=")), "")
        hid = next((p[3:] for p in rest if p.startswith("id=")), "")
        return RemoteAgent(addr=parts[1], pid=int(parts[2]), host=parts[3], job_id=job, host_id=hid)
    return None


def new_tls_identity() -> dict[str, str]:
    """A new TLS identity for one mesh (TLS-1): ``{"ca", "cert", "key"}`` (PEM), the
    mesh's CA certificate, and the server certificate and key that every agent and
    worker of the mesh presents. Only ``"ca"`` may be kept (in the state file):
    the key goes to the agents in their configuration and nowhere else (TLS-3)."""
    from monarch_kernel import _native

    ca, cert, key = _native.tls_identity()
    return {"ca": ca, "cert": cert, "key": key}


def agent_config(
    name: str, token: str, idle_timeout: float, meta: str, tls: dict[str, str] | None = None
) -> dict[str, Any]:
    """What every host's agent of mesh ``name`` is handed on its stdin. With ``tls``
    (``new_tls_identity()``) the agents and their workers serve TLS (TLS-1)."""
    cfg: dict[str, Any] = {
        "name": name,
        "token": token,
        "idle_timeout": idle_timeout,
        "meta": meta,
        "bind_host": "auto",
    }
    if tls:
        cfg["tls"] = {k: tls[k] for k in ("ca", "cert", "key")}
    if os.environ.get("XDG_STATE_HOME"):  # a shared home: the same folder on every host
        cfg["state_home"] = os.environ["XDG_STATE_HOME"]
    return cfg


# -- ssh ---------------------------------------------------------------------------------


@dataclass
class SSHHosts:
    """Hosts reached with ``ssh`` (``ssh_args`` before the host, e.g. ``["-F", cfg]``)."""

    targets: list[str]
    python: str
    ssh_args: list[str] = field(default_factory=list)
    #: The job these hosts come from (``monarch_kernel.job``), kept in the state file.
    tag: str = ""

    kind = "ssh"

    def start(self, cfg: dict[str, Any], timeout: float = 60.0) -> tuple[list[RemoteAgent], dict[str, Any]]:
        """Starts an agent on every host (in parallel); the agents and the job record."""
        if shutil.which("ssh") is None:
            raise MeshSpecError(
                "ssh is not installed here; install an OpenSSH client to start meshes on other hosts"
            )
        line = json.dumps(cfg) + "\n"

        def one(target: str) -> RemoteAgent:
            remote = " ".join(shlex.quote(a) for a in [self.python, *AGENT_ARGS, "--detach"])
            argv = ["ssh", "-T", "-o", "BatchMode=yes", *self.ssh_args, target, remote]
            try:
                done = subprocess.run(argv, input=line, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise MeshStartError(
                    f"ssh {target}: the host agent did not start within {timeout:g} s",
                    host=target,
                    mesh=cfg["name"],
                ) from None
            agent = next((a for a in map(_parse_ready, done.stdout.splitlines()) if a), None)
            if agent is None:
                by_hand = " ".join(shlex.quote(a) for a in ["ssh", *self.ssh_args, target])
                raise MeshStartError(
                    f"ssh {target}: the host agent did not start (exit status {done.returncode}): "
                    f"{(done.stderr or done.stdout).strip()[-1500:] or 'no output'}. Check that `{by_hand}` "
                    f"works without a password and that {self.python} has monarch-kernel installed there.",
                    host=target,
                    mesh=cfg["name"],
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
            raise _StartFailed(errors[0], agents)
        return agents, {
            "kind": "ssh",
            "targets": list(self.targets),
            "ssh_args": list(self.ssh_args),
            "tag": self.tag,
        }


class _StartFailed(Exception):
    """Some hosts' agents started, others did not: the caller stops those that did."""

    def __init__(self, error: MeshStartError, started: list[RemoteAgent]) -> None:
        super().__init__(str(error))
        self.error, self.started = error, started


# -- SLURM ----------------------------------------------------------------------------------


@dataclass
class SlurmHosts:
    """``nodes`` nodes from SLURM: one ``srun`` makes the job (it waits in the queue
    like any job) and runs an agent per node as its one step, so the job is the
    mesh's: it ends when the mesh stops (scancel), when its agents end (idle timeout),
    or at its time limit."""

    nodes: int
    python: str
    partition: str | None = None
    time_limit: str | None = None
    gpus_per_node: int | None = None
    slurm_args: list[str] = field(default_factory=list)
    #: How long to wait for the nodes (the queue) and the agents.
    timeout: float = 600.0
    #: The job these hosts come from (``monarch_kernel.job``), kept in the state file.
    tag: str = ""

    kind = "slurm"

    def srun_argv(self, name: str) -> list[str]:
        _need("srun")
        argv = [
            "srun",
            f"--nodes={self.nodes}",
            f"--ntasks={self.nodes}",
            "--ntasks-per-node=1",
            "--input=all",
            "--kill-on-bad-exit=0",
            f"--job-name=monarch-{name}",
        ]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.time_limit:
            argv.append(f"--time={self.time_limit}")
        if self.gpus_per_node:
            argv.append(f"--gpus-per-node={self.gpus_per_node}")
        return [*argv, *self.slurm_args, self.python, *AGENT_ARGS]

    def start(self, cfg: dict[str, Any]) -> tuple[list[RemoteAgent], dict[str, Any]]:
        """Runs ``srun`` detached (its own session: it outlives this process, as the
        mesh does) and waits for every node's ready line in its output."""
        out_dir = private_dir(state_dir() / "launch")
        fd, out_path = tempfile.mkstemp(prefix=f"{cfg['name']}-", suffix=".out", dir=out_dir)
        with os.fdopen(fd, "wb") as out:
            launcher = subprocess.Popen(
                self.srun_argv(cfg["name"]),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
            )
        assert launcher.stdin is not None
        launcher.stdin.write((json.dumps(cfg) + "\n").encode())
        launcher.stdin.close()
        deadline = time.monotonic() + self.timeout
        lines: list[str] = []
        try:
            while time.monotonic() < deadline:
                lines = Path(out_path).read_text(errors="replace").splitlines()
                if sum(ln.startswith(READY) for ln in lines) >= self.nodes or launcher.poll() is not None:
                    break
                if any("Exited with exit code" in ln or "srun: error" in ln for ln in lines):
                    break  # an agent failed: srun goes on with the others, the mesh cannot
                time.sleep(0.05)
        except BaseException:  # an interrupt while SLURM queues: nothing may stay queued
            _end_launch(launcher, lines)
            raise
        agents = sorted((a for a in map(_parse_ready, lines) if a), key=lambda a: a.host)
        if len(agents) < self.nodes:
            _end_launch(launcher, lines)
            said = "\n".join(lines).strip()[-1500:] or "(none)"
            raise _StartFailed(
                MeshStartError(
                    f"srun started {len(agents)} of {self.nodes} host agents within {self.timeout:g} s "
                    f"({' '.join(self.srun_argv(cfg['name'])[:-3])}); its output:\n{said}",
                    mesh=cfg["name"],
                ),
                [],
            )
        Path(out_path).unlink(missing_ok=True)  # nothing more comes: the agents log on their hosts
        job = {"kind": "slurm", "job_id": agents[0].job_id, "launcher_pid": launcher.pid, "tag": self.tag}
        return agents, job


def _end_launch(launcher: subprocess.Popen[bytes], lines: list[str]) -> None:
    """Ends an ``srun`` that did not bring every agent up, and its job."""
    job_id = next((a.job_id for a in map(_parse_ready, lines) if a and a.job_id), "")
    if job_id:
        end_job({"kind": "slurm", "job_id": job_id})
    launcher.terminate()
    try:
        launcher.wait(10)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait(5)


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        raise MeshSpecError(f"{tool} is not installed here; SLURM meshes need SLURM's client commands")


def end_job(job: dict[str, Any]) -> bool:
    """Ends what the allocator started beyond the agents: a mesh's SLURM job. True if
    there was one and ``scancel`` took it (its agents end with it, wherever they run)."""
    if job.get("kind") != "slurm" or not job.get("job_id") or shutil.which("scancel") is None:
        return False
    return subprocess.run(["scancel", str(job["job_id"])], capture_output=True, timeout=30).returncode == 0


def job_end_reason(job: dict[str, Any], wait: float = 3.0) -> str | None:
    """Why a SLURM job's agents went away, in words, if the job has ended (state and
    reason from ``scontrol``, given ``wait`` s to record the end: the agents can go
    first); None for other allocators or a job still running."""
    if job.get("kind") != "slurm" or not job.get("job_id") or shutil.which("scontrol") is None:
        return None
    deadline = time.monotonic() + wait
    while True:
        try:
            out = subprocess.run(
                ["scontrol", "show", "job", "-o", str(job["job_id"])],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
        state, reason = fields.get("JobState", ""), fields.get("Reason", "None")
        if state and state not in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING"):
            break
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)
    said = {
        "TIMEOUT": "reached its time limit",
        "CANCELLED": "was cancelled (scancel)",
        "NODE_FAIL": "lost a node",
    }
    why = said.get(state, f"ended ({state})")
    return f"its SLURM job {job['job_id']} {why}{'' if reason in ('None', '') else f' ({reason})'}"


def start_agents(
    hosts: SSHHosts | SlurmHosts, cfg: dict[str, Any]
) -> tuple[list[RemoteAgent], dict[str, Any]]:
    """Starts the agents (see the module docstring); on a partial failure, stops the
    agents that did start and raises the first error."""
    try:
        return hosts.start(cfg)
    except _StartFailed as e:
        from monarch_kernel.control import AgentClient

        ca = (cfg.get("tls") or {}).get("ca")
        for a in e.started:
            try:
                AgentClient(a.addr, cfg["token"], ca).shutdown(epoch=0, timeout=5)
            except Exception:
                pass
        raise e.error from None


__all__ = [
    "RemoteAgent",
    "SSHHosts",
    "SlurmHosts",
    "agent_config",
    "end_job",
    "job_end_reason",
    "new_tls_identity",
    "start_agents",
]
