"""The Helm chart on the real API server: what it renders is valid Kubernetes, it installs,
its service accounts can do what the code needs and no more, the admission policy keeps each
agent to its own node's ResourceSlices, and upgrade and uninstall leave nothing behind.

The nodes are real (kubelet + containerd, the chart's image imported): the releases' agent and
controller pods really run. The identities are exercised with real tokens from the
TokenRequest API, bound to pods as the kubelet's would be. The schema check is the API server
itself (`kubectl apply --dry-run=server`): no network for kubeconform's schemas here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from dra_gpu import kube
from dra_gpu.testing import ControlPlane, RealNode, eventually
from tests.e2e import helpers

CHART = helpers.REPO / "charts" / "dra-gpu"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
NODE_KEY = "authentication.kubernetes.io/node-name"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# Kinds whose CRDs (Prometheus Operator) this cluster does not have.
NOT_SERVED = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


class Identity:
    """Plain HTTPS with one bearer token: the API server sees exactly this token's user."""

    def __init__(self, control_plane: ControlPlane, token: str) -> None:
        self.server = control_plane.server
        self.ssl = ssl.create_default_context(cafile=str(control_plane.ca_file))
        self.headers = {"Authorization": f"Bearer {token}"}

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method, self.server + path, json=body, headers=self.headers, ssl=self.ssl
            ) as response,
        ):
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:  # a watch: one JSON document per line
                return response.status, {"text": text[:200]}


@pytest.fixture(scope="module")
def helm(control_plane: ControlPlane) -> helpers.Helm:
    return helpers.Helm(control_plane)


async def apply_dry_run(control_plane: ControlPlane, namespace: str, manifests: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(control_plane.binary("kubectl")),
        "apply",
        "--dry-run=server",
        "--namespace",
        namespace,
        "-f",
        "-",
        env={**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(manifests.encode())
    assert proc.returncode == 0, f"the API server refused the rendered chart:\n{err.decode()}"
    return out.decode()


@pytest.mark.parametrize("values", [None, FULL_VALUES], ids=["default-values", "full-values"])
async def test_rendered_chart_is_accepted_by_the_api_server(
    control_plane: ControlPlane, helm: helpers.Helm, namespace: str, values: Path | None
) -> None:
    extra = ["--values", str(values)] if values else []
    rendered = await helm("template", "rel", str(CHART), "--namespace", namespace, *extra)
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    served = [d for d in docs if d["kind"] not in NOT_SERVED]
    assert len(served) >= 16
    out = await apply_dry_run(control_plane, namespace, yaml.safe_dump_all(served))
    assert out.count("(server dry run)") == len(served), out


async def test_bad_values_stop_the_install_naming_the_key(
    helm: helpers.Helm, namespace: str
) -> None:
    code, _, err = await helm.run(
        "install",
        f"bad-{secrets.token_hex(3)}",
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        "agent.backend=cuda,controller.replicaz=2",
    )
    assert code != 0
    assert "/agent/backend" in err, err
    assert "'replicaz' not allowed" in err, err


# ---- one release, installed once for the identity checks ---------------------------------


class Release:
    def __init__(self, name: str, namespace: str, driver: str, device_class: str) -> None:
        self.name, self.namespace = name, namespace
        self.driver, self.device_class = driver, device_class
        self.agent_sa = f"{name}-dra-gpu-agent"
        self.controller_sa = f"{name}-dra-gpu-controller"
        self.policy = f"{namespace}-{name}-dra-gpu-agent-own-node"
        self.notes = ""


async def install(helm: helpers.Helm, api: kube.Kube, *extra: str) -> Release:
    suffix = secrets.token_hex(3)
    namespace, name = f"chart-{suffix}", f"r{suffix}"
    # Unique driver and class names: DeviceClasses are cluster-scoped, other tests have theirs.
    release = Release(name, namespace, f"chart-{suffix}.example.com", f"gpu-{suffix}")
    await api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    release.notes = await helm(
        "install",
        name,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        f"driverName={release.driver},deviceClasses.default.name={release.device_class}",
        *extra,
    )
    return release


async def remove(helm: helpers.Helm, api: kube.Kube, release: Release) -> None:
    await helm.run("uninstall", release.name, "--namespace", release.namespace)
    await api.delete(f"/api/v1/namespaces/{release.namespace}")
    await eventually(
        lambda: helpers.gone(api, f"/api/v1/namespaces/{release.namespace}"),
        timeout=120,
        what=f"namespace {release.namespace} gone",
    )


@pytest_asyncio.fixture(scope="module")
async def release(
    helm: helpers.Helm, api: kube.Kube, nodes: list[RealNode]
) -> AsyncIterator[Release]:
    # The real nodes run the chart's pods and the pod our agent token is bound to, and
    # complete the deletion of the chart's pods after uninstall.
    installed = await install(helm, api)
    yield installed
    await remove(helm, api, installed)


async def token_for(
    api: kube.Kube, namespace: str, service_account: str, pod: kube.Body | None = None
) -> str:
    """A ServiceAccount token from the TokenRequest API; bound to ``pod`` if given, which is
    what makes the API server put the pod's node name into the token."""
    spec: dict[str, Any] = {"expirationSeconds": 600}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    answer = await api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    token: str = answer["status"]["token"]
    return token


async def agent_pod_on(api: kube.Kube, release: Release, node: str) -> kube.Body:
    """A pod as the DaemonSet makes one: the agent's ServiceAccount, bound to ``node``."""
    return await api.create(
        f"/api/v1/namespaces/{release.namespace}/pods",
        {
            "metadata": {"name": f"agent-{node}-{secrets.token_hex(2)}"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": release.agent_sa,
                "containers": [helpers.workload("agent")],
            },
        },
    )


def slice_body(release: Release, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{release.driver}-{secrets.token_hex(2)}"},
        "spec": {
            "driver": release.driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


async def test_install_creates_the_device_classes_and_the_policy(
    api: kube.Kube, release: Release
) -> None:
    device_class = await api.get(f"/apis/resource.k8s.io/v1/deviceclasses/{release.device_class}")
    assert device_class["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{release.driver}"'}}
    ]
    admission = "/apis/admissionregistration.k8s.io/v1"
    policy = await api.get(f"{admission}/validatingadmissionpolicies/{release.policy}")
    binding = await api.get(f"{admission}/validatingadmissionpolicybindings/{release.policy}")
    assert binding["spec"] == {"policyName": release.policy, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    # The policy compiled: a CEL typo would show up here, not as a silently allowed write.
    await eventually(
        lambda: policy_checked(api, release.policy), what=f"policy {release.policy} type-checked"
    )
    for kind in ("serviceaccounts", "configmaps", "services"):
        listing = await api.get(
            f"/api/v1/namespaces/{release.namespace}/{kind}",
            labelSelector=f"app.kubernetes.io/instance={release.name}",
        )
        assert listing["items"], f"no {kind} of the release"
    # NOTES.txt tells how to check it works, with this release's names.
    assert f"kubectl get resourceslices --field-selector spec.driver={release.driver}" in (
        release.notes
    )
    assert f"kubectl get deviceclasses {release.device_class}" in release.notes
    assert "dra-gpu explain pod/<name>" in release.notes


async def policy_checked(api: kube.Kube, name: str) -> bool:
    policy = await api.get(
        f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}"
    )
    status = policy.get("status") or {}
    if status.get("observedGeneration") != policy["metadata"]["generation"]:
        return False
    warnings = (status.get("typeChecking") or {}).get("expressionWarnings") or []
    assert not warnings, f"policy {name} has CEL type errors: {warnings}"
    return True


async def test_controller_can_read_what_it_watches_and_no_secrets(
    control_plane: ControlPlane, api: kube.Kube, release: Release
) -> None:
    controller = Identity(
        control_plane, await token_for(api, release.namespace, release.controller_sa)
    )
    watched = [
        "/apis/resource.k8s.io/v1/deviceclasses",
        "/apis/resource.k8s.io/v1/resourceclaims",
        "/apis/resource.k8s.io/v1/resourceslices",
        "/api/v1/pods",
        "/api/v1/nodes",
        "/api/v1/events",
    ]
    reads = [
        *watched,
        *(f"{path}?watch=1&timeoutSeconds=1" for path in watched),  # what Kopf does
        "/api/v1/nodes/node-01",
        f"/api/v1/namespaces/{release.namespace}/events?fieldSelector=involvedObject.uid%3Dx",
    ]
    answers = await asyncio.gather(*(controller.request("GET", path) for path in reads))
    for path, (status, body) in zip(reads, answers, strict=True):
        assert status == 200, f"controller GET {path}: {status} {body}"
    for path in ("/api/v1/secrets", f"/api/v1/namespaces/{release.namespace}/secrets"):
        status, body = await controller.request("GET", path)
        assert status == 403, f"controller may read {path}: {status}"
    # Writes, without writing: SelfSubjectAccessReview as the controller.
    allowed = [
        ("delete", "resource.k8s.io", "resourceslices", None, ""),
        ("patch", "resource.k8s.io", "resourceclaims", "default", "status"),
        ("create", "events.k8s.io", "events", "default", ""),
        ("create", "coordination.k8s.io", "leases", release.namespace, ""),
        ("update", "coordination.k8s.io", "leases", release.namespace, ""),
    ]
    denied = [
        ("get", "", "secrets", release.namespace, ""),
        ("create", "resource.k8s.io", "resourceslices", None, ""),
        ("update", "resource.k8s.io", "resourceclaims", "default", ""),
        ("update", "coordination.k8s.io", "leases", "default", ""),
        ("create", "", "events", "default", ""),
        ("patch", "", "pods", "default", ""),
    ]
    lease = f"{release.name}-dra-gpu-controller"  # the release's own Lease, no other
    for attributes in allowed:
        assert await can(controller, *attributes, name=lease), f"controller cannot {attributes}"
    for attributes in denied:
        assert not await can(controller, *attributes, name=lease), f"controller may {attributes}"
    assert not await can(
        controller,
        "update",
        "coordination.k8s.io",
        "leases",
        release.namespace,
        "",
        name="dra-gpu-controller",
    ), "controller may take another release's Lease"
    # The admission webhook's own Secret and configuration, by name, and nothing else.
    secret = f"{release.name}-dra-gpu-webhook-tls"
    configuration = f"{release.namespace}-{release.name}-dra-gpu"
    webhook_access = [
        (("get", "", "secrets", release.namespace, ""), secret, True),
        (("update", "", "secrets", release.namespace, ""), secret, True),
        (("create", "", "secrets", release.namespace, ""), "", True),
        (("get", "", "secrets", release.namespace, ""), "other", False),
        (("update", "", "secrets", release.namespace, ""), "other", False),
        (("get", "", "secrets", "default", ""), secret, False),
        (("list", "", "secrets", release.namespace, ""), "", False),
        (
            ("patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", None, ""),
            configuration,
            True,
        ),
        (
            ("patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", None, ""),
            "other",
            False,
        ),
    ]
    for attributes, name, expected in webhook_access:
        assert await can(controller, *attributes, name=name) == expected, (attributes, name)


async def can(
    identity: Identity,
    verb: str,
    group: str,
    resource: str,
    namespace: str | None,
    subresource: str,
    name: str = "",
) -> bool:
    attributes: dict[str, Any] = {
        "verb": verb,
        "group": group,
        "resource": resource,
        "subresource": subresource,
    }
    if namespace is not None:
        attributes["namespace"] = namespace
    if name and verb != "create":
        attributes["name"] = name
    status, body = await identity.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        },
    )
    assert status == 201, body
    return bool(body["status"].get("allowed"))


async def refusal_of(
    api: kube.Kube, agent: Identity, body: dict[str, Any]
) -> dict[str, Any] | None:
    """The answer to the agent creating ``body``, if refused. The policy may take a moment to
    become active after install: a slice that slipped through is undone, and None returned."""
    code, answer = await agent.request("POST", SLICES, body)
    if code == 201:
        await api.delete(f"{SLICES}/{body['metadata']['name']}")
        return None
    return {"code": code, **answer}


async def test_agent_writes_slices_of_its_own_node_only(
    control_plane: ControlPlane, api: kube.Kube, release: Release
) -> None:
    pod = await agent_pod_on(api, release, "node-01")
    agent = Identity(control_plane, await token_for(api, release.namespace, release.agent_sa, pod))
    # The pod-bound token carries the node: that is what the policy compares with.
    status, review = await agent.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert status == 201, review
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{release.namespace}:{release.agent_sa}"
    assert user["extra"][NODE_KEY] == ["node-01"]

    created: list[str] = []
    try:
        # Refused for node-02 by the policy (its message, not RBAC's).
        refusal = await eventually(
            lambda: refusal_of(api, agent, slice_body(release, "node-02")),
            what="policy denies node-02's slice",
        )
        assert refusal["code"] == 403, refusal
        assert f"ValidatingAdmissionPolicy '{release.policy}'" in refusal["message"], refusal
        assert (
            "dra-gpu agent on node node-01 may only write ResourceSlices of its own node, "
            "not of node node-02" in refusal["message"]
        ), refusal

        # Its own node: create, update, delete.
        own = slice_body(release, "node-01")
        code, answer = await agent.request("POST", SLICES, own)
        assert code == 201, answer
        created.append(own["metadata"]["name"])
        answer["spec"]["pool"]["generation"] = 2
        code, answer = await agent.request("PUT", f"{SLICES}/{own['metadata']['name']}", answer)
        assert code == 200, answer

        # Moving its own slice to another node is an update the policy refuses too.
        answer["spec"]["nodeName"] = "node-02"
        code, moved = await agent.request("PUT", f"{SLICES}/{own['metadata']['name']}", answer)
        assert code in (403, 422), moved  # 422: nodeName is immutable; either way refused

        # Another node's slice (written by the admin) can be neither updated nor deleted.
        theirs = await api.create(SLICES, slice_body(release, "node-02"))
        created.append(theirs["metadata"]["name"])
        theirs["spec"]["pool"]["generation"] = 2
        code, answer = await agent.request("PUT", f"{SLICES}/{theirs['metadata']['name']}", theirs)
        assert code == 403, answer
        assert "not of node node-02" in answer["message"], answer
        code, answer = await agent.request("DELETE", f"{SLICES}/{theirs['metadata']['name']}")
        assert code == 403, answer
        assert "not of node node-02" in answer["message"], answer

        code, answer = await agent.request("DELETE", f"{SLICES}/{own['metadata']['name']}")
        assert code == 200, answer
        created.remove(own["metadata"]["name"])
    finally:
        for name in created:
            await api.delete(f"{SLICES}/{name}")


async def test_agent_token_without_a_node_is_refused_by_the_policy(
    control_plane: ControlPlane, api: kube.Kube, release: Release
) -> None:
    # A token not bound to a pod carries no node name: no slice at all, with a clear reason.
    agent = Identity(control_plane, await token_for(api, release.namespace, release.agent_sa))
    body = slice_body(release, "node-01")
    refusal = await eventually(
        lambda: refusal_of(api, agent, body), what="policy denies a slice from a token without node"
    )
    assert refusal["code"] == 403, refusal
    assert "no node name in the token" in refusal["message"], refusal


async def test_agent_has_exactly_the_access_the_code_needs(
    control_plane: ControlPlane, api: kube.Kube, release: Release
) -> None:
    agent = Identity(control_plane, await token_for(api, release.namespace, release.agent_sa))
    allowed = [
        ("get", "", "nodes", None, ""),
        ("list", "resource.k8s.io", "resourceslices", None, ""),
        ("watch", "resource.k8s.io", "resourceslices", None, ""),
        ("create", "resource.k8s.io", "resourceslices", None, ""),
        ("update", "resource.k8s.io", "resourceslices", None, ""),
        ("delete", "resource.k8s.io", "resourceslices", None, ""),
        ("get", "resource.k8s.io", "resourceclaims", "default", ""),
        ("list", "resource.k8s.io", "resourceclaims", None, ""),
        ("patch", "resource.k8s.io", "resourceclaims", "default", "status"),
        ("create", "events.k8s.io", "events", "default", ""),
        ("list", "", "pods", None, ""),  # its node's (the claim cache's field selector)
        ("watch", "", "pods", None, ""),
    ]
    denied = [
        ("get", "", "secrets", release.namespace, ""),
        ("list", "", "secrets", None, ""),
        ("list", "", "nodes", None, ""),
        ("update", "resource.k8s.io", "resourceclaims", "default", ""),
        ("create", "resource.k8s.io", "deviceclasses", None, ""),
        ("get", "", "pods", "default", ""),
        ("patch", "", "pods", "default", ""),
    ]
    for attributes in allowed:
        assert await can(agent, *attributes), f"agent cannot {attributes}"
    for attributes in denied:
        assert not await can(agent, *attributes), f"agent may {attributes}"


async def test_upgrade_and_uninstall_leave_only_what_the_user_made(
    helm: helpers.Helm, api: kube.Kube, nodes: list[RealNode], tmp_path: Path
) -> None:
    release = await install(helm, api)
    extra_class = f"{release.device_class}-big"
    user_class = f"{release.device_class}-users-own"
    try:
        grown = tmp_path / "grown.yaml"
        grown.write_text(
            json.dumps(
                {
                    "controller": {"replicas": 1},
                    "deviceClasses": {
                        "extra": [
                            {
                                "name": extra_class,
                                "selectors": [f'device.attributes["{release.driver}"].index == 0'],
                            }
                        ]
                    },
                }
            )
        )
        upgrade = ("upgrade", release.name, str(CHART), "--namespace", release.namespace)
        await helm(*upgrade, "--reuse-values", "--values", str(grown))
        base = f"/apis/apps/v1/namespaces/{release.namespace}"
        deployment = await api.get(f"{base}/deployments/{release.name}-dra-gpu-controller")
        assert deployment["spec"]["replicas"] == 1
        await api.get(f"/apis/resource.k8s.io/v1/deviceclasses/{extra_class}")
        # What the user made beside the chart: a DeviceClass and a ConfigMap of its own.
        await api.create(
            "/apis/resource.k8s.io/v1/deviceclasses",
            {"metadata": {"name": user_class}, "spec": {}},
        )
        await api.create(
            f"/api/v1/namespaces/{release.namespace}/configmaps",
            {"metadata": {"name": "users-own"}, "data": {"a": "b"}},
        )
        cluster_scoped = [
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{release.namespace}-{release.name}-dra-gpu-agent",
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{release.namespace}-{release.name}-dra-gpu-controller",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{release.namespace}-{release.name}-dra-gpu-agent",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{release.namespace}-{release.name}-dra-gpu-controller",
            f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{release.policy}",
            f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{release.policy}",
            f"/apis/resource.k8s.io/v1/deviceclasses/{release.device_class}",
            f"/apis/resource.k8s.io/v1/deviceclasses/{extra_class}",
        ]
        for path in cluster_scoped:
            assert await helpers.exists(api, path), path

        # Dropping the extra class in an upgrade deletes it.
        shrunk = tmp_path / "shrunk.yaml"
        shrunk.write_text(json.dumps({"deviceClasses": {"extra": []}}))
        await helm(*upgrade, "--reuse-values", "--values", str(shrunk))
        assert not await helpers.exists(api, cluster_scoped[-1])

        await helm("uninstall", release.name, "--namespace", release.namespace)
        for path in cluster_scoped:
            await eventually(functools.partial(helpers.gone, api, path), what=f"{path} deleted")
        selector = f"app.kubernetes.io/instance={release.name}"
        for path in (
            "/api/v1/namespaces/{ns}/serviceaccounts",
            "/api/v1/namespaces/{ns}/configmaps",
            "/api/v1/namespaces/{ns}/services",
            "/apis/apps/v1/namespaces/{ns}/deployments",
            "/apis/apps/v1/namespaces/{ns}/daemonsets",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        ):
            listing = await api.get(path.format(ns=release.namespace), labelSelector=selector)
            assert listing["items"] == [], json.dumps(listing["items"])[:500]
        assert await helpers.exists(api, f"/apis/resource.k8s.io/v1/deviceclasses/{user_class}")
        assert await helpers.exists(
            api, f"/api/v1/namespaces/{release.namespace}/configmaps/users-own"
        )
    finally:
        with contextlib.suppress(kube.ApiError):
            await api.delete(f"/apis/resource.k8s.io/v1/deviceclasses/{user_class}")
        await remove(helm, api, release)
