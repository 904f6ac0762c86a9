"""Jobs: where meshes run, in the shapes of Monarch's ``monarch.job``.

A job is a declarative specification of host meshes; ``job.state()`` (which applies
the job first if needed) gives each as a ``HostMesh``, whose ``spawn_procs`` starts a
host agent on every host and the procs under them::

    from monarch_kernel.job import SlurmJob
    job = SlurmJob(meshes={"trainers": 2}, partition="gpu", time_limit="02:00:00", gpus_per_node=8)
    procs = job.state().trainers.spawn_procs(per_host={"gpus": 8}, name="train")

- ``LocalJob``: this host (``this_host()`` for every mesh name).
- ``SSHJob``: hosts reached with the user's ``ssh`` (config, keys, ProxyJump as they
  are); each mesh spawned on them gets an agent per host.
- ``SlurmJob``: nodes from SLURM. Each mesh spawned on one of its host meshes is a
  SLURM job of its own (one ``srun``), which ends with the mesh (``stop()``,
  ``monarch-kernel down``, the idle timeout) or at the time limit.

``job.kill()`` stops every mesh spawned from the job, whichever process controls it.

``dump()``/``dumps()`` and ``job_load()``/``job_loads()`` save and restore a job (it
is plain data); a named mesh is found again with ``attach(name)`` as well.
"""

from __future__ import annotations

import os
import pickle
import sys
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from monarch_kernel.controller import HostMesh, this_host
from monarch_kernel.errors import MeshSpecError
from monarch_kernel.hosts import SlurmHosts, SSHHosts

#: Where ``state()`` saves the job by default (as Monarch does).
DEFAULT_JOB_PATH = ".monarch/job_state.pkl"


class JobState:
    """The host meshes of an applied job, as attributes (``state.trainers``)."""

    def __init__(self, hosts: Mapping[str, HostMesh]) -> None:
        self._hosts = dict(hosts)

    def __getattr__(self, attr: str) -> HostMesh:
        try:
            return self._hosts[attr]
        except KeyError:
            names = ", ".join(sorted(self._hosts)) or "none"
            raise AttributeError(f"{attr!r} is not a host mesh of this job (it has: {names})") from None


class JobTrait(ABC):
    """A job: a specification, applied to a scheduler by ``apply()``; ``state()``
    gives its host meshes (see the module docstring)."""

    def __init__(self) -> None:
        self._applied = False
        #: Marks the meshes spawned from this job (in their state files), for kill().
        self._tag = uuid.uuid4().hex

    @property
    def active(self) -> bool:
        """Whether the job has been applied (and not killed)."""
        return self._applied

    def apply(self) -> None:
        """Brings the job into existence; a no-op if it already is."""
        if not self._applied:
            self._create()
            self._applied = True

    def state(self, cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
        """The job's host meshes, applying it first if needed; with ``cached_path``,
        the applied job is saved there (``job_load`` reads it back)."""
        if not self._applied:
            self.apply()
            if cached_path is not None:
                self.dump(cached_path)
        return self._state()

    def kill(self) -> None:
        """Ends the job: stops every mesh spawned from it (from any process). A mesh
        whose agents cannot be reached from here is left running, and once the others
        are stopped its ``MeshUnreachableError`` says where it runs."""
        from monarch_kernel.controller import stop_record
        from monarch_kernel.errors import MeshUnreachableError
        from monarch_kernel.hosts import registry

        unreached: list[MeshUnreachableError] = []
        for name in registry.names():
            rec = registry.read(name)
            if rec is not None and rec.job.get("tag") == self._tag:
                try:
                    stop_record(rec)
                except MeshUnreachableError as e:
                    unreached.append(e)
        self._applied = False
        if unreached:
            raise unreached[0]

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this job can stand in for ``spec`` (same kind and specification)."""
        return type(spec) is type(self) and spec._spec() == self._spec()

    def dump(self, filename: str) -> None:
        """Saves the job to ``filename`` (its folder is made if needed)."""
        os.makedirs(os.path.dirname(os.path.abspath(filename)), exist_ok=True)
        with open(filename, "wb") as f:
            f.write(self.dumps())

    def dumps(self) -> bytes:
        return pickle.dumps(self)

    def _create(self) -> None:  # noqa: B027 - most jobs have nothing to make up front
        """Makes what the job needs before its hosts can be used."""

    @abstractmethod
    def _state(self) -> JobState: ...

    @abstractmethod
    def _spec(self) -> Any: ...


class LocalJob(JobTrait):
    """This host, under every name in ``hosts``."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self._names = list(hosts)

    def _state(self) -> JobState:
        return JobState({n: this_host() for n in self._names})

    def _spec(self) -> Any:
        return self._names


class ProcessJob(JobTrait):
    """Monarch's job of local processes standing for hosts. Not here: raises on use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "monarch_kernel has no ProcessJob: use LocalJob (this host under each mesh name) or "
            "spawn_procs(per_host={'procs': N}); for several hosts, SSHJob or SlurmJob"
        )

    def _state(self) -> JobState:  # pragma: no cover (never constructed)
        raise NotImplementedError

    def _spec(self) -> Any:  # pragma: no cover
        raise NotImplementedError


def _python(python: str | None, python_exe: str | None) -> str:
    return python or python_exe or sys.executable


class SSHJob(JobTrait):
    """Hosts reached over ssh: ``SSHJob(hosts=["node1", "node2"])`` is one host mesh
    named ``hosts``; ``meshes={"trainers": [...], ...}`` or ``add_mesh()`` names more.
    ``python`` runs the agents and workers there (default: this interpreter's path,
    for a shared filesystem); ``ssh_args`` go before each host (e.g. ``["-F", cfg]``)."""

    def __init__(
        self,
        hosts: Sequence[str] | None = None,
        python: str | None = None,
        ssh_args: Sequence[str] = (),
        meshes: Mapping[str, Sequence[str]] | None = None,
        *,
        python_exe: str | None = None,
    ) -> None:
        super().__init__()
        self._python = _python(python, python_exe)
        self._ssh_args = list(ssh_args)
        self._meshes: dict[str, list[str]] = {k: list(v) for k, v in (meshes or {}).items()}
        if hosts is not None:
            self._meshes["hosts"] = list(hosts)
        for name, targets in self._meshes.items():
            _check_targets(name, targets)

    def add_mesh(self, name: str, hosts: Sequence[str]) -> None:
        """Adds host mesh ``name`` of ``hosts``."""
        _check_targets(name, list(hosts))
        self._meshes[name] = list(hosts)

    def _state(self) -> JobState:
        return JobState(
            {
                n: HostMesh(SSHHosts(targets, self._python, self._ssh_args, tag=self._tag))
                for n, targets in self._meshes.items()
            }
        )

    def _spec(self) -> Any:
        return (self._meshes, self._python, self._ssh_args)


def _check_targets(name: str, targets: list[str]) -> None:
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise MeshSpecError(f"host mesh {name!r} needs a list of host names, not {targets!r}")


class SlurmJob(JobTrait):
    """Nodes from SLURM: ``meshes={"trainers": 2}`` is a host mesh of 2 nodes. Options
    go to ``srun`` (``partition``, ``time_limit``, ``gpus_per_node``, and any others in
    ``slurm_args``)."""

    def __init__(
        self,
        meshes: Mapping[str, int],
        python: str | None = None,
        slurm_args: Sequence[str] = (),
        partition: str | None = None,
        time_limit: str | None = None,
        gpus_per_node: int | None = None,
        *,
        python_exe: str | None = None,
    ) -> None:
        super().__init__()
        for name, n in meshes.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise MeshSpecError(f"SlurmJob mesh {name!r} needs a positive number of nodes, not {n!r}")
        self._meshes = dict(meshes)
        self._python = _python(python, python_exe)
        self._slurm_args = list(slurm_args)
        self._partition, self._time_limit, self._gpus = partition, time_limit, gpus_per_node

    def _state(self) -> JobState:
        return JobState(
            {
                name: HostMesh(
                    SlurmHosts(
                        n,
                        self._python,
                        self._partition,
                        self._time_limit,
                        self._gpus,
                        list(self._slurm_args),
                        tag=self._tag,
                    )
                )
                for name, n in self._meshes.items()
            }
        )

    def _spec(self) -> Any:
        return (self._meshes, self._python, self._slurm_args, self._partition, self._time_limit, self._gpus)


def job_loads(data: bytes) -> JobTrait:
    """A job from ``JobTrait.dumps()``."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"not a job: {type(job).__name__}")
    return job


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """A job from ``JobTrait.dump()``."""
    with open(filename, "rb") as f:
        return job_loads(f.read())


__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "ProcessJob",
    "SSHJob",
    "SlurmJob",
    "job_load",
    "job_loads",
]
