from pathlib import Path

from dra_gpu.testing import ClusterEnv


def test_exports_round_trip_and_put_the_built_binaries_first() -> None:
    env = ClusterEnv(Path("/r/kubeconfig"), Path("/r/kubelet"), Path("/cache/bin/v1.34.4"))
    text = env.exports()
    assert text.splitlines() == [
        "export KUBECONFIG=/r/kubeconfig",
        "export DRA_GPU_NODES_DIR=/r/kubelet",
        'export PATH=/cache/bin/v1.34.4:"$PATH"',
    ]
    assert ClusterEnv.parse(text) == env
