"""The NVML backend: the node's real GPUs, read through pynvml.

This module owns the translation from NVML's answers (enums, byte counts, driver version
strings, PCI addresses) into the inventory model. Every NVML call is blocking, so all of them
run in a worker thread and never on the event loop that answers the kubelet. An NVML failure
is never turned into "no GPUs": it raises ``InventoryError`` naming the call and the GPU, because
an empty inventory would publish an empty pool and the user would only see "cannot allocate".
"Not supported" is an answer, not a failure, for the few properties that are optional. A lost
GPU (``nvml.health_watch``) is published as it was last read well, so its taint reaches the
slice and the other GPUs keep being published; a GPU in MIG mode is published as its
partitions (``nvml.instances``).

Sharing: the GPUs the agent's ``--shared-gpus`` setting names (``devices.sharing``) are offered
to several claims at once, each with a memory share, exactly as a simulated GPU with ``sharing``
is: the policy is checked against the memory NVML reports, and a policy that does not fit is an
``InventoryError`` naming the GPU, the setting and the field. A named GPU in MIG mode is published
MIG-partitioned and not shared, logged once: MIG mode is the hardware's state (it changes with
``nvidia-smi -mig`` and a GPU reset), and failing the whole inventory for it would stop every
other GPU of the node from being published. Names no GPU here has are logged once and passed
over (one setting serves all nodes). The settings sharing needs on a GPU (compute mode for MPS,
the time slice) are set here too.

Must not: block the event loop; publish an empty inventory for an NVML failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from dra_gpu.devices import edits, health, mig, model, nvml_cdi, pci, sharing
from dra_gpu.devices.nvml import health_watch, session

_T = TypeVar("_T")

# Values of nvmlBrandType_t and nvmlDeviceArchitecture_t from nvml.h; they are ABI and stable.
_BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "Titan",
    7: "NVIDIA vApps",
    8: "NVIDIA VPC",
    9: "NVIDIA VCS",
    10: "NVIDIA VWS",
    11: "NVIDIA Cloud Gaming",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
    17: "NVIDIA DLA",
    18: "NVIDIA vGameDev",
    19: "NVIDIA NPU",
}
_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
_BUS_ID = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


class NvmlBackend(health_watch.HealthWatch):
    """Reads the node's GPUs; use ``async with`` or call ``aclose()`` to shut NVML down.

    NVML is initialised once, on the first ``inventory()``; a failed initialisation is retried
    on the next call. GPUs are named ``gpu-<NVML index>``. One class in four parts, each over the
    next: this one reads and shares the GPUs, ``health_watch.HealthWatch`` their faults,
    ``instances.MigManagement`` their MIG instances, ``session.Session`` the NVML calls.
    """

    def __init__(
        self,
        node: str,
        nvml: session.NvmlApi | None = None,
        *,
        xids: health.XidPolicy | None = None,
        shared_gpus: sharing.SharedGpus | None = None,
        driver_root: Path = Path("/"),
        nvidia_smi: str = "nvidia-smi",
        sysfs: Path = pci.SYSFS,
    ) -> None:
        super().__init__(node, nvml, xids)
        self.sysfs = sysfs
        """Where each GPU's PCIe root and NUMA node are read (``devices.pci``)."""
        self.driver_root = driver_root
        """Where the driver's ``/dev`` nodes and ``/proc/driver`` files are read (CDI edits)."""
        self.nvidia_smi = nvidia_smi
        """Runs ``compute-policy --set-timeslice`` for TimeSlicing GPUs."""
        self._minors: dict[int, int] = {}  # NVML index -> /dev/nvidia<minor> (last inventory)
        self.shared_gpus = shared_gpus or sharing.SharedGpus()

    async def inventory(self) -> model.Inventory:
        return await asyncio.to_thread(self._read_blocking)

    async def container_edits(self, devices: Sequence[edits.GivenDevice]) -> edits.ClaimEdits:
        """A claim's CDI edits as NVIDIA's toolkit (``nvcdi``) and DRA driver write them
        (``devices.nvml_cdi``): ``NVIDIA_VISIBLE_DEVICES`` and the control nodes once, each GPU's
        ``/dev/nvidia<minor>``, a MIG device's capability nodes."""
        minors = dict(self._minors)
        return await asyncio.to_thread(
            nvml_cdi.claim_edits, self.driver_root, devices, minors, self._log_once
        )

    async def set_compute_mode(self, device: str, uuid: str, exclusive: bool) -> None:
        """``EXCLUSIVE_PROCESS`` (one process, the MPS server, on the GPU) or ``DEFAULT``
        (``nvmlDeviceSetComputeMode``, as ``nvidia-smi -c``; needs root). ``agent.mps``."""
        await asyncio.to_thread(self._set_compute_mode_blocking, device, exclusive)

    def _set_compute_mode_blocking(self, device: str, exclusive: bool) -> None:
        nvml = self._nvml
        mode = (
            nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if exclusive else nvml.NVML_COMPUTEMODE_DEFAULT
        )
        with self._lock:
            self._init_locked()
            index, handle = self._mig_gpu(device)
            self._nv("nvmlDeviceSetComputeMode", index, handle, mode)

    async def set_time_slice(self, device: str, uuid: str, time_slice: str) -> None:
        """``nvidia-smi compute-policy -i <uuid> --set-timeslice <0-3>``, as NVIDIA's driver."""
        await asyncio.to_thread(self._set_time_slice_blocking, device, uuid, time_slice)

    def _set_time_slice_blocking(self, device: str, uuid: str, time_slice: str) -> None:
        argv = [
            self.nvidia_smi,
            "compute-policy",
            "-i",
            uuid,
            "--set-timeslice",
            str(model.TIME_SLICES.index(time_slice)),
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise model.InventoryError(f"{device}: {' '.join(argv)}: {err}") from None
        if done.returncode != 0:
            raise model.InventoryError(
                f"{device}: {' '.join(argv)} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()}"
            )

    async def aclose(self) -> None:
        await asyncio.to_thread(self._shutdown_blocking)

    async def __aenter__(self) -> NvmlBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _shutdown_blocking(self) -> None:
        self._stop_watching_blocking()
        with self._lock:
            self._shutdown_locked()

    def _read_blocking(self) -> model.Inventory:
        nvml = self._nvml
        tables: dict[str, mig.MigTable] = {}
        with self._lock:
            self._init_locked()
            driver = session.as_text(
                self._call("nvmlSystemGetDriverVersion", None, nvml.nvmlSystemGetDriverVersion)
            )
            cuda = self._optional(
                "nvmlSystemGetCudaDriverVersion_v2", None, nvml.nvmlSystemGetCudaDriverVersion_v2
            )
            count = self._call("nvmlDeviceGetCount", None, nvml.nvmlDeviceGetCount)
            read: dict[int, model.Device] = {}
            for index in range(count):
                device = self._read_or_recall_locked(index, driver, cuda, tables)
                if device is not None:
                    read[index] = device
        devices = tuple(read.values())
        for name in self.shared_gpus.absent({i: d.uuid for i, d in read.items()}):
            self._log_once(
                logging.INFO, f"{self.shared_gpus.source}: {name} is not on this node: passed over"
            )
        try:
            inventory = mig.partition_inventory(self.node, devices, tables)
        except model.InventoryError as err:
            raise model.InventoryError(f"node {self.node}: MIG partitions: {err}") from None
        self._last_inventory = inventory
        return inventory

    def _read_or_recall_locked(
        self, index: int, driver: str, cuda: int | None, tables: dict[str, mig.MigTable]
    ) -> model.Device | None:
        """GPU ``index`` as NVML reads it now. A lost GPU (``GPU_IS_LOST`` from any call, or a
        UUID NVML no longer tells for a GPU read before) is the GPU as last read, so the slice
        keeps it and the health monitor's ``lost`` taint reaches it; one never read is left out
        (logged) until it answers. Any other failure fails the inventory, as before."""
        try:
            device = self._read_gpu(index, driver, cuda, tables)
        except model.InventoryError as err:
            if not self._is_lost(index):
                raise
            known = self._known.get(index)
            if known is None:
                self._log_once(
                    logging.WARNING,
                    f"GPU {index} is lost and was never read ({err}): left out until it answers",
                )
                return None
            self._log_once(
                logging.WARNING, f"GPU {index} is lost ({err}): published as last read, tainted"
            )
            if known.table is not None:
                tables[known.device.name] = known.table
            return known.device
        self._known[index] = health_watch.Reading(device, tables.get(device.name))
        return device

    def _read_gpu(
        self, index: int, driver: str, cuda: int | None, tables: dict[str, mig.MigTable]
    ) -> model.Device:
        nvml = self._nvml
        handle = self._call(
            "nvmlDeviceGetHandleByIndex", index, nvml.nvmlDeviceGetHandleByIndex, index
        )

        def call(name: str, fn: Callable[[Any], _T]) -> _T:
            return self._call(name, index, fn, handle)

        uuid = session.as_text(call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID))
        product_name = session.as_text(call("nvmlDeviceGetName", nvml.nvmlDeviceGetName))
        brand = call("nvmlDeviceGetBrand", nvml.nvmlDeviceGetBrand)
        architecture = self._optional(
            "nvmlDeviceGetArchitecture", index, nvml.nvmlDeviceGetArchitecture, handle
        )
        major, minor = call(
            "nvmlDeviceGetCudaComputeCapability", nvml.nvmlDeviceGetCudaComputeCapability
        )
        bus_id = session.as_text(call("nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetPciInfo).busId)
        memory_bytes = call("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo).total
        try:  # the GPU's /dev/nvidia<minor>, for the claims' CDI specs; not for publishing
            self._minors[index] = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except nvml.NVMLError as err:
            self._log_once(logging.WARNING, f"GPU {index}: no device minor from NVML: {err}")
        # MIG mode is "not supported" on GPUs without MIG: that is the answer "not capable".
        mig_mode = self._optional("nvmlDeviceGetMigMode", index, nvml.nvmlDeviceGetMigMode, handle)
        mig_on = mig_mode is not None and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        if mig_on:
            table = self._mig_table(index, handle, uuid, product_name, memory_bytes)
            tables[f"gpu-{index}"] = table
        else:
            self._mig_refused.pop(index, None)
        try:
            device = model.gpu_device(
                index=index,
                uuid=uuid,
                memory=model.format_bytes(memory_bytes),
                product_name=product_name,
                brand=_BRANDS.get(brand, "Unknown"),
                architecture=_ARCHITECTURES.get(architecture or 0, "Unknown"),
                cuda_compute_capability=f"{major}.{minor}",
                driver_version=driver,
                cuda_driver_version=None if cuda is None else cuda_version(cuda),
                mig_capable=mig_mode is not None,
                pci_bus_id=pci_bus_id(bus_id),
            )
            # The standard topology attributes (pcieRoot, numaNode), as sysfs gives them.
            topology = pci.topology(pci_bus_id(bus_id), self.sysfs)
            if topology:
                device = dataclasses.replace(device, attributes={**device.attributes, **topology})
            entry = self.shared_gpus.entry_for(index, uuid)
            if entry is None:
                return device
            if mig_on:
                self._log_once(
                    logging.WARNING,
                    f"GPU {index} is in MIG mode, so it is published MIG-partitioned and not "
                    f"shared, although {self.shared_gpus.source} names it ({entry.gpus_path})",
                )
                return device
            return self.shared_gpus.share(device, entry)
        except model.InventoryError as err:
            # NVML answered, but with something the API cannot take (a version we cannot read),
            # or a GPU that --shared-gpus names twice or whose memory its policy does not fit.
            raise model.InventoryError(f"node {self.node}: GPU {index}: {err}") from None


def cuda_version(encoded: int) -> str:
    """CUDA's integer version as semver: 12040 -> "12.4.0" (1000 * major + 10 * minor)."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}.0"


def pci_bus_id(raw: str) -> str:
    """NVML's "00000000:3B:00.0" in the kernel's form, "0000:3b:00.0", as sysfs prints it."""
    match = _BUS_ID.fullmatch(raw.strip())
    if match is None:
        raise model.InventoryError(f"PCI bus id {raw!r} is not of the form 0000:3b:00.0")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"
