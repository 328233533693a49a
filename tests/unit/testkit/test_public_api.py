"""dra_gpu.testing is an API other people build on: its surface changes only on purpose."""

import dra_gpu.testing


def test_testing_kit_exports_exactly_its_public_names() -> None:
    public = {n for n in dir(dra_gpu.testing) if not n.startswith("_")}
    assert set(dra_gpu.testing.__all__) == {
        "AgentProcess",
        "ClusterEnv",
        "ControlPlane",
        "ControlPlaneError",
        "ControllerProcess",
        "KubeletClaim",
        "KubeletDevice",
        "NodeRuntime",
        "Prometheus",
        "PrometheusError",
        "RealNode",
        "ScrapeTarget",
        "as_user",
        "cluster_down",
        "cluster_up",
        "default_bin_dir",
        "eventually",
        "prometheus_of",
        "start_nodes",
    }
    assert public == set(dra_gpu.testing.__all__)
