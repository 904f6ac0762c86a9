"""How a pod's end is told (``hosts._k8s.pod_end``), from pod objects as the API
returns them: the words a user reads when a pod of a mesh is lost."""

from __future__ import annotations

from kubernetes import client

from monarch_kernel.hosts._k8s import pod_end


def pod(
    *,
    phase: str = "Running",
    reason: str | None = None,
    message: str | None = None,
    deleting: bool = False,
    conditions: list[client.V1PodCondition] | None = None,
    terminated: client.V1ContainerStateTerminated | None = None,
) -> client.V1Pod:
    state = client.V1ContainerState(terminated=terminated)
    status = client.V1ContainerStatus(
        name="agent", image="i", image_id="", ready=False, restart_count=0, state=state
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="p-0", deletion_timestamp="2026-12-02T00:00:00Z" if deleting else None
        ),
        status=client.V1PodStatus(
            phase=phase, reason=reason, message=message, conditions=conditions, container_statuses=[status]
        ),
    )


def test_a_running_pod_has_not_ended():
    assert pod_end(pod()) is None


def test_an_oom_killed_container_says_so_and_what_to_do():
    t = client.V1ContainerStateTerminated(exit_code=137, reason="OOMKilled")
    assert pod_end(pod(phase="Failed", terminated=t)) == (
        "pod p-0's container was OOM-killed (exit 137): it needs more memory"
    )


def test_an_evicted_pod_gives_the_kubelets_message():
    why = pod_end(pod(phase="Failed", reason="Evicted", message="The node was low on resource: memory."))
    assert why == "pod p-0 was evicted: The node was low on resource: memory."


def test_a_disrupted_pod_gives_the_conditions_reason():
    c = client.V1PodCondition(
        type="DisruptionTarget",
        status="True",
        reason="EvictionByEvictionAPI",
        message="Eviction API: evicting",
    )
    assert pod_end(pod(conditions=[c], deleting=True)) == (
        "pod p-0 was disrupted (EvictionByEvictionAPI: Eviction API: evicting)"
    )


def test_a_deleted_pod_and_an_ended_container():
    assert pod_end(pod(deleting=True)) == "pod p-0 was deleted"
    t = client.V1ContainerStateTerminated(exit_code=1, reason="Error", message="boom")
    assert pod_end(pod(phase="Failed", terminated=t)) == "pod p-0's container ended (Error 1: boom)"
