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
- ``KubernetesJob``: pods from Kubernetes. Each mesh spawned on one of its host
  meshes is a Kubernetes Job of its own (a pod per host), deleted with the mesh.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monarch_kernel._compat import _unsupported
from monarch_kernel._job_commands import exec_command
from monarch_kernel._port_forward import PortForwarder
from monarch_kernel._shell import shell
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
    def apply_id(self) -> str | None:
        """The id of this application of the job (it marks the meshes spawned from
        it, for ``kill()``); None until it is applied."""
        return self._tag if self._applied else None

    @property
    def active(self) -> bool:
        """Whether the job has been applied (and not killed)."""
        return self._applied

    def apply(self, client_script: str | None = None) -> None:
        """Brings the job into existence; a no-op if it already is. Monarch's
        ``client_script`` (run the controller inside the allocation) is refused: this
        process is the controller; run it where the job's hosts can be reached."""
        if client_script is not None:
            raise MeshSpecError(
                f"apply(client_script={client_script!r}): this process is the controller; run the "
                "script itself (python script.py) on a host that reaches the job's hosts (a login node)"
            )
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
    """Nodes from SLURM: ``meshes={"trainers": 2}`` is a host mesh of 2 nodes. The
    arguments are Monarch's, in its order; each mesh spawned on a host mesh is a
    SLURM job of its own (one ``srun``), so they become ``srun`` options:
    ``job_name``, ``time_limit``, ``partition``, ``gpus_per_node``,
    ``cpus_per_task``, ``mem``, ``account``, ``qos``, ``exclusive`` (other users'
    jobs kept off the nodes: this user's other meshes may share them), then
    ``slurm_args`` as given. ``log_dir`` keeps ``srun``'s output;
    ``job_start_timeout`` bounds the wait in SLURM's queue (None: no bound).
    ``python_exe`` runs the agents and workers (default: this interpreter's path,
    for a shared filesystem). What has no meaning here (``monarch_port``, more than
    one task per node, a gateway for a controller outside the cluster) is refused
    with the reason (docs/monarch-compat.md)."""

    def __init__(
        self,
        meshes: Mapping[str, int],
        python_exe: str | None = None,
        slurm_args: Sequence[str] = (),
        monarch_port: int | None = None,
        job_name: str | None = None,
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: float | None = None,
        account: str | None = None,
        qos: str | None = None,
        out_of_cluster: bool = False,
        attach_to: str | None = None,
        bind_to: str | None = None,
        *,
        python: str | None = None,
    ) -> None:
        super().__init__()
        _refuse_slurm_options(monarch_port, ntasks_per_node, out_of_cluster, attach_to, bind_to)
        self._meshes: dict[str, int] = {}
        for name, n in meshes.items():
            self.add_mesh(name, n)
        self._python = _python(python, python_exe)
        options = {
            "job-name": job_name,
            "time": time_limit,
            "partition": partition,
            "gpus-per-node": gpus_per_node,
            "cpus-per-task": cpus_per_task,
            "mem": mem,
            "account": account,
            "qos": qos,
            "exclusive": "user" if exclusive else None,
        }
        self._srun_args = [f"--{k}={v}" for k, v in options.items() if v is not None] + list(slurm_args)
        self._log_dir = os.path.abspath(log_dir) if log_dir is not None else None
        self._start_timeout = job_start_timeout

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Adds host mesh ``name`` of ``num_nodes`` nodes."""
        if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
            raise MeshSpecError(f"SlurmJob mesh {name!r} needs a positive number of nodes, not {num_nodes!r}")
        self._meshes[name] = num_nodes

    def _state(self) -> JobState:
        return JobState(
            {
                name: HostMesh(
                    SlurmHosts(
                        n,
                        self._python,
                        slurm_args=list(self._srun_args),
                        timeout=self._start_timeout,
                        tag=self._tag,
                        log_dir=self._log_dir,
                    )
                )
                for name, n in self._meshes.items()
            }
        )

    def _spec(self) -> Any:
        return (self._meshes, self._python, self._srun_args, self._log_dir, self._start_timeout)


@dataclass(frozen=True)
class ImageSpec:
    """Monarch's container image of a mesh's pods, with resource requests and limits
    (e.g. ``{"nvidia.com/gpu": 8}``); the image must have monarch-kernel installed."""

    image: str
    resources: dict[str, str | int] | None = None


@dataclass(frozen=True)
class KubeConfig:
    """Monarch's way to name the cluster: ``KubeConfig.from_path(path)``, or
    ``KubeConfig()`` for the user's kubeconfig, else the in-cluster service account."""

    local: str | None = None

    @classmethod
    def from_path(cls, path: str) -> KubeConfig:
        return cls(local=os.path.expanduser(path))

    @classmethod
    def from_config(cls, config: Any) -> KubeConfig:
        raise MeshSpecError(
            "KubeConfig.from_config: give the cluster as a kubeconfig file instead "
            "(KubeConfig.from_path(path)); the job is saved as plain data (dump(), job_load())"
        )

    @property
    def out_of_cluster(self) -> bool:
        return self.local is not None


class KubernetesJob(JobTrait):
    """Pods from Kubernetes: each mesh spawned on one of its host meshes is a
    Kubernetes Job of its own (a pod per host, an agent in each), deleted with the
    mesh (``stop()``, ``monarch-kernel down``, ``kill()``) or by Kubernetes after the
    agents' idle timeout::

        job = KubernetesJob(namespace="research", meshes={"trainers": 4}, image="registry/team/train:latest",
                            gpus_per_pod=8, labels={"team": "nlp"})
        procs = job.state().trainers.spawn_procs(per_host={"gpus": 8}, name="train")

    Monarch's form works as well: ``KubernetesJob(namespace)`` then
    ``add_mesh(name, num_replicas, image_spec=ImageSpec(image, resources))``.
    ``kubeconfig`` (a path or ``KubeConfig``) names the cluster (default: the user's
    kubeconfig, else the in-cluster service account); ``timeout`` bounds the wait for
    the pods to be Ready (None: no bound); ``python`` is the interpreter in the image
    that has monarch-kernel (default ``python``). The account needs to create and
    delete Jobs, Secrets and Pods in the namespace (README: Kubernetes)."""

    def __init__(
        self,
        namespace: str,
        timeout: int | None = None,
        kubeconfig: KubeConfig | str | None = None,
        attach_to: str | None = None,
        *,
        meshes: Mapping[str, int] | None = None,
        image: str | None = None,
        gpus_per_pod: int | None = None,
        labels: Mapping[str, str] | None = None,
        python: str = "python",
    ) -> None:
        super().__init__()
        if attach_to is not None:
            raise MeshSpecError(
                f"KubernetesJob(attach_to={attach_to!r}): this controller talks to each pod's agent "
                "directly; run it where the pods' addresses can be reached (inside the cluster, or on a "
                "network routed to the pods)"
            )
        if isinstance(kubeconfig, KubeConfig):
            kubeconfig = kubeconfig.local
        self._namespace = namespace
        self._timeout = timeout
        self._kubeconfig = os.path.abspath(os.path.expanduser(kubeconfig)) if kubeconfig else None
        self._python = python
        self._meshes: dict[str, dict[str, Any]] = {}
        self._defaults: dict[str, Any] = {
            "image": image,
            "gpus_per_pod": gpus_per_pod,
            "labels": dict(labels or {}),
        }
        for name, n in (meshes or {}).items():
            self.add_mesh(name, n)

    def add_mesh(
        self,
        name: str,
        num_replicas: int,
        label_selector: str | None = None,
        pod_rank_label: str = "apps.kubernetes.io/pod-index",
        image_spec: ImageSpec | None = None,
        port: int = 26600,
        pod_template: Any = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Adds host mesh ``name`` of ``num_replicas`` pods. With an image
        (``image_spec``, or the job's ``image``) each mesh spawned on it makes its
        pods; without one, as in Monarch, it attaches to ``num_replicas`` standing
        pods made elsewhere (``monarch-kernel k8s-pool``), found by ``label_selector``
        (default: Monarch's labels of mesh ``name``'s worker pods) and ranked by
        ``pod_rank_label``. ``pod_template`` is refused with why."""
        if not isinstance(num_replicas, int) or isinstance(num_replicas, bool) or num_replicas < 1:
            raise MeshSpecError(
                f"KubernetesJob mesh {name!r} needs a positive number of pods, not {num_replicas!r}"
            )
        if pod_template is not None:
            raise MeshSpecError(
                f"KubernetesJob.add_mesh({name!r}, pod_template=): pod templates are not supported yet; give "
                "image_spec=ImageSpec(image, resources) and the job makes the pods"
            )
        if label_selector is not None and image_spec is not None:
            raise MeshSpecError(
                f"KubernetesJob.add_mesh({name!r}): label_selector (pods made elsewhere) and image_spec (pods "
                "this job makes) exclude each other, as in Monarch"
            )
        image = image_spec.image if image_spec is not None else self._defaults["image"]
        if label_selector is not None or not image:
            from monarch_kernel.hosts import default_selector

            self._meshes[name] = {
                "pods": num_replicas,
                "selector": label_selector or default_selector(name),
                "rank_label": pod_rank_label,
                "port": port,
            }
            return
        resources = {
            str(k): str(v) for k, v in ((image_spec.resources if image_spec else None) or {}).items()
        }
        gpus = resources.pop("nvidia.com/gpu", None) or self._defaults["gpus_per_pod"]
        self._meshes[name] = {
            "pods": num_replicas,
            "image": image,
            "gpus_per_pod": int(gpus) if gpus else None,
            "resources": resources,
            "labels": {**self._defaults["labels"], **dict(labels or {})},
            "port": port,
        }

    def _state(self) -> JobState:
        from monarch_kernel.hosts import KubernetesPods

        return JobState(
            {
                name: HostMesh(
                    KubernetesPods(
                        m["pods"],
                        self._namespace,
                        m.get("image", ""),
                        python=self._python,
                        gpus_per_pod=m.get("gpus_per_pod"),
                        labels=m.get("labels", {}),
                        kubeconfig=self._kubeconfig,
                        port=m["port"],
                        resources=m.get("resources", {}),
                        timeout=self._timeout,
                        tag=self._tag,
                        selector=m.get("selector", ""),
                        rank_label=m.get("rank_label", "apps.kubernetes.io/pod-index"),
                    )
                )
                for name, m in self._meshes.items()
            }
        )

    def _spec(self) -> Any:
        return (self._namespace, self._meshes, self._kubeconfig, self._python, self._timeout)


def _refuse_slurm_options(
    monarch_port: int | None,
    ntasks_per_node: int,
    out_of_cluster: bool,
    attach_to: str | None,
    bind_to: str | None,
) -> None:
    """Monarch's ``SlurmJob`` options that have no meaning here, each refused with why
    (their defaults pass)."""
    if monarch_port is not None:
        raise MeshSpecError(
            f"SlurmJob(monarch_port={monarch_port}): each node's host agent listens on a free port and "
            "reports it, so several meshes can share a node; leave monarch_port out"
        )
    if ntasks_per_node != 1:
        raise MeshSpecError(
            f"SlurmJob(ntasks_per_node={ntasks_per_node}): one host agent runs per node and starts the "
            "procs spawn_procs asks for, e.g. spawn_procs(per_host={'gpus': 8}); leave ntasks_per_node at 1"
        )
    if out_of_cluster or attach_to is not None or bind_to is not None:
        raise MeshSpecError(
            "SlurmJob(out_of_cluster=, attach_to=, bind_to=): this controller talks to each node's agent "
            "directly, on the address of the node that faces it; run it where it can reach the nodes "
            "(a login node), or reach them with SSHJob through the user's ssh configuration (ProxyJump)"
        )


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


# -- the project's current job ------------------------------------------------------

_MONARCH_DIR = Path(".monarch")


def _context_dir() -> Path:
    """The current context's folder: where ``DEFAULT_JOB_PATH`` links to (``default``
    until a link is made)."""
    link = Path(DEFAULT_JOB_PATH)
    if link.is_symlink():
        return _MONARCH_DIR / Path(os.readlink(link)).parent
    return _MONARCH_DIR / "default"


def set_current_job(module_path: str) -> None:
    """Makes the job at ``module_path`` (``"package.module.attr"``, a ``JobTrait``)
    the project's current one, as Monarch does: its path is kept in
    ``.monarch/<context>/spec``, and ``DEFAULT_JOB_PATH`` becomes a link to the
    context's saved state (a plain file there moves into the ``default`` context)."""
    if not isinstance(module_path, str) or "." not in module_path:
        raise MeshSpecError(
            f"set_current_job: give 'module.attr' (where the job is defined), not {module_path!r}"
        )
    link = Path(DEFAULT_JOB_PATH)
    _MONARCH_DIR.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        default = _MONARCH_DIR / "default"
        default.mkdir(parents=True, exist_ok=True)
        if link.exists():
            link.rename(default / "state.pkl")
        link.symlink_to(Path("default") / "state.pkl")
    spec = _context_dir() / "spec"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(module_path)


def load_current_job() -> JobTrait:
    """A new instance of the project's current job (``set_current_job``), not yet
    applied: its ``state()`` applies it, or takes the saved state if it still fits."""
    import importlib

    spec = _context_dir() / "spec"
    try:
        module_path = spec.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no current job: {spec} does not exist; name one with set_current_job('module.attr')"
        ) from None
    module, _, attr = module_path.rpartition(".")
    job = getattr(importlib.import_module(module), attr, None)
    if not isinstance(job, JobTrait):
        raise TypeError(
            f"{module_path} must be a JobTrait (set_current_job names it), not {type(job).__name__}"
        )
    return job


def hosts_from_config(name: str) -> HostMesh:
    """The host mesh ``name`` of the project's configuration: the current job's
    (``set_current_job``), else the job saved at ``DEFAULT_JOB_PATH``; with neither,
    this host, so the same code runs on a laptop and on a cluster."""
    job: JobTrait | None = None
    if (_context_dir() / "spec").exists():
        job = load_current_job()
    elif Path(DEFAULT_JOB_PATH).exists():
        job = job_load(DEFAULT_JOB_PATH)
    if job is None:
        return this_host()
    return getattr(job.state(), name)


# -- Monarch's names that have no meaning here ---------------------------------------

#: Monarch's environment variables for its host identities; nothing here reads them.
SERVICE_PROC_IDS_ENV = "MONARCH_SERVICE_PROC_IDS"
SERVICE_PROC_RANK_ENV = "MONARCH_SERVICE_PROC_RANK"

_IDENTITIES = "host agents are addressed by address and mesh token, not by Monarch's service ProcIds"
deserialize_service_proc_ids = _unsupported("deserialize_service_proc_ids", _IDENTITIES)
new_service_proc_id = _unsupported("new_service_proc_id", _IDENTITIES)
ranked_service_proc_id_from_env = _unsupported("ranked_service_proc_id_from_env", _IDENTITIES)
serialize_service_proc_ids = _unsupported("serialize_service_proc_ids", _IDENTITIES)
service_proc_addr = _unsupported("service_proc_addr", _IDENTITIES)
service_proc_addrs = _unsupported("service_proc_addrs", _IDENTITIES)
MeshAdminConfig = _unsupported(
    "MeshAdminConfig", "monarch-kernel ls / status and the Meshes panel show every mesh, its hosts and ranks"
)
TelemetryConfig = _unsupported(
    "TelemetryConfig",
    "procs.status(), the usage figures of the Meshes panel, and span / traced for your own spans",
)


__all__ = [
    "DEFAULT_JOB_PATH",
    "ImageSpec",
    "JobState",
    "JobTrait",
    "KubeConfig",
    "KubernetesJob",
    "LocalJob",
    "MeshAdminConfig",
    "PortForwarder",
    "ProcessJob",
    "SERVICE_PROC_IDS_ENV",
    "SERVICE_PROC_RANK_ENV",
    "SSHJob",
    "SlurmJob",
    "TelemetryConfig",
    "deserialize_service_proc_ids",
    "exec_command",
    "hosts_from_config",
    "job_load",
    "job_loads",
    "load_current_job",
    "new_service_proc_id",
    "ranked_service_proc_id_from_env",
    "serialize_service_proc_ids",
    "service_proc_addr",
    "service_proc_addrs",
    "set_current_job",
    "shell",
]
