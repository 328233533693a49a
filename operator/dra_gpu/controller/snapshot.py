"""The cluster read once, for a command (``explain``, ``status``): a session with the API server
and a ``ClusterView`` filled from one paged list of each kind.

Owns: ``session`` (connect with the user's kubeconfig and ``--context``, probe, and every
failure of the API server in words: ``kube.Refused`` naming what the command reads,
``kube.Unreachable``, ``CommandError`` for any other error answer), ``list_items`` (every page of
a list, ``limit`` and ``continue``) and ``load_view``.
Must not: explain or count anything (the commands do, with the controller's pure readings).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from dra_gpu import kube
from dra_gpu.controller.view import ClusterView
from dra_gpu.kube import watch

RESOURCE = "/apis/resource.k8s.io/v1"
PAGE_SIZE = 500
"""Objects per page of a list, as kubectl's ``--chunk-size`` default."""
PATHS = {
    "DeviceClass": f"{RESOURCE}/deviceclasses",
    "ResourceClaim": f"{RESOURCE}/resourceclaims",
    "ResourceSlice": f"{RESOURCE}/resourceslices",
    "Node": "/api/v1/nodes",
    "DeviceTaintRule": f"{RESOURCE}/devicetaintrules",
}
OPTIONAL = frozenset({"DeviceTaintRule"})
"""Kinds read when they can be: not served (before 1.37) or not readable for the user (403),
a view without them (DeviceTaintRules only add taints to what explanations show)."""


class CommandError(Exception):
    """The command ran and failed (not found, the API server answered with an error); the
    message says why."""


def namespaced(path: str, namespace: str | None) -> str:
    """``/api/v1/pods`` in ``namespace`` (``/api/v1/namespaces/NS/pods``); None: all."""
    if namespace is None:
        return path
    prefix, _, resource = path.rpartition("/")
    return f"{prefix}/namespaces/{namespace}/{resource}"


@contextlib.asynccontextmanager
async def session(
    kubeconfig: Path | None, *, source: str | None, context: str | None, needs: str
) -> AsyncIterator[kube.Kube]:
    """A probed client; ``needs`` says what the command reads, for a 401 or 403."""
    async with await kube.Kube.connect(kubeconfig, source=source, context=context) as api:
        try:
            await api.probe()
            yield api
        except kube.ApiError as exc:
            if exc.status in (401, 403):
                raise api.refused(exc, needs=needs) from exc
            raise CommandError(f"the API server at {api.server} answered: {exc}") from exc
        except kube.CONNECTION_ERRORS as exc:
            raise api.unreachable(exc) from exc


async def list_items(api: kube.Kube, path: str, **query: Any) -> list[kube.Body]:
    """Every item of a list, page by page."""
    items: list[kube.Body] = []
    async for page in watch.pages(api, path, PAGE_SIZE, **query):
        items.extend(page.get("items") or [])
    return items


async def load_view(
    api: kube.Kube,
    kinds: Sequence[str],
    *,
    pods_in: str | None = None,
    all_pods: bool = False,
    selector: str | None = None,
    pods_without_claims: bool = True,
) -> ClusterView:
    """A view of ``kinds`` (cluster-wide), and Pods of namespace ``pods_in`` (or of every
    namespace with ``all_pods``; neither: none), those matching ``selector`` only."""
    view = ClusterView(pods_without_claims=pods_without_claims)
    for kind in kinds:
        try:
            items = await list_items(api, PATHS[kind])
        except kube.ApiError as exc:
            if kind in OPTIONAL and (exc.not_found or exc.status == 403):
                continue
            raise
        for item in items:
            view.apply(kind, "ADDED", item)
    if pods_in is not None or all_pods:
        path = namespaced("/api/v1/pods", None if all_pods else pods_in)
        for item in await list_items(api, path, labelSelector=selector):
            view.apply("Pod", "ADDED", item)
    return view
