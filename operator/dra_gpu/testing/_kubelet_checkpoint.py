"""What the real kubelet recorded as prepared: its DRA checkpoint, ``dra_manager_state``.

The kubelet writes ``{"Data": "<json>", "Checksum": N}`` into its root directory, where Data
holds ``ClaimInfoStateList`` (``pkg/kubelet/cm/dra/state``, the same in 1.35 to 1.37): per
claim its UID, name, namespace, the pods using it, and per driver the devices the plugin
answered with. A claim is recorded before its prepare call returns; it counts as prepared here
once a driver's answer is in (devices listed).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STATE_FILE = "dra_manager_state"


@dataclasses.dataclass(frozen=True)
class KubeletDevice:
    driver: str
    pool: str
    device: str
    requests: tuple[str, ...]
    cdi_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class KubeletClaim:
    uid: str
    namespace: str
    name: str
    pod_uids: frozenset[str]
    devices: tuple[KubeletDevice, ...]


def parse(text: str) -> dict[str, KubeletClaim]:
    """The claims of a checkpoint file's text whose devices a driver reported, by claim UID."""
    outer = json.loads(text)
    data = json.loads(outer["Data"])
    claims = {}
    for state in data.get("ClaimInfoStateList") or []:
        devices = tuple(_devices(state.get("DriverState") or {}))
        if devices:
            claims[state["ClaimUID"]] = KubeletClaim(
                uid=state["ClaimUID"],
                namespace=state["Namespace"],
                name=state["ClaimName"],
                pod_uids=frozenset(state.get("PodUIDs") or ()),
                devices=devices,
            )
    return claims


def _devices(drivers: Mapping[str, Any]) -> list[KubeletDevice]:
    return [
        KubeletDevice(
            driver=driver,
            pool=device["PoolName"],
            device=device["DeviceName"],
            requests=tuple(device.get("RequestNames") or ()),
            cdi_ids=tuple(device.get("CDIDeviceIDs") or ()),
        )
        for driver, state in sorted(drivers.items())
        for device in state.get("Devices") or ()
    ]


def read(kubelet_dir: Path) -> dict[str, KubeletClaim]:
    """The kubelet's prepared claims; none before it first wrote its checkpoint."""
    try:
        text = (kubelet_dir / STATE_FILE).read_text()
    except FileNotFoundError:
        return {}
    return parse(text)
