"""Why a claim is pending: the tutorial's four pieces, from API bodies, in plain words."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.controller import explain, published
from dra_gpu.controller.explain import Reason, Verdict

EXAMPLES = Path(__file__).resolve().parents[3] / "crds-examples"
DRIVER = "gpu.example.com"
CLASS = "gpu-inferencia"
ISSUE_EXAMPLE = (
    "request gpu: no device fits: node-01/gpu-1 has memory 8Gi, needs >= 24Gi; "
    "node-01/gpu-0 is allocated to default/other-0"
)
NOT_CHECKED = "not checked (an earlier piece is missing)"

Body = dict[str, Any]


# --- bodies, as the tutorial writes them ---------------------------------------------------


def template_claim(name: str = "recomendador-7d9f-gpu-x2k4") -> Body:
    """The claim the resourceclaim controller generates from the tutorial's template."""
    template = next(yaml.safe_load_all((EXAMPLES / "recomendador.yaml").read_text()))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}"},
        "spec": copy.deepcopy(template["spec"]["spec"]),
    }


def device_class(expression: str | None = None) -> Body:
    body: Body = yaml.safe_load((EXAMPLES / "deviceclass.yaml").read_text())
    if expression is not None:
        body["spec"]["selectors"] = [{"cel": {"expression": expression}}]
    return body


def tutorial_slice() -> Body:
    """node-01 with gpu-0 (24Gi) and gpu-1 (8Gi), as in step 3."""
    body: Body = yaml.safe_load((EXAMPLES / "resourceslice.yaml").read_text())
    return body


def gpu_slice(
    node: str,
    devices: dict[str, str | None],
    *,
    generation: int = 1,
    count: int = 1,
    driver: str = DRIVER,
    name: str | None = None,
) -> Body:
    """A slice of ``node``'s pool; ``devices`` maps names to memory (None: no capacity)."""
    return {
        "metadata": {"name": name or f"{node}-{driver}-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": [
                {"name": d, **({"capacity": {"memory": {"value": m}}} if m else {})}
                for d, m in devices.items()
            ],
        },
    }


def ready_node(name: str = "node-01", *, ready: bool = True, **spec: Any) -> Body:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pending_pod(**spec: Any) -> Body:
    return {
        "metadata": {"namespace": "default", "name": "recomendador-7d9f"},
        "spec": {"containers": [{"name": "recomendador"}], **spec},
    }


def allocated_claim(name: str, *devices: str, pool: str = "node-01", **extra: Any) -> Body:
    return {
        "metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": d, **extra}
                        for d in devices
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [pool]}
                            ]
                        }
                    ]
                },
            }
        },
    }


def explain_tutorial(
    claim: Body | None = None,
    *,
    classes: dict[str, Body] | None = None,
    slices: list[Body] | None = None,
    claims: list[Body] | None = None,
    nodes: dict[str, Body] | None = None,
    pod: Body | None = None,
    prepare_failure: explain.PrepareFailure | None = None,
) -> explain.Explanation:
    """The tutorial's cluster once the class and the slice exist, unless told otherwise."""
    return explain.explain_claim(
        claim if claim is not None else template_claim(),
        pod=pod if pod is not None else pending_pod(),
        classes=classes if classes is not None else {CLASS: device_class()},
        slices=slices if slices is not None else [tutorial_slice()],
        claims=claims or [],
        nodes=nodes if nodes is not None else {"node-01": ready_node()},
        prepare_failure=prepare_failure,
    )


def piece(result: explain.Explanation, name: str) -> explain.Piece:
    (found,) = [p for p in result.pieces if p.name == name]
    return found


def set_request(claim: Body, **fields: Any) -> Body:
    claim["spec"]["devices"]["requests"][0]["exactly"].update(fields)
    return claim


def memory_selector(quantity: str, op: str = ">=") -> list[Body]:
    expression = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{quantity}")) {op} 0'
    return [{"cel": {"expression": expression}}]


# --- the tutorial's four states --------------------------------------------------------------


def test_missing_class_is_named_in_the_schedulers_words() -> None:
    result = explain_tutorial(classes={})
    assert result.reason == Reason.DEVICE_CLASS_MISSING
    assert result.message == "request gpu: device class gpu-inferencia does not exist"
    assert result.missing
    assert [p.satisfied for p in result.pieces] == [False, None, None, None]


def test_class_without_slices_means_no_devices_published() -> None:
    result = explain_tutorial(slices=[])
    assert result.reason == Reason.NO_DEVICES_PUBLISHED
    assert result.message == "request gpu: no devices published"
    assert piece(result, "class").satisfied is True
    assert piece(result, "devices").satisfied is False


def test_published_24gi_device_leaves_nothing_missing() -> None:
    result = explain_tutorial()
    assert result.reason == Reason.SATISFIABLE
    assert not result.missing
    assert result.message == "no missing piece found: every request can be satisfied on node-01"
    (request,) = result.requests
    assert request.nodes == ("node-01",)
    assert [(d.label, d.verdict) for d in request.devices] == [
        ("node-01/gpu-0", Verdict.FITS),
        ("node-01/gpu-1", Verdict.MISMATCH),
    ]
    assert all(p.satisfied for p in result.pieces)


def test_issue_example_names_the_small_gpu_and_the_holder_of_the_big_one() -> None:
    result = explain_tutorial(claims=[allocated_claim("other-0", "gpu-0")])
    assert result.message == ISSUE_EXAMPLE
    assert result.reason == Reason.DEVICES_ALLOCATED
    assert piece(result, "devices").reason == ISSUE_EXAMPLE
    assert piece(result, "node").satisfied is True


def test_both_fitting_gpus_taken_is_devices_allocated() -> None:
    claim = set_request(template_claim(), selectors=memory_selector("8Gi"))
    claims = [allocated_claim("other-0", "gpu-0"), allocated_claim("other-1", "gpu-1")]
    result = explain_tutorial(claim, claims=claims)
    assert result.reason == Reason.DEVICES_ALLOCATED
    assert result.message == (
        "request gpu: no device fits: node-01/gpu-0 is allocated to default/other-0; "
        "node-01/gpu-1 is allocated to default/other-1"
    )


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (ready_node(ready=False), "node node-01 is not Ready"),
        (ready_node(unschedulable=True), "node node-01 is cordoned (unschedulable)"),
        (
            ready_node(taints=[{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]),
            "node node-01 has taint gpu=broken:NoSchedule, which the pod does not tolerate",
        ),
    ],
)
def test_excluded_node_is_the_missing_piece(node: Body, why: str) -> None:
    result = explain_tutorial(nodes={"node-01": node})
    assert result.reason == Reason.NODE_EXCLUDED
    assert result.message == (
        f"request gpu: no device fits: node-01/gpu-1 has memory 8Gi, needs >= 24Gi; "
        f"node-01/gpu-0: {why}"
    )
    assert piece(result, "devices").satisfied is True
    assert piece(result, "devices").reason == "node-01/gpu-0 fits"
    assert piece(result, "node").satisfied is False
    assert piece(result, "node").reason == f"request gpu: node-01/gpu-0: {why}"


def test_tolerated_taint_does_not_exclude() -> None:
    node = ready_node(taints=[{"key": "gpu", "value": "broken", "effect": "NoSchedule"}])
    tolerant = pending_pod(tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert explain_tutorial(nodes={"node-01": node}, pod=tolerant).reason == Reason.SATISFIABLE
    prefer_no = ready_node(taints=[{"key": "gpu", "effect": "PreferNoSchedule"}])
    assert explain_tutorial(nodes={"node-01": prefer_no}).reason == Reason.SATISFIABLE


def test_missing_node_and_pod_placement_rules_exclude_devices() -> None:
    assert explain_tutorial(nodes={}).message.endswith("node-01/gpu-0: node node-01 does not exist")
    selector = pending_pod(nodeSelector={"disktype": "ssd"})
    assert explain_tutorial(pod=selector).message.endswith(
        "node-01/gpu-0: node node-01 does not match the pod's nodeSelector disktype=ssd"
    )
    affinity = pending_pod(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "NotIn",
                                    "values": ["node-01"],
                                }
                            ]
                        }
                    ]
                }
            }
        }
    )
    assert explain_tutorial(pod=affinity).message.endswith(
        "node-01/gpu-0: node node-01 does not match the pod's required node affinity"
    )
    bound = explain_tutorial(pod=pending_pod(nodeName="node-02"))
    assert bound.reason == Reason.NODE_EXCLUDED
    assert bound.message.endswith("node-01/gpu-0: the pod is bound to node-02")


def test_without_a_pod_only_node_health_is_checked() -> None:
    tainted = ready_node(taints=[{"key": "gpu", "effect": "NoSchedule"}])
    result = explain.explain_claim(
        template_claim(),
        pod=None,
        classes={CLASS: device_class()},
        slices=[tutorial_slice()],
        claims=[],
        nodes={"node-01": tainted},
    )
    assert result.reason == Reason.SATISFIABLE


def test_allocated_claim_has_nothing_to_explain() -> None:
    claim = template_claim()
    claim["status"] = allocated_claim("x", "gpu-0")["status"]
    result = explain_tutorial(claim, pod=pending_pod(nodeName="node-01"))
    assert result.reason == Reason.ALLOCATED
    assert result.message == "allocated node-01/gpu-0 on node-01"
    assert not result.missing
    assert all(p.satisfied for p in result.pieces)


NOT_REGISTERED_EVENT: Body = {
    "reason": "FailedPrepareDynamicResources",
    "type": "Warning",
    "message": "Failed to prepare dynamic resources: prepare dynamic resources: "
    "DRA driver gpu.example.com is not registered",
    "source": {"component": "kubelet", "host": "node-01"},
    "involvedObject": {"kind": "Pod", "uid": "pod-uid"},
    "firstTimestamp": "2026-01-01T10:00:00Z",
    "lastTimestamp": "2026-01-01T10:05:00Z",
    "count": 31,
}
NOT_REGISTERED = explain.PrepareFailure(
    "DRA driver gpu.example.com is not registered", "node-01", "2026-01-01T10:00:00Z", "pod-uid"
)


def test_the_kubelets_event_is_read_as_a_prepare_failure() -> None:
    assert explain.prepare_failure(NOT_REGISTERED_EVENT) == NOT_REGISTERED
    assert NOT_REGISTERED.driver == "gpu.example.com"
    assert explain.prepare_failure({**NOT_REGISTERED_EVENT, "reason": "Scheduled"}) is None
    # events.k8s.io's shape, as a core/v1 watch shows it
    newer = {
        "reason": "FailedPrepareDynamicResources",
        "message": "NodePrepareResources failed for claim ns/c-1: gpu-0 fell off the bus",
        "reportingInstance": "node-02",
        "eventTime": "2026-01-01T10:00:00.000000Z",
        "involvedObject": {"uid": "u"},
    }
    failure = explain.prepare_failure(newer)
    assert failure == explain.PrepareFailure(
        "NodePrepareResources failed for claim ns/c-1: gpu-0 fell off the bus",
        "node-02",
        "2026-01-01T10:00:00.000000Z",
        "u",
    )
    assert (failure.claim, failure.driver) == ("ns/c-1", None)


def test_an_agent_that_does_not_answer_is_named() -> None:
    claim = template_claim()
    claim["status"] = allocated_claim("x", "gpu-0")["status"]
    said = (
        "NodePrepareResources: rpc error: code = Unavailable desc = connection error: desc = "
        '"transport: Error while dialing: dial unix /var/lib/kubelet/plugins/gpu.example.com/'
        'dra.sock: connect: no such file or directory"'
    )
    failure = explain.PrepareFailure(said, "node-01", "2026-01-01T10:00:00Z")
    result = explain_tutorial(claim, pod=pending_pod(nodeName="node-01"), prepare_failure=failure)
    assert result.reason == Reason.DRIVER_NOT_READY
    assert result.message == (
        "driver gpu.example.com on node-01 has not prepared the claim since "
        f"2026-01-01T10:00:00Z; the kubelet says: {said} (the node agent of gpu.example.com on "
        "node-01 does not answer: stopped, or restarting)"
    )


def test_a_failure_concerns_the_claims_of_the_driver_it_names() -> None:
    claim = allocated_claim("c-1", "gpu-0")
    claim["metadata"]["namespace"] = "ns"
    other_driver = explain.PrepareFailure("DRA driver nic.example.com is not registered")
    other_claim = explain.PrepareFailure("NodePrepareResources failed for claim ns/c-2: x")
    this_claim = explain.PrepareFailure("NodePrepareResources failed for claim ns/c-1: x")
    assert NOT_REGISTERED.concerns(claim, DRIVER)
    assert this_claim.concerns(claim, DRIVER)
    assert not other_driver.concerns(claim, DRIVER)
    assert not other_claim.concerns(claim, DRIVER)
    assert not NOT_REGISTERED.concerns(template_claim(), DRIVER)  # not allocated


def test_kubelet_prepare_error_is_the_driver_piece() -> None:
    claim = template_claim()
    claim["status"] = allocated_claim("x", "gpu-0")["status"]
    result = explain_tutorial(
        claim, pod=pending_pod(nodeName="node-01"), prepare_failure=NOT_REGISTERED
    )
    assert result.reason == Reason.DRIVER_NOT_READY
    assert result.message == (
        "driver gpu.example.com on node-01 has not prepared the claim since "
        "2026-01-01T10:00:00Z; the kubelet says: DRA driver gpu.example.com is not registered "
        "(the node agent of gpu.example.com is not running on node-01, or has not registered "
        "with its kubelet yet)"
    )
    assert [p.satisfied for p in result.pieces] == [True, True, True, False]
    assert piece(result, "driver").reason == result.message


def test_format_pieces_for_the_four_tutorial_states() -> None:
    allocated = template_claim()
    allocated["status"] = allocated_claim("x", "gpu-0")["status"]
    on_node = pending_pod(nodeName="node-01")
    states = [
        explain_tutorial(classes={}),
        explain_tutorial(slices=[]),
        explain_tutorial(allocated, pod=on_node),
        explain_tutorial(
            allocated,
            pod=on_node,
            prepare_failure=explain.PrepareFailure("DRA driver gpu.example.com is not registered"),
        ),
    ]
    assert [explain.format_pieces(s) for s in states] == [
        "class    NO   request gpu: device class gpu-inferencia does not exist\n"
        f"devices  --   {NOT_CHECKED}\n"
        f"node     --   {NOT_CHECKED}\n"
        f"driver   --   {NOT_CHECKED}\n",
        "class    OK   device class gpu-inferencia exists\n"
        "devices  NO   request gpu: no devices published\n"
        f"node     --   {NOT_CHECKED}\n"
        f"driver   --   {NOT_CHECKED}\n",
        "class    OK   device class gpu-inferencia exists\n"
        "devices  OK   allocated node-01/gpu-0\n"
        "node     OK   the pod is bound to node-01\n"
        "driver   OK   gpu.example.com published devices for node-01\n",
        "class    OK   device class gpu-inferencia exists\n"
        "devices  OK   allocated node-01/gpu-0\n"
        "node     OK   the pod is bound to node-01\n"
        "driver   NO   driver gpu.example.com on node-01 has not prepared the claim; the "
        "kubelet says: DRA driver gpu.example.com is not registered (the node agent of "
        "gpu.example.com is not running on node-01, or has not registered with its kubelet "
        "yet)\n",
    ]


# --- pools -----------------------------------------------------------------------------------


def test_incomplete_pool_is_a_reason() -> None:
    half = gpu_slice("node-01", {"gpu-0": "24Gi"}, generation=3, count=2)
    result = explain_tutorial(slices=[half])
    assert result.reason == Reason.POOL_INCOMPLETE
    assert result.message == (
        "request gpu: no devices published: "
        "pool node-01 of gpu.example.com is incomplete: 1 of 2 slices at generation 3"
    )


def test_slices_that_disagree_on_their_count_are_an_incomplete_pool_as_for_the_metrics() -> None:
    first = gpu_slice("node-01", {"gpu-1": "8Gi"}, count=2, name="a")
    second = gpu_slice("node-01", {"gpu-0": "24Gi"}, count=1, name="b")
    result = explain_tutorial(slices=[first, second])
    assert result.reason == Reason.POOL_INCOMPLETE
    assert result.message.endswith(
        "pool node-01 of gpu.example.com is incomplete: its 2 slices at generation 1 "
        "disagree on resourceSliceCount (1, 2)"
    )
    devices, _ = published.current_pools([first, second])
    assert devices == []  # one rule: the metrics do not count it either


def test_only_the_highest_generation_of_a_pool_counts() -> None:
    old = gpu_slice("node-01", {"gpu-0": "24Gi"}, generation=1)
    new = gpu_slice("node-01", {"gpu-1": "8Gi"}, generation=2)
    result = explain_tutorial(slices=[old, new])
    assert result.reason == Reason.NO_DEVICE_FITS
    assert (
        result.message == "request gpu: no device fits: node-01/gpu-1 has memory 8Gi, needs >= 24Gi"
    )


def test_pool_of_several_slices_counts_when_complete() -> None:
    first = gpu_slice("node-01", {"gpu-1": "8Gi"}, count=2, name="a")
    second = gpu_slice("node-01", {"gpu-0": "24Gi"}, count=2, name="b")
    assert explain_tutorial(slices=[first, second]).reason == Reason.SATISFIABLE


def test_devices_of_other_drivers_only_mean_no_device_of_the_class() -> None:
    nic = gpu_slice("node-01", {"nic-0": None}, driver="nic.example.com")
    result = explain_tutorial(slices=[nic])
    assert result.reason == Reason.NO_DEVICES_PUBLISHED
    assert result.message == (
        "request gpu: no device of class gpu-inferencia published: "
        "node-01/nic-0 has driver nic.example.com, needs gpu.example.com"
    )


# --- selectors -------------------------------------------------------------------------------


def test_cel_runtime_error_on_a_device_lacking_the_capacity() -> None:
    slice_ = gpu_slice("node-01", {"gpu-0": "24Gi", "gpu-2": None})
    result = explain_tutorial(slices=[slice_])
    assert result.reason == Reason.SELECTOR_ERROR
    assert result.message.startswith("request gpu: selector error: node-01/gpu-2: selector #0: ")
    assert "memory" in result.message
    (request,) = result.requests
    assert [d.verdict for d in request.devices] == [Verdict.FITS, Verdict.ERROR]


def test_cel_runtime_error_on_an_excluded_node_does_not_block() -> None:
    slices = [
        gpu_slice("node-01", {"gpu-0": "24Gi"}),
        gpu_slice("node-02", {"gpu-2": None}),
    ]
    nodes = {"node-01": ready_node(), "node-02": ready_node("node-02", ready=False)}
    assert explain_tutorial(slices=slices, nodes=nodes).reason == Reason.SATISFIABLE


def test_class_selector_that_does_not_compile() -> None:
    broken = 'device.driver == "gpu.example.com" &&'
    result = explain_tutorial(classes={CLASS: device_class(broken)})
    assert result.reason == Reason.SELECTOR_INVALID
    assert result.message.startswith(
        "request gpu: device class gpu-inferencia: selector #0 does not compile: "
    )
    assert result.message.endswith(f"({broken})")
    assert [p.satisfied for p in result.pieces] == [False, None, None, None]


def test_request_selector_that_does_not_compile_is_the_devices_piece() -> None:
    claim = set_request(template_claim(), selectors=[{"cel": {"expression": "device.("}}])
    result = explain_tutorial(claim)
    assert result.reason == Reason.SELECTOR_INVALID
    assert result.message.startswith("request gpu: selector #0 does not compile: ")
    assert [p.satisfied for p in result.pieces] == [True, False, None, None]


@pytest.mark.parametrize(
    ("expression", "needs"),
    [
        (f'device.capacity["{DRIVER}"].memory.compareTo(quantity("24Gi")) > 0', "needs > 24Gi"),
        (f'device.capacity["{DRIVER}"]["memory"].compareTo(quantity("16Gi")) == 1', "needs > 16Gi"),
        (f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("16Gi"))', "needs > 16Gi"),
        (f'!device.capacity["{DRIVER}"].memory.isLessThan(quantity("12Gi"))', "needs >= 12Gi"),
    ],
)
def test_capacity_comparisons_read_as_plain_words(expression: str, needs: str) -> None:
    claim = set_request(template_claim(), selectors=[{"cel": {"expression": expression}}])
    slice_ = gpu_slice("node-01", {"gpu-1": "8Gi"})
    result = explain_tutorial(claim, slices=[slice_])
    assert result.message == f"request gpu: no device fits: node-01/gpu-1 has memory 8Gi, {needs}"


def test_other_selectors_are_quoted_collapsed_and_cut() -> None:
    long = (
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("24Gi")) >= 0\n  && '
        + " && ".join(f'device.driver != "other-{i}.example.com"' for i in range(5))
    )
    claim = set_request(template_claim(), selectors=[{"cel": {"expression": long}}])
    result = explain_tutorial(claim, slices=[gpu_slice("node-01", {"gpu-1": "8Gi"})])
    prefix = "request gpu: no device fits: node-01/gpu-1 does not match selector #0 ("
    assert result.message.startswith(prefix)
    quoted = result.message.removeprefix(prefix).removesuffix(")")
    assert len(quoted) == 80
    assert quoted.endswith("…")
    assert "\n" not in quoted
    assert "  " not in quoted


def test_attribute_equality_reads_as_plain_words() -> None:
    claim = set_request(
        template_claim(),
        selectors=[{"cel": {"expression": f'device.attributes["{DRIVER}"].model == "L4"'}}],
    )
    slice_ = gpu_slice("node-01", {"gpu-0": "24Gi"})
    slice_["spec"]["devices"][0]["attributes"] = {"model": {"string": "T4"}}
    result = explain_tutorial(claim, slices=[slice_])
    assert result.message == 'request gpu: no device fits: node-01/gpu-0 has model "T4", needs "L4"'


# --- counts, modes, alternatives -------------------------------------------------------------


def test_count_two_with_one_fitting_device() -> None:
    result = explain_tutorial(set_request(template_claim(), count=2))
    assert result.reason == Reason.NOT_ENOUGH_DEVICES
    assert result.message == (
        "request gpu: needs 2 devices on one node, at most 1 available: "
        "node-01/gpu-1 has memory 8Gi, needs >= 24Gi; node-01/gpu-0 fits"
    )


def test_count_two_spread_over_two_nodes_is_not_enough() -> None:
    slices = [gpu_slice("node-01", {"gpu-0": "24Gi"}), gpu_slice("node-02", {"gpu-0": "24Gi"})]
    nodes = {"node-01": ready_node(), "node-02": ready_node("node-02")}
    result = explain_tutorial(set_request(template_claim(), count=2), slices=slices, nodes=nodes)
    assert result.reason == Reason.NOT_ENOUGH_DEVICES
    assert result.message.startswith(
        "request gpu: needs 2 devices on one node, at most 1 available"
    )


def test_allocation_mode_all_needs_every_matching_device_free() -> None:
    claim = set_request(template_claim(), allocationMode="All", selectors=[])
    claim["spec"]["devices"]["requests"][0]["exactly"].pop("count")
    assert explain_tutorial(claim).reason == Reason.SATISFIABLE
    result = explain_tutorial(claim, claims=[allocated_claim("other-0", "gpu-1")])
    assert result.reason == Reason.DEVICES_ALLOCATED
    assert result.message == (
        "request gpu: needs every matching device of one node, free: "
        "node-01/gpu-1 is allocated to default/other-0; node-01/gpu-0 fits"
    )


def test_admin_access_and_the_claim_itself_do_not_hold_devices() -> None:
    claim = template_claim()
    claims = [allocated_claim("admin", "gpu-0", adminAccess=True), claim]
    assert explain_tutorial(claim, claims=claims).reason == Reason.SATISFIABLE


def first_available(*alternatives: tuple[str, str, str]) -> Body:
    claim = template_claim()
    claim["spec"]["devices"]["requests"] = [
        {
            "name": "gpu",
            "firstAvailable": [
                {"name": name, "deviceClassName": cls, "selectors": memory_selector(memory)}
                for name, cls, memory in alternatives
            ],
        }
    ]
    return claim


def test_first_available_fits_if_any_alternative_does() -> None:
    claim = first_available(("large", CLASS, "40Gi"), ("small", CLASS, "16Gi"))
    result = explain_tutorial(claim)
    assert result.reason == Reason.SATISFIABLE
    (request,) = result.requests
    assert request.request == "gpu"
    assert request.nodes == ("node-01",)
    assert [a.request for a in request.subrequests] == ["gpu/large", "gpu/small"]
    assert [a.reason for a in request.subrequests] == [Reason.NO_DEVICE_FITS, Reason.FITS]


def test_first_available_explains_every_alternative_when_none_fits() -> None:
    claim = first_available(("large", CLASS, "40Gi"), ("huge", CLASS, "80Gi"))
    result = explain_tutorial(claim)
    assert result.reason == Reason.NO_DEVICE_FITS
    assert result.message == (
        "request gpu/large: no device fits: node-01/gpu-0 has memory 24Gi, needs >= 40Gi; "
        "node-01/gpu-1 has memory 8Gi, needs >= 40Gi | "
        "request gpu/huge: no device fits: node-01/gpu-0 has memory 24Gi, needs >= 80Gi; "
        "node-01/gpu-1 has memory 8Gi, needs >= 80Gi"
    )


def test_first_available_with_a_missing_class_is_blocked_like_the_scheduler() -> None:
    claim = first_available(("large", CLASS, "16Gi"), ("small", "gpu-pequena", "8Gi"))
    result = explain_tutorial(claim)
    assert result.reason == Reason.DEVICE_CLASS_MISSING
    assert result.message == "request gpu/small: device class gpu-pequena does not exist"


def test_claim_names_the_most_important_missing_piece_first() -> None:
    claim = template_claim()
    requests = claim["spec"]["devices"]["requests"]
    requests.append(copy.deepcopy(requests[0]))
    requests[1]["name"] = "extra"
    requests[1]["exactly"]["deviceClassName"] = "gpu-entrenamiento"
    result = explain_tutorial(claim, claims=[allocated_claim("other-0", "gpu-0")])
    assert result.reason == Reason.DEVICE_CLASS_MISSING
    assert result.message == (
        "request extra: device class gpu-entrenamiento does not exist | " + ISSUE_EXAMPLE
    )
    assert piece(result, "class").satisfied is False
    assert piece(result, "devices").satisfied is False


def test_requests_that_fit_on_different_nodes_have_no_common_node() -> None:
    claim = template_claim()
    requests = claim["spec"]["devices"]["requests"]
    requests.append(copy.deepcopy(requests[0]))
    requests[1]["name"] = "small"
    requests[1]["exactly"]["selectors"] = memory_selector("8Gi", "==")
    slices = [gpu_slice("node-01", {"gpu-0": "24Gi"}), gpu_slice("node-02", {"gpu-0": "8Gi"})]
    nodes = {"node-01": ready_node(), "node-02": ready_node("node-02")}
    result = explain_tutorial(claim, slices=slices, nodes=nodes)
    assert result.reason == Reason.NO_COMMON_NODE
    assert result.message == (
        "no node satisfies every request: request gpu fits on node-01; "
        "request small fits on node-02"
    )


def test_claim_being_deleted() -> None:
    claim = template_claim()
    claim["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    result = explain_tutorial(claim)
    assert result.reason == Reason.CLAIM_DELETING
    assert result.message == "resourceclaim default/recomendador-7d9f-gpu-x2k4 is being deleted"


# --- stable, bounded output ------------------------------------------------------------------


def test_output_does_not_depend_on_the_order_of_inputs() -> None:
    slices = [
        gpu_slice(f"node-{n:02d}", {f"gpu-{i}": "8Gi" for i in range(12)}) for n in range(1, 4)
    ]
    claims = [allocated_claim(f"other-{i}", "gpu-10", pool="node-02") for i in range(3)]
    nodes = {f"node-{n:02d}": ready_node(f"node-{n:02d}") for n in range(1, 4)}
    expected = explain_tutorial(slices=slices, claims=claims, nodes=nodes)
    shuffler = random.Random(7)
    for _ in range(5):
        shuffled = copy.deepcopy(slices)
        for body in shuffled:
            shuffler.shuffle(body["spec"]["devices"])
        shuffler.shuffle(shuffled)
        again = explain_tutorial(
            slices=shuffled, claims=shuffler.sample(claims, len(claims)), nodes=nodes
        )
        assert again == expected


def test_long_device_lists_are_counted_not_listed() -> None:
    slices = [gpu_slice("node-01", {f"gpu-{i}": "8Gi" for i in range(128)})]
    result = explain_tutorial(slices=slices)
    assert result.message == (
        "request gpu: no device fits: node-01/gpu-0 has memory 8Gi, needs >= 24Gi; "
        "node-01/gpu-1 has memory 8Gi, needs >= 24Gi; "
        "node-01/gpu-2 has memory 8Gi, needs >= 24Gi; and 125 more do not match"
    )
    assert len(result.requests[0].devices) == 128


def test_messages_are_one_line_and_never_exceed_the_event_limit() -> None:
    node = "n" * 60 + "." + "o" * 60 + "." + "d" * 60 + "." + "e" * 60  # 243 characters
    many = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("24Gi")) >= 0 && ' + " && ".join(
        f'device.driver != "other-{i}.example.com"' for i in range(5)
    )
    claim = set_request(template_claim(), selectors=[{"cel": {"expression": many}}])
    slices = [gpu_slice(node, {f"gpu-{i}": "8Gi" for i in range(8)})]
    result = explain_tutorial(claim, slices=slices, nodes={node: ready_node(node)})
    assert len(result.message) == explain.MESSAGE_LIMIT
    assert result.message.endswith("…")
    broken = explain_tutorial(classes={CLASS: device_class("device.driver ==\n  ")})
    assert "\n" not in broken.message
    assert "|" not in broken.message


def test_failing_requests_beyond_three_are_counted() -> None:
    claim = template_claim()
    requests = claim["spec"]["devices"]["requests"]
    for i in range(10):
        extra = copy.deepcopy(requests[0])
        extra["name"] = f"extra-with-a-rather-long-request-name-{i}"
        extra["exactly"]["deviceClassName"] = f"a-class-with-a-long-long-long-name-{i}" * 3
        requests.append(extra)
    result = explain_tutorial(claim)
    assert len(result.message) <= explain.MESSAGE_LIMIT
    assert result.message.endswith("and 7 more requests")


def test_free_device_only_on_an_excluded_node_is_node_excluded() -> None:
    slices = [gpu_slice("node-01", {"gpu-0": "24Gi"}), gpu_slice("node-02", {"gpu-0": "24Gi"})]
    nodes = {"node-01": ready_node(), "node-02": ready_node("node-02", ready=False)}
    result = explain_tutorial(
        slices=slices, nodes=nodes, claims=[allocated_claim("other-0", "gpu-0")]
    )
    assert result.reason == Reason.NODE_EXCLUDED
    assert result.message == (
        "request gpu: no device fits: node-01/gpu-0 is allocated to default/other-0; "
        "node-02/gpu-0: node node-02 is not Ready"
    )


def test_devices_of_all_nodes_slices_fit_on_every_eligible_node() -> None:
    shared = gpu_slice("shared", {"gpu-0": "24Gi"})
    del shared["spec"]["nodeName"]
    shared["spec"]["allNodes"] = True
    nodes = {"node-01": ready_node(), "node-02": ready_node("node-02", ready=False)}
    result = explain_tutorial(slices=[shared], nodes=nodes)
    assert result.reason == Reason.SATISFIABLE
    assert result.requests[0].nodes == ("node-01",)
    assert result.requests[0].devices[0].label == "shared/gpu-0"


# --- device taints (Kubernetes 1.36+: the scheduler skips a device it is tainted off) --------

XID_79 = {
    "key": "gpu.example.com/xid",
    "value": "79",
    "effect": "NoExecute",
    "timeAdded": "2026-03-01T12:03:00Z",
}


def tainted_tutorial_slice(*taints: Body) -> Body:
    body = tutorial_slice()
    for device in body["spec"]["devices"]:
        if device["name"] == "gpu-0":
            device["taints"] = list(taints)
    return body


def test_a_tainted_gpu_is_named_with_its_taint_and_since_when() -> None:
    result = explain_tutorial(slices=[tainted_tutorial_slice(XID_79)])
    assert result.reason == Reason.DEVICES_TAINTED
    assert result.message == (
        "request gpu: no device fits: node-01/gpu-1 has memory 8Gi, needs >= 24Gi; "
        "node-01/gpu-0 is tainted gpu.example.com/xid=79:NoExecute since 12:03"
    )
    assert piece(result, "devices").satisfied is False


def test_a_tolerated_or_effectless_taint_keeps_the_device_usable() -> None:
    claim = template_claim()
    claim["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": "gpu.example.com/xid", "operator": "Exists", "effect": "NoExecute"}
    ]
    tainted = [tainted_tutorial_slice(XID_79)]
    assert explain_tutorial(claim, slices=tainted).reason == Reason.SATISFIABLE
    harmless = [tainted_tutorial_slice({**XID_79, "effect": "None"})]
    assert explain_tutorial(slices=harmless).reason == Reason.SATISFIABLE
    other_value = template_claim()
    other_value["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": "gpu.example.com/xid", "value": "48"}
    ]
    assert explain_tutorial(other_value, slices=tainted).reason == Reason.DEVICES_TAINTED


def test_device_taint_text_without_value_or_time() -> None:
    assert explain.device_taint_text({"key": "k", "effect": "NoSchedule"}) == "k:NoSchedule"
