"""The kubelet stand-in's DRA rules, without sockets or a cluster: version choice, the
kubelet's texts, which container gets which device, CDI resolution and event bodies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from dra_gpu.agent import cdi
from dra_gpu.proto.dra.v1 import api_pb2 as dra_v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from dra_gpu.testing import _dra
from dra_gpu.testing._dra import ClaimRef, DraFailure, NotReadyYet, PreparedDevice

# --- registration ---------------------------------------------------------------------------


def test_the_plugins_order_decides_the_service() -> None:
    assert _dra.choose_service(["v1.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1.DRAPlugin"
    assert _dra.choose_service(["v1beta1.DRAPlugin", "v1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert _dra.choose_service(["v1alpha1.DRAResourceHealth", "v1.DRAPlugin"]) == "v1.DRAPlugin"


def test_no_known_service_fails_with_the_kubelets_text() -> None:
    with pytest.raises(DraFailure) as failure:
        _dra.choose_service(["v1alpha3.NodeService", "v9.DRAPlugin"])
    assert str(failure.value) == (
        'none of services supported by the plugin (["v1alpha3.NodeService" "v9.DRAPlugin"]) '
        'are supported by the kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    )
    with pytest.raises(DraFailure, match="empty list of supported gRPC services"):
        _dra.choose_service([])


def test_registration_errors_are_the_texts_the_kubelet_notifies() -> None:
    assert (
        _dra.registration_error(
            "DRAPlugin", "gpu.example.com", "/p/dra.sock", ["v1.DRAPlugin"], "/r"
        )
        is None
    )
    assert _dra.registration_error("CSIPlugin", "x", "/e", ["v1.DRAPlugin"], "/r/x.sock") == (
        "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket "
        "/r/x.sock"
    )
    message = _dra.registration_error("DRAPlugin", "gpu.example.com", "/e", ["v2.DRAPlugin"], "/r")
    assert message is not None
    assert message.startswith(
        "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC "
        "versions of DRA driver plugin gpu.example.com at endpoint /e: none of services "
        'supported by the plugin (["v2.DRAPlugin"])'
    )


def test_grpc_errors_read_like_gos() -> None:
    assert (
        _dra.go_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        == "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    )
    assert (
        _dra.go_rpc_error(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        == "rpc error: code = Unimplemented desc = Method not found!"
    )
    assert _dra.go_rpc_error(grpc.StatusCode.CANCELLED, None).startswith(
        "rpc error: code = Canceled"
    )


# --- claims of a pod ------------------------------------------------------------------------


def _pod(**status: object) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {
            "resourceClaims": [
                {"name": "direct", "resourceClaimName": "shared-claim"},
                {"name": "tmpl", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": status,
    }


def test_template_claims_are_named_by_the_pod_status() -> None:
    assert _dra.pod_claims(_pod()) is None  # the controller has not created it yet
    pod = _pod(resourceClaimStatuses=[{"name": "tmpl", "resourceClaimName": "p-tmpl-x7k"}])
    assert _dra.pod_claims(pod) == [
        _dra.PodClaim("direct", "shared-claim", from_template=False),
        _dra.PodClaim("tmpl", "p-tmpl-x7k", from_template=True),
    ]
    no_claim_needed = _pod(resourceClaimStatuses=[{"name": "tmpl"}])
    assert _dra.pod_claims(no_claim_needed) == [
        _dra.PodClaim("direct", "shared-claim", from_template=False)
    ]


def _claim(*, owner: str | None = None, allocated: bool = True, reserved: bool = True) -> dict:
    meta: dict[str, object] = {"name": "c", "namespace": "ns", "uid": "claim-uid"}
    if owner:
        meta["ownerReferences"] = [{"kind": "Pod", "uid": owner, "controller": True}]
    status: dict[str, object] = {}
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [
                    {"driver": "gpu.example.com", "pool": "n", "device": "gpu-0", "request": "g"},
                    {"driver": "b.example.com", "pool": "n", "device": "x", "request": "g"},
                    {"driver": "gpu.example.com", "pool": "n", "device": "gpu-1", "request": "g"},
                ]
            }
        }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    return {"metadata": meta, "status": status}


def test_a_claim_must_be_allocated_and_reserved_for_the_pod_before_prepare() -> None:
    pod = _pod()
    _dra.check_claim_for_pod(pod, _claim(), from_template=False)
    with pytest.raises(NotReadyYet, match="not allocated"):
        _dra.check_claim_for_pod(pod, _claim(allocated=False), from_template=False)
    with pytest.raises(NotReadyYet, match="not reserved"):
        _dra.check_claim_for_pod(pod, _claim(reserved=False), from_template=False)


def test_a_template_claim_of_another_pod_is_refused_with_the_kubelets_text() -> None:
    pod = _pod()
    _dra.check_claim_for_pod(pod, _claim(owner="pod-uid"), from_template=True)
    with pytest.raises(DraFailure) as failure:
        _dra.check_claim_for_pod(pod, _claim(owner="other"), from_template=True)
    assert str(failure.value) == (
        "ResourceClaim ns/c was not created for pod ns/p (pod is not owner)"
    )


def test_claims_are_grouped_by_the_drivers_of_their_results() -> None:
    assert _dra.claim_drivers(_claim()) == ["b.example.com", "gpu.example.com"]
    assert _dra.claim_drivers(_claim(allocated=False)) == []


# --- responses ------------------------------------------------------------------------------

REQUESTED = [ClaimRef("ns", "first", "uid-1"), ClaimRef("ns", "second", "uid-2")]


def test_a_complete_response_passes() -> None:
    _dra.check_results("NodePrepareResources", REQUESTED, {"uid-1": "", "uid-2": ""})


@pytest.mark.parametrize(
    ("errors", "text"),
    [
        (
            {"uid-1": "", "uid-2": "no such GPU"},
            "NodePrepareResources failed for ResourceClaim second: no such GPU",
        ),
        (
            {"uid-1": "", "uid-2": "", "uid-9": ""},
            "NodePrepareResources returned result for unknown claim UID uid-9",
        ),
        ({"uid-1": ""}, "NodePrepareResources skipped 1 ResourceClaims"),
    ],
)
def test_bad_responses_fail_with_the_kubelets_texts(errors: dict[str, str], text: str) -> None:
    with pytest.raises(DraFailure) as failure:
        _dra.check_results("NodePrepareResources", REQUESTED, errors)
    assert str(failure.value) == text


def test_event_messages_carry_the_kubelets_prefixes() -> None:
    assert _dra.prepare_message("DRA driver gpu.example.com is not registered") == (
        "Failed to prepare dynamic resources: prepare dynamic resources: "
        "DRA driver gpu.example.com is not registered"
    )
    assert _dra.unprepare_message("x").endswith("unprepare dynamic resources: x")


# --- which container gets which device ------------------------------------------------------


def _device(request_names: tuple[str, ...], device_id: str) -> PreparedDevice:
    return PreparedDevice("gpu.example.com", "n", device_id, request_names, (device_id,))


DEVICES = {
    "gpus": [_device(("big",), "v/c=big"), _device(("small",), "v/c=small")],
    "any": [_device((), "v/c=any")],
}


def _container(*refs: dict[str, str]) -> dict[str, object]:
    return {"name": "c", "resources": {"claims": list(refs)}}


def test_a_container_naming_a_request_gets_only_that_requests_devices() -> None:
    assert _dra.container_cdi_ids(_container({"name": "gpus", "request": "big"}), DEVICES) == [
        "v/c=big"
    ]


def test_a_container_naming_no_request_gets_every_device_of_the_claim() -> None:
    assert _dra.container_cdi_ids(_container({"name": "gpus"}), DEVICES) == [
        "v/c=big",
        "v/c=small",
    ]


def test_a_device_naming_no_request_goes_to_every_container_of_its_claim() -> None:
    assert _dra.container_cdi_ids(_container({"name": "any", "request": "whatever"}), DEVICES) == [
        "v/c=any"
    ]


def test_a_container_without_claims_gets_nothing() -> None:
    assert _dra.container_cdi_ids({"name": "sidecar"}, DEVICES) == []


# --- CDI, as a runtime reads it -------------------------------------------------------------


def _write_spec(cdi_dir: Path, name: str, spec: object) -> None:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    (cdi_dir / name).write_text(json.dumps(spec))


def test_ids_from_our_spec_writer_resolve_to_its_env(tmp_path: Path) -> None:
    spec = cdi.claim_spec("gpu.example.com", "1a2b", [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    cdi.write_claim_spec(tmp_path, spec, claim_uid="1a2b")
    index = _dra.index_cdi_specs(_dra.load_cdi_specs(tmp_path))
    device_id = cdi.cdi_device_id("gpu.example.com", "1a2b", "gpu-0")
    resolved = _dra.resolve_cdi_ids(index, [device_id], tmp_path)
    assert _dra.env_of(_dra.merge_container_edits(resolved)) == {"GPU_DEVICE_0": "gpu-0"}


def test_spec_wide_edits_apply_once_after_the_devices_edits(tmp_path: Path) -> None:
    _write_spec(
        tmp_path,
        "v-c.json",
        {
            "cdiVersion": "0.5.0",
            "kind": "v.example/c",
            "containerEdits": {"env": ["COMMON=1", "A=spec"], "mounts": [{"hostPath": "/h"}]},
            "devices": [
                {"name": "a", "containerEdits": {"env": ["A=a"], "deviceNodes": [{"path": "/a"}]}},
                {"name": "b", "containerEdits": {"env": ["B=b"]}},
            ],
        },
    )
    (tmp_path / "ignored.txt").write_text("not a spec")
    index = _dra.index_cdi_specs(_dra.load_cdi_specs(tmp_path))
    edits = _dra.merge_container_edits(
        _dra.resolve_cdi_ids(index, ["v.example/c=a", "v.example/c=b"], tmp_path)
    )
    assert edits["env"] == ["A=a", "B=b", "COMMON=1", "A=spec"]
    assert edits["deviceNodes"] == [{"path": "/a"}]
    assert edits["mounts"] == [{"hostPath": "/h"}]
    assert _dra.env_of(edits) == {"A": "spec", "B": "b", "COMMON": "1"}


def test_yaml_specs_are_read_too(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        "cdiVersion: 0.3.0\nkind: v.example/c\ndevices:\n"
        "- name: d\n  containerEdits:\n    env: [X=1]\n"
    )
    index = _dra.index_cdi_specs(_dra.load_cdi_specs(tmp_path))
    assert _dra.resolve_cdi_ids(index, ["v.example/c=d"], tmp_path)[0].device_edits == {
        "env": ["X=1"]
    }


def test_an_id_without_a_spec_fails_naming_the_id_and_the_directory(tmp_path: Path) -> None:
    _write_spec(tmp_path, "broken.json", ["not", "a", "spec"])
    (tmp_path / "garbage.json").write_text("{")
    index = _dra.index_cdi_specs(_dra.load_cdi_specs(tmp_path))
    with pytest.raises(DraFailure) as failure:
        _dra.resolve_cdi_ids(index, ["v.example/c=missing"], tmp_path)
    assert str(failure.value) == f"CDI device v.example/c=missing not found in {tmp_path}"


def test_the_kind_must_match_the_ids_vendor_and_class(tmp_path: Path) -> None:
    _write_spec(
        tmp_path,
        "s.json",
        {"cdiVersion": "0.3.0", "kind": "v.example/other", "devices": [{"name": "d"}]},
    )
    index = _dra.index_cdi_specs(_dra.load_cdi_specs(tmp_path))
    with pytest.raises(DraFailure, match="not found"):
        _dra.resolve_cdi_ids(index, ["v.example/c=d"], tmp_path)


def test_a_device_defined_twice_does_not_resolve(tmp_path: Path) -> None:
    spec = {"cdiVersion": "0.3.0", "kind": "v.example/c", "devices": [{"name": "d"}]}
    _write_spec(tmp_path, "one.json", spec)
    _write_spec(tmp_path, "two.json", spec)
    index = _dra.index_cdi_specs(_dra.load_cdi_specs(tmp_path))
    with pytest.raises(DraFailure, match="defined more than once"):
        _dra.resolve_cdi_ids(index, ["v.example/c=d"], tmp_path)


def test_a_malformed_id_is_reported_as_such(tmp_path: Path) -> None:
    with pytest.raises(DraFailure, match="not of the form vendor/class=name"):
        _dra.resolve_cdi_ids({}, ["gpu-0"], tmp_path)


def test_a_missing_cdi_directory_holds_no_specs(tmp_path: Path) -> None:
    assert _dra.load_cdi_specs(tmp_path / "absent") == []


# --- events ---------------------------------------------------------------------------------


def test_event_bodies_look_like_the_kubelets() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"}}
    body = _dra.pod_event_body(
        pod,
        node="node-01",
        reason="FailedPrepareDynamicResources",
        message="m",
        now="2025-01-01T00:00:00Z",
        unique=255,
    )
    assert body["metadata"] == {"name": "p.ff", "namespace": "ns"}
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ns",
        "uid": "pod-uid",
    }
    assert body["type"] == "Warning"
    assert body["source"] == {"component": "kubelet", "host": "node-01"}
    assert (body["reportingComponent"], body["reportingInstance"]) == ("kubelet", "node-01")
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2025-01-01T00:00:00Z"
    assert body["count"] == 1


# --- a plugin dropped while a call is in flight ----------------------------------------------


class SlowPlugin(dra_v1_grpc.DRAPluginServicer):
    async def NodePrepareResources(self, request: object, context: object) -> object:
        await asyncio.sleep(30)
        return dra_v1.NodePrepareResourcesResponse()


async def test_a_call_on_a_plugin_closed_meanwhile_fails_like_any_call(tmp_path: Path) -> None:
    # Discovery closes an instance whose socket was re-created while the node's worker waits
    # on it; grpc then cancels the call, which must not end the worker as a cancellation.
    socket = tmp_path / "dra.sock"
    server = grpc.aio.server()
    dra_v1_grpc.add_DRAPluginServicer_to_server(SlowPlugin(), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    plugin = _dra._Plugin("gpu.example.com", "v1.DRAPlugin", str(socket), socket)
    try:
        closing = asyncio.get_running_loop().call_later(
            0.3, lambda: asyncio.ensure_future(plugin.close())
        )
        with pytest.raises(DraFailure, match="code = Canceled desc = grpc: the client connection"):
            await plugin.prepare([ClaimRef("ns", "c", "uid-1")], deadline=20)
        closing.cancel()
    finally:
        await server.stop(None)
