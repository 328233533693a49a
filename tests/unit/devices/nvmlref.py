"""The NVML oracle: NVIDIA's go-nvml mock machines, as a subprocess.

``hack/build-nvmlref.sh`` builds ``hack/nvmlref`` (go-nvml v0.13.4-1's ``pkg/nvml/mock`` machines
dgxa100, dgxh100, dgxh200, dgxb200, plus a100-80gb and a30 from its GPU configurations; profile
names by go-nvlib) into the cache and prints its path; ``Oracle`` keeps one process running and
asks it one request at a time (one JSON line each way; the requests are described in
``hack/nvmlref/main.go``). Every NVML answer carries ``return`` (``"SUCCESS"``,
``"ERROR_NOT_SUPPORTED"``, ...) and ``code`` (nvml.h's value).

What the mock does not model, where the fake pynvml keeps its nvml.h-derived behaviour and the
tests compare only what the oracle models:

- profile ids: the mock's ``info.id`` is the enum asked for; NVML answers its own ids (19 for an
  A100's 1g.5gb). ``devices.gpu_models`` holds NVML's (MIG User Guide).
- profile names: the mock's info has none (v1 struct); go-nvlib's rule on the mock's memory
  names them, wrongly for some H200 and B200 profiles (``gpu_models.MOCK_ERRATA``).
- placements of the H100, H200 and B200 mocks span compute slices, not memory slices, for 3g,
  7g and the two-slice 1g profile (``MOCK_ERRATA``); the A100 and A30 mocks' are NVML's.
- creation: the mock creates any GPU instance at any placement, in or out of MIG mode,
  overlapping or not, and any number of compute instances in one; NVML refuses (``NOT_SUPPORTED``
  out of MIG mode, ``INSUFFICIENT_RESOURCES`` for taken slices, ``INVALID_ARGUMENT`` for a
  placement the profile does not have). GPU instance ids count from 0 in creation order; NVML's
  follow the placement.
- permissions: nvml.h's "Requires privileged user" (``NO_PERMISSION``) is never answered.
- MIG device handles (``GetMaxMigDeviceCount``, ``GetMigDeviceHandleByIndex``) and
  ``GetGpuInstanceById``, events (``GetSupportedEventTypes``): not implemented (``call`` answers
  ``"modeled": false``).
- PCI: ``busId`` and ``busIdLegacy`` are empty and domain/bus/device 0; only ``pciDeviceId`` is
  set (the mock's own bus id, ``0000:<index>:00.0``, serves only DeviceGetHandleByPciBusId).
- UUIDs are random for each built machine (``GPU-<uuid4>``); ``memory`` reports free 0, used 0.
- memory: the H100, H200 and B200 mocks report each profile's memory as slices x 10, 18 or 23
  GiB exactly; real GPUs report a little less. The tables keep the mock's numbers.

Run alone: ``.venv/bin/python -m tests.unit.devices.nvmlref dump dgxh200`` prints a dump.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.unit import oracles

MACHINES = ("dgxa100", "dgxh100", "dgxh200", "dgxb200", "a100-80gb", "a30")
"""Every machine the oracle has; the first four are go-nvml's own."""


def build_oracle() -> Path:
    """The oracle binary, built (or found in the cache) by hack/build-nvmlref.sh."""
    return oracles.built("build-nvmlref.sh")


class Oracle(oracles.LineOracle):
    """One running nvmlref; ``ask`` is a round trip of one line."""

    def ask(self, op: str, machine: str, **fields: Any) -> dict[str, Any]:
        answer = self.round_trip({"op": op, "machine": machine, **fields})
        if "error" in answer:
            raise ValueError(f"nvmlref: {op} on {machine}: {answer['error']}")
        return answer

    def dump(self, machine: str) -> dict[str, Any]:
        return self.ask("dump", machine)


def value(answer: dict[str, Any]) -> Any:
    """The value of a successful NVML answer; AssertionError naming the code otherwise."""
    assert answer["return"] == "SUCCESS", answer
    return answer["value"]


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] != "dump":
        raise SystemExit(
            f"usage: python -m tests.unit.devices.nvmlref dump {{{','.join(MACHINES)}}}"
        )
    with Oracle(build_oracle()) as oracle:
        print(json.dumps(oracle.dump(argv[1]), indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
