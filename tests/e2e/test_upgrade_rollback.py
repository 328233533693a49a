"""``helm upgrade`` from the previous release and ``helm rollback`` to it, under load, on real
nodes (issue 29, item 2).

The previous release is ``PREVIOUS``, the last commit before per-pod sockets and the serialize
lock: its own chart and its own image (``hack/build-previous-release.py``: built from this
repository's history, renamed so that the nodes hold it beside the current one), imported into
the running nodes. It is installed, pods that claim a GPU start every 2 s on each of the three
nodes (``rollouts.Load``), then:

1. ``helm upgrade`` to this tree's chart and image. The new agents start beside the old ones
   (``maxSurge: 1``), which take no lock and never read the checkpoint again: each new agent
   notices its predecessor and merges what it writes, the fold of its journal as it stops
   included (``agent/runner.py``, ``_follow_legacy``).
2. ``helm upgrade`` of the new release (a value changed), then ``helm rollback`` to the first
   upgrade: both roll new agents beside new agents. Asserted for 1 and 2: no failed prepare,
   no moment without a registered plugin, two registered at once on every node.
3. ``helm rollback`` to the previous release: its own DaemonSet (``maxSurge: 0``) replaces each
   new agent by an old one, which reads the snapshot the new one folded at its stop (the
   checkpoint's versioning rule). Measured and printed — that release's strategy leaves each
   node without a plugin for a moment, in which the kubelet's prepares fail and are retried;
   asserted: the DaemonSet is the previous release's.

Throughout: every pod ran, none restarted. At the end, once the load's pods are gone: every
claim unprepared — nothing in any node's agent checkpoint, its CDI directory or the kubelet's
checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint
from dra_gpu.testing import RealNode, eventually
from tests.e2e import helpers
from tests.e2e.rollouts import (
    Load,
    Release,
    chart_values,
    installed,
    one_gpu_template,
    published,
    roll,
)
from tests.support import binaries

CHART = helpers.REPO / "charts" / "dra-gpu"
PREVIOUS = "7f7010a0eba332be8a79a2462b184d1cb3f518b5"
"""The previous release: the last commit before the agent's per-pod sockets and serialize lock
(its agents have fixed socket names; its chart rolls them with ``maxSurge: 0``)."""


@pytest.fixture(scope="session")
def previous(nodes: list[RealNode]) -> tuple[Path, str]:
    """The previous release's chart and image name, the image in every node."""
    built = binaries.previous_release(PREVIOUS)
    ((archive, image),) = json.loads((built / "images.json").read_text()).items()
    for node in nodes:
        node.import_image(built / archive)
    return built / "tree" / "charts" / "dra-gpu", image


@pytest_asyncio.fixture
async def old_release(
    helm: helpers.Helm,
    api: kube.Kube,
    nodes: list[RealNode],
    previous: tuple[Path, str],
    tmp_path: Path,
) -> AsyncIterator[Release]:
    chart, image = previous
    old = Release(secrets.token_hex(3))
    repository, tag = image.rsplit(":", 1)
    values = {**chart_values(old, nodes), "image": {"repository": repository, "tag": tag}}
    async with installed(helm, api, nodes, old, chart, values, tmp_path / "old-values.json"):
        yield old


def left_prepared(node: RealNode, driver: str) -> list[str]:
    """What is still prepared of ``driver`` on ``node``: the agent's checkpoint, its CDI specs,
    the kubelet's checkpoint."""
    file = node.root / "var/lib/dra-gpu" / driver / "checkpoint.json"
    left = [f"agent checkpoint: {uid}" for uid in checkpoint.read_checkpoint(file).claims]
    left += [f"CDI spec: {uid}" for uid in cdi.list_claim_specs(node.cdi_dir, driver)]
    left += [
        f"kubelet: {uid}"
        for uid, claim in node.prepared_claims().items()
        if any(device.driver == driver for device in claim.devices)
    ]
    return left


async def test_helm_upgrade_from_the_previous_release_and_rollback_lose_nothing(
    api: kube.Kube,
    helm: helpers.Helm,
    nodes: list[RealNode],
    old_release: Release,
    namespace: str,  # after the release: its pods go while the agents can unprepare
    tmp_path: Path,
) -> None:
    release = old_release
    new_values = tmp_path / "new-values.json"
    new_values.write_text(json.dumps(chart_values(release, nodes)))
    await one_gpu_template(api, namespace, release.device_class)
    await eventually(
        lambda: published(api, release, len(nodes)), timeout=120, what="every pool published"
    )

    load = Load(api, namespace, nodes)
    loading = asyncio.create_task(load.run())
    try:
        await eventually(lambda: len(load.ran) >= 6, timeout=90, what="pods on the old agents")
        upgrade = await roll(
            api,
            nodes,
            release,
            load,
            namespace,
            "upgrade from the previous release",
            lambda: helm(
                *("upgrade", release.name, str(CHART), "--namespace", release.namespace),
                *("--values", str(new_values)),
            ),
        )
        strategy = (await api.get(release.daemonset))["spec"]["updateStrategy"]
        assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        again = await roll(
            api,
            nodes,
            release,
            load,
            namespace,
            "an upgrade of the new release (a value changed)",
            lambda: helm(
                *("upgrade", release.name, str(CHART), "--namespace", release.namespace),
                *("--values", str(new_values), "--set", "agent.podAnnotations.again=yes"),
            ),
        )
        back = await roll(
            api,
            nodes,
            release,
            load,
            namespace,
            "rollback to the first upgrade",
            lambda: helm("rollback", release.name, "2", "--namespace", release.namespace),
        )
        rollback = await roll(
            api,
            nodes,
            release,
            load,
            namespace,
            "rollback to the previous release",
            lambda: helm("rollback", release.name, "1", "--namespace", release.namespace),
        )
        strategy = (await api.get(release.daemonset))["spec"]["updateStrategy"]
    finally:
        load.stop.set()
        await loading

    print(
        f"\n{upgrade}\n{again}\n{back}\n{rollback}\npods started: {load.count}, ran: "
        f"{len(load.ran)}, never ran: {len(load.never_ran)}, restarts: {load.restarts}"
    )
    for phase in (upgrade, again, back):  # every agent involved has per-pod sockets or merges
        assert phase.failed_prepares == [], phase
        assert all(gap == 0.0 for gap in phase.longest_gap.values()), phase
        assert all(count == 2 for count in phase.most_sockets.values()), phase
    assert strategy["rollingUpdate"]["maxSurge"] == 0  # the previous release's own
    assert load.never_ran == []
    assert load.restarts == 0

    # Every claim of the load (prepared by old agents, new ones, old ones again) unprepared.
    def nothing_left() -> bool:
        return not any(left_prepared(node, release.driver) for node in nodes)

    await eventually(nothing_left, timeout=60, what="nothing prepared left on any node")
