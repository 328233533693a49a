"""dra-gpu's public test kit, in the spirit of ``kopf.testing``.

A real control plane on loopback (``ControlPlane``), the kubelet stand-in that keeps fake nodes
alive (``KubeletStandIn``) with its DRA part (``DraSettings``, ``DraStandIn``: plugin
registration, prepare and unprepare over the real gRPC protocol), the node agent as a real
process (``AgentProcess``), and the background cluster behind ``make cluster-up``.
"""

from dra_gpu.testing._agent import AgentProcess, ControllerProcess, as_user
from dra_gpu.testing._cluster import (
    ClusterEnv,
    agents_down,
    agents_up,
    cluster_down,
    cluster_up,
    controller_up,
)
from dra_gpu.testing._control_plane import ControlPlane, ControlPlaneError, default_bin_dir
from dra_gpu.testing._dra import DraSettings, DraStandIn, PreparedClaim, PreparedDevice
from dra_gpu.testing._kubelet import KubeletStandIn, NodeSpec
from dra_gpu.testing._kubelet_checkpoint import KubeletClaim, KubeletDevice
from dra_gpu.testing._node import NodeRuntime, RealNode, start_nodes
from dra_gpu.testing._waiting import eventually

__all__ = [
    "AgentProcess",
    "ClusterEnv",
    "ControlPlane",
    "ControlPlaneError",
    "ControllerProcess",
    "DraSettings",
    "DraStandIn",
    "KubeletClaim",
    "KubeletDevice",
    "KubeletStandIn",
    "NodeRuntime",
    "NodeSpec",
    "PreparedClaim",
    "PreparedDevice",
    "RealNode",
    "agents_down",
    "agents_up",
    "as_user",
    "cluster_down",
    "cluster_up",
    "controller_up",
    "default_bin_dir",
    "eventually",
    "start_nodes",
]
