"""The k8s test bed: a real Kubernetes control plane (kube-apiserver, etcd,
kube-controller-manager, kube-scheduler, kwok) on a test cluster's login host, with
the kubelet's part played by ``tools.k8s.kubelet`` (see ``_bed``)."""

from tools.k8s._bed import NAMESPACE, KubeBed, cache_dir, missing

__all__ = ["NAMESPACE", "KubeBed", "cache_dir", "missing"]
