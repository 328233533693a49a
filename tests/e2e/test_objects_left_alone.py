"""A session-end check: after the whole suite, with the controller running throughout,
nothing of Kopf's sits on objects that belong to users.

Marked ``session_end``: ``tests/conftest.py`` runs it after every other test of the session,
whatever the files are called, and it counts as a test (a failure here fails the run).
"""

from __future__ import annotations

import pytest

from dra_gpu import kube
from dra_gpu.testing import ControllerProcess, eventually
from tests.e2e.helpers import workload

pytestmark = pytest.mark.session_end

KOPF_MARK = "kopf.zalando.org"
RESOURCE = "/apis/resource.k8s.io/v1"


async def test_no_kopf_annotations_or_finalizers_on_pods_claims_or_classes(
    api: kube.Kube, controller: ControllerProcess, namespace: str
) -> None:
    # Objects of every kind the controller handles, alive while it runs and explains them.
    await api.create(
        f"{RESOURCE}/deviceclasses",
        {
            "metadata": {"name": "dra-gpu-test-left"},
            "spec": {"selectors": [{"cel": {"expression": "true"}}]},
        },
    )
    try:
        await api.create(
            f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
            {
                "metadata": {"name": "left"},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "missing-class"}}
                        ]
                    }
                },
            },
        )
        await api.create(
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "metadata": {"name": "left"},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "left"}],
                    "containers": [workload(claims=["gpu"])],
                },
            },
        )
        start = controller.reconciles()
        await eventually(lambda: controller.reconciles() >= start + 3, what="reconciled")

        checked = 0
        for path in ("/api/v1/pods", f"{RESOURCE}/resourceclaims", f"{RESOURCE}/deviceclasses"):
            for item in (await api.get(path))["items"]:
                meta = item["metadata"]
                marks = [k for k in meta.get("annotations") or {} if KOPF_MARK in k]
                marks += [f for f in meta.get("finalizers") or [] if KOPF_MARK in f]
                assert marks == [], f"{path}/{meta['name']} carries {marks}"
                checked += 1
        assert checked >= 3
    finally:
        await api.delete(f"{RESOURCE}/deviceclasses/dra-gpu-test-left")
