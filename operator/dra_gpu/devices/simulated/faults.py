"""The simulated faults file: the faults a test or demo says the simulated GPUs have now.

Owns the file's format (one entry per device: an XID, optionally of one MIG GPU instance, a
double-bit ECC error, a lost GPU, NVML's recovery action) and its strict parsing, each fault
made as the nvml backend would report it (classified by the XID policy). A bad file is a
``ProfileError`` naming the file and the field; a missing file lists nothing. Must not: keep
state between reads (``SimulatedBackend.faults`` says which GPUs were reset since).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from dra_gpu.devices import health, model, strict
from dra_gpu.devices.simulated import profile
from dra_gpu.resource import names


def load_faults(
    path: Path,
    xids: health.XidPolicy,
    partition_at: Callable[[str, int], str | None] | None = None,
) -> tuple[health.Fault, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as err:
        raise model.ProfileError(f"faults file {path}: cannot be read: {err}") from None
    return parse_faults(text, xids, source=str(path), partition_at=partition_at)


_FAULT_FIELDS = {"xid", "gpuInstance", "ecc", "lost", "recovery"}


def parse_faults(
    text: str,
    xids: health.XidPolicy,
    source: str = "<string>",
    partition_at: Callable[[str, int], str | None] | None = None,
) -> tuple[health.Fault, ...]:
    """The faults a faults file lists, as NVML would report them::

        gpu-0: {xid: 48}                  # an XID, GPU-wide (a MIG-mode GPU: every partition)
        gpu-1: {xid: 94, gpuInstance: 2}  # an XID of MIG GPU instance 2 (its partition only)
        gpu-2: {ecc: double-bit}
        gpu-3: {lost: true}               # the GPU answers GPU_IS_LOST
        gpu-4: {recovery: gpu-reset}      # NVML's recovery action (one of RECOVERY_ACTIONS)

    XIDs are classified by ``xids`` (those that taint nothing give no fault). ``partition_at``
    maps (GPU, GPU instance id) to the partition device of that instance; without one, or an
    instance without a partition, the XID is the whole GPU's, as the nvml backend does."""
    try:
        data = yaml.load(text, Loader=strict.StrictLoader)
    except yaml.YAMLError as err:
        raise model.ProfileError(f"faults file {source}: not valid YAML: {err}") from None
    parser = profile.Parser(source, what="faults file")
    faults: list[health.Fault] = []
    for device, spec in parser.mapping(data, "", None).items():
        if not isinstance(device, str) or not names.is_dns_label(device):
            raise parser.error(str(device), "a device name must be a DNS label (e.g. gpu-0)")
        entries = parser.mapping(spec, device, _FAULT_FIELDS)
        if not entries.keys() - {"gpuInstance"}:
            raise parser.error(device, "expected one of xid, ecc, lost, recovery")
        instance = entries.get("gpuInstance")
        if instance is not None and (
            isinstance(instance, bool) or not isinstance(instance, int) or instance < 0
        ):
            raise parser.error(
                f"{device}.gpuInstance", f"expected a GPU instance id, got {instance!r}"
            )
        if instance is not None and "xid" not in entries:
            raise parser.error(f"{device}.gpuInstance", "only an xid is scoped to a GPU instance")
        for cause, value in entries.items():
            path = f"{device}.{cause}"
            if cause == "gpuInstance":
                continue
            if cause == "xid":
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise parser.error(path, f"expected an XID (a positive number), got {value!r}")
                target, message = device, f"XID {value} (simulated)"
                if instance is not None:
                    message = f"XID {value} (simulated, GPU instance {instance})"
                    partition = partition_at(device, instance) if partition_at else None
                    if partition is None:
                        message += ", which no partition is published for: the whole GPU is tainted"
                    else:
                        target = partition
                fault = xids.fault(target, value, message)
                if fault is not None:
                    faults.append(fault)
            elif cause == "ecc":
                if value != "double-bit":
                    raise parser.error(path, f"expected double-bit, got {value!r}")
                faults.append(xids.ecc_fault(device, "double-bit ECC error (simulated)"))
            elif cause == "recovery":
                actions = tuple(health.RECOVERY_ACTIONS.values())
                if value not in actions:
                    raise parser.error(path, f"expected one of {', '.join(actions)}, got {value!r}")
                faults.append(
                    xids.recovery_fault(device, value, f"recovery action {value} (simulated)")
                )
            elif value is not True:
                raise parser.error(path, f"expected true, got {value!r}")
            else:
                faults.append(xids.lost_fault(device, "the GPU is lost (simulated)"))
    return tuple(faults)
