"""The controller's admission webhook as `helm template` renders it: the Service every replica
stands behind, the ValidatingWebhookConfiguration (three webhooks, one per kind, at the paths
Kopf serves the handler ids on), the certificate's two modes (self-issued by the controller,
or cert-manager's), the RBAC each mode needs and no more, and the alerts on the webhook's
metric. The matchConditions' CEL is compiled by the real API server when tests/e2e installs
the chart, and evaluated there on objects with and without the driver's config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from dra_gpu import config
from tests.chart.template import CHART, Manifest, container, env_of, find, helm, refusal, render

DOWNWARD = {"metadata.namespace": "dra", "metadata.name": "pod-x"}
KINDS = ("resourceclaims", "resourceclaimtemplates", "deviceclasses")
SECRET = "rel-dra-gpu-webhook-tls"
CONFIGURATION = "dra-rel-dra-gpu"  # cluster-scoped: <namespace>-<fullname>
CERT_MANAGER = ("--set", "controller.admission.certManager.enabled=true")


def webhooks(docs: list[Manifest], *, warnings: bool = False) -> dict[str, Manifest]:
    """The configuration's webhooks by the resource each reviews: those that refuse, or
    (``warnings``) those that can only warn."""
    configuration = find(docs, "ValidatingWebhookConfiguration")
    found = {}
    for hook in configuration["webhooks"]:
        if ("-warnings." in hook["name"]) != warnings:
            continue
        (rule,) = hook["rules"]
        (resource,) = rule["resources"]
        found[resource] = hook
    assert sorted(found) == sorted(KINDS if not warnings else KINDS[:2])
    return found


def controller_settings(docs: list[Manifest]) -> config.ControllerSettings:
    env = env_of(find(docs, "Deployment"), DOWNWARD)
    ours = {k for k in env if k.startswith(config.ENV_PREFIX)}
    fields = {config.env_name(f.name) for f in dataclasses.fields(config.ControllerSettings)}
    assert ours <= fields, f"variables the code does not read: {ours - fields}"
    settings: config.ControllerSettings = config.settings_from(
        config.ControllerSettings, argparse.Namespace(), env
    )
    return settings


def rules_of(docs: list[Manifest], kind: str, suffix: str) -> list[Manifest]:
    rules: list[Manifest] = find(docs, kind, suffix)["rules"]
    return rules


def secret_rules(docs: list[Manifest]) -> list[tuple[str, Manifest]]:
    return [
        (doc["metadata"]["name"], rule)
        for doc in docs
        for rule in doc.get("rules", [])
        if "secrets" in rule.get("resources", [])
    ]


def test_three_webhooks_send_each_kind_to_its_path_on_the_controllers_service() -> None:
    docs = render()
    service = find(docs, "Service", "-webhook")
    assert service["metadata"]["name"] == "rel-dra-gpu-webhook"
    assert service["metadata"]["namespace"] == "dra"
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    # Every replica serves: the Service selects the Deployment's pods, leader or not.
    deployment = find(docs, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    assert ports["webhook"] == 8443
    assert container(deployment)["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Deleted, a replica serves on until the API server no longer picks its endpoint.
    assert container(deployment)["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}

    configuration = find(docs, "ValidatingWebhookConfiguration")
    assert configuration["metadata"]["name"] == CONFIGURATION
    assert "annotations" not in configuration["metadata"]
    for resource, hook in webhooks(docs).items():
        assert hook["name"] == f"{resource}.gpu.example.com"
        assert hook["clientConfig"] == {
            "service": {
                "name": "rel-dra-gpu-webhook",
                "namespace": "dra",
                "path": f"/{resource}",
                "port": 443,
            }
        }  # no caBundle: the controller keeps it
        (rule,) = hook["rules"]
        assert rule["apiGroups"] == ["resource.k8s.io"]
        assert rule["apiVersions"] == ["v1"]
        assert hook["matchPolicy"] == "Equivalent"  # v1beta1/v1beta2 arrive as v1
        assert hook["failurePolicy"] == "Ignore"
        assert hook["timeoutSeconds"] == 5
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]


def test_claims_and_templates_are_reviewed_when_created_and_classes_also_when_updated() -> None:
    hooks = webhooks(render())
    scopes = {r: (h["rules"][0]["operations"], h["rules"][0]["scope"]) for r, h in hooks.items()}
    assert scopes == {
        "resourceclaims": (["CREATE"], "Namespaced"),  # spec immutable: UPDATE is metadata
        "resourceclaimtemplates": (["CREATE"], "Namespaced"),
        "deviceclasses": (["CREATE", "UPDATE"], "Cluster"),
    }


def test_only_objects_carrying_the_drivers_opaque_config_are_sent() -> None:
    hooks = webhooks(render("--set", "driverName=gpu.acme.io"))
    conditions = {
        resource: {c["name"]: c["expression"] for c in hook["matchConditions"]}
        for resource, hook in hooks.items()
    }
    ours = "exists(c, has(c.opaque) && c.opaque.driver == 'gpu.acme.io')"
    assert conditions["resourceclaims"] == {
        "has-driver-config": "has(object.spec) && has(object.spec.devices) && "
        f"has(object.spec.devices.config) && object.spec.devices.config.{ours}"
    }
    assert conditions["resourceclaimtemplates"] == {
        "has-driver-config": "has(object.spec) && has(object.spec.spec) && "
        "has(object.spec.spec.devices) && has(object.spec.spec.devices.config) && "
        f"object.spec.spec.devices.config.{ours}"
    }
    assert conditions["deviceclasses"] == {
        "has-driver-config": f"has(object.spec) && has(object.spec.config) && "
        f"object.spec.config.{ours}",
        # An UPDATE that leaves the config alone (labels, finalizers) is never refused.
        "config-changed": "request.operation != 'UPDATE' || !has(oldObject.spec.config) || "
        "!has(object.spec.config) || oldObject.spec.config != object.spec.config",
    }


def test_webhook_names_are_domains_of_three_labels_even_for_a_one_label_driver() -> None:
    names = {h["name"] for h in webhooks(render("--set", "driverName=gpu")).values()}
    assert names == {f"{kind}.admission.gpu" for kind in KINDS}


def test_namespaced_kinds_skip_kube_system_unless_told_otherwise() -> None:
    hooks = webhooks(render())
    default = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]
    }
    assert hooks["resourceclaims"]["namespaceSelector"] == default
    assert hooks["resourceclaimtemplates"]["namespaceSelector"] == default
    assert "namespaceSelector" not in hooks["deviceclasses"]  # cluster-scoped: none applies
    # The chart's own classes are checked as it renders (with Fail, they come before the
    # controller could review them).
    assert hooks["deviceclasses"]["objectSelector"] == {
        "matchExpressions": [
            {"key": "app.kubernetes.io/instance", "operator": "NotIn", "values": ["rel"]}
        ]
    }
    own = {"matchLabels": {"gpus": "checked"}, "matchExpressions": None}
    hooks = webhooks(
        render("--set-json", f"controller.admission.namespaceSelector={json.dumps(own)}")
    )
    assert hooks["resourceclaims"]["namespaceSelector"] == {"matchLabels": {"gpus": "checked"}}
    every = webhooks(render("--set", "controller.admission.namespaceSelector=null"))
    assert "namespaceSelector" not in every["resourceclaims"]  # the API server's default: all


def test_failure_policy_and_timeout_are_values() -> None:
    docs = render(
        *("--set", "controller.admission.failurePolicy=Fail"),
        *("--set", "controller.admission.timeoutSeconds=10"),
    )
    for resource, hook in webhooks(docs).items():
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Fail", 10), resource


def test_self_issued_the_controller_is_told_every_name_and_the_chart_renders_no_secret() -> None:
    docs = render()
    settings = controller_settings(docs)
    assert settings.webhook_port == 8443
    assert settings.webhook_service == find(docs, "Service", "-webhook")["metadata"]["name"]
    assert settings.webhook_secret == SECRET
    assert settings.webhook_configuration == CONFIGURATION
    assert settings.webhook_cert_dir is None  # the controller issues its own
    # The controller creates the Secret: a rendered one would be Helm's, reset by each upgrade.
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert not [d for d in docs if d["kind"] in {"Certificate", "Issuer"}]
    volumes = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert [v["name"] for v in volumes] == ["tmp"]


def test_self_issued_rbac_names_only_the_webhooks_secret_and_configuration() -> None:
    docs = render()
    assert rules_of(docs, "Role", "-controller-webhook") == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [SECRET],
            "verbs": ["get", "update"],
        },
    ]
    assert find(docs, "Role", "-controller-webhook")["metadata"]["namespace"] == "dra"
    binding = find(docs, "RoleBinding", "-controller-webhook")
    assert binding["roleRef"]["name"] == "rel-dra-gpu-controller-webhook"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-dra-gpu-controller", "namespace": "dra"}
    ]
    on_configurations = [
        rule
        for rule in rules_of(docs, "ClusterRole", "-controller")
        if "validatingwebhookconfigurations" in rule["resources"]
    ]
    assert on_configurations == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": [CONFIGURATION],
            "verbs": ["get", "patch"],
        }
    ]
    assert [name for name, _ in secret_rules(docs)] == ["rel-dra-gpu-controller-webhook"] * 2


def test_cert_manager_issues_the_certificate_and_the_controller_reads_it_mounted() -> None:
    docs = render(*CERT_MANAGER)
    certificate = find(docs, "Certificate")
    assert certificate["metadata"] == certificate["metadata"] | {
        "name": "rel-dra-gpu-webhook",
        "namespace": "dra",
    }
    assert certificate["spec"] == {
        "secretName": SECRET,
        "dnsNames": [
            "rel-dra-gpu-webhook",
            "rel-dra-gpu-webhook.dra",
            "rel-dra-gpu-webhook.dra.svc",
            "rel-dra-gpu-webhook.dra.svc.cluster.local",
        ],
        "issuerRef": {
            "name": "rel-dra-gpu-webhook-selfsigned",
            "kind": "Issuer",
            "group": "cert-manager.io",
        },
    }
    issuer = find(docs, "Issuer")
    assert (issuer["metadata"]["name"], issuer["spec"]) == (
        "rel-dra-gpu-webhook-selfsigned",
        {"selfSigned": {}},
    )
    configuration = find(docs, "ValidatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "dra/rel-dra-gpu-webhook"
    }
    deployment = find(docs, "Deployment")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": SECRET}} in volumes
    mount = next(m for m in container(deployment)["volumeMounts"] if m["name"] == "webhook-tls")
    assert mount == {
        "name": "webhook-tls",
        "mountPath": "/var/run/dra-gpu/webhook",
        "readOnly": True,
    }
    settings = controller_settings(docs)
    assert settings.webhook_cert_dir == Path(mount["mountPath"])
    assert settings.webhook_port == 8443
    # cert-manager writes the Secret and the caBundle: the controller writes neither.
    assert secret_rules(docs) == []
    assert not [
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-webhook")
    ]
    cluster_rules = rules_of(docs, "ClusterRole", "-controller")
    assert not [r for r in cluster_rules if "validatingwebhookconfigurations" in r["resources"]]


def test_cert_manager_with_an_issuer_of_the_users_renders_no_issuer() -> None:
    ref = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    docs = render(
        *CERT_MANAGER, "--set-json", f"controller.admission.certManager.issuerRef={json.dumps(ref)}"
    )
    assert find(docs, "Certificate")["spec"]["issuerRef"] == ref
    assert not [d for d in docs if d["kind"] == "Issuer"]


@pytest.mark.parametrize(
    "args",
    [
        ("--set", "controller.admission.enabled=false"),
        ("--set", "controller.enabled=false"),
        ("--set", "controller.admission.enabled=false", *CERT_MANAGER),
    ],
)
def test_without_admission_none_of_it_is_rendered(args: tuple[str, ...]) -> None:
    docs = render(*args)
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ValidatingWebhookConfiguration", "Certificate", "Issuer", "Secret"}
    assert not [d for d in docs if d["metadata"]["name"].endswith(("-webhook", "-webhook-tls"))]
    assert secret_rules(docs) == []
    everything = json.dumps(docs)
    assert "validatingwebhookconfigurations" not in everything
    assert "DRA_GPU_WEBHOOK" not in everything
    if "Deployment" in kinds:
        ports = {p["name"] for p in container(find(docs, "Deployment"))["ports"]}
        assert "webhook" not in ports
        assert controller_settings(docs).webhook_port == 0  # no admission listener


def test_a_disruption_budget_keeps_a_replica_when_there_are_several() -> None:
    budget = find(render(), "PodDisruptionBudget")
    assert budget["metadata"]["name"] == "rel-dra-gpu-controller"
    assert budget["spec"]["maxUnavailable"] == 1
    selector = find(render(), "Deployment")["spec"]["selector"]
    assert budget["spec"]["selector"] == selector
    assert not [
        d for d in render("--set", "controller.replicas=1") if d["kind"] == "PodDisruptionBudget"
    ]


def test_admission_alerts_sum_the_replicas_and_follow_the_rules_conventions() -> None:
    docs = render(
        *("--set", "metrics.prometheusRule.enabled=true"),
        *("--set", "metrics.prometheusRule.runbookUrl=https://example.invalid/ops.md"),
    )
    rules = {r["alert"]: r for r in find(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]}
    errors, refusals = rules["DraGpuAdmissionErrors"], rules["DraGpuAdmissionRefusalsHigh"]
    job = 'job="rel-dra-gpu-controller-metrics"'
    # Each replica counts the reviews it answered: summed, unlike the cluster-wide series.
    errors_seen = f'dra_gpu_admission_requests_total{{{job},result="error"}}'
    assert errors["expr"].strip() == f"sum by (kind) (increase({errors_seen}[5m])) > 0"
    assert errors["for"] == "10m"
    assert f'dra_gpu_admission_requests_total{{{job},result="refused"}}[15m]' in refusals["expr"]
    assert "> 0.5" in refusals["expr"]
    assert ">= 10" in refusals["expr"]
    assert refusals["for"] == "15m"
    for name, body in (
        ("dragpuadmissionerrors", errors),
        ("dragpuadmissionrefusalshigh", refusals),
    ):
        assert body["labels"] == {"severity": "warning"}
        assert body["annotations"]["runbook_url"] == f"https://example.invalid/ops.md#{name}"
        assert "{{ $labels.kind }}" in body["annotations"]["summary"]
    off = render(
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "controller.admission.enabled=false",
    )
    alerts = {r["alert"] for r in find(off, "PrometheusRule")["spec"]["groups"][0]["rules"]}
    assert not {"DraGpuAdmissionErrors", "DraGpuAdmissionRefusalsHigh"} & alerts


def _admission(values: dict[str, Any]) -> dict[str, Any]:
    return {"controller": {"admission": values}}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (_admission({"failurePolicy": "Sometimes"}), "/controller/admission/failurePolicy"),
        (_admission({"timeoutSeconds": 60}), "/controller/admission/timeoutSeconds"),
        (_admission({"timeoutSeconds": 0}), "/controller/admission/timeoutSeconds"),
        (_admission({"port": 0}), "/controller/admission/port"),
        (_admission({"bogus": 1}), "additional properties 'bogus' not allowed"),
        (
            _admission({"certManager": {"enabled": True, "issuerRef": {"nmae": "x"}}}),
            "/controller/admission/certManager/issuerRef",
        ),
        (
            _admission({"certManager": {"enabled": True, "issuerRef": {"kind": "ClusterIssuer"}}}),
            "controller.admission.certManager.issuerRef: name is required",
        ),
        (
            _admission(
                {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}
            ),
            "/controller/admission/namespaceSelector/matchExpressions/0/operator",
        ),
        (_admission({"port": 9400}), "controller.admission.port: 9400 is also the controller's"),
    ],
)
def test_bad_admission_values_are_refused_naming_the_key(
    tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    stderr = refusal(values, tmp_path)
    assert named in stderr, stderr


def test_claims_of_the_drivers_classes_without_a_config_go_to_a_webhook_that_only_warns() -> None:
    docs = render(
        *("--set", "deviceClasses.extra[0].name=gpu-inferencia"),
        *("--set", "controller.admission.warnings.classes={gpu-mine}"),
        *("--set", "controller.admission.failurePolicy=Fail"),
    )
    hooks = webhooks(docs, warnings=True)
    classes = "in ['gpu.example.com', 'gpu-inferencia', 'gpu-mine']"
    for resource, devices in [
        ("resourceclaims", "object.spec.devices"),
        ("resourceclaimtemplates", "object.spec.spec.devices"),
    ]:
        hook = hooks[resource]
        assert hook["name"] == f"{resource}-warnings.gpu.example.com"
        assert hook["clientConfig"]["service"]["path"] == f"/{resource}"  # the same handler
        assert hook["failurePolicy"] == "Ignore"  # advice never stops a workload
        assert hook["rules"][0]["operations"] == ["CREATE"]
        conditions = {c["name"]: c["expression"] for c in hook["matchConditions"]}
        requests = conditions["requests-a-class-of-the-driver"]
        assert (
            f"{devices}.requests.exists(r, (has(r.exactly) && r.exactly.deviceClassName "
            f"{classes})" in requests
        )
        assert f"r.firstAvailable.exists(s, s.deviceClassName {classes})" in requests
        # Never both webhooks for one object: one review, one warning.
        assert conditions["no-driver-config"].startswith("!(")
        assert f"{devices}.config.exists(c, has(c.opaque)" in conditions["no-driver-config"]
    off = find(
        render("--set", "controller.admission.warnings.enabled=false"),
        "ValidatingWebhookConfiguration",
    )
    assert [h["name"] for h in off["webhooks"] if "-warnings." in h["name"]] == []


def test_a_chart_class_config_prepare_would_refuse_fails_the_render_naming_it() -> None:
    bad = {
        "name": "gpu-shared",
        "config": [
            {
                "opaque": {
                    "driver": "gpu.example.com",
                    "parameters": {
                        "apiVersion": "gpu.dra-gpu.io/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "MPS"},
                    },
                }
            }
        ],
    }
    done = helm(
        "template", "rel", str(CHART), "--set-json", f"deviceClasses.extra=[{json.dumps(bad)}]"
    )
    assert done.returncode != 0
    assert (
        "deviceClasses.extra[gpu-shared].config[0].opaque.parameters.sharing.strategy: MPS "
        "is not one of Exclusive, TimeSlicing" in done.stderr
    )
