"""Meshes on Kubernetes: ``KubernetesJob`` against a real kube-apiserver, its Job
controller, garbage collector and scheduler (tools/k8s). The controller runs on the
bed's login host; each pod's agent and workers are real processes in a network
namespace whose address is the pod's IP.

What is checked: a 2-pod x 2-proc mesh with actors on both pods, made as a labelled
Job whose pods it owns; the agent's configuration not left in the workers'
environment; a new controller reattaching; a pod deleted from outside reported as
its host, with Kubernetes' reason, while the other pod goes on; ``job.kill()`` and
``monarch-kernel down`` leaving no pod, Job, Secret or process."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multihost.controller import Controller, ControllerError, private_mount
from tools.k8s import NAMESPACE, KubeBed
from tools.testcluster._netns import pids_in

SETUP = f"""
import os, socket
from monarch_kernel import Actor, endpoint, attach
from monarch_kernel.job import KubernetesJob

class Where(Actor):
    @endpoint
    def where(self):
        return [socket.gethostname(), "MONARCH_AGENT_CONFIG" in os.environ, os.getcwd()]

failures = []
def record(f):
    failures.append([f.kind, f.host, str(f)])

def new_job(n, **kw):
    return KubernetesJob(namespace={NAMESPACE!r}, meshes={{"trainers": n}}, image="monarch-kernel:test", **kw)
"""

LIST = """
import json
def pods():
    out = []
    for p in core.list_namespaced_pod(NS).items:
        out.append({"name": p.metadata.name, "labels": p.metadata.labels, "phase": p.status.phase,
                    "owners": [o.kind for o in p.metadata.owner_references or []]})
    return out
print(json.dumps({"pods": pods(), "jobs": [j.metadata.name for j in batch.list_namespaced_job(NS).items],
                  "secrets": [[s.metadata.name, [o.kind for o in s.metadata.owner_references or []]]
                              for s in core.list_namespaced_secret(NS).items if s.metadata.name.startswith("monarch-")]}))
""".replace("NS", repr(NAMESPACE))


def objects(bed: KubeBed) -> dict:
    """The bed namespace's pods, Jobs and monarch Secrets, as the API lists them."""
    return json.loads(bed.api(LIST).strip().splitlines()[-1])


def nothing_left(bed: KubeBed, within: float = 30.0) -> None:
    """Until no pod, Job or monarch Secret is in the namespace and nothing runs in a
    pod's network namespace; fails the test otherwise."""
    deadline = time.monotonic() + within
    while True:
        left = objects(bed)
        procs = pids_in([h.ns for h in bed.cluster.hosts])
        if not (left["pods"] or left["jobs"] or left["secrets"] or procs):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"left after {within:g} s: {left}, processes {procs}\n{bed.logs()}")
        time.sleep(0.2)


@pytest.fixture
def state_home(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def controllers(bed: KubeBed, state_home: Path) -> Iterator[list[Controller]]:
    """Controllers made by ``new(controllers, bed, state_home)``; at the end every
    mesh is stopped (``monarch-kernel down --all``) and nothing may be left."""
    made: list[Controller] = []
    yield made
    for c in made:
        c.close()
    bed.run_in_login(
        [sys.executable, "-m", "monarch_kernel", "down", "--all", "--yes", "--force"],
        env={**os.environ, "XDG_STATE_HOME": str(state_home)},
        capture_output=True,
        timeout=120,
    )
    nothing_left(bed)


def new(controllers: list[Controller], bed: KubeBed, state_home: Path) -> Controller:
    c = Controller(bed.cluster, str(state_home), env=bed.env())
    controllers.append(c)
    c.run(SETUP)
    return c


def test_a_mesh_of_two_pods_runs_actors_on_both_as_a_job_that_owns_its_pods(bed, controllers, state_home):
    c = new(controllers, bed, state_home)
    c.run("job = new_job(2, labels={'team': 'nlp'})")
    c.run("procs = job.state(cached_path=None).trainers.spawn_procs(per_host={'procs': 2}, name='pair')")
    c.run("w = procs.spawn('where', Where)")
    seen = c.eval("w.where.call().get(timeout=60).values()")
    assert len(seen) == 4
    hosts = {h for h, _, _ in seen}
    assert len(hosts) == 2 and all(h.startswith("monarch-pair-") for h in hosts), seen
    assert not any(has_config for _, has_config, _ in seen), "the agent's configuration reached the workers"
    assert all("/pods/" in cwd for _, _, cwd in seen), seen  # each pod's own folder, not the notebook's
    made = objects(bed)
    assert {p["name"] for p in made["pods"]} == hosts
    for p in made["pods"]:
        assert p["phase"] == "Running"
        assert p["owners"] == ["Job"]
        assert p["labels"]["team"] == "nlp"
        assert p["labels"]["monarch.pytorch.org/mesh-name"] == "pair"
    assert len(made["jobs"]) == 1 and made["secrets"] == [[made["jobs"][0], ["Job"]]]
    c.run("job.kill()")
    nothing_left(bed)


def test_a_new_controller_reattaches_to_a_mesh_on_pods(bed, controllers, state_home):
    first = new(controllers, bed, state_home)
    saved = state_home.parent / "job.pkl"
    first.run(f"job = new_job(2); job.dump({str(saved)!r})")
    first.run("procs = job.state(cached_path=None).trainers.spawn_procs(per_host={'procs': 1}, name='kept')")
    first.run("w = procs.spawn('where', Where)")
    before = sorted(h for h, _, _ in first.eval("w.where.call().get(timeout=60).values()"))
    first.close()  # a named mesh outlives its controller
    second = new(controllers, bed, state_home)
    second.run("procs = attach('kept')")
    second.run("w = procs.spawn('where2', Where)")
    after = sorted(h for h, _, _ in second.eval("w.where.call().get(timeout=60).values()"))
    assert after == before
    # The saved job, loaded in the new controller, ends what the first one spawned.
    second.run(f"from monarch_kernel.job import job_load\njob_load({str(saved)!r}).kill()")
    nothing_left(bed)


@pytest.mark.parametrize("how", ["deleted", "evicted"])
def test_a_pod_deleted_from_outside_is_reported_as_its_host_with_kubernetes_reason(
    bed, controllers, state_home, how
):
    c = new(controllers, bed, state_home)
    c.run(
        "procs = new_job(2).state(cached_path=None).trainers.spawn_procs(per_host={'procs': 2}, name='lose')"
    )
    c.run("procs.on_failure(record)")
    c.run("w = procs.spawn('where', Where)")
    seen = c.eval("w.where.call().get(timeout=60).values()")
    victim = seen[0][0]
    if how == "deleted":
        bed.api(f"core.delete_namespaced_pod({victim!r}, {NAMESPACE!r})")
    else:  # the Eviction API, as a node drain does
        meta = f"client.V1ObjectMeta(name={victim!r}, namespace={NAMESPACE!r})"
        bed.api(
            f"core.create_namespaced_pod_eviction({victim!r}, {NAMESPACE!r}, client.V1Eviction(metadata={meta}))"
        )
    deadline = time.monotonic() + 30
    while not c.eval("failures") and time.monotonic() < deadline:
        time.sleep(0.2)
    failures = c.eval("failures")
    assert [f[0] for f in failures] == ["host_lost"], failures
    kind, host, message = failures[0]
    assert host == victim
    said = {
        "deleted": f"pod {victim} was deleted",
        "evicted": f"pod {victim} was disrupted (EvictionByEvictionAPI",
    }
    assert said[how] in message, message
    # The other pod goes on.
    left = c.eval("[v[0] for v in w.slice(hosts=1).where.call().get(timeout=60).values()]")
    assert victim not in left and len(left) == 2


def test_sync_workspace_brings_an_edited_local_module_to_the_pods_and_reloads_it(
    bed, controllers, state_home, tmp_path
):
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    (notebook / "helpers.py").write_text("VALUE = 1\n")
    c = new(controllers, bed, state_home)
    c.run(f"os.chdir({str(notebook)!r})")
    c.run(
        "procs = new_job(2).state(cached_path=None).trainers.spawn_procs(per_host={'procs': 2}, name='code')"
    )
    c.run(
        "class Uses(Actor):\n"
        "    @endpoint\n"
        "    def value(self):\n"
        "        import helpers\n"
        "        return [helpers.VALUE, helpers.__file__]\n"
    )
    c.run("u = procs.spawn('uses', Uses)")
    with pytest.raises(
        Exception, match="No module named 'helpers'"
    ):  # the pods do not see the notebook's files
        c.eval("u.value.call().get(timeout=60)")
    first = c.eval("repr(procs.sync_workspace().get())")
    assert first.startswith("synced 1 changed file") and "to 2 hosts" in first, first
    values = c.eval("u.value.call().get(timeout=60).values()")
    assert [v for v, _ in values] == [1, 1, 1, 1]
    assert all(str(notebook) not in f and "/workspace/code@monarch-code-" in f for _, f in values), values
    (notebook / "helpers.py").write_text("VALUE = 2\n")
    second = c.eval("repr(procs.sync_workspace(auto_reload=True).get())")
    assert "synced 1 changed file" in second and "reloaded helpers (ranks 0-3)" in second, second
    assert [v for v, _ in c.eval("u.value.call().get(timeout=60).values()")] == [2, 2, 2, 2]
    third = c.eval("repr(procs.sync_workspace().get())")
    assert third.startswith("synced 0 changed files (0 B) to 2 hosts; 1 unchanged"), third


def test_a_pod_whose_agent_cannot_start_fails_the_spawn_with_its_reason_and_leaves_nothing(
    bed, controllers, state_home
):
    c = new(controllers, bed, state_home)
    c.run(
        "job = KubernetesJob(namespace='research', meshes={'trainers': 2}, image='monarch-kernel:test', python='/no/python')"
    )
    with pytest.raises(Exception) as failed:
        c.run("job.state(cached_path=None).trainers.spawn_procs(per_host={'procs': 1}, name='broken')")
    message = str(failed.value)
    assert "MeshStartError" in message and "container ended (Error 127" in message, message
    assert "before its host agent started" in message
    nothing_left(bed)


def test_pods_that_cannot_be_scheduled_fail_the_spawn_with_the_schedulers_words(bed, controllers, state_home):
    c = new(controllers, bed, state_home)
    c.run("job = new_job(2, gpus_per_pod=16, timeout=3)")  # the bed's nodes have 8 GPUs each
    with pytest.raises(Exception) as failed:
        c.run("job.state(cached_path=None).trainers.spawn_procs(per_host={'procs': 1}, name='toobig')")
    message = str(failed.value)
    assert "0 of 2 pods" in message and "is not scheduled" in message, message
    assert "Insufficient nvidia.com/gpu" in message, message
    nothing_left(bed)


def test_the_kubernetes_notebook_runs_against_the_bed(bed, state_home, jupyter_path, tmp_path):
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "kubernetes-out.ipynb"
    folder = tmp_path / "notebook"  # the notebook's folder: what it syncs
    folder.mkdir()
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(state_home),
        "MONARCH_DEMO_NAMESPACE": NAMESPACE,
        "MONARCH_DEMO_IMAGE": "monarch-kernel:test",
    }
    argv = [
        sys.executable,
        str(root / "demo" / "run_notebook.py"),
        str(root / "notebooks" / "kubernetes.ipynb"),
    ]
    done = bed.run_in_login(
        [*argv, "--save", str(out)], env=env, cwd=folder, capture_output=True, text=True, timeout=300
    )
    text = done.stdout
    assert done.returncode == 0, text[-3000:] + done.stderr[-3000:]
    assert "synced 1 changed file (47 B) to 2 hosts; 0 unchanged" in text
    assert text.count(": hello from version 1") == 4
    assert "synced 1 changed file (47 B) to 2 hosts; 0 unchanged; reloaded helpers (ranks 0-3)" in text
    assert text.count(": hello from version 2") == 4 + 2  # the mesh's 4 procs, then the magic's 2
    assert "hello from version 2" in text.split("%%mesh")[-1]
    assert text.count("monarch-k8s-magic-") == 2  # %mesh up --k8s: two pods, one proc each
    assert "['stopped', 'stopped', 'stopped', 'stopped']" in text
    nothing_left(bed)


def test_a_mesh_whose_notebook_went_away_ends_at_its_idle_timeout_and_kubernetes_deletes_its_pods(
    bed, controllers, state_home
):
    c = new(controllers, bed, state_home)
    c.run(
        "procs = new_job(2).state(cached_path=None).trainers.spawn_procs("
        "per_host={'procs': 1}, name='idle', idle_timeout=2)"
    )
    c.run("w = procs.spawn('where', Where)")
    assert len(c.eval("w.where.call().get(timeout=60).values()")) == 2
    c.proc.kill()  # the notebook goes away without stopping its mesh
    c.proc.wait(10)
    # The agents end after 2 s without a controller; their pods succeed, the Job
    # completes, and Kubernetes deletes it (ttlSecondsAfterFinished), pods with it.
    deadline = time.monotonic() + 90
    while objects(bed)["pods"] or objects(bed)["jobs"]:
        assert time.monotonic() < deadline, f"still there after 90 s: {objects(bed)}\n{bed.logs()}"
        time.sleep(1)
    nothing_left(bed)


#: Runs the controller as a pod of the cluster would: no kubeconfig, the service
#: account's token and the cluster's CA at the in-cluster path (a tmpfs over /run in
#: a mount namespace of its own; $0 holds the two files), the API's address in the
#: environment.
IN_CLUSTER = private_mount(
    'mount -t tmpfs tmpfs /run && d=/run/secrets/kubernetes.io/serviceaccount && mkdir -p $d && cp "$0"/* $d && exec "$@"'
)


def readme_role() -> dict:
    """The Role the README says a notebook's account needs."""
    import yaml

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = text.split("```yaml", 1)[1].split("```", 1)[0]
    return yaml.safe_load(
        "\n".join(line[2:] if line.startswith("  ") else line for line in block.splitlines())
    )


def test_a_notebook_inside_the_cluster_with_the_readmes_role_runs_a_mesh(
    bed, controllers, state_home, tmp_path
):
    role = readme_role()
    assert role["kind"] == "Role"
    role["metadata"]["namespace"] = NAMESPACE
    secrets = tmp_path / "serviceaccount"
    secrets.mkdir()
    token = bed.api(
        f"""
from kubernetes import utils
core.create_namespaced_service_account({NAMESPACE!r}, {{"metadata": {{"name": "notebook"}}}})
rbac = client.RbacAuthorizationV1Api(api)
rbac.create_namespaced_role({NAMESPACE!r}, {role!r})
rbac.create_namespaced_role_binding({NAMESPACE!r}, {{
    "metadata": {{"name": "notebook"}},
    "roleRef": {{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": {role["metadata"]["name"]!r}}},
    "subjects": [{{"kind": "ServiceAccount", "name": "notebook", "namespace": {NAMESPACE!r}}}]}})
t = core.create_namespaced_service_account_token("notebook", {NAMESPACE!r}, {{"spec": {{"expirationSeconds": 3600}}}})
print(t.status.token)
"""
    ).split()[-1]
    (secrets / "token").write_text(token)
    (secrets / "ca.crt").write_text((bed.dir / "ca.crt").read_text())
    (secrets / "namespace").write_text(NAMESPACE)
    env = {k: v for k, v in bed.env().items() if k != "KUBECONFIG"}
    env |= {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "26443", "HOME": str(tmp_path)}
    c = Controller(bed.cluster, str(state_home), env=env, prefix=[*IN_CLUSTER, str(secrets)])
    controllers.append(c)
    c.run(SETUP)
    assert not c.eval("'KUBECONFIG' in os.environ or os.path.exists(os.path.expanduser('~/.kube'))")
    c.run("from monarch_kernel.hosts._k8s import api_client\nfrom kubernetes import client as kc")
    with pytest.raises(ControllerError, match="Forbidden"):  # it is the service account, not an administrator
        c.eval("kc.CoreV1Api(api_client(None)).list_node()")
    c.run(
        "procs = new_job(2).state(cached_path=None).trainers.spawn_procs(per_host={'procs': 1}, name='inside')"
    )
    c.run("w = procs.spawn('where', Where)")
    assert len(c.eval("w.where.call().get(timeout=60).values()")) == 2
    c.run("procs.stop()")  # as the service account: deletes the Job, its pods and Secret
    nothing_left(bed)


POOL = """
from kubernetes import utils
import json, sys
for item in json.loads(sys.stdin.read())["items"]:
    utils.create_from_dict(api, item, namespace=NS)
""".replace("NS", repr(NAMESPACE))

POOL_READY = """
import time
deadline = time.monotonic() + 60
def ready():
    pods = core.list_namespaced_pod(NS, label_selector="monarch.pytorch.org/mesh-name=pool").items
    ok = [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
    return len(ok) == 2 and all((p.status.container_statuses or [None])[0].restart_count >= RESTARTS for p in ok)
while not ready():
    assert time.monotonic() < deadline, [p.status for p in core.list_namespaced_pod(NS).items]
    time.sleep(0.2)
"""


def pool_ready(bed: KubeBed, restarts: int) -> None:
    bed.api(POOL_READY.replace("NS", repr(NAMESPACE)).replace("RESTARTS", str(restarts)), timeout=90)


def test_meshes_attach_to_a_pool_of_standing_pods_one_at_a_time(bed, controllers, state_home):
    made = bed.run_in_login(
        [
            sys.executable,
            "-m",
            "monarch_kernel",
            "k8s-pool",
            "pool",
            "--replicas",
            "2",
            "--image",
            "monarch-kernel:test",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    prelude = "from kubernetes import client, config\napi = config.new_client_from_config()\n"
    applied = bed.run_in_login(
        [sys.executable, "-c", prelude + POOL], input=made.stdout, capture_output=True, text=True, timeout=60
    )
    assert applied.returncode == 0, applied.stderr
    try:
        pool_ready(bed, restarts=0)
        c = new(controllers, bed, state_home)
        c.run(
            f"job = KubernetesJob(namespace={NAMESPACE!r})\njob.add_mesh('pool', 2)"
        )  # Monarch's attach form
        c.run("procs = job.state(cached_path=None).pool.spawn_procs(per_host={'procs': 2}, name='onpool')")
        c.run("w = procs.spawn('where', Where)")
        assert sorted({h for h, _, _ in c.eval("w.where.call().get(timeout=60).values()")}) == [
            "pool-0",
            "pool-1",
        ]
        # A second mesh on pods that serve one is refused; the first goes on.
        with pytest.raises(ControllerError, match="pod pool-0 serves a mesh already"):
            c.run("job.state(cached_path=None).pool.spawn_procs(per_host={'procs': 1}, name='second')")
        assert len(c.eval("w.where.call().get(timeout=60).values()")) == 4
        # Its end ends the agents; the pods restart them for the next mesh, and stay.
        c.run("procs.stop()")
        pool_ready(bed, restarts=1)
        c.run("again = job.state(cached_path=None).pool.spawn_procs(per_host={'procs': 1}, name='next')")
        assert len(c.eval("again.spawn('where', Where).where.call().get(timeout=60).values()")) == 2
        c.run("job.kill()")
        pool_ready(bed, restarts=2)
        assert {p["name"] for p in objects(bed)["pods"]} == {"pool-0", "pool-1"}
    finally:
        bed.api(
            f"client.AppsV1Api(api).delete_namespaced_stateful_set('pool', {NAMESPACE!r})\n"
            f"core.delete_namespaced_secret('monarch-pool-pool', {NAMESPACE!r})\n"
            f"core.delete_collection_namespaced_pod({NAMESPACE!r}, label_selector='monarch.pytorch.org/mesh-name=pool')"
        )


def test_attaching_to_pods_that_do_not_exist_says_how_to_make_them(bed, controllers, state_home):
    c = new(controllers, bed, state_home)
    c.run("import monarch_kernel.hosts._k8s as k8s\nk8s.NO_POD_S = 1.0")  # (30 s by default)
    c.run(f"job = KubernetesJob(namespace={NAMESPACE!r})\njob.add_mesh('nosuchpool', 2)")
    with pytest.raises(ControllerError) as failed:
        c.run("job.state(cached_path=None).nosuchpool.spawn_procs(per_host={'procs': 1})")
    message = str(failed.value)
    assert (
        "no pod has the labels app.kubernetes.io/name=monarch-worker,monarch.pytorch.org/mesh-name=nosuchpool"
        in message
    )
    assert "monarch-kernel k8s-pool NAME" in message
    nothing_left(bed)


def test_gpus_per_pod_become_the_pods_gpu_requests_and_one_proc_per_gpu(bed, controllers, state_home):
    c = new(controllers, bed, state_home)
    c.run(
        "procs = new_job(1, gpus_per_pod=2).state(cached_path=None).trainers.spawn_procs(per_host={'gpus': 2}, name='g')"
    )
    assert c.eval("procs.sizes") == {"hosts": 1, "gpus": 2}
    asked = bed.api(
        f"print([c.resources.limits for p in core.list_namespaced_pod({NAMESPACE!r}).items for c in p.spec.containers])"
    )
    assert "'nvidia.com/gpu': '2'" in asked, asked
    c.run("procs.stop()")
    nothing_left(bed)
