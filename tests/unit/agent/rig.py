"""An agent's ``DeviceState`` over a backend, for unit tests of prepare that need no API server.

``ClaimsApi`` answers the one API call prepare makes, a GET of a claim: ``allocate`` stores a
claim as the scheduler leaves it (``status.allocation.devices.results``) and returns its
``ClaimRef``. ``device_state`` is the agent's state as it starts, its files under a test's
directory (CDI specs in ``cdi/``, ``checkpoint.json``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.state import DeviceState
from dra_gpu.agent.status import StatusSink
from dra_gpu.devices import model
from dra_gpu.resource.bodies import ClaimUID

DRIVER = "gpu.example.com"
NODE = "node-01"


class ClaimsApi:
    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def allocate(
        self, name: str, results: Sequence[dict[str, Any]], config: Sequence[Any] = ()
    ) -> ClaimRef:
        uid = f"uid-{name}"
        allocation = {"devices": {"results": list(results), "config": list(config)}}
        self.claims[name] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"allocation": allocation},
        }
        return ClaimRef("ns", name, ClaimUID(uid))

    async def get(self, path: str) -> dict[str, Any]:
        return self.claims[path.rsplit("/", 1)[1]]


class NoStatus:
    def set_devices(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        pass


def device_state(
    tmp_path: Path,
    backend: model.Backend,
    api: ClaimsApi,
    status: StatusSink | None = None,
    **settings: Any,
) -> DeviceState:
    """The agent's state over ``backend`` (its MIG instances too, if it has them)."""

    async def inventory(fresh: bool) -> model.Inventory:
        return await backend.inventory()

    return DeviceState(
        api=api,  # type: ignore[arg-type]  # prepare only GETs claims
        driver=DRIVER,
        node=NODE,
        container_edits=backend.container_edits,
        cdi_dir=tmp_path / "cdi",
        checkpoint_file=tmp_path / "checkpoint.json",
        inventory=inventory,
        status=status or NoStatus(),
        mig=backend if isinstance(backend, model.MigInstances) else None,
        **settings,
    )
