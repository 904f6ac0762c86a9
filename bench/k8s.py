"""The Kubernetes rows of `make bench`, on the k8s test bed (tools/k8s: a real
kube-apiserver, scheduler and controller manager; each pod a network namespace of this
machine), made for these rows and removed after.

- ``KubernetesJob`` bring-up of ``PODS`` pods x 1 proc to the first reply of an actor
  on every rank, beside the API server's own: ``PODS`` bare pods (``sleep``) created
  to Running and Ready, measured in the same run, alternated ``ROUNDS`` times (medians);
- ``sync_workspace`` of a folder of 50 small modules to those pods: the first sync,
  and one after a single file changed.

    python -m bench.k8s
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.k8s import NAMESPACE, KubeBed, missing

ROOT = Path(__file__).resolve().parents[1]
PODS = 4
ROUNDS = 3
Row = tuple[str, float, str, str, float, str]

#: Runs in the bed's login host: prints the figures as one JSON line.
INSIDE = """
import json, os, statistics, sys, tempfile, time
from pathlib import Path
from kubernetes import client, config
from monarch_kernel import Actor, endpoint
from monarch_kernel.job import KubernetesJob

PODS, ROUNDS, NS = {pods}, {rounds}, {ns!r}
core = client.CoreV1Api(config.new_client_from_config())

class Echo(Actor):
    @endpoint
    def ping(self):
        return 1

def bare_pods():
    names = [f"bare-{{i}}-{{os.getpid()}}-{{time.monotonic_ns()}}" for i in range(PODS)]
    t = time.perf_counter()
    for n in names:
        core.create_namespaced_pod(NS, {{"metadata": {{"name": n}}, "spec": {{"restartPolicy": "Never",
            "containers": [{{"name": "c", "image": "busybox", "command": ["sleep", "600"]}}]}}}})
    while True:
        pods = [core.read_namespaced_pod(n, NS) for n in names]
        if all(any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) for p in pods):
            break
        time.sleep(0.02)
    took = time.perf_counter() - t
    for n in names:
        core.delete_namespaced_pod(n, NS)
    while any(p.metadata.name in names for p in core.list_namespaced_pod(NS).items):
        time.sleep(0.1)
    return took

def mesh():
    t = time.perf_counter()
    job = KubernetesJob(namespace=NS, meshes={{"hosts": PODS}}, image="monarch-kernel:bench")
    procs = job.state(cached_path=None).hosts.spawn_procs(per_host={{"procs": 1}})
    assert procs.spawn("echo", Echo).ping.call().get(timeout=120).values() == [1] * PODS
    return job, procs, time.perf_counter() - t

out = {{"bare": [], "mesh": []}}
for _ in range(ROUNDS):
    out["bare"].append(bare_pods())
    job, procs, took = mesh()
    out["mesh"].append(took)
    if len(out["mesh"]) < ROUNDS:
        job.kill()
folder = Path(tempfile.mkdtemp(prefix="bench-ws-"))
for i in range(50):
    (folder / f"mod{{i}}.py").write_text(f"VALUE = {{i}}\\n" + "# padding\\n" * 200)
t = time.perf_counter()
first = procs.sync_workspace(str(folder)).get()
out["sync_first"] = time.perf_counter() - t
(folder / "mod7.py").write_text("VALUE = -7\\n")
t = time.perf_counter()
again = procs.sync_workspace(str(folder), auto_reload=True).get()
out["sync_one"] = time.perf_counter() - t
out["sync_files"] = first.files
job.kill()
print(json.dumps(out))
"""


def measure() -> dict[str, Any]:
    bed = KubeBed.up(pods=PODS + PODS)  # (room for the bare pods beside a mesh's)
    state = tempfile.mkdtemp(prefix="bench-k8s-")
    try:
        code = INSIDE.format(pods=PODS, rounds=ROUNDS, ns=NAMESPACE)
        env = {"XDG_STATE_HOME": state, "MONARCH_FORWARD_OUTPUT": "0"}
        done = bed.run_in_login(
            [sys.executable, "-c", code],
            env={**os.environ, **env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode:
            raise RuntimeError(
                f"the k8s bench failed ({done.returncode}):\n{done.stderr[-3000:]}\n{bed.logs()}"
            )
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        bed.down()
        shutil.rmtree(state, ignore_errors=True)


def rows() -> list[Row]:
    f = measure()
    med = statistics.median
    nan = float("nan")
    return [
        (
            f"KubernetesJob {PODS} pods x 1 proc: bring-up to every rank's reply",
            med(f["mesh"]),
            "s",
            f"{PODS} bare pods to Ready",
            med(f["bare"]),
            "(k8s bed; medians of 3)",
        ),
        (
            f"sync_workspace of {f['sync_files']} files to {PODS} pods, first",
            f["sync_first"] * 1e3,
            "ms",
            "",
            nan,
            "",
        ),
        (f"sync_workspace after 1 file changed, {PODS} pods, reload", f["sync_one"] * 1e3, "ms", "", nan, ""),
    ]


def main() -> None:
    from bench.run import print_cluster_rows

    print_cluster_rows(rows, PODS + PODS, "k8s", missing)


if __name__ == "__main__":
    main()
