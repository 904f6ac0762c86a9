"""The SLURM allocator: ``nodes`` nodes from SLURM. One ``srun`` makes the mesh's job
and runs an agent per node as its step (``--input=all`` hands every task the
configuration, TLS-3). The job lasts as long as its ``srun``, which runs detached
from this process (its own session), so that the mesh outlives the kernel;
``scancel`` ends it all (``end``), and so does the end of the agents."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from monarch_kernel.errors import MeshSpecError, MeshStartError
from monarch_kernel.hosts._allocator import (
    AGENT_ARGS,
    READY,
    AgentConfig,
    AgentInfo,
    Allocation,
    stop_started,
)
from monarch_kernel.hosts._local import private_dir, state_dir


@dataclass(frozen=True)
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
    #: How long to wait for the nodes (the queue) and the agents; None: as long as
    #: SLURM queues the job (an interrupt still ends the wait, and the job).
    timeout: float | None = 600.0
    #: The job these hosts come from (``monarch_kernel.job``), kept in the state file.
    tag: str = ""
    #: The SLURM job's name (default: ``monarch-MESH``).
    job_name: str | None = None
    #: A folder that keeps ``srun``'s output (``MESH-*.out``); None: it is read for
    #: the agents' ready lines, then removed.
    log_dir: str | None = None

    kind = "slurm"
    remote = True
    shares_files = True

    @property
    def nhosts(self) -> int:
        return self.nodes

    def worker_env(self, per_host: dict[str, int]) -> dict[str, str]:
        return {}  # (each node's workers place themselves on its GPUs)

    def picked(self, indices: Sequence[int]) -> SlurmHosts:
        return replace(self, nodes=len(indices))  # SLURM picks the nodes

    def with_python(self, python: str) -> SlurmHosts:
        return replace(self, python=python)

    def describe(self) -> str:
        return f"{self.nodes} SLURM nodes"

    def srun_argv(self, name: str) -> list[str]:
        _need("srun")
        argv = [
            "srun",
            f"--nodes={self.nodes}",
            f"--ntasks={self.nodes}",
            "--ntasks-per-node=1",
            "--input=all",
            "--kill-on-bad-exit=0",
            f"--job-name={self.job_name or f'monarch-{name}'}",
        ]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.time_limit:
            argv.append(f"--time={self.time_limit}")
        if self.gpus_per_node:
            argv.append(f"--gpus-per-node={self.gpus_per_node}")
        return [*argv, *self.slurm_args, self.python, *AGENT_ARGS]

    def allocate(self, cfg: AgentConfig) -> Allocation:
        """Runs ``srun`` detached (its own session: it outlives this process, as the
        mesh does) and waits for every node's ready line in its output."""
        out_dir = Path(self.log_dir) if self.log_dir else private_dir(state_dir() / "launch")
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, out_path = tempfile.mkstemp(prefix=f"{cfg.name}-", suffix=".out", dir=out_dir)
        with os.fdopen(fd, "wb") as out:
            launcher = subprocess.Popen(
                self.srun_argv(cfg.name),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
            )
        assert launcher.stdin is not None
        launcher.stdin.write(cfg.to_line())
        launcher.stdin.close()
        deadline = time.monotonic() + (self.timeout if self.timeout is not None else math.inf)
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
        agents = sorted((a for a in map(AgentInfo.parse_ready, lines) if a), key=lambda a: node_order(a.host))
        if len(agents) < self.nodes:
            _end_launch(launcher, lines)
            said = "\n".join(lines).strip()[-1500:] or "(none)"
            raise stop_started(
                MeshStartError(
                    f"srun started {len(agents)} of {self.nodes} host agents "
                    f"{'' if self.timeout is None else f'within {self.timeout:g} s '}"
                    f"({' '.join(self.srun_argv(cfg.name)[:-3])}); its output:\n{said}",
                    mesh=cfg.name,
                ),
                [],
                cfg,
            )
        if not self.log_dir:
            Path(out_path).unlink(missing_ok=True)  # nothing more comes: the agents log on their hosts
        job = {"kind": "slurm", "job_id": agents[0].job_id, "launcher_pid": launcher.pid, "tag": self.tag}
        return Allocation(agents, job)


def node_order(host: str) -> tuple[tuple[int, int | str], ...]:
    """The key that puts node names in SLURM's order (its hostlists' ``h[1-64]``):
    numbers by value, so ``h2`` comes before ``h10``. The ranks of a SLURM mesh follow
    it, host by host."""
    return tuple((1, int(t)) if t.isdigit() else (0, t) for t in re.split(r"(\d+)", host) if t)


def _end_launch(launcher: subprocess.Popen[bytes], lines: list[str]) -> None:
    """Ends an ``srun`` that did not bring every agent up, and its job."""
    job_id = next((a.job_id for a in map(AgentInfo.parse_ready, lines) if a and a.job_id), "")
    if job_id:
        end({"kind": "slurm", "job_id": job_id})
    launcher.terminate()
    try:
        launcher.wait(10)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait(5)


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        raise MeshSpecError(f"{tool} is not installed here; SLURM meshes need SLURM's client commands")


def end(job: dict[str, Any]) -> bool:
    """Ends a mesh's SLURM job (``_allocator.release``). True if ``scancel`` took it
    (its agents end with it, wherever they run)."""
    if not job.get("job_id") or shutil.which("scancel") is None:
        return False
    return subprocess.run(["scancel", str(job["job_id"])], capture_output=True, timeout=30).returncode == 0


def end_reason(job: dict[str, Any], wait: float = 3.0, host: str | None = None) -> str | None:
    """Why a SLURM job's agents went away, in words, if the job has ended (state and
    reason from ``scontrol``, given ``wait`` s to record the end: the agents can go
    first); None for a job still running (``_allocator.end_reason``). A node alone
    (``host``) is told by the job's end too: SLURM ends the job with a lost node."""
    if not job.get("job_id") or shutil.which("scontrol") is None:
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


__all__ = ["SlurmHosts", "end", "end_reason"]
