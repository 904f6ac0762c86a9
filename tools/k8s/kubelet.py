"""The kubelet's part for the k8s test bed: real processes for the pods that the real
scheduler binds to the bed's nodes (kwok keeps those nodes Ready; it runs nothing).

For each pod bound to one of ``--nodes``, this process

- takes a free network namespace of the bed (a test host: its address becomes the
  pod's IP), resolves the container's environment as a kubelet does (values,
  ``secretKeyRef``, ``fieldRef`` of the pod's name, namespace, node and IP), and
  starts the container's command there under the pod's name as hostname, in a
  folder of the pod's own (pods share no working directory with anyone), with the
  bed's Python first on ``PATH`` (the image "has monarch-kernel installed");
- reports it through the API: Running with its IP, then Ready once its
  ``readinessProbe`` (``tcpSocket``) connects;
- restarts the container when it exits if the pod's ``restartPolicy`` says so
  (``Always``, ``OnFailure`` after a failure; at most once a second, its
  ``restartCount`` and ``lastState`` reported), in the same namespace once nothing of
  the last run is left there;
- otherwise reports the container's end (exit code, ``Completed``/``Error``) and the
  pod's phase (Succeeded, Failed), and frees the namespace (nothing of the pod may
  run on);
- on a pod's deletion, stops its processes (SIGTERM, then SIGKILL after the pod's
  grace period, at most ``MAX_GRACE_S``), records the container's end and deletes
  the pod for good, as a kubelet does.

    python -m tools.k8s.kubelet --kubeconfig K --nodes n1,n2 --slots ns=addr,... --dir D

It polls the API (``POLL_S``): simpler than a watch, and as quick for tests.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tools.testcluster._netns import Host, in_host, pids_in

POLL_S = 0.2
MAX_GRACE_S = 5.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Running:
    """A pod this kubelet started: its process, namespace slot and state."""

    uid: str
    name: str
    namespace: str
    slot: tuple[str, str]
    proc: subprocess.Popen[bytes]
    started: str
    probe_port: int | None
    ready: bool = False
    restarts: int = 0
    #: When the container was last started (monotonic), and how it ended before.
    launched: float = field(default_factory=time.monotonic)
    last: dict[str, Any] | None = None
    #: Set once its deletion was seen: when SIGKILL follows the SIGTERM.
    kill_at: float | None = None
    env: dict[str, str] = field(default_factory=dict)


class Kubelet:
    def __init__(self, api: Any, nodes: list[str], slots: list[tuple[str, str]], folder: Path) -> None:
        self.core = client.CoreV1Api(api)
        self.nodes = set(nodes)
        self.free = list(slots)
        self.folder = folder
        self.running: dict[str, Running] = {}
        #: Pods (uid) this kubelet ran to their end, and will not run again.
        self.done: set[str] = set()

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> None:
        while True:
            try:
                pods: list[Any] = self.core.list_pod_for_all_namespaces().items
            except (ApiException, OSError) as e:
                print(f"kubelet: cannot list pods: {e}", file=sys.stderr, flush=True)
                time.sleep(1)
                continue
            seen = set()
            for pod in pods:
                if pod.spec.node_name not in self.nodes:
                    continue
                seen.add(pod.metadata.uid)
                try:
                    self.sync(pod)
                except ApiException as e:
                    if e.status != 404:
                        print(
                            f"kubelet: {pod.metadata.name}: {e.status} {e.reason}",
                            file=sys.stderr,
                            flush=True,
                        )
            for uid in [u for u in self.running if u not in seen]:  # gone from the API: stop it
                self.stop(self.running[uid], force=True)
                self.finish(uid)
            time.sleep(POLL_S)

    def sync(self, pod: Any) -> None:
        uid = pod.metadata.uid
        r = self.running.get(uid)
        if pod.metadata.deletion_timestamp is not None:
            if r is not None:
                if r.kill_at is None:
                    grace = pod.spec.termination_grace_period_seconds
                    r.kill_at = time.monotonic() + min(MAX_GRACE_S, 30 if grace is None else grace)
                    self.signal(r, signal.SIGTERM)
                if r.proc.poll() is None and time.monotonic() >= r.kill_at:
                    self.signal(r, signal.SIGKILL)
                if r.proc.poll() is None:
                    return
                self.report_end(pod, r)
                self.finish(uid)
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
                ),
            )
            return
        if r is None:
            if uid not in self.done and pod.status.phase == "Pending":
                self.start(pod)
            return
        if r.proc.poll() is not None:
            policy = pod.spec.restart_policy or "Always"
            if policy == "Always" or (policy == "OnFailure" and r.proc.returncode != 0):
                self.restart(pod, r)
                return
            self.report_end(pod, r)
            self.finish(uid)
            return
        if not r.ready and self.probe(r):
            r.ready = True
            self.patch(pod, ready=True, running_since=r.started, restarts=r.restarts)

    # -- starting and stopping --------------------------------------------------------

    def start(self, pod: Any) -> None:
        if not self.free:
            self.waiting(pod, "NoNetwork", "no free network namespace in the test bed")
            return
        c = pod.spec.containers[0]
        ns, addr = self.free[0]
        try:
            proc = self.launch(pod, ns, addr)
        except LookupError as e:
            self.waiting(pod, "CreateContainerConfigError", str(e))
            return
        self.free.pop(0)
        probe = (
            c.readiness_probe.tcp_socket.port if c.readiness_probe and c.readiness_probe.tcp_socket else None
        )
        r = Running(
            pod.metadata.uid, pod.metadata.name, pod.metadata.namespace, (ns, addr), proc, _now(), probe
        )
        self.running[r.uid] = r
        self.patch(pod, ip=addr, running_since=r.started, ready=probe is None)
        r.ready = probe is None

    def restart(self, pod: Any, r: Running) -> None:
        """The container of ``r`` exited and its pod restarts it (restartPolicy), in
        the same namespace once nothing of it runs there, at most once a second."""
        code = r.proc.returncode
        last = {
            "terminated": {
                "exitCode": 128 - code if code < 0 else code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": r.started,
                "finishedAt": _now(),
            }
        }
        while pids_in([r.slot[0]]):
            self.signal(r, signal.SIGKILL)
            time.sleep(0.05)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - r.launched)))
        try:
            r.proc = self.launch(pod, *r.slot)
        except LookupError as e:
            self.waiting(pod, "CreateContainerConfigError", str(e))
            return
        r.restarts += 1
        r.started, r.launched, r.ready, r.last = _now(), time.monotonic(), r.probe_port is None, last
        self.patch(pod, running_since=r.started, ready=r.ready, restarts=r.restarts, last=last)

    def launch(self, pod: Any, ns: str, addr: str) -> subprocess.Popen[bytes]:
        """Starts the pod's container in namespace ``ns`` (LookupError: its environment
        names a secret or key that is not there)."""
        c = pod.spec.containers[0]
        env = self.environment(pod, c, addr)
        home = self.folder / "pods" / f"{pod.metadata.namespace}_{pod.metadata.name}"
        home.mkdir(parents=True, exist_ok=True)
        venv_bin = str(Path(sys.executable).parent)
        base = {
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "HOSTNAME": pod.metadata.name,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        argv = [*(c.command or []), *(c.args or [])]
        log = open(home / "container.log", "ab")
        proc = subprocess.Popen(
            in_host(Host(pod.metadata.name, ns, addr), argv),
            cwd=c.working_dir or str(home),
            env={**base, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        return proc

    def environment(self, pod: Any, c: Any, ip: str) -> dict[str, str]:
        """The container's environment as a kubelet resolves it (LookupError: a secret
        or key that is not there, as CreateContainerConfigError)."""
        fields = {
            "metadata.name": pod.metadata.name,
            "metadata.namespace": pod.metadata.namespace,
            "spec.nodeName": pod.spec.node_name,
            "status.podIP": ip,
        }
        out: dict[str, str] = {}
        for e in c.env or []:
            if e.value_from is None:
                out[e.name] = e.value or ""
            elif e.value_from.field_ref is not None:
                out[e.name] = fields.get(e.value_from.field_ref.field_path, "")
            elif e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                try:
                    secret = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                except ApiException as err:
                    raise LookupError(f'secret "{ref.name}" not found ({err.status})') from None
                data = secret.data or {}
                if ref.key not in data:
                    raise LookupError(f"couldn't find key {ref.key} in Secret {ref.name}")
                out[e.name] = base64.b64decode(data[ref.key]).decode()
        return out

    def probe(self, r: Running) -> bool:
        if r.probe_port is None:
            return True
        try:
            with socket.create_connection((r.slot[1], r.probe_port), timeout=0.5):
                return True
        except OSError:
            return False

    def signal(self, r: Running, sig: int) -> None:
        for pid in pids_in([r.slot[0]]):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, r: Running, force: bool) -> None:
        self.signal(r, signal.SIGKILL if force else signal.SIGTERM)
        try:
            r.proc.wait(MAX_GRACE_S)
        except subprocess.TimeoutExpired:
            self.signal(r, signal.SIGKILL)
            r.proc.wait()

    def finish(self, uid: str) -> None:
        """Frees the pod's namespace once nothing of it runs there."""
        r = self.running.pop(uid)
        self.done.add(uid)
        deadline = time.monotonic() + MAX_GRACE_S
        while pids_in([r.slot[0]]):
            self.signal(r, signal.SIGKILL if time.monotonic() > deadline else signal.SIGTERM)
            time.sleep(0.05)
        self.free.append(r.slot)

    # -- reporting --------------------------------------------------------------------

    def patch(
        self,
        pod: Any,
        *,
        ip: str | None = None,
        running_since: str,
        ready: bool,
        restarts: int = 0,
        last: dict[str, Any] | None = None,
    ) -> None:
        ready_s = "True" if ready else "False"
        status: dict[str, Any] = {
            "phase": "Running",
            "startTime": running_since,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": running_since},
                {"type": "ContainersReady", "status": ready_s, "lastTransitionTime": _now()},
                {"type": "Ready", "status": ready_s, "lastTransitionTime": _now()},
            ],
            "containerStatuses": [
                self.container(pod, {"running": {"startedAt": running_since}}, ready, restarts, last)
            ],
        }
        if ip is not None:
            status |= {"podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip, "hostIPs": [{"ip": ip}]}
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})

    def waiting(self, pod: Any, reason: str, message: str) -> None:
        state = {"waiting": {"reason": reason, "message": message}}
        status = {"containerStatuses": [self.container(pod, state, False)]}
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})

    def report_end(self, pod: Any, r: Running) -> None:
        code = r.proc.returncode
        code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number
        reason = "Completed" if code == 0 else "Error"
        term = {"exitCode": code, "reason": reason, "startedAt": r.started, "finishedAt": _now()}
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [
                {"type": "ContainersReady", "status": "False", "lastTransitionTime": _now()},
                {"type": "Ready", "status": "False", "lastTransitionTime": _now()},
            ],
            "containerStatuses": [self.container(pod, {"terminated": term}, False)],
        }
        try:
            self.core.patch_namespaced_pod_status(r.name, r.namespace, {"status": status})
        except ApiException as e:
            if e.status != 404:
                raise

    @staticmethod
    def container(
        pod: Any, state: dict[str, Any], ready: bool, restarts: int = 0, last: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        c = pod.spec.containers[0]
        out = {
            "name": c.name,
            "image": c.image,
            "imageID": f"docker-pullable://{c.image}",
            "ready": ready,
            "restartCount": restarts,
            "started": "running" in state,
            "state": state,
        }
        if last is not None:
            out["lastState"] = last
        return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", required=True)
    p.add_argument("--slots", required=True, help="NAMESPACE=ADDRESS,...")
    p.add_argument("--dir", required=True)
    a = p.parse_args(argv)
    api = config.new_client_from_config(config_file=a.kubeconfig)
    slots = [tuple(s.split("=", 1)) for s in a.slots.split(",") if s]
    Kubelet(api, a.nodes.split(","), slots, Path(a.dir)).run()  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
