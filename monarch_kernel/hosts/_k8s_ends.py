"""How a Kubernetes mesh ends: deleting its Job (``end``), and telling why its pods
went away in Kubernetes' words (``end_reason``), from a watch of its pods that each
session of the mesh starts (``follow``). ``_allocator`` reaches it as the "k8s" kind."""

from __future__ import annotations

import threading
import time
from typing import Any

from monarch_kernel.errors import MeshSpecError
from monarch_kernel.hosts._k8s import HOST_WAIT_S, api_client, delete_job, job_selector, pod_end


def end(job: dict[str, Any]) -> bool:
    """The kind's end (``_allocator.release``): stops following the mesh's pods, then
    deletes its Job, pods and Secret (``_k8s.delete_job``)."""
    with _lock:
        _done.add((str(job["namespace"]), job_selector(job)))
    return delete_job(job)


#: Why each pod of a followed mesh ended, as first seen: (namespace, pod) -> words;
#: forgotten when a pod of that name runs again.
#: The kubelet deletes a pod for good once its containers stopped, often before the
#: controller asks (an eviction's reason would be gone with it).
_ended: dict[tuple[str, str], str] = {}
#: The meshes followed (their selectors), and those whose end was asked for.
_followed: set[tuple[str, str]] = set()
_done: set[tuple[str, str]] = set()
_lock = threading.Lock()


def follow(job: dict[str, Any]) -> None:
    """Watches the mesh's pods (a thread of its own, until ``end``) and keeps how each
    ended, for ``end_reason`` (``_allocator.follow``: a session of the mesh starts)."""
    key = (str(job["namespace"]), job_selector(job))
    with _lock:
        if key in _followed:
            return
        _followed.add(key)
        _done.discard(key)
    threading.Thread(target=_watch, args=(job, key), name="monarch-k8s-watch", daemon=True).start()


def _watch(job: dict[str, Any], key: tuple[str, str]) -> None:
    from kubernetes import client, watch
    from kubernetes.client.rest import ApiException

    try:
        core = client.CoreV1Api(api_client(job.get("kubeconfig") or None))
    except MeshSpecError:
        return
    ns, selector = key
    while key not in _done:
        try:
            for ev in watch.Watch().stream(
                core.list_namespaced_pod, ns, label_selector=selector, timeout_seconds=10
            ):
                pod = ev["object"]
                why = pod_end(pod) or (
                    f"pod {pod.metadata.name} was deleted" if ev["type"] == "DELETED" else None
                )
                if why:  # the first words of its end are the ones to keep
                    _ended.setdefault((ns, pod.metadata.name), why)
                else:  # it runs (again: a pool's pod of the same name, restarted)
                    _ended.pop((ns, pod.metadata.name), None)
                if key in _done:
                    break
        except ApiException as e:
            if e.status in (401, 403):  # not allowed to watch pods: end_reason lists them instead
                break
            time.sleep(1.0)
        except Exception:  # the API went away for a while: look again
            time.sleep(1.0)
    with _lock:
        _followed.discard(key)


def end_reason(job: dict[str, Any], wait: float = 3.0, host: str | None = None) -> str | None:
    """Why the agent of pod ``host`` (or, without it, every agent of the mesh) went
    away, in Kubernetes' words; None while it runs. Given ``wait`` s for Kubernetes
    to record the end (the agent can go first), and at least ``HOST_WAIT_S`` for one
    pod: its agent's connection breaks as the container ends, before the kubelet
    reports how it ended."""
    from kubernetes import client

    try:
        core: Any = client.CoreV1Api(api_client(job.get("kubeconfig") or None))
    except MeshSpecError:
        return None
    deadline = time.monotonic() + (wait if host is None else max(wait, HOST_WAIT_S))
    selector = job_selector(job)
    while True:
        if host is not None and (job["namespace"], host) in _ended:
            return _ended[(job["namespace"], host)]
        try:
            pods = core.list_namespaced_pod(
                job["namespace"],
                label_selector=selector,
                _request_timeout=max(1.0, deadline - time.monotonic()),
            ).items
        except Exception:  # ApiException; the API gone or silent (urllib3's errors): it cannot tell
            return None
        if host is not None:
            mine = [p for p in pods if p.metadata.name == host]
            why = (
                pod_end(mine[0]) if mine else _ended.get((job["namespace"], host), f"pod {host} was deleted")
            )
        else:
            ends = [pod_end(p) for p in pods]
            why = None if not pods or None in ends else "; ".join(e for e in ends if e)
            owner = f"pods {selector}" if job.get("attached") else f"Kubernetes Job {job['name']}"
            why = why and f"its {owner} ended: {why}"
        if why or time.monotonic() >= deadline:
            return why
        time.sleep(0.2)


__all__ = ["end", "end_reason", "follow"]
