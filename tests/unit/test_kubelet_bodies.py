"""What the kubelet stand-in posts: the fields the scheduler and node lifecycle look at."""

from dra_gpu.testing._kubelet import NodeSpec, has_claims, node_body, running_pod_status


def test_node_body_has_capacity_pods_and_ready_condition() -> None:
    body = node_body(NodeSpec("node-07", labels={"gpu": "yes"}, cpu="8"), "v1.34.4")
    assert body["metadata"]["labels"] == {
        "kubernetes.io/hostname": "node-07",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "gpu": "yes",
    }
    status = body["status"]
    assert status["allocatable"] == status["capacity"]
    assert status["capacity"]["cpu"] == "8"
    assert status["capacity"]["pods"] == "110"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "Ready": "True",
        "MemoryPressure": "False",
        "DiskPressure": "False",
        "PIDPressure": "False",
    }
    assert status["nodeInfo"]["kubeletVersion"] == "v1.34.4"


def test_running_status_lists_every_container_running_and_ready() -> None:
    pod = {
        "metadata": {"uid": "u1"},
        "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
        "status": {"phase": "Pending", "startTime": "2026-01-01T00:00:00Z"},
    }
    status = running_pod_status(pod, "10.244.1.2")["status"]
    assert status["phase"] == "Running"
    assert status["podIP"] == "10.244.1.2"
    assert status["startTime"] == "2026-01-01T00:00:00Z"
    assert [c["name"] for c in status["containerStatuses"]] == ["a", "b"]
    assert all(c["ready"] and "running" in c["state"] for c in status["containerStatuses"])
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "ContainersReady"}


def test_pods_with_resource_claims_are_recognised() -> None:
    assert has_claims({"spec": {"resourceClaims": [{"name": "gpu"}]}})
    assert not has_claims({"spec": {"resourceClaims": []}})
    assert not has_claims({"spec": {}})
