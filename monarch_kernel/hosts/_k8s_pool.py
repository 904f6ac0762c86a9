"""A pool of standing pods for Kubernetes meshes to attach to (Monarch's attach form of
``KubernetesJob.add_mesh``): the objects ``monarch-kernel k8s-pool`` prints."""

from __future__ import annotations

import secrets
from typing import Any

from monarch_kernel.hosts._allocator import AgentConfig, new_tls_identity
from monarch_kernel.hosts._k8s import DEFAULT_PORT, agent_container, dns_name, worker_labels


def pool_manifests(
    name: str,
    replicas: int,
    image: str,
    python: str = "python",
    gpus_per_pod: int | None = None,
    port: int = DEFAULT_PORT,
    idle_timeout: float = 24 * 3600.0,
) -> list[dict[str, Any]]:
    """A pool of ``replicas`` standing pods for meshes to attach to
    (``KubernetesJob.add_mesh(name, n)`` without an image): a Secret with the pool's
    credentials (a token and a TLS identity of its own) and a StatefulSet whose pods
    carry Monarch's labels (``app.kubernetes.io/name=monarch-worker``,
    ``monarch.pytorch.org/mesh-name=NAME``, ranked by ``apps.kubernetes.io/pod-index``)
    and each run an agent that waits for a controller. An agent serves one mesh and
    ends with it (or at ``idle_timeout`` after its controller went away); its pod
    restarts it for the next mesh."""
    secret = f"monarch-pool-{dns_name(name)}"
    cfg = AgentConfig(
        name=name,
        token=secrets.token_urlsafe(32),
        idle_timeout=idle_timeout,
        bind_host="auto",
        tls=new_tls_identity(),
    )
    labels = worker_labels(name)
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret, "labels": labels},
            "stringData": {"config": cfg.to_line().decode()},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": dns_name(name), "labels": labels},
            "spec": {
                "replicas": replicas,
                "serviceName": dns_name(name),
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            agent_container(image, python, secret, port, gpus_per_pod, {}, standing=True)
                        ]
                    },
                },
            },
        },
    ]


__all__ = ["pool_manifests"]
