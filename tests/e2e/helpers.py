"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from dra_gpu import kube

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "crds-examples"


class Kubectl:
    """The built kubectl against the test cluster, as the tutorial's reader runs it."""

    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = str(binary)
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    async def __call__(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {err.decode()}")
        return out.decode()


async def exists(api: kube.Kube, path: str) -> bool:
    try:
        await api.get(path)
    except kube.ApiError as exc:
        if exc.not_found:
            return False
        raise
    return True


async def events_of(api: kube.Kube, namespace: str, kind: str = "Pod") -> list[kube.Body]:
    listing = await api.get(
        f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.kind={kind}"
    )
    items: list[kube.Body] = listing.get("items", [])
    return items


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1)[:4000]
