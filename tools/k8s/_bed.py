"""``KubeBed``: a real Kubernetes control plane in a test cluster's login host, with
nodes that kwok keeps Ready and a kubelet part (``tools.k8s.kubelet``) that runs each
pod's command in a network namespace of the cluster.

- etcd, kube-apiserver (token authentication, RBAC), kube-controller-manager (the Job
  controller, garbage collection, service accounts), kube-scheduler and kwok, built
  from their Go modules (``build.sh``, cached outside the repository), all on the
  login host's loopback: nothing listens anywhere else;
- ``nodes`` nodes of ``gpus_per_node`` GPUs (``nvidia.com/gpu``), and ``pods`` test
  hosts (network namespaces) whose addresses become the pods' IPs;
- a namespace ``NAMESPACE`` with its default service account, and a kubeconfig
  (``kubeconfig``) with an administrator's token, for clients in the login host.

Everything runs in the cluster's namespaces, so ``down()`` (the cluster's removal)
ends it all, also after a crash (``Cluster.reap_stale``)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from tools.testcluster import Cluster, ClusterError
from tools.testcluster._programs import tail

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "k8s" / "build.sh"
VERSION = "v1.37.2"
NAMESPACE = "research"
API_PORT = 26443
ETCD_PORT = 23790
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def cache_dir() -> Path:
    base = os.environ.get("MONARCH_K8S_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "monarch-kernel", "k8s"
    )
    return Path(base) / VERSION


def missing() -> list[str]:
    """The control plane's binaries not in the cache (``build.sh`` builds them)."""
    return [b for b in BINARIES if not (cache_dir() / "bin" / b).exists()]


class KubeBed:
    """A Kubernetes control plane on a test cluster (see the module docstring)."""

    def __init__(self, cluster: Cluster, nodes: list[str]) -> None:
        self.cluster = cluster
        self.nodes = nodes
        self.dir = cluster.dir / "k8s"
        self.kubeconfig = self.dir / "kubeconfig"
        self.bin = cache_dir() / "bin"

    @classmethod
    def load(cls, name: str, nodes: int = 2) -> KubeBed:
        """The bed on the recorded cluster ``name`` (made by ``up(keep=True)``)."""
        return cls(Cluster.load(name), [f"node{i}" for i in range(nodes)])

    @classmethod
    def up(
        cls,
        pods: int = 4,
        nodes: int = 2,
        gpus_per_node: int = 8,
        name: str | None = None,
        *,
        keep: bool = False,
    ) -> KubeBed:
        """Brings the control plane up on a new cluster of ``pods`` hosts (neither
        sshd nor SLURM: the hosts are the pods' network namespaces, and run nothing
        but their pods); a failure removes what was made, then raises ``ClusterError``.
        ``keep``: the bed outlives this process (``Cluster.up``'s ``keep``)."""
        if gone := missing():
            raise ClusterError(f"the k8s test bed's binaries are not built ({', '.join(gone)}): run {BUILD}")
        cluster = Cluster.up(hosts=pods, slurm=False, ssh=False, name=name, keep=keep)
        bed = cls(cluster, [f"node{i}" for i in range(nodes)])
        try:
            bed._start(gpus_per_node)
        except BaseException:
            cluster.down()
            raise
        return bed

    def down(self) -> None:
        self.cluster.down()

    def __enter__(self) -> KubeBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- running commands in the login host -------------------------------------------

    def env(self) -> dict[str, str]:
        """Environment additions for clients in the login host."""
        return {**self.cluster.env(), "KUBECONFIG": str(self.kubeconfig)}

    def login_cmd(self, argv: list[str]) -> list[str]:
        return self.cluster.login_cmd(argv)

    def run_in_login(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        env = {**kwargs.pop("env", os.environ), **self.env()}
        return self.cluster.run_in_login(argv, env=env, **kwargs)

    def api(self, code: str, timeout: float = 60) -> str:
        """Runs Python ``code`` in the login host with ``core``, ``batch`` (the
        kubernetes client's APIs, as the administrator) and ``client`` defined; its
        standard output."""
        prelude = (
            "from kubernetes import client, config\n"
            f"api = config.new_client_from_config(config_file={str(self.kubeconfig)!r})\n"
            "core, batch = client.CoreV1Api(api), client.BatchV1Api(api)\n"
        )
        done = self.run_in_login(
            [sys.executable, "-c", prelude + code], cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode:
            raise ClusterError(f"the k8s API call failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done.stdout

    # -- bring-up ---------------------------------------------------------------------

    def _start(self, gpus_per_node: int) -> None:
        d = self.dir
        d.mkdir(mode=0o700)
        token = secrets.token_hex(16)
        self._certs()
        (d / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
        ca = (d / "ca.crt").read_text()
        import base64

        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: bed\n  cluster:\n    server: https://127.0.0.1:{API_PORT}\n"
            f"    certificate-authority-data: {base64.b64encode(ca.encode()).decode()}\n"
            f"users:\n- name: admin\n  user:\n    token: {token}\n"
            f"contexts:\n- name: bed\n  context:\n    cluster: bed\n    user: admin\n    namespace: {NAMESPACE}\n"
            "current-context: bed\n"
        )
        self.kubeconfig.chmod(0o600)
        login, daemons, b = self.cluster.login, self.cluster.daemons, self.bin
        etcd_url = f"http://127.0.0.1:{ETCD_PORT}"
        daemons.start(
            "etcd",
            login,
            [
                str(b / "etcd"),
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{ETCD_PORT + 10}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PORT + 10}",
                f"--initial-cluster=default=http://127.0.0.1:{ETCD_PORT + 10}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            d / "etcd.log",
        )
        daemons.start(
            "kube-apiserver",
            login,
            [
                str(b / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                f"--secure-port={API_PORT}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={d / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/24",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--profiling=false",
            ],
            d / "apiserver.log",
        )
        self._wait_api("/readyz", "", d / "apiserver.log", d / "etcd.log")
        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1"]
        daemons.start(
            "kube-controller-manager",
            login,
            [
                str(b / "kube-controller-manager"),
                *common,
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                "--use-service-account-credentials=false",
                "--controllers=*,-node-ipam-controller",
                "--profiling=false",
            ],
            d / "controller-manager.log",
        )
        daemons.start("kube-scheduler", login, [str(b / "kube-scheduler"), *common], d / "scheduler.log")
        stages = cache_dir() / "stages"
        daemons.start(
            "kwok",
            login,
            [
                str(b / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--server-address=127.0.0.1:10247",
                "-c",
                str(stages / "node-initialize.yaml"),
                "-c",
                str(stages / "node-heartbeat.yaml"),
            ],
            d / "kwok.log",
        )
        slots = ",".join(f"{h.ns}={h.addr}" for h in self.cluster.hosts)
        daemons.start(
            "the kubelet part",
            login,
            [
                sys.executable,
                "-m",
                "tools.k8s.kubelet",
                f"--kubeconfig={self.kubeconfig}",
                f"--nodes={','.join(self.nodes)}",
                f"--slots={slots}",
                f"--dir={d}",
            ],
            d / "kubelet.log",
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.api(_SETUP.format(nodes=self.nodes, gpus=gpus_per_node, ns=NAMESPACE), timeout=120)
        logs = [d / "controller-manager.log", d / "kwok.log", d / "scheduler.log"]
        self._wait_api(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default", token, *logs)
        for node in self.nodes:
            self._wait_api(f"/api/v1/nodes/{node}", token, *logs, want='"type":"Ready","status":"True"')

    def _wait_api(self, path: str = "/readyz", token: str = "", *logs: Path, want: str = "") -> None:
        """Until ``GET path`` answers (with ``want`` in its compact JSON), while every
        daemon runs (``Daemons.wait``)."""
        argv = ["curl", "-sf", "--cacert", str(self.dir / "ca.crt"), f"https://127.0.0.1:{API_PORT}{path}"]
        if token:
            argv += ["-H", f"Authorization: Bearer {token}"]
        probe = self.login_cmd(argv)

        def ready() -> bool:
            done = subprocess.run(probe, capture_output=True, text=True)
            return done.returncode == 0 and want in done.stdout.replace(" ", "").replace("\n", "")

        self.cluster.daemons.wait(f"GET {path}", ready, *logs)

    def _certs(self) -> None:
        """A CA, the API server's certificate (127.0.0.1) and the service accounts' keys."""
        d = self.dir

        def ssl(*args: str) -> None:
            done = subprocess.run(["openssl", *args], cwd=d, capture_output=True, text=True)
            if done.returncode:
                raise ClusterError(f"openssl {args[0]} failed: {done.stderr[-1000:]}")

        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=monarch-kernel test bed CA")  # fmt: skip
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
            "-subj", "/CN=kube-apiserver")  # fmt: skip
        (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n")
        ssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "apiserver.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
        ssl("genrsa", "-out", "sa.key", "2048")
        ssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def logs(self) -> str:
        """The end of every daemon's log, and of each pod's container log."""
        parts = [f"--- {p.name}{tail(p, 30)}" for p in sorted(self.dir.glob("*.log"))]
        parts += [f"--- {p.parent.name}{tail(p, 30)}" for p in sorted(self.dir.glob("pods/*/container.log"))]
        return "\n".join(parts)


#: Run in the login host once the API answers: the nodes and the namespace (the
#: controller manager then makes its default service account), as the administrator.
_SETUP = """
for name in {nodes!r}:
    node = {{
        "metadata": {{"name": name, "annotations": {{"kwok.x-k8s.io/node": "fake"}},
                     "labels": {{"kubernetes.io/hostname": name, "type": "kwok"}}}},
        "status": {{"allocatable": {{"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "{gpus}"}},
                   "capacity": {{"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "{gpus}"}}}},
    }}
    core.create_node(node)
core.create_namespace({{"metadata": {{"name": "{ns}"}}}})
"""


__all__ = ["NAMESPACE", "KubeBed", "cache_dir", "missing"]
