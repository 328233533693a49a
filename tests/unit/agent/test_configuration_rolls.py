"""An agent keeps the configuration it started with until its pod is replaced: the simulated
profile is read once at start, so a changed (or broken) profile reaches a node only with the
new pod the DaemonSet rolls out there, one node at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_gpu import config
from dra_gpu.agent import runner
from dra_gpu.devices import model

NODE = "node-01"


async def test_the_running_agent_keeps_the_profile_it_started_with(tmp_path: Path) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"nodes:\n  {NODE}:\n    devices:\n    - count: 2\n      memory: 8Gi\n")
    settings = config.AgentSettings(node_name=NODE, profile=profile, cdi_dir=tmp_path / "cdi")
    backend = runner.make_backend(settings)
    try:
        assert len((await backend.inventory()).devices) == 2
        # helm upgrade rewrote the mounted ConfigMap: a GPU more, then a typo.
        profile.write_text(f"nodes:\n  {NODE}:\n    devices:\n    - count: 3\n      memory: 8Gi\n")
        assert len((await backend.inventory()).devices) == 2
        profile.write_text(f"nodes:\n  {NODE}:\n    devices:\n    - count: 3\n      memroy: 8Gi\n")
        assert len((await backend.inventory()).devices) == 2
    finally:
        await backend.aclose()
    # The new pod reads the new profile, and a bad one stops that pod alone, naming the field.
    with pytest.raises(model.ProfileError, match=r"devices\[0\]"):
        runner.make_backend(settings)
