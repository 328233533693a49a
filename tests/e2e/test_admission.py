"""The admission webhook as ``helm install`` ships it, on real nodes, through ``kubectl apply``.

The chart's own ValidatingWebhookConfiguration and Service are what the API server calls: it
resolves the Service to a ready endpoint (a controller pod's IP in a node's network) and dials
it through the test kit's egress, as a real cluster's API server reaches its webhooks. Both
controller replicas serve; the leader issued the certificate and put its CA in the caBundle.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
import yaml

from dra_gpu import kube
from dra_gpu.devices import opaque
from dra_gpu.testing import RealNode, eventually
from tests.e2e import helpers
from tests.e2e.helpers import Kubectl
from tests.e2e.test_chart import CHART, Release, install, remove

RESOURCE = "/apis/resource.k8s.io/v1"
DENIED = "denied the request: "


@pytest_asyncio.fixture(scope="module")
async def release(
    helm: helpers.Helm, api: kube.Kube, kubectl: Kubectl, nodes: list[RealNode]
) -> AsyncIterator[Release]:
    installed = await install(
        helm, api, "--set", "controller.replicas=2", "--wait", "--timeout=240s"
    )
    # The caBundle is the leader's to fill in: until then the API server cannot trust the
    # webhook and, failing open, admits. Ready when a bad config is refused.
    bad = claim(installed, "probe", gpu_config(sharing={"strategy": "MPS"}))
    await eventually(
        lambda: refused_by_webhook(kubectl, bad), timeout=90, what="the webhook refuses"
    )
    yield installed
    await remove(helm, api, installed)


def gpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": opaque.API_VERSION, "kind": opaque.KIND, **fields}


def claim_spec(release: Release, *configs: dict[str, Any], selector: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": release.device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "devices": {
            "requests": [{"name": "gpu", "exactly": exactly}],
            "config": [{"opaque": {"driver": release.driver, "parameters": c}} for c in configs],
        }
    }


def claim(
    release: Release, name: str, *configs: dict[str, Any], selector: str = ""
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": release.namespace},
        "spec": claim_spec(release, *configs, selector=selector),
    }


def memory_at_least(release: Release, quantity: str) -> str:
    return f'device.capacity["{release.driver}"].memory.compareTo(quantity("{quantity}")) >= 0'


async def apply(kubectl: Kubectl, body: dict[str, Any], *flags: str) -> tuple[int, str, str]:
    return await kubectl.run("apply", "-f", "-", *flags, stdin=yaml.safe_dump(body))


async def refused_by_webhook(kubectl: Kubectl, body: dict[str, Any]) -> bool:
    code, _, err = await apply(kubectl, body, "--dry-run=server")
    return code != 0 and DENIED in err


async def reviews_answered(api: kube.Kube, kubectl: Kubectl, release: Release) -> int:
    """Admission reviews answered by every controller replica (their /metrics, read through
    the API server's pod proxy)."""
    pods = await api.get(
        f"/api/v1/namespaces/{release.namespace}/pods",
        labelSelector="app.kubernetes.io/component=controller",
    )
    total = 0
    for pod in pods["items"]:
        name = pod["metadata"]["name"]
        text = await kubectl(
            "get", "--raw", f"/api/v1/namespaces/{release.namespace}/pods/{name}:9400/proxy/metrics"
        )
        for line in text.splitlines():
            if line.startswith("dra_gpu_admission_requests_total{"):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


# --- refusals ------------------------------------------------------------------------------


async def test_configs_prepare_would_refuse_are_refused_at_apply_naming_object_and_field(
    api: kube.Kube, kubectl: Kubectl, release: Release
) -> None:
    ns = release.namespace
    bad_claim = claim(release, "bad-claim", gpu_config(sharing={"strategy": "MPS"}))
    template: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bad-template", "namespace": ns},
        "spec": {"spec": claim_spec(release, gpu_config(), gpu_config(sharng={}))},
    }
    device_class: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"{release.device_class}-bad"},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{release.driver}"'}}],
            "config": [
                {"opaque": {"driver": release.driver, "parameters": gpu_config(migProfile="3g")}}
            ],
        },
    }
    expected = {
        "bad-claim": f"ResourceClaim {ns}/bad-claim: spec.devices.config[0].opaque.parameters"
        ".sharing.strategy: 'MPS' is not one of Exclusive, TimeSlicing",
        "bad-template": f"ResourceClaimTemplate {ns}/bad-template: spec.spec.devices.config[1]"
        ".opaque.parameters.sharng: unknown field (known: apiVersion, env, kind, migProfile, "
        "sharing)",
        f"{release.device_class}-bad": f"DeviceClass {release.device_class}-bad: "
        "spec.config[0].opaque.parameters.migProfile: '3g' is not a MIG profile name",
    }
    for body in (bad_claim, template, device_class):
        name = body["metadata"]["name"]
        code, _, err = await apply(kubectl, body)
        assert code != 0, f"{name} was admitted"
        assert DENIED + expected[name] in err, err
    assert not await helpers.exists(api, f"{RESOURCE}/namespaces/{ns}/resourceclaims/bad-claim")
    assert not await helpers.exists(
        api, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates/bad-template"
    )
    assert not await helpers.exists(api, f"{RESOURCE}/deviceclasses/{release.device_class}-bad")


async def test_dry_run_server_is_answered_like_an_apply_and_creates_nothing(
    api: kube.Kube, kubectl: Kubectl, release: Release
) -> None:
    good = claim(release, "dry-good", gpu_config(sharing={"strategy": "TimeSlicing"}))
    code, out, err = await apply(kubectl, good, "--dry-run=server")
    assert code == 0, err
    assert "(server dry run)" in out
    assert not await helpers.exists(
        api, f"{RESOURCE}/namespaces/{release.namespace}/resourceclaims/dry-good"
    )
    assert await refused_by_webhook(kubectl, claim(release, "dry-bad", gpu_config(env={"A": 1})))


async def test_objects_of_other_drivers_never_reach_the_webhook(
    api: kube.Kube, kubectl: Kubectl, release: Release
) -> None:
    before = await reviews_answered(api, kubectl, release)
    foreign = claim(release, "foreign")
    foreign["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "other-class"
    foreign["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "other.example.com", "parameters": {"anything": "goes"}}}
    ]
    plain = copy.deepcopy(foreign)
    plain["metadata"]["name"] = "plain"
    del plain["spec"]["devices"]["config"]
    for body in (foreign, plain):
        code, _, err = await apply(kubectl, body, "--dry-run=server")
        assert code == 0, err
    assert await reviews_answered(api, kubectl, release) == before
    # Ours: a config for our driver (the strict webhook), or a claim of our class without one
    # (the webhook that only warns), each reviewed once.
    code, _, err = await apply(kubectl, claim(release, "ours", gpu_config()), "--dry-run=server")
    assert code == 0, err
    assert await reviews_answered(api, kubectl, release) == before + 1
    code, _, err = await apply(kubectl, claim(release, "our-class"), "--dry-run=server")
    assert code == 0, err
    assert await reviews_answered(api, kubectl, release) == before + 2


# --- warnings ------------------------------------------------------------------------------


async def test_a_claim_nothing_can_satisfy_is_admitted_with_a_warning(
    api: kube.Kube, kubectl: Kubectl, release: Release
) -> None:
    ns = release.namespace
    big = claim(release, "big", gpu_config(), selector=memory_at_least(release, "200Gi"))
    code, _, err = await apply(kubectl, big)
    assert code == 0, err
    warning = re.search(r"^Warning: (.*)$", err, re.MULTILINE)
    assert warning is not None, f"no warning: {err!r}"
    assert warning.group(1).startswith(f"ResourceClaim {ns}/big: request gpu: no device fits: ")
    assert "node-01/gpu-0 has memory 24Gi, needs >= 200Gi" in warning.group(1)
    assert await helpers.exists(api, f"{RESOURCE}/namespaces/{ns}/resourceclaims/big")
    # Without a config of ours, the same through the webhook that only warns.
    plain = claim(release, "big-plain", selector=memory_at_least(release, "200Gi"))
    code, _, err = await apply(kubectl, plain)
    assert code == 0, err
    assert f"Warning: ResourceClaim {ns}/big-plain: request gpu: no device fits: " in err, err
    fits = claim(release, "fits", gpu_config(), selector=memory_at_least(release, "16Gi"))
    code, _, err = await apply(kubectl, fits)
    assert code == 0, err
    assert "Warning" not in err


# --- replicas, failure policies ----------------------------------------------------------


async def test_a_replica_deleted_mid_apply_lets_no_bad_config_through(
    api: kube.Kube, kubectl: Kubectl, release: Release
) -> None:
    ns = release.namespace
    pods = await api.get(
        f"/api/v1/namespaces/{ns}/pods", labelSelector="app.kubernetes.io/component=controller"
    )
    victim = pods["items"][0]["metadata"]["name"]
    bad = claim(release, "mid-apply", gpu_config(sharing={"strategy": "MPS"}))
    deleting = asyncio.create_task(kubectl("delete", "pod", "-n", ns, victim, "--wait=true"))
    outcomes: list[bool] = []
    started = time.monotonic()
    while not deleting.done() or len(outcomes) < 20:
        outcomes.append(await refused_by_webhook(kubectl, bad))
    await deleting
    print(
        f"ADMISSION mid-delete: {len(outcomes)} applies in {time.monotonic() - started:.1f}s, "
        f"{outcomes.count(False)} admitted"
    )
    assert all(outcomes), f"{outcomes.count(False)} of {len(outcomes)} bad configs admitted"
    await kubectl(
        "rollout",
        "status",
        "-n",
        ns,
        f"deployment/{release.name}-dra-gpu-controller",
        "--timeout=180s",
    )


async def test_with_the_webhook_down_ignore_admits_within_its_timeout_and_fail_refuses(
    helm: helpers.Helm, api: kube.Kube, kubectl: Kubectl, release: Release
) -> None:
    ns = release.namespace
    deployment = f"deployment/{release.name}-dra-gpu-controller"
    await kubectl("scale", "-n", ns, deployment, "--replicas=0")

    async def no_controller() -> bool:
        pods = await api.get(
            f"/api/v1/namespaces/{ns}/pods", labelSelector="app.kubernetes.io/component=controller"
        )
        return not pods["items"]

    await eventually(no_controller, timeout=120, what="controller pods gone")
    bad = claim(release, "while-down", gpu_config(sharing={"strategy": "MPS"}))
    started = time.monotonic()
    code, _, err = await apply(kubectl, bad, "--dry-run=server")
    took = time.monotonic() - started
    print(f"ADMISSION webhook down, failurePolicy Ignore: admitted in {took:.2f}s")
    assert code == 0, err
    await helm(
        "upgrade",
        release.name,
        str(CHART),
        "--namespace",
        ns,
        "--reuse-values",
        "--set",
        "controller.admission.failurePolicy=Fail,controller.replicas=0",
    )
    code, _, err = await apply(kubectl, bad, "--dry-run=server")
    assert code != 0
    assert "failed calling webhook" in err, err
    good = claim(release, "good-while-down", gpu_config())
    code, _, err = await apply(kubectl, good, "--dry-run=server")
    assert code != 0, "Fail refuses every object the webhook would have seen"
    # Back up: the strict cluster's webhook serves again and answers as before.
    await helm(
        "upgrade",
        release.name,
        str(CHART),
        "--namespace",
        ns,
        "--reuse-values",
        "--set",
        "controller.replicas=2",
        "--wait",
        "--timeout=240s",
    )
    await eventually(lambda: refused_by_webhook(kubectl, bad), timeout=90, what="refused again")
    code, _, err = await apply(kubectl, good, "--dry-run=server")
    assert code == 0, err


async def test_webhook_configuration_carries_the_leaders_ca(
    api: kube.Kube, release: Release
) -> None:
    configurations = await api.get(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    )
    ours = [
        c
        for c in configurations["items"]
        if any(
            release.namespace == (w["clientConfig"].get("service") or {}).get("namespace")
            for w in c.get("webhooks") or []
        )
    ]
    assert len(ours) == 1, json.dumps([c["metadata"]["name"] for c in configurations["items"]])
    bundles = {w["clientConfig"].get("caBundle") for w in ours[0]["webhooks"]}
    assert len(bundles) == 1
    assert None not in bundles
