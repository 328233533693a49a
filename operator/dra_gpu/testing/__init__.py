"""dra-gpu's public test kit, in the spirit of ``kopf.testing``.

A real control plane on loopback (``ControlPlane``), real nodes (``RealNode``: the upstream
kubelet on containerd, each in namespaces of its own; ``NodeRuntime`` names what they run;
``prepared_claims`` reads what the kubelet recorded as prepared), the node agent and the
controller as real processes (``AgentProcess``, ``ControllerProcess``), a real Prometheus that
scrapes them as the chart's monitors would (``Prometheus``, ``ScrapeTarget``), and the
background cluster behind ``make cluster-up``.
"""

from dra_gpu.testing._agent import AgentProcess, ControllerProcess, as_user
from dra_gpu.testing._cluster import ClusterEnv, cluster_down, cluster_up, prometheus_of
from dra_gpu.testing._control_plane import ControlPlane, ControlPlaneError, default_bin_dir
from dra_gpu.testing._kubelet_checkpoint import KubeletClaim, KubeletDevice
from dra_gpu.testing._node import NodeRuntime, RealNode, start_nodes
from dra_gpu.testing._prometheus import Prometheus, PrometheusError, ScrapeTarget
from dra_gpu.testing._waiting import eventually

__all__ = [
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
]
