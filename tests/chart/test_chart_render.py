"""The Helm chart as `helm template` renders it: no cluster, only the built helm binary (the
folder's tests are marked ``binaries``).

What the chart sets must be what the code reads: every DRA_GPU_* variable of a container is a
settings field and parses into valid settings; the driver name is one value; host paths are
the same inside and outside; bad values stop the render naming the key. The rendered objects
are checked against the real API server in tests/e2e/test_chart.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu import config
from dra_gpu.agent import server
from dra_gpu.devices import model, simulated
from tests.chart.template import CHART, FULL_VALUES, container, env_of, find, helm, refusal, render


def settings_from_env(settings_type: type[Any], env: dict[str, str]) -> Any:
    fields = {f.name for f in dataclasses.fields(settings_type)}
    ours = {k for k in env if k.startswith(config.ENV_PREFIX)}
    assert ours <= {config.env_name(f) for f in fields}, "a variable the code does not read"
    return config.settings_from(settings_type, argparse.Namespace(), env)


DOWNWARD = {
    "spec.nodeName": "node-01",
    "metadata.namespace": "dra",
    "metadata.name": "pod-x",
    "metadata.uid": "0a1b2c3d-0000-4000-8000-000000000001",
}
TUTORIAL = CHART / "profiles" / "tutorial.yaml"


def test_helm_lint_passes_with_default_and_full_values() -> None:
    for extra in ([], ["--values", str(FULL_VALUES)]):
        done = helm("lint", "--strict", str(CHART), *extra)
        assert done.returncode == 0, done.stdout + done.stderr


def test_default_render_has_one_object_per_piece() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in render())
    assert kinds == [
        ("ClusterRole", "dra-rel-dra-gpu-agent"),
        ("ClusterRole", "dra-rel-dra-gpu-controller"),
        ("ClusterRoleBinding", "dra-rel-dra-gpu-agent"),
        ("ClusterRoleBinding", "dra-rel-dra-gpu-controller"),
        ("ConfigMap", "rel-dra-gpu-profile"),
        ("DaemonSet", "rel-dra-gpu-agent"),
        ("Deployment", "rel-dra-gpu-controller"),
        ("DeviceClass", "gpu.example.com"),
        ("PodDisruptionBudget", "rel-dra-gpu-controller"),
        ("Role", "rel-dra-gpu-controller-leader"),
        ("Role", "rel-dra-gpu-controller-webhook"),
        ("RoleBinding", "rel-dra-gpu-controller-leader"),
        ("RoleBinding", "rel-dra-gpu-controller-webhook"),
        ("Service", "rel-dra-gpu-agent-metrics"),
        ("Service", "rel-dra-gpu-controller-metrics"),
        ("Service", "rel-dra-gpu-webhook"),
        ("ServiceAccount", "rel-dra-gpu-agent"),
        ("ServiceAccount", "rel-dra-gpu-controller"),
        ("ValidatingAdmissionPolicy", "dra-rel-dra-gpu-agent-own-node"),
        ("ValidatingAdmissionPolicyBinding", "dra-rel-dra-gpu-agent-own-node"),
        ("ValidatingWebhookConfiguration", "dra-rel-dra-gpu"),
    ]


def test_agent_environment_is_valid_agent_settings() -> None:
    docs = render()
    agent = find(docs, "DaemonSet")
    settings = settings_from_env(config.AgentSettings, env_of(agent, DOWNWARD))
    assert settings.node_name == "node-01"
    assert settings.driver_name == "gpu.example.com"
    assert settings.backend == "simulated"
    assert (settings.metrics_port, settings.health_port) == (9402, 9403)
    ports = {p["name"]: p["containerPort"] for p in container(agent)["ports"]}
    assert ports == {"metrics": 9402, "health": 9403}
    # The profile file the agent is pointed at is the ConfigMap's, and the agent can parse it.
    mounts = {m["name"]: m["mountPath"] for m in container(agent)["volumeMounts"]}
    assert settings.profile == Path(mounts["profile"]) / "profile.yaml"
    profile_text = find(docs, "ConfigMap", "-profile")["data"]["profile.yaml"]
    profile = simulated.parse_profile(profile_text, "chart default profile")
    assert profile is not None
    assert yaml.safe_load(profile_text) == yaml.safe_load(TUTORIAL.read_text())


def test_a_users_profile_replaces_the_tutorials_whole() -> None:
    # Only node-02: node-01's tutorial GPUs must not be merged in (a node not listed publishes
    # an empty pool), and the agents roll when the profile changes.
    mine = render("--set", "agent.profile.nodes.node-02.devices[0].name=gpu-0",
                  "--set", "agent.profile.nodes.node-02.devices[0].memory=80Gi")  # fmt: skip
    text = find(mine, "ConfigMap", "-profile")["data"]["profile.yaml"]
    assert yaml.safe_load(text) == {
        "nodes": {"node-02": {"devices": [{"name": "gpu-0", "memory": "80Gi"}]}}
    }
    profile = simulated.parse_profile(text, "a user's profile")
    assert profile is not None
    checksum = "checksum/profile"
    annotations = [
        find(d, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
        for d in (render(), mine)
    ]
    assert annotations[0][checksum] != annotations[1][checksum]


def test_controller_environment_is_valid_controller_settings() -> None:
    controller = find(render(), "Deployment")
    settings = settings_from_env(config.ControllerSettings, env_of(controller, DOWNWARD))
    assert settings.namespace == "dra"  # the Lease's namespace: the release namespace
    assert settings.lease_name == "rel-dra-gpu-controller"  # one Lease per release
    assert settings.identity == "pod-x"
    assert (settings.metrics_port, settings.health_port) == (9400, 9401)
    assert controller["spec"]["replicas"] == 2
    assert container(controller)["args"] == [
        "--log-level", "INFO", "--log-format", "text", "controller"
    ]  # fmt: skip
    json_logs = render("--set", "logFormat=json")
    for kind, command in (("Deployment", "controller"), ("DaemonSet", "agent")):
        args = container(find(json_logs, kind))["args"]
        assert args[args.index("--log-format") + 1 :] == ["json", command], kind


def test_full_values_reach_the_settings() -> None:
    docs = render("--values", str(FULL_VALUES))
    agent = settings_from_env(config.AgentSettings, env_of(find(docs, "DaemonSet"), DOWNWARD))
    assert agent.backend == "nvml"
    assert agent.profile is None
    assert agent.kubelet_dir == Path("/var/lib/k0s/kubelet")
    assert agent.driver_name == "gpu.acme.io"
    controller = settings_from_env(
        config.ControllerSettings, env_of(find(docs, "Deployment"), DOWNWARD)
    )
    assert (controller.lease_seconds, controller.resync_seconds) == (20, 15.5)
    assert find(docs, "DaemonSet")["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    mps, time_slicing = agent.shared_gpu_policy.entries
    assert (mps.indexes, mps.uuids) == ({0}, {"GPU-5f2a1c3e-0001-4000-8000-000000000001"})
    assert (time_slicing.indexes, time_slicing.sharing.mode) == ({2}, "TimeSlicing")


def test_the_api_rate_limits_reach_both_components() -> None:
    for values, agent_limit, controller_limit, events_limit in (
        ((), (50.0, 100), (50.0, 100), (100.0, 200)),  # the kubelet's; kube-scheduler's; twice
        (("--values", str(FULL_VALUES)), (0.0, 1), (75.5, 150), (0.0, 1)),  # qps 0: no limit
        (("--set", "agent.api.qps=5"), (5.0, 100), (50.0, 100), (100.0, 200)),  # one key
    ):
        docs = render(*values)
        agent = settings_from_env(config.AgentSettings, env_of(find(docs, "DaemonSet"), DOWNWARD))
        controller = settings_from_env(
            config.ControllerSettings, env_of(find(docs, "Deployment"), DOWNWARD)
        )
        assert (agent.api_qps, agent.api_burst) == agent_limit, values
        assert (controller.api_qps, controller.api_burst) == controller_limit, values
        assert (controller.event_qps, controller.event_burst) == events_limit, values


def test_nvml_sharing_reaches_the_agent_as_its_shared_gpus_setting() -> None:
    """agent.nvml.sharing is the agent's --shared-gpus, the same entries; unset, no variable."""
    assert "DRA_GPU_SHARED_GPUS" not in env_of(find(render(), "DaemonSet"), DOWNWARD)
    entry = {
        "gpus": "all",
        "mode": "MPS",
        "memory": {"default": "8Gi", "min": "4Gi", "max": 32 * 2**30},
    }
    docs = render(
        "--set", "agent.backend=nvml", "--set-json", f"agent.nvml.sharing=[{json.dumps(entry)}]"
    )
    env = env_of(find(docs, "DaemonSet"), DOWNWARD)
    settings = settings_from_env(config.AgentSettings, env)
    (shared,) = settings.shared_gpu_policy.entries
    assert shared.every
    assert shared.sharing == model.Sharing("MPS", model.MemoryPolicy("8Gi", "4Gi", max="32Gi"))


@pytest.mark.parametrize(
    ("mode", "given", "expected"),
    [
        ("MPS", "utility", "utility,compute"),  # the MPS daemon's binaries come with compute
        ("MPS", "compute,utility", "compute,utility"),
        ("MPS", "all", "all"),
        ("TimeSlicing", "utility", "utility"),
    ],
)
def test_mps_sharing_asks_the_toolkit_for_the_daemons_binaries(
    mode: str, given: str, expected: str
) -> None:
    entry = {"gpus": [0], "mode": mode, "memory": {"default": "8Gi", "min": "4Gi"}}
    docs = render(
        "--set", "agent.backend=nvml",
        "--set-json", f"agent.nvml.driverCapabilities={json.dumps(given)}",
        "--set-json", f"agent.nvml.sharing=[{json.dumps(entry)}]",
    )  # fmt: skip
    assert env_of(find(docs, "DaemonSet"), DOWNWARD)["NVIDIA_DRIVER_CAPABILITIES"] == expected


def test_cdi_only_workloads_make_prepare_answer_the_toolkits_devices() -> None:
    """agent.nvml.workloads: cdi is the agent's --toolkit-cdi-kind (agent.nvml.toolkitCdiKind);
    runtimeClass (the default) sets nothing and the simulated backend never reads it."""
    for args in ((), ("--set", "agent.backend=nvml"), ("--set", "agent.nvml.workloads=cdi")):
        env = env_of(find(render(*args), "DaemonSet"), DOWNWARD)
        assert "DRA_GPU_TOOLKIT_CDI_KIND" not in env, args
    docs = render("--set", "agent.backend=nvml", "--set", "agent.nvml.workloads=cdi")
    settings = settings_from_env(config.AgentSettings, env_of(find(docs, "DaemonSet"), DOWNWARD))
    assert settings.toolkit_cdi_kind == "nvidia.com/gpu"
    assert not [d for d in docs if d["kind"] == "RuntimeClass"]
    docs = render(
        "--set", "agent.backend=nvml",
        "--set", "agent.nvml.workloads=cdi",
        "--set", "agent.nvml.toolkitCdiKind=example.com/gpu",
    )  # fmt: skip
    env = env_of(find(docs, "DaemonSet"), DOWNWARD)
    assert settings_from_env(config.AgentSettings, env).toolkit_cdi_kind == "example.com/gpu"


def test_agent_host_paths_are_mounted_at_the_same_paths() -> None:
    agent = find(render(), "DaemonSet")
    pod = agent["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container(agent)["volumeMounts"]}
    assert host == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        "plugin-dir": "/var/lib/kubelet/plugins/gpu.example.com",
        "cdi": "/var/run/cdi",
        "checkpoint": "/var/lib/dra-gpu/gpu.example.com",
        "shm": "/dev/shm",  # the MPS daemons' /dev/shm, which the shares' containers get
    }
    assert all(mounts[name] == path for name, path in host.items())
    settings = settings_from_env(config.AgentSettings, env_of(agent, DOWNWARD))
    assert str(settings.registration_socket.parent) == host["plugins-registry"]
    assert str(settings.plugin_dir) == host["plugin-dir"]


def test_agent_is_root_without_privileges() -> None:
    agent = find(render(), "DaemonSet")
    pod = agent["spec"]["template"]["spec"]
    security = container(agent)["securityContext"]
    assert pod["securityContext"]["runAsUser"] == 0
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security
    assert pod["priorityClassName"] == "system-node-critical"


def test_agent_rolls_with_a_surge_on_sockets_of_its_own_pod() -> None:
    agent = find(render(), "DaemonSet")
    # The new pod registers beside the old one; the old one goes once the new one is ready.
    assert agent["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    settings = settings_from_env(config.AgentSettings, env_of(agent, DOWNWARD))
    uid = DOWNWARD["metadata.uid"]
    assert settings.pod_uid == uid
    assert settings.registration_socket.name == f"gpu.example.com-{uid}-reg.sock"
    assert settings.dra_socket.name == f"dra-{uid}.sock"
    # The lock that serializes the two pods' prepares is on the host path both mount.
    mounts = {m["name"]: m["mountPath"] for m in container(agent)["volumeMounts"]}
    assert settings.serialize_lock.parent == Path(mounts["checkpoint"])
    # The old behaviour on request: a maxUnavailable turns the surge off (the API takes only one
    # of the two non-zero, and never both zero); percentages too.
    for args in (["--set", "agent.maxSurge=0"], []):
        old = find(render("--set", "agent.maxUnavailable=1", *args), "DaemonSet")
        assert old["spec"]["updateStrategy"]["rollingUpdate"] == {
            "maxUnavailable": 1,
            "maxSurge": 0,
        }
    full = find(render("--values", str(FULL_VALUES)), "DaemonSet")
    assert full["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxUnavailable": "10%",
        "maxSurge": 0,
    }
    wide = find(render("--set", "agent.maxSurge=25%"), "DaemonSet")
    assert wide["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == "25%"
    done = helm("template", "rel", str(CHART), "--set", "agent.maxSurge=0")
    assert done.returncode != 0
    assert "agent.maxSurge and agent.maxUnavailable cannot both be 0" in done.stderr


def _profile(device: dict[str, Any], **node: Any) -> dict[str, Any]:
    entry = {"memory": "24Gi"} | device
    return {"agent": {"profile": {"nodes": {"node-01": {"devices": [entry]} | node}}}}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (_profile({"memroy": "8Gi"}), "/agent/profile/nodes/node-01/devices/0"),
        (_profile({"count": 0}), "/agent/profile/nodes/node-01/devices/0/count"),
        (_profile({"mig": "A100"}), "/agent/profile/nodes/node-01/devices/0/mig"),
        (
            _profile({"sharing": {"mode": "MPS", "memory": {"default": "8Gi", "mni": "4Gi"}}}),
            "/agent/profile/nodes/node-01/devices/0/sharing/memory",
        ),
        (_profile({}, gpus=[]), "/agent/profile/nodes/node-01"),
        ({"agent": {"profile": {"defaults": {"name": "gpu-0"}, "nodes": {}}}}, "defaults"),
        # (helm's validator reports a bad property name at a wrong location, but names it)
        ({"agent": {"profile": {"nodes": {"Node_01": {}}}}}, "'Node_01' does not match"),
        (
            {
                "agent": {
                    "backend": "nvml",
                    "nvml": {"sharing": [{"gpus": "all", "mdoe": "MPS", "memory": {}}]},
                }
            },
            "/agent/nvml/sharing/0",
        ),
    ],
)
def test_a_typo_in_the_profile_or_the_sharing_settings_fails_the_render_naming_it(
    tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    stderr = refusal(values, tmp_path)
    assert named in stderr, stderr


def test_every_profile_the_chart_ships_passes_its_schema() -> None:
    for path in sorted((CHART / "profiles").glob("*.yaml")):
        values = {"agent": {"profile": yaml.safe_load(path.read_text())}}
        done = helm(
            "template", "rel", str(CHART), "--set-json", f"agent={json.dumps(values['agent'])}"
        )
        assert done.returncode == 0, f"{path.name}: {done.stderr}"


def test_controller_runs_as_non_root_with_read_only_root() -> None:
    controller = find(render(), "Deployment")
    pod = controller["spec"]["template"]["spec"]
    security = container(controller)["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    probes = {
        container(controller)[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")
    }
    assert probes == {"/healthz", "/readyz"}


def test_the_agents_probes_wait_for_its_two_grpc_calls() -> None:
    # /healthz and /readyz call the registration and DRA servers, each with its own deadline.
    deadline = inspect.signature(server.answers).parameters["deadline"].default
    agent = container(find(render(), "DaemonSet"))
    for probe in ("livenessProbe", "readinessProbe"):
        assert agent[probe]["timeoutSeconds"] > 2 * deadline, probe


def test_no_rule_grants_wildcards_and_secrets_only_the_webhooks_own() -> None:
    """The one Secret: the admission webhook's self-issued certificate, by name (create cannot
    be named), in the controller's webhook Role (tests/chart/test_chart_render_admission.py)."""
    for doc in render("--values", str(FULL_VALUES)):
        for rule in doc.get("rules", []):
            named = [*rule.get("resources", []), *rule.get("verbs", []), *rule["apiGroups"]]
            assert "*" not in named, rule
            assert "configmaps" not in rule.get("resources", []), rule
            if "secrets" not in rule.get("resources", []):
                continue
            assert (doc["kind"], doc["metadata"]["name"]) == (
                "Role",
                "acme-gpus-controller-webhook",
            )
            assert rule["resources"] == ["secrets"], rule
            assert rule in (
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": ["acme-gpus-webhook-tls"],
                    "verbs": ["get", "update"],
                },
            ), rule


def test_driver_name_is_one_value_used_everywhere() -> None:
    text = helm("template", "rel", str(CHART), "--set", "driverName=gpu.acme.io").stdout
    assert "gpu.example.com" not in text
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert find(docs, "DeviceClass")["metadata"]["name"] == "gpu.acme.io"
    assert find(docs, "DeviceClass")["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.acme.io"'}}
    ]
    # A checkpoint directory per driver: a release of another driver never shares it.
    volumes = find(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    checkpoint = next(v for v in volumes if v["name"] == "checkpoint")
    assert checkpoint["hostPath"]["path"] == "/var/lib/dra-gpu/gpu.acme.io"


def test_extra_device_classes_keep_the_driver_selector() -> None:
    docs = render("--values", str(FULL_VALUES))
    classes = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}
    assert sorted(classes) == ["acme-gpu", "gpu-24gi", "gpu-inferencia", "gpu-shared"]
    expressions = [s["cel"]["expression"] for s in classes["gpu-24gi"]["selectors"]]
    assert expressions[0] == 'device.driver == "gpu.acme.io"'
    assert 'compareTo(quantity("24Gi")) >= 0' in expressions[1]
    assert classes["gpu-shared"]["config"][0]["opaque"]["driver"] == "gpu.acme.io"
    assert classes["gpu-24gi"]["extendedResourceName"] == "gpu.acme.io/gpu-24gi"
    assert "extendedResourceName" not in classes["gpu-shared"]


def test_default_class_answers_extended_resource_requests() -> None:
    (default,) = [d for d in render() if d["kind"] == "DeviceClass"]
    assert default["spec"]["extendedResourceName"] == "gpu.example.com/gpu"
    (acme,) = [d for d in render("--set", "driverName=gpu.acme.io") if d["kind"] == "DeviceClass"]
    assert acme["spec"]["extendedResourceName"] == "gpu.acme.io/gpu"
    migrating = render("--set", "deviceClasses.default.extendedResource.name=nvidia.com/gpu")
    assert find(migrating, "DeviceClass")["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    full = render("--values", str(FULL_VALUES))
    assert find(full, "DeviceClass", "acme-gpu")["spec"]["extendedResourceName"] == (
        "nvidia.com/gpu"
    )
    off = render("--set", "deviceClasses.default.extendedResource.enabled=false")
    assert "extendedResourceName" not in find(off, "DeviceClass")["spec"]


def test_prometheus_operator_objects_only_when_enabled() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor"}
    docs = render("--values", str(FULL_VALUES))
    monitor = find(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert find(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_policy_matches_exactly_the_agent_service_account() -> None:
    docs = render("--values", str(FULL_VALUES))
    policy = find(docs, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        'request.userInfo.username == "system:serviceaccount:dra:acme-agent"'
    )
    assert find(docs, "ServiceAccount", "-agent")["metadata"]["name"] == "acme-agent"
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = find(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


def _nvml_sharing(entry: dict[str, Any]) -> dict[str, Any]:
    """Values with one agent.nvml.sharing entry: a valid one, with ``entry``'s keys replaced."""
    valid = {"gpus": "all", "memory": {"default": "8Gi", "min": "4Gi"}}
    return {"agent": {"backend": "nvml", "nvml": {"sharing": [valid | entry]}}}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"agent": {"bogus": 1}}, "additional properties 'bogus' not allowed"),
        ({"controller": {"replicas": "two"}}, "/controller/replicas"),
        ({"agent": {"api": {"qps": -1}}}, "/agent/api/qps"),
        ({"controller": {"api": {"burst": 0}}}, "/controller/api/burst"),
        ({"controller": {"api": {"qps": "fast"}}}, "/controller/api/qps"),
        ({"agent": {"backend": "cuda"}}, "/agent/backend"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "/metrics/serviceMonitor/enabled"),
        ({"driverName": "Not A DNS Name"}, "/driverName"),
        (
            {"deviceClasses": {"default": {"extendedResource": {"name": "gpu"}}}},
            "/deviceClasses/default/extendedResource/name",
        ),
        (
            {"deviceClasses": {"default": {"extendedResource": {"name": "kubernetes.io/gpu"}}}},
            "/deviceClasses/default/extendedResource/name",
        ),
        (
            {"deviceClasses": {"extra": [{"name": "x", "extendedResourceName": "a b/c"}]}},
            "/deviceClasses/extra/0/extendedResourceName",
        ),
        ({"agent": {"nvml": {"toolkitCdiKind": "nvidia.com"}}}, "/agent/nvml/toolkitCdiKind"),
        (_nvml_sharing({"gpus": [0], "mode": "x"}), "/agent/nvml/sharing/0/mode"),
        (_nvml_sharing({"gpus": ["gpu-0"]}), "/agent/nvml/sharing/0/gpus/0"),
        (
            _nvml_sharing({"memory": {"default": "8 Gi", "min": 1}}),
            "/agent/nvml/sharing/0/memory/default",
        ),
        (_nvml_sharing({"memory": {"default": "8Gi"}}), "/agent/nvml/sharing/0/memory"),
        (
            {"agent": {"nvml": {"sharing": [{"gpus": "all", "memory": {"default": 1, "min": 1}}]}}},
            "agent.nvml.sharing: only the nvml backend reads it",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_key(
    tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    stderr = refusal(values, tmp_path)
    assert named in stderr, stderr


def test_nvml_agents_run_only_on_nodes_labelled_as_gpu_nodes_unless_told_otherwise() -> None:
    def affinity(*args: str) -> Any:
        agent = find(render("--set", "agent.backend=nvml", *args), "DaemonSet")
        return agent["spec"]["template"]["spec"].get("affinity")

    terms = affinity()["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    labels = {e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}
    # Either label will do: one term each (terms are ORed, expressions in a term ANDed).
    assert labels == {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    assert all(len(t["matchExpressions"]) == 1 for t in terms["nodeSelectorTerms"])
    assert affinity("--set", "agent.nvml.gpuNodeAffinity=false") is None
    own = affinity("--set", "agent.affinity.podAntiAffinity.x=y")
    assert own == {"podAntiAffinity": {"x": "y"}}  # the user's affinity replaces ours
    simulated_agent = find(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert "affinity" not in simulated_agent  # simulated GPUs live on any node


def test_a_quota_for_the_critical_priority_classes_only_when_asked_for() -> None:
    assert not [d for d in render() if d["kind"] == "ResourceQuota"]
    docs = render("--set", "priorityQuota.enabled=true", "--set", "priorityQuota.pods=50")
    quota = find(docs, "ResourceQuota", "-critical-pods")
    assert quota["metadata"]["namespace"] == "dra"
    assert quota["spec"]["hard"] == {"pods": "50"}
    (scope,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert (scope["scopeName"], scope["operator"]) == ("PriorityClass", "In")
    agent = find(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert agent["priorityClassName"] in scope["values"]
