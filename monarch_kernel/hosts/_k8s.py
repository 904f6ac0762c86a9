"""The Kubernetes allocator: ``pods`` pods in a namespace, one host agent in each.

A mesh on Kubernetes is one batch/v1 **Job** of its own (Indexed: a pod per host,
ranked by its completion index), the way a mesh on SLURM is one ``srun``:

- the pods are the Job's (owner references), labelled with the mesh, the job that
  spawned it and the user's labels; deleting the Job (``end``: ``stop()``, ``%mesh
  down``, ``job.kill()``) deletes them, and Kubernetes deletes a Job whose agents all
  ended at their idle timeout (``ttlSecondsAfterFinished``), pods with it;
- a pod that fails is not replaced (``backoffLimitPerIndex: 0``): a lost pod is a
  lost host, reported with the reason Kubernetes gives (``end_reason``), and the
  other pods go on;
- the agent's configuration (the mesh's token and TLS key, TLS-3) is a Secret owned
  by the Job, handed to the container as one environment variable that the agent
  reads and removes before anything else starts; the pod's own address reaches the
  agent through the downward API (``status.podIP``), and the agent listens on a
  fixed port, which a readiness probe checks, so the controller connects to
  ``POD_IP:PORT`` once the pod is Ready.

The API is reached with the ``kubernetes`` client and the user's kubeconfig
(``$KUBECONFIG``, ``~/.kube/config``, or the path given), else the in-cluster service
account."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from monarch_kernel.errors import MeshSpecError, MeshStartError
from monarch_kernel.hosts._allocator import AGENT_ARGS, AgentConfig, AgentInfo, Allocation

#: The port the agent listens on in its pod (Monarch's default worker port).
DEFAULT_PORT = 26600
#: The label that ranks a mesh's pods (the Job controller sets it).
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
#: The label that ranks a pool's pods (the StatefulSet controller sets it; Monarch's
#: ``pod_rank_label`` default).
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
#: Monarch's label of a worker pod, and its value.
WORKER_LABEL = "app.kubernetes.io/name"
#: Labels every pod of a mesh carries (Monarch's names for a worker pod, and ours).
MESH_LABEL = "monarch.pytorch.org/mesh-name"
JOB_LABEL = "monarch-kernel/job"
#: The environment variables the agent's container gets.
CONFIG_ENV = "MONARCH_AGENT_CONFIG"
POD_IP_ENV = "MONARCH_BIND_HOST"
PORT_ENV = "MONARCH_AGENT_PORT"
#: Seconds Kubernetes keeps a Job whose agents all ended (their idle timeout).
FINISHED_TTL_S = 30
#: Seconds without any pod before ``spawn_procs`` says so (whatever its timeout).
NO_POD_S = 30.0
#: Seconds ``end_reason`` gives the kubelet to report how one pod ended.
HOST_WAIT_S = 2.0


def api_client(kubeconfig: str | None) -> Any:
    """A ``kubernetes`` ApiClient: ``kubeconfig`` (a path), else the user's kubeconfig,
    else the in-cluster service account; a clear error if there is none."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise MeshSpecError(
            "Kubernetes meshes need the kubernetes client: pip install 'monarch-kernel[k8s]' "
            "(or pip install kubernetes)"
        ) from None
    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        try:
            return config.new_client_from_config()
        except (config.ConfigException, OSError, TypeError):
            conf = client.Configuration()
            config.load_incluster_config(client_configuration=conf)
            return client.ApiClient(conf)
    except (config.ConfigException, OSError) as e:
        raise MeshSpecError(
            f"cannot reach the Kubernetes API: {e}. Give KubernetesJob(kubeconfig=...) a kubeconfig, set "
            "$KUBECONFIG, or run inside the cluster with a service account"
        ) from None


def dns_name(text: str) -> str:
    """``text`` as part of a DNS label (RFC 1123): lower case, letters, digits and '-'."""
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return out[:40] or "mesh"


@dataclass(frozen=True)
class KubernetesPods:
    """``pods`` pods of ``image`` in ``namespace``, an agent in each (see the module
    docstring). ``python`` is the interpreter in the image that has monarch-kernel."""

    pods: int
    namespace: str
    image: str
    python: str = "python"
    gpus_per_pod: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    kubeconfig: str | None = None
    port: int = DEFAULT_PORT
    #: Resource requests and limits of the agent's container beyond GPUs.
    resources: dict[str, str] = field(default_factory=dict)
    #: How long to wait for every pod to be Ready; None: as long as it takes.
    timeout: float | None = 600.0
    #: The job these hosts come from (``monarch_kernel.job``), kept in the state file.
    tag: str = ""
    #: Pods made elsewhere to attach to, instead of making a Job: a label selector
    #: (standing agents, ``pool_manifests``) and the label that ranks them.
    selector: str = ""
    rank_label: str = POD_INDEX_LABEL

    kind = "k8s"
    remote = True
    shares_files = False

    @property
    def nhosts(self) -> int:
        return self.pods

    def worker_env(self, per_host: dict[str, int]) -> dict[str, str]:
        gpus = per_host.get("gpus")
        if gpus and self.gpus_per_pod is not None and gpus > self.gpus_per_pod:
            raise MeshSpecError(
                f"per_host={{'gpus': {gpus}}} asks for more GPUs than each pod has ({self.gpus_per_pod}); "
                f"give KubernetesJob(gpus_per_pod={gpus}) or ask for fewer"
            )
        return {}

    def picked(self, indices: Sequence[int]) -> KubernetesPods:
        return replace(self, pods=len(indices))  # the scheduler picks the nodes

    def with_python(self, python: str) -> KubernetesPods:
        return replace(self, python=python)

    def describe(self) -> str:
        if self.selector:
            return f"{self.pods} Kubernetes pods with labels {self.selector} in namespace {self.namespace}"
        return f"{self.pods} Kubernetes pods of {self.image} in namespace {self.namespace}"

    def job_body(self, name: str, mesh: str) -> dict[str, Any]:
        """The batch/v1 Job of a mesh (see the module docstring)."""
        labels = {**self.labels, MESH_LABEL: dns_name(mesh), JOB_LABEL: name}
        labels.setdefault(WORKER_LABEL, "monarch-worker")
        container = agent_container(
            self.image, self.python, name, self.port, self.gpus_per_pod, self.resources
        )
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "completionMode": "Indexed",
                "completions": self.pods,
                "parallelism": self.pods,
                "backoffLimitPerIndex": 0,
                "ttlSecondsAfterFinished": FINISHED_TTL_S,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"restartPolicy": "Never", "containers": [container]},
                },
            },
        }

    def allocate(self, cfg: AgentConfig) -> Allocation:
        """Creates the mesh's Secret and Job, and waits until every pod is Ready (or,
        with ``selector``, attaches to standing pods: ``_attach``)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = api_client(self.kubeconfig)
        if self.selector:
            return self._attach(client.CoreV1Api(api), cfg)
        core: Any = client.CoreV1Api(api)
        batch: Any = client.BatchV1Api(api)
        name = f"monarch-{dns_name(cfg.name)}-{secrets.token_hex(3)}"
        job = {"kind": "k8s", "name": name, "namespace": self.namespace, "kubeconfig": self.kubeconfig or ""}
        job["tag"] = self.tag
        secret = {"metadata": {"name": name}, "stringData": {"config": cfg.to_line().decode()}}
        try:
            core.create_namespaced_secret(self.namespace, secret)
            made = batch.create_namespaced_job(self.namespace, self.job_body(name, cfg.name))
            owner = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": made.metadata.uid,
                "blockOwnerDeletion": True,
            }
            core.patch_namespaced_secret(name, self.namespace, {"metadata": {"ownerReferences": [owner]}})
        except ApiException as e:
            end_quietly(job)
            raise MeshStartError(
                f"Kubernetes refused the mesh's Job in namespace {self.namespace!r}: {_said(e)}. "
                "The account needs to create Jobs and Secrets there (README: Kubernetes)",
                mesh=cfg.name,
            ) from None
        except Exception as e:  # the API went away meanwhile (urllib3, OSError)
            end_quietly(job)
            raise MeshStartError(
                f"cannot reach the Kubernetes API at {api.configuration.host}: {e}", mesh=cfg.name
            ) from None
        try:
            pods = self._wait_ready(core, job_selector(job), INDEX_LABEL, cfg.name, f"pods of Job {name}")
        except BaseException:  # an interrupt too: nothing may stay scheduled
            end_quietly(job)
            raise
        agents = [
            AgentInfo(addr=f"{p.status.pod_ip}:{self.port}", pid=0, host=p.metadata.name, job_id=name)
            for p in pods
        ]
        return Allocation(agents, job)

    def _attach(self, core: Any, cfg: AgentConfig) -> Allocation:
        """Standing pods made elsewhere (``pool_manifests``): ranks 0 to ``pods``-1 of
        the pods ``selector`` finds, once Ready; the mesh takes their credentials (from
        the Secret their agents' configuration comes from). A pod whose agent already
        serves a mesh is refused, not taken over."""
        from kubernetes.client.rest import ApiException

        from monarch_kernel.control import AgentClient

        pods = self._wait_ready(
            core, self.selector, self.rank_label, cfg.name, f"pods with labels {self.selector}"
        )
        ref = next(
            (e.value_from.secret_key_ref for e in pods[0].spec.containers[0].env or []
             if e.name == CONFIG_ENV and e.value_from and e.value_from.secret_key_ref),
            None,
        )  # fmt: skip
        if ref is None:
            raise MeshStartError(
                f"pod {pods[0].metadata.name} does not run a monarch-kernel agent from a Secret ({CONFIG_ENV}); "
                "make the pods with `monarch-kernel k8s-pool`",
                mesh=cfg.name,
            )
        try:
            secret = core.read_namespaced_secret(ref.name, self.namespace)
            import base64

            pool = AgentConfig.from_line(base64.b64decode((secret.data or {})[ref.key]))
        except (ApiException, KeyError) as e:
            raise MeshStartError(
                f"cannot read the pool's Secret {ref.name}: {getattr(e, 'reason', e)}; the account needs to get "
                "secrets in the namespace (README: Kubernetes)",
                mesh=cfg.name,
            ) from None
        ca = (pool.tls or {}).get("ca", "")
        agents = []
        for p in pods:
            port = next(
                (cp.container_port for cp in p.spec.containers[0].ports or [] if cp.name == "monarch"),
                self.port,
            )
            agent = AgentInfo(addr=f"{p.status.pod_ip}:{port}", pid=0, host=p.metadata.name)
            state = AgentClient(agent.addr, pool.token, ca or None).ping(timeout=10)
            if state["epoch"] > 0:
                raise MeshStartError(
                    f"pod {p.metadata.name} serves a mesh already; stop it first (monarch-kernel down), or give "
                    "the pool more replicas",
                    mesh=cfg.name,
                )
            agents.append(agent)
        job = {"kind": "k8s", "namespace": self.namespace, "selector": self.selector, "attached": True}
        job |= {"kubeconfig": self.kubeconfig or "", "tag": self.tag}
        return Allocation(agents, job, token=pool.token, ca=ca)

    def _wait_ready(self, core: Any, selector: str, rank_label: str, mesh: str, what: str) -> list[Any]:
        """The pods ``selector`` finds, ranks 0 to ``pods``-1 by ``rank_label``, once
        all are Ready; a pod that fails first, the timeout, or no pod at all after
        ``NO_POD_S`` (a selector that matches nothing, a Job whose pods are refused)
        raises ``MeshStartError`` with what Kubernetes says."""
        started = time.monotonic()
        deadline = started + (self.timeout if self.timeout is not None else float("inf"))
        seen: list[Any] = []
        while True:
            seen = core.list_namespaced_pod(self.namespace, label_selector=selector).items
            if not seen and time.monotonic() - started > NO_POD_S:
                raise MeshStartError(
                    f"no pod has the labels {selector} in namespace {self.namespace!r} after {NO_POD_S:g} s; "
                    + (
                        "make them with `monarch-kernel k8s-pool NAME` (the selector is Monarch's for mesh NAME)"
                        if self.selector
                        else f"see `kubectl -n {self.namespace} describe job` (a quota or admission refusing them?)"
                    ),
                    mesh=mesh,
                )
            by_index = {_rank(p, rank_label): p for p in seen}
            for p in seen:
                why = pod_end(p)
                if why and not _restarts(p):
                    raise MeshStartError(f"{why} before its host agent started", mesh=mesh)
            ready = [by_index[i] for i in range(self.pods) if i in by_index and _ready(by_index[i])]
            if len(ready) == self.pods:
                return ready
            if time.monotonic() > deadline:
                waiting = "; ".join(_waiting(p) for p in seen) or "no pod was created"
                raise MeshStartError(
                    f"{len(ready)} of {self.pods} {what} were Ready within {self.timeout:g} s "
                    f"({waiting}); see `kubectl -n {self.namespace} describe pods -l {selector}`",
                    mesh=mesh,
                )
            time.sleep(0.2)


def agent_container(
    image: str,
    python: str,
    secret: str,
    port: int,
    gpus: int | None,
    resources: dict[str, str],
    standing: bool = False,
) -> dict[str, Any]:
    """The container of a pod that runs a host agent: its configuration from Secret
    ``secret``, its address from the downward API, ``port`` checked by a readiness
    probe; ``standing``: it waits for a controller as long as it takes (a pool)."""
    limits = dict(resources)
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    container: dict[str, Any] = {
        "name": "agent",
        "image": image,
        "command": [python, *AGENT_ARGS, "--config-env", *(["--standing"] if standing else [])],
        "env": [
            {"name": CONFIG_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": "config"}}},
            {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": PORT_ENV, "value": str(port)},
        ],
        "ports": [{"name": "monarch", "containerPort": port}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
    }
    if limits:
        container["resources"] = {"limits": limits, "requests": limits}
    return container


def worker_labels(mesh: str) -> dict[str, str]:
    """Monarch's labels of mesh ``mesh``'s worker pods."""
    return {WORKER_LABEL: "monarch-worker", MESH_LABEL: dns_name(mesh)}


def default_selector(mesh: str) -> str:
    """Monarch's label selector of mesh ``mesh``'s worker pods (its attach form)."""
    return ",".join(f"{k}={v}" for k, v in worker_labels(mesh).items())


def job_selector(job: dict[str, Any]) -> str:
    """The label selector of a mesh's pods, from its job record: those of its Job, or
    those of the pool it attached to."""
    return str(job["selector"]) if job.get("attached") else f"{JOB_LABEL}={job['name']}"


def _rank(pod: Any, label: str) -> int:
    try:
        return int((pod.metadata.labels or {}).get(label, -1))
    except ValueError:
        return -1


def _restarts(pod: Any) -> bool:
    """Whether the pod restarts its container (a pool's): an ended container is not its end."""
    return (pod.spec.restart_policy or "Always") != "Never"


def _ready(pod: Any) -> bool:
    return bool(pod.status.pod_ip) and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


def _waiting(pod: Any) -> str:
    """What a pod that is not Ready waits for, in words."""
    st = pod.status
    for c in st.conditions or []:
        if c.type == "PodScheduled" and c.status != "True":
            return f"{pod.metadata.name} is not scheduled: {c.message or c.reason}"
    for cs in st.container_statuses or []:
        if cs.state and cs.state.waiting:
            return f"{pod.metadata.name} waits: {cs.state.waiting.reason} {cs.state.waiting.message or ''}".strip()
    return f"{pod.metadata.name} is {st.phase}"


def pod_end(pod: Any) -> str | None:
    """Why ``pod`` ended (or is ending), in Kubernetes' words; None while it runs."""
    name, st = pod.metadata.name, pod.status
    disruption = next(
        (c for c in st.conditions or [] if c.type == "DisruptionTarget" and c.status == "True"), None
    )
    if st.reason == "Evicted":
        return f"pod {name} was evicted: {st.message or 'no reason given'}"
    if disruption is not None:
        return f"pod {name} was disrupted ({disruption.reason}: {disruption.message or ''})".replace(
            ": )", ")"
        )
    if pod.metadata.deletion_timestamp is not None:
        return f"pod {name} was deleted"
    for cs in st.container_statuses or []:
        t = cs.state.terminated if cs.state else None
        if t is not None:
            if t.reason == "OOMKilled":
                return f"pod {name}'s container was OOM-killed (exit {t.exit_code}): it needs more memory"
            return f"pod {name}'s container ended ({t.reason or 'exit'} {t.exit_code}{': ' + t.message if t.message else ''})"
    if st.phase in ("Failed", "Succeeded"):
        return f"pod {name} {st.phase.lower()}{': ' + st.message if st.message else ''}"
    return None


def _said(e: Any) -> str:
    try:
        return str(json.loads(e.body).get("message") or e.reason)
    except (TypeError, ValueError, AttributeError):
        return f"{e.status} {e.reason}"


def end_quietly(job: dict[str, Any]) -> None:
    """``delete_job(job)`` after a failed start, whose own error is the one to raise."""
    try:
        delete_job(job)
    except Exception:
        pass


def delete_job(job: dict[str, Any]) -> bool:
    """Deletes a mesh's Job, its pods and its Secret. True if the Job was there to
    delete. Standing pods a mesh attached to are not its own: they stay (their agents
    end with the mesh, and their pods restart them)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    if job.get("attached"):
        return False
    try:
        api = api_client(job.get("kubeconfig") or None)
    except MeshSpecError:
        return False
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    ns, name = job["namespace"], job["name"]
    found = False
    try:
        batch.delete_namespaced_job(name, ns, propagation_policy="Background")
        found = True
    except ApiException as e:
        if e.status != 404:
            raise
    # The garbage collector deletes the pods too; deleting them here ends them now.
    try:
        core.delete_collection_namespaced_pod(ns, label_selector=job_selector(job))
        core.delete_namespaced_secret(name, ns)
    except ApiException as e:
        if e.status != 404:
            raise
    return found


__all__ = [
    "KubernetesPods",
    "agent_container",
    "api_client",
    "default_selector",
    "delete_job",
    "end_quietly",
    "job_selector",
    "pod_end",
    "worker_labels",
]
