"""The NVML backend: the node's real GPUs, read through pynvml.

This module owns the translation from NVML's answers (enums, byte counts, driver version
strings, PCI addresses) into the inventory model. Every NVML call is blocking, so all of them
run in a worker thread and never on the event loop that answers the kubelet. An NVML failure
is never turned into "no GPUs": it raises ``InventoryError`` naming the call and the GPU, because
an empty inventory would publish an empty pool and the user would only see "cannot allocate".
"Not supported" is an answer, not a failure, for the few properties that are optional.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

from dra_gpu.devices import model

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


class NvmlApi(Protocol):
    """The parts of the pynvml module this backend uses (tests pass a fake with the same names)."""

    @property
    def NVMLError(self) -> type[Exception]: ...  # read-only: a module's subclass fits
    @property
    def NVML_ERROR_NOT_SUPPORTED(self) -> int: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetBrand(self, handle: Any) -> int: ...
    def nvmlDeviceGetArchitecture(self, device: Any) -> int: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any: ...
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]: ...


class NvmlBackend:
    """Reads the node's GPUs; use ``async with`` or call ``aclose()`` to shut NVML down.

    NVML is initialised once, on the first ``inventory()``; a failed initialisation is retried
    on the next call. GPUs are named ``gpu-<NVML index>``.
    """

    def __init__(self, node: str, nvml: NvmlApi | None = None) -> None:
        self.node = node
        # Imported here, not at module load: a node without the NVIDIA driver can still import
        # the package and run the simulated backend.
        self._nvml = nvml if nvml is not None else cast(NvmlApi, importlib.import_module("pynvml"))
        self._lock = threading.Lock()  # overlapping inventory() calls run in different threads
        self._initialised = False

    async def inventory(self) -> model.Inventory:
        return await asyncio.to_thread(self._read_blocking)

    def container_env(self, position: int, device: model.Device) -> dict[str, str]:
        """``NVIDIA_VISIBLE_DEVICES=<uuid>``, which the NVIDIA container runtime reads.

        Every device sets the same variable, so a container given two GPUs of one claim keeps
        only one value; several GPUs per container need device nodes in the spec, not this
        variable."""
        return {"NVIDIA_VISIBLE_DEVICES": device.uuid}

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
        with self._lock:
            if self._initialised:
                self._initialised = False
                self._call("nvmlShutdown", None, self._nvml.nvmlShutdown)

    def _read_blocking(self) -> model.Inventory:
        nvml = self._nvml
        with self._lock:
            if not self._initialised:
                self._call("nvmlInit", None, nvml.nvmlInit)
                self._initialised = True
            driver = _text(
                self._call("nvmlSystemGetDriverVersion", None, nvml.nvmlSystemGetDriverVersion)
            )
            cuda = self._optional(
                "nvmlSystemGetCudaDriverVersion_v2", None, nvml.nvmlSystemGetCudaDriverVersion_v2
            )
            count = self._call("nvmlDeviceGetCount", None, nvml.nvmlDeviceGetCount)
            devices = tuple(self._read_gpu(index, driver, cuda) for index in range(count))
        return model.Inventory(node=self.node, devices=devices)

    def _read_gpu(self, index: int, driver: str, cuda: int | None) -> model.Device:
        nvml = self._nvml
        handle = self._call(
            "nvmlDeviceGetHandleByIndex", index, nvml.nvmlDeviceGetHandleByIndex, index
        )

        def call(name: str, fn: Callable[[Any], _T]) -> _T:
            return self._call(name, index, fn, handle)

        uuid = _text(call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID))
        product_name = _text(call("nvmlDeviceGetName", nvml.nvmlDeviceGetName))
        brand = call("nvmlDeviceGetBrand", nvml.nvmlDeviceGetBrand)
        architecture = self._optional(
            "nvmlDeviceGetArchitecture", index, nvml.nvmlDeviceGetArchitecture, handle
        )
        major, minor = call(
            "nvmlDeviceGetCudaComputeCapability", nvml.nvmlDeviceGetCudaComputeCapability
        )
        bus_id = _text(call("nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetPciInfo).busId)
        memory_bytes = call("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo).total
        # MIG mode is "not supported" on GPUs without MIG: that is the answer "not capable".
        mig = self._optional("nvmlDeviceGetMigMode", index, nvml.nvmlDeviceGetMigMode, handle)
        try:
            return model.gpu_device(
                index=index,
                uuid=uuid,
                memory=model.format_bytes(memory_bytes),
                product_name=product_name,
                brand=_BRANDS.get(brand, "Unknown"),
                architecture=_ARCHITECTURES.get(architecture or 0, "Unknown"),
                cuda_compute_capability=f"{major}.{minor}",
                driver_version=driver,
                cuda_driver_version=None if cuda is None else cuda_version(cuda),
                mig_capable=mig is not None,
                pci_bus_id=pci_bus_id(bus_id),
            )
        except model.InventoryError as err:
            # NVML answered, but with something the API cannot take (a version we cannot read).
            raise model.InventoryError(f"node {self.node}: GPU {index}: {err}") from None

    def _call(self, name: str, index: int | None, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            raise model.InventoryError(f"{self._where(index)}: NVML {name} failed: {err}") from err

    def _optional(
        self, name: str, index: int | None, fn: Callable[..., _T], *args: Any
    ) -> _T | None:
        """Like ``_call``, but "not supported" answers None instead of failing."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            if getattr(err, "value", None) == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise model.InventoryError(f"{self._where(index)}: NVML {name} failed: {err}") from err

    def _where(self, index: int | None) -> str:
        return f"node {self.node}" if index is None else f"node {self.node}: GPU {index}"


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


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes; newer ones decode. Fixed-size C buffers may carry NULs.
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value.rstrip("\x00").strip()
