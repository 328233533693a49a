"""``hack/gpu-check``: what the nvml backend makes of a real GPU machine, as one JSON report.

For a machine with an NVIDIA GPU and its driver, no Kubernetes and no network: only this
checkout (or the installed ``dra-gpu`` package) and a small venv with nvidia-ml-py (docs/nodes.md,
"Checking a real GPU node"). It drives the project's own code, not a copy of it:

- ``host``: kernel, Python, the nvidia-ml-py version, ``/proc/driver/nvidia/version``, the
  ``/dev/nvidia*`` nodes, the effective uid (MIG placements need a privileged caller);
- ``nvml``: whether NVML initialises, the driver, NVML and CUDA driver versions, the GPU count;
- ``inventory``: ``devices.nvml.NvmlBackend.inventory()`` (devices, attributes, capacity, MIG
  partitions and counter sets) and the GPUs whose MIG management NVML refused;
- ``slices``: the ResourceSlices the agent's publisher would write for it
  (``slices.build_slices``, as ``agent.publisher`` calls it);
- ``cdi``: the CDI specs of a claim for one GPU and of a claim for two, built by the agent's own
  prepare path (``agent.state.DeviceState._claim_spec`` over the backend's ``container_edits``;
  ``claim_spec`` below is the one place that calls it), and every device node they name: whether
  it exists on the host, and as what;
- ``health``: per GPU, the event types NVML says it supports and whether registering XID and
  double-bit ECC events succeeds (an event set is created, registered, waited on for 100 ms and
  freed), and what the backend's own health poll and event thread report (``faults()``,
  ``monitored()``; stopped within about two seconds);
- ``mig``: per GPU, its current and pending MIG mode, every GPU instance profile with its
  possible placements, the MIG instances that exist now, and the capability nodes a claim of
  each would get (``devices.nvml_cdi``).

It never changes the GPU: every NVML call goes through ``ReadOnlyNvml``, which lets through only
calls that read (``nvml...Get...``, init and shutdown, event sets) and refuses the rest before
NVML sees them (``MutatingCall``): no MIG mode change, no GPU or compute instance created or
destroyed, no GPU reset, no compute mode or time-slice set, no MPS daemon started (the backend is
given no sharing). The report lists every NVML call made and any refused.

Each section records its error (``{"error": "..."}``) instead of ending the run; the log lines
of the code under check (a device node left out of a spec, say) are in ``log``. Exit status: 0
when the report was written, 1 when NVML could not be initialised (the report says why; the
sections that need NVML are then left out) or ``--out`` could not be written (the report is
still printed), 2 for bad arguments.

``--nvml-module MODULE:FACTORY`` runs it against another NVML module: ``FACTORY()`` returns the
object used in place of ``pynvml`` (the unit tests pass the project's fake pynvml,
``tests/unit/commands/gpu_check_fakes.py``).

What was verified: only against that fake pynvml (an A100 in MIG mode and two H100s), in
``tests/unit/commands/test_gpu_check.py``. No machine with a real NVIDIA GPU was available while
it was written (the project's device machine was not lent to that task), so it has never run
against real NVML; the first run on one is its real test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import functools
import importlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import socket
import stat
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from dra_gpu import DEFAULT_DRIVER_NAME, kube
from dra_gpu.agent import cdi, claims, slices, state
from dra_gpu.devices import edits, model, nvml, nvml_cdi, opaque, pci
from dra_gpu.resource import bodies, names

Report = dict[str, Any]

REPORT_VERSION = 1
NODE_UID = "00000000-0000-0000-0000-000000000000"
"""The owner reference's uid in the slices shown (there is no Node object here)."""
EVENT_WAIT_MS = 100
"""The one wait on the registered event set: long enough to see it work, never long."""
MONITORED_WAIT_SECONDS = 5.0
"""How long the backend's event thread is given to register every GPU."""

# nvmlEventType* bits, from nvml.h (ABI).
EVENT_TYPES = {
    0x1: "SingleBitEccError",
    0x2: "DoubleBitEccError",
    0x4: "PState",
    0x8: "XidCriticalError",
    0x10: "Clock",
    0x80: "PowerSourceChange",
    0x100: "MigConfigChange",
    0x200: "SingleBitEccErrorStorm",
    0x400: "DramRetirementEvent",
    0x800: "DramRetirementFailure",
    0x1000: "NonFatalPoisonError",
    0x2000: "FatalPoisonError",
    0x4000: "GpuUnavailableError",
    0x8000: "GpuRecoveryAction",
}
WATCHED_EVENTS = 0x8 | 0x2
"""What the backend registers: critical XIDs and double-bit ECC errors."""

# Calls that read, by name. Everything else (Set*, Create*, Destroy*, Reset*, Clear*, ...) is
# refused: a deny list would let through a mutating call nobody thought of.
_READS = re.compile(r"nvml[A-Za-z]*?Get[A-Za-z0-9_]*")
_WRITE_WORDS = re.compile(
    r"Set(?!Wait|Free|Create)|Create|Destroy|Reset|Clear|Modify|Remove|Inject"
)
_ALSO_ALLOWED = frozenset(
    {
        "nvmlInit",
        "nvmlInit_v2",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlEventSetCreate",
        "nvmlEventSetWait",
        "nvmlEventSetWait_v2",
        "nvmlEventSetFree",
        "nvmlDeviceRegisterEvents",
    }
)


class MutatingCall(RuntimeError):
    """An NVML call that could change the GPU, refused before it reached NVML."""


def is_read_only(name: str) -> bool:
    """Whether NVML function ``name`` only reads (or manages this process's event set)."""
    if name in _ALSO_ALLOWED:
        return True
    body = name.removeprefix("nvml")
    return bool(_READS.fullmatch(name)) and not _WRITE_WORDS.search(body.split("Get", 1)[0])


class ReadOnlyNvml:
    """An NVML module (``pynvml`` or a fake) that lets through only the calls that read.

    Attributes that are not NVML functions (constants, error classes, ctypes structs) pass as
    they are. ``calls`` counts the calls made by name; ``refused`` lists those refused."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.calls: collections.Counter[str] = collections.Counter()
        self.refused: list[str] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._module, name)
        if not (name.startswith("nvml") and callable(found)) or isinstance(found, type):
            return found
        if not is_read_only(name):
            self.refused.append(name)
            raise MutatingCall(f"gpu-check never calls {name}: it could change the GPU")

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return found(*args, **kwargs)

        return call


# ---- the command ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hack/gpu-check",
        description="Print what dra-gpu's nvml backend makes of this machine's GPUs (JSON); "
        "never changes the GPU.",
    )
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument(
        "--node", default=_default_node(), help="node name in the slices (default: host name)"
    )
    parser.add_argument("--driver", default=DEFAULT_DRIVER_NAME, help="DRA driver name")
    parser.add_argument(
        "--driver-root",
        type=Path,
        default=Path("/"),
        help="where /dev/nvidia* and /proc/driver/nvidia are read (default: /)",
    )
    parser.add_argument(
        "--sysfs", type=Path, default=pci.SYSFS, help="sysfs root for pcieRoot and numaNode"
    )
    parser.add_argument(
        "--nvml-module",
        metavar="MODULE:FACTORY",
        help="use FACTORY() from MODULE in place of pynvml (tests)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report, code = asyncio.run(check(args))
    text = json.dumps(report, indent=2, sort_keys=False, default=str) + "\n"
    if args.out is not None:
        try:
            args.out.write_text(text)
        except OSError as err:
            print(f"gpu-check: cannot write {args.out}: {err}", file=sys.stderr)
            sys.stdout.write(text)
            return 1
    sys.stdout.write(text)
    return code


class _Collect(logging.Handler):
    """Keeps the log lines of the code under check (a device node left out of a spec, a GPU
    unmonitored): they go in the report's ``log``, not to the terminal."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


async def check(args: argparse.Namespace) -> tuple[Report, int]:
    """The report, and the exit status (1: NVML did not initialise)."""
    collect = _Collect()
    root = logging.getLogger()
    root.addHandler(collect)
    root.setLevel(logging.INFO)
    try:
        report, code = await _check(args)
    finally:
        root.removeHandler(collect)
    report["log"] = collect.lines
    return report, code


async def _check(args: argparse.Namespace) -> tuple[Report, int]:
    report: Report = {"report_version": REPORT_VERSION, "host": host_facts(args.driver_root)}
    try:
        module = load_nvml(args.nvml_module)
    except Exception as err:
        report["nvml"] = {"initialised": False, "error": f"loading the NVML module: {_err(err)}"}
        return report, 1
    guard = ReadOnlyNvml(module)
    api = cast(nvml.NvmlApi, guard)
    try:
        await asyncio.to_thread(guard.nvmlInit)
    except Exception as err:
        report["nvml"] = {"initialised": False, "error": f"nvmlInit: {_err(err)}"}
        report["nvml_calls"] = dict(guard.calls)
        return report, 1
    try:
        facts = await asyncio.to_thread(_sections, nvml_facts(api))
        report["nvml"] = {"initialised": True, **facts}
        backend = nvml.NvmlBackend(args.node, api, driver_root=args.driver_root, sysfs=args.sysfs)
        try:
            inventory = await _section(report, "inventory", backend.inventory())
            if isinstance(inventory, model.Inventory):
                report["inventory"] = inventory_report(inventory, backend)
                report["slices"] = _guarded(
                    lambda: slices.build_slices(
                        args.node,
                        NODE_UID,
                        args.driver,
                        inventory.devices,
                        1,
                        counter_sets=inventory.counter_sets,
                    )
                )
                report["cdi"] = await cdi_report(backend, inventory, args)
            else:
                report["slices"] = report["cdi"] = {"skipped": "no inventory (see inventory)"}
            report["health"] = await health_report(api, backend)
            report["mig"] = await mig_report(api, backend, args.driver_root)
        finally:
            await _section(report, "shutdown", backend.aclose(), keep=False)
    finally:
        try:
            guard.nvmlShutdown()
        except Exception as err:
            report["shutdown"] = {"error": f"nvmlShutdown: {_err(err)}"}
    report["nvml_calls"] = dict(sorted(guard.calls.items()))
    report["nvml_calls_refused"] = list(guard.refused)
    return report, 0


def load_nvml(spec: str | None) -> Any:
    """``pynvml``, or ``FACTORY()`` of ``MODULE:FACTORY``."""
    if spec is None:
        return importlib.import_module("pynvml")
    module_name, sep, factory = spec.partition(":")
    if not sep or not module_name or not factory:
        raise ValueError(f"--nvml-module {spec!r} is not MODULE:FACTORY")
    return getattr(importlib.import_module(module_name), factory)()


# ---- sections -----------------------------------------------------------------------------


def host_facts(driver_root: Path) -> Report:
    uname = platform.uname()
    facts: Report = {
        "kernel": uname.release,
        "kernel_version": uname.version,
        "machine": uname.machine,
        "python": platform.python_version(),
        "euid": os.geteuid(),
        "driver_root": str(driver_root),
    }
    try:
        facts["nvidia_ml_py"] = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        facts["nvidia_ml_py"] = None
    try:
        facts["dev_nodes"] = sorted(
            str(p.relative_to(driver_root)) for p in (driver_root / "dev").glob("nvidia*")
        )
    except OSError as err:
        facts["dev_nodes"] = {"error": _err(err)}
    version_file = driver_root / "proc/driver/nvidia/version"
    try:
        facts["proc_driver_version"] = version_file.read_text().splitlines()[0].strip()
    except (OSError, IndexError) as err:
        facts["proc_driver_version"] = {"error": f"{version_file}: {_err(err)}"}
    return facts


def nvml_facts(api: nvml.NvmlApi) -> dict[str, Callable[[], Any]]:
    dynamic = cast(Any, api)
    return {
        "driver_version": lambda: _text(api.nvmlSystemGetDriverVersion()),
        "nvml_version": lambda: _text(dynamic.nvmlSystemGetNVMLVersion()),
        "cuda_driver_version": lambda: nvml.cuda_version(api.nvmlSystemGetCudaDriverVersion_v2()),
        "device_count": api.nvmlDeviceGetCount,
    }


def inventory_report(inventory: model.Inventory, backend: nvml.NvmlBackend) -> Report:
    return {
        "devices": [
            {
                "name": d.name,
                "uuid": d.uuid,
                "partition_of": d.partition_of,
                "healthy": d.healthy,
                "attributes": {k: v.to_api() for k, v in d.attributes.items()},
                "capacity": dict(d.capacity),
                "consumes": {k: dict(v) for k, v in d.consumes.items()},
            }
            for d in inventory.devices
        ],
        "counter_sets": [c.to_api() for c in inventory.counter_sets],
        "mig_refusals": [str(r) for r in backend.mig_refusals()],
    }


async def claim_spec(
    backend: nvml.NvmlBackend, driver: str, node: str, uid: str, devices: Sequence[model.Device]
) -> cdi.CdiSpec | None:
    """The CDI spec the agent's prepare writes for a claim of ``devices`` (one request ``gpu``,
    no opaque config): ``agent.state.DeviceState._claim_spec``, the agent's own code, over a
    state that reaches nothing else (no API, no checkpoint written, no sharing)."""
    allocated = [claims.AllocatedDevice(request="gpu", pool=node, device=d.name) for d in devices]
    configs = opaque.effective_configs([], driver, ["gpu"])
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        device_state = state.DeviceState(
            api=cast(kube.Kube, None),
            driver=driver,
            node=node,
            container_edits=backend.container_edits,
            cdi_dir=Path(scratch),
            checkpoint_file=Path(scratch) / "checkpoint.json",
            inventory=_no_inventory,
            status=_NoStatus(),
        )
        ref = claims.ClaimRef("gpu-check", f"claim-{len(devices)}", bodies.ClaimUID(uid))
        return await device_state._claim_spec(
            ref, allocated, {d.name: d for d in devices}, configs, {}
        )


async def cdi_report(
    backend: nvml.NvmlBackend, inventory: model.Inventory, args: argparse.Namespace
) -> Report:
    partitioned = {d.partition_of for d in inventory.devices if d.partition_of}
    whole = [
        d
        for d in inventory.devices
        if d.partition_of is None and d.name not in partitioned and d.sharing is None
    ]
    found: Report = {"whole_gpus": [d.name for d in whole]}
    for count in (1, 2):
        key = f"claim_of_{count}_gpu{'s' if count > 1 else ''}"
        if len(whole) < count:
            found[key] = {"skipped": f"the node has {len(whole)} whole GPU(s) not in MIG mode"}
            continue
        devices = whole[:count]
        uid = f"00000000-0000-4000-8000-00000000000{count}"
        try:
            spec = await claim_spec(backend, args.driver, args.node, uid, devices)
        except Exception as err:
            found[key] = {"devices": [d.name for d in devices], "error": _err(err)}
            continue
        found[key] = {
            "devices": [d.name for d in devices],
            "uuids": [d.uuid for d in devices],
            "cdi_device_ids": [cdi.cdi_device_id(args.driver, uid, d.name) for d in devices],
            "spec": spec,
            "visible_devices": _visible_devices(spec),
            "device_nodes": [node_report(args.driver_root, n) for n in _device_nodes(spec)],
            "control_nodes_left_out": [
                p for p in edits.CONTROL_DEVICE_NODES if p not in _device_nodes_paths(spec)
            ],
        }
    return found


def node_report(driver_root: Path, node: Mapping[str, Any]) -> Report:
    """A device node a spec names, and what is at its path under the driver root."""
    path = str(node.get("path", ""))
    host = driver_root / path.lstrip("/")
    found: Report = {"path": path, "spec": dict(node), "host_path": str(host)}
    try:
        info = host.stat()
    except OSError as err:
        found["exists"] = False
        found["why"] = err.strerror or str(err)
        return found
    found["exists"] = True
    found["char_device"] = stat.S_ISCHR(info.st_mode)
    if stat.S_ISCHR(info.st_mode):
        found["major"], found["minor"] = os.major(info.st_rdev), os.minor(info.st_rdev)
        found["mode"] = oct(stat.S_IMODE(info.st_mode))
        if "major" in node and (node.get("major"), node.get("minor")) != (
            found["major"],
            found["minor"],
        ):
            found["mismatch"] = "the spec's major:minor differ from the host's node"
    return found


async def health_report(api: nvml.NvmlApi, backend: nvml.NvmlBackend) -> Report:
    found: Report = {"gpus": await asyncio.to_thread(_guarded, lambda: register_events(api))}
    polled = await _section(found, "backend_faults", backend.faults(), keep=False)
    if isinstance(polled, tuple):
        found["backend_faults"] = [repr(f) for f in polled]
    found["backend_monitored"] = await _section(
        found, "backend_monitored", _monitored(api, backend)
    )
    return found


def register_events(api: nvml.NvmlApi) -> Report:
    """Per GPU: its supported event types and whether registering the watched ones succeeds,
    on an event set of our own, waited on once for ``EVENT_WAIT_MS`` and freed."""
    gpus: Report = {}
    event_set = api.nvmlEventSetCreate()
    try:
        for index in range(api.nvmlDeviceGetCount()):
            gpu: Report = {}
            gpus[f"gpu-{index}"] = gpu
            try:
                handle = api.nvmlDeviceGetHandleByIndex(index)
                supported = int(api.nvmlDeviceGetSupportedEventTypes(handle))
            except Exception as err:
                gpu["error"] = _err(err)
                continue
            gpu["supported"] = [n for bit, n in EVENT_TYPES.items() if supported & bit]
            gpu["supported_mask"] = hex(supported)
            wanted = supported & WATCHED_EVENTS
            gpu["registered"] = [n for bit, n in EVENT_TYPES.items() if wanted & bit]
            if not wanted:
                gpu["registration"] = "nothing to register: no XID or double-bit ECC events"
                continue
            try:
                api.nvmlDeviceRegisterEvents(handle, wanted, event_set)
            except Exception as err:
                gpu["registration"] = {"error": _err(err)}
            else:
                gpu["registration"] = "ok"
        try:
            data = api.nvmlEventSetWait_v2(event_set, EVENT_WAIT_MS)
        except Exception as err:
            gpus["wait"] = f"no event within {EVENT_WAIT_MS} ms ({_err(err)})"
        else:
            gpus["wait"] = f"an event: type {data.eventType:#x}, data {data.eventData}"
    finally:
        api.nvmlEventSetFree(event_set)
    return gpus


async def _monitored(api: nvml.NvmlApi, backend: nvml.NvmlBackend) -> Report:
    """The backend's ``monitored()`` once its event thread has tried every GPU (or after
    ``MONITORED_WAIT_SECONDS``)."""
    expected = await asyncio.to_thread(api.nvmlDeviceGetCount)
    for _ in range(int(MONITORED_WAIT_SECONDS / 0.05)):
        if len(backend.monitored()) >= expected:
            break
        await asyncio.sleep(0.05)
    monitored = backend.monitored()
    return {"gpus": dict(sorted(monitored.items())), "complete": len(monitored) >= expected}


async def mig_report(api: nvml.NvmlApi, backend: nvml.NvmlBackend, driver_root: Path) -> Report:
    found: Report = {"gpus": await asyncio.to_thread(_guarded, lambda: mig_modes(api))}
    instances = await _section(found, "instances", backend.mig_instances(), keep=False)
    if not isinstance(instances, tuple):
        return found
    found["instances"] = []
    for instance in instances:
        nodes = await asyncio.to_thread(
            _guarded, functools.partial(capability_nodes, api, driver_root, instance)
        )
        found["instances"].append(
            {
                "parent": instance.placement.parent,
                "profile": instance.placement.profile,
                "start": instance.placement.start,
                "gpu_instance": instance.gpu_instance,
                "compute_instance": instance.compute_instance,
                "uuid": instance.uuid,
                "capability_nodes": nodes,
            }
        )
    return found


def mig_modes(api: nvml.NvmlApi) -> Report:
    """Per GPU: current and pending MIG mode, and each GPU instance profile with its possible
    placements (read whether or not MIG mode is on, as nvml.h says NVML answers)."""
    gpus: Report = {}
    for index in range(api.nvmlDeviceGetCount()):
        gpu: Report = {}
        gpus[f"gpu-{index}"] = gpu
        try:
            handle = api.nvmlDeviceGetHandleByIndex(index)
            current, pending = api.nvmlDeviceGetMigMode(handle)
        except Exception as err:
            if getattr(err, "value", None) == api.NVML_ERROR_NOT_SUPPORTED:
                gpu["mode"] = "not supported: the GPU has no MIG"
            else:
                gpu["mode"] = {"error": _err(err)}
            continue
        gpu["mode"] = {"current": _mode(api, current), "pending": _mode(api, pending)}
        gpu["profiles"] = _profiles(api, handle)
    return gpus


def _profiles(api: nvml.NvmlApi, handle: Any) -> list[Report]:
    profiles: list[Report] = []
    for enum in range(api.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = api.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        except Exception as err:
            if getattr(err, "value", None) not in (
                api.NVML_ERROR_NOT_SUPPORTED,
                api.NVML_ERROR_INVALID_ARGUMENT,
            ):
                profiles.append({"enum": enum, "error": _err(err)})
            continue
        profile: Report = {
            "enum": enum,
            "id": int(info.id),
            "name": _text(info.name),
            "slice_count": int(info.sliceCount),
            "instance_count": int(info.instanceCount),
            "memory_mib": int(info.memorySizeMB),
        }
        placements = (api.c_nvmlGpuInstancePlacement_t * 32)()
        count = ctypes.c_uint(0)
        try:
            api.nvmlDeviceGetGpuInstancePossiblePlacements(
                handle, info.id, placements, ctypes.byref(count)
            )
        except Exception as err:
            profile["placements"] = {"error": _err(err)}
        else:
            profile["placements"] = [
                {"start": placements[i].start, "size": placements[i].size}
                for i in range(count.value)
            ]
        profiles.append(profile)
    return profiles


def capability_nodes(api: nvml.NvmlApi, driver_root: Path, instance: model.MigInstance) -> Any:
    """The capability nodes a claim of this MIG device gets, and whether each exists."""
    if instance.compute_instance is None:
        return {"skipped": "a GPU instance without a compute instance"}
    index = int(instance.placement.parent.removeprefix("gpu-"))
    minor = int(api.nvmlDeviceGetMinorNumber(api.nvmlDeviceGetHandleByIndex(index)))
    nodes = nvml_cdi.mig_capability_nodes(driver_root, minor, instance, instance.placement.parent)
    return [node_report(driver_root, cdi_node(n)) for n in nodes]


def cdi_node(node: edits.DeviceNode) -> dict[str, Any]:
    found: dict[str, Any] = {"path": node.path}
    for key in ("type", "major", "minor"):
        if getattr(node, key) is not None:
            found[key] = getattr(node, key)
    return found


# ---- helpers --------------------------------------------------------------------------------


class _NoStatus:
    def set_devices(self, ref: claims.ClaimRef, entries: list[dict[str, Any]]) -> None:
        pass


async def _no_inventory(fresh: bool) -> model.Inventory:
    raise RuntimeError("gpu-check gives the agent's state no inventory")


async def _section(report: Report, name: str, work: Awaitable[Any], *, keep: bool = True) -> Any:
    """``work``'s result; on an error, ``report[name]`` says it and None is returned."""
    try:
        result = await work
    except Exception as err:
        report[name] = {"error": _err(err)}
        return None
    if keep:
        report[name] = result
    return result


def _guarded(work: Callable[[], Any]) -> Any:
    try:
        return work()
    except Exception as err:
        return {"error": _err(err)}


def _sections(parts: Mapping[str, Callable[[], Any]]) -> Report:
    return {name: _guarded(work) for name, work in parts.items()}


def _device_nodes(spec: cdi.CdiSpec | None) -> list[Mapping[str, Any]]:
    if spec is None:
        return []
    nodes = list(spec.get("containerEdits", {}).get("deviceNodes", []))
    for device in spec.get("devices", []):
        nodes.extend(device["containerEdits"].get("deviceNodes", []))
    return cast(list[Mapping[str, Any]], nodes)


def _device_nodes_paths(spec: cdi.CdiSpec | None) -> set[str]:
    return {str(n.get("path")) for n in _device_nodes(spec)}


def _visible_devices(spec: cdi.CdiSpec | None) -> list[str] | None:
    if spec is None:
        return None
    for entry in spec.get("containerEdits", {}).get("env", []):
        key, _, value = entry.partition("=")
        if key == edits.VISIBLE_DEVICES_ENV:
            return value.split(",")
    return None


def _mode(api: nvml.NvmlApi, value: int) -> str:
    return "enabled" if value == api.NVML_DEVICE_MIG_ENABLE else "disabled"


def _default_node() -> str:
    name = socket.gethostname().lower()
    return name if names.is_dns_subdomain(name) else "gpu-node"


def _text(value: str | bytes) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value.rstrip("\x00").strip()


def _err(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


if __name__ == "__main__":
    sys.exit(main())
