"""A rolling update of the agents with no prepare outage, measured on real nodes.

The chart is installed with ``helm install`` (its agent pods really run, from the image ``make
images`` built), three nodes with simulated GPUs. Then pods that claim a GPU start every 2 s on
each of the three nodes while ``helm upgrade`` changes a pod annotation, which rolls every
agent pod: on each node the new pod registers beside the old one (sockets of its own), the
kubelet calls the newer, and the old one finishes what it has and goes. Measured and printed:
the pods started during the rollout, the kubelet's failed prepares and the pods' restarts
(both must be 0), and per node the longest time with no registration socket of the driver in
the kubelet's registry directory (polled every 100 ms): the gap in which the kubelet had no
plugin to call.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import RealNode, eventually
from tests.e2e import helpers
from tests.e2e.rollouts import (
    Load,
    Release,
    agent_uids,
    chart_values,
    installed,
    one_gpu_template,
    published,
    roll,
)

CHART = helpers.REPO / "charts" / "dra-gpu"


@pytest_asyncio.fixture
async def release(
    helm: helpers.Helm, api: kube.Kube, nodes: list[RealNode], tmp_path: Path
) -> AsyncIterator[Release]:
    new = Release(secrets.token_hex(3))
    values = chart_values(new, nodes)
    async with installed(helm, api, nodes, new, CHART, values, tmp_path / "values.json"):
        yield new


async def test_helm_upgrade_rolls_the_agents_with_no_failed_prepare_and_no_gap(
    api: kube.Kube,
    helm: helpers.Helm,
    nodes: list[RealNode],
    release: Release,
    namespace: str,  # after the release: its pods go while the agents can unprepare
) -> None:
    await one_gpu_template(api, namespace, release.device_class)
    await eventually(
        lambda: published(api, release, len(nodes)), timeout=120, what="every pool published"
    )
    ds = await api.get(release.daemonset)
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    before = await agent_uids(api, release)

    load = Load(api, namespace, nodes)
    loading = asyncio.create_task(load.run())
    try:
        await eventually(lambda: load.ran, timeout=60, what="the load's first pod running")
        rollout = await roll(
            api,
            nodes,
            release,
            load,
            namespace,
            f"rollout of {len(nodes)} agents",
            lambda: helm(
                *("upgrade", release.name, str(CHART), "--namespace", release.namespace),
                *(
                    "--reuse-values",
                    "--set",
                    f"agent.podAnnotations.rollout=r{secrets.token_hex(2)}",
                ),
            ),
        )
    finally:
        load.stop.set()
        await loading

    assert not (await agent_uids(api, release)) & before, "every agent pod was replaced"
    print(
        f"\n{rollout}; pods started: {load.count}, ran: {len(load.ran)}, never ran: "
        f"{len(load.never_ran)}, restarts: {load.restarts}"
    )
    assert rollout.failed_prepares == []
    assert load.never_ran == []
    assert load.restarts == 0
    assert all(count == 2 for count in rollout.most_sockets.values()), rollout.most_sockets
    assert all(gap == 0.0 for gap in rollout.longest_gap.values()), rollout.longest_gap
