"""CDI (Container Device Interface) names and the per-claim spec files the runtime reads.

The kubelet hands our CDI device IDs to the container runtime unchanged and the runtime looks
them up in the spec files we write, so the IDs in the gRPC response and the names in the spec
must agree exactly. This module owns that agreement: each name is built by one function here,
and both the spec writer and the prepare response call it.

It owns one spec file per prepared claim, ``<vendor>-<class>_<claim UID>.json`` in the CDI
directory (``/var/run/cdi``, a tmpfs: the checkpoint is what re-creates specs after a reboot).
It knows nothing of Kubernetes objects, gRPC or GPU backends: callers say what each device gets
and what the claim's containers get whichever device they are given (``devices.edits``: env,
device nodes, mounts; the spec's top-level ``containerEdits``, which keeps every device's name,
and so every recorded CDI device ID, as the previous version wrote it). File functions block
(fsync), so async callers run them in a thread. A recorded spec is edited here too, when a
claim's MIG instance is created again (``with_device_replaced``).

Names (vendor ``k8s.<driver>``, class ``gpu``)::

    kind       k8s.gpu.example.com/gpu
    device     <claim UID>-<device>                 unique per claim: runtimes cache specs
    device ID  k8s.gpu.example.com/gpu=<claim UID>-<device>
    file       k8s.gpu.example.com-gpu_<claim UID>.json
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Required, TypedDict, cast

from dra_gpu.agent import files
from dra_gpu.devices import edits

CDI_CLASS: Final = "gpu"

SPEC_SUFFIX: Final = ".json"

# Spec versions we may write, lowest first. Our specs carry `env`, `deviceNodes` (path, type,
# major, minor, fileMode: never `hostPath`, 0.5.0's) and `mounts` (never `type`, 0.4.0's), per
# device and at the spec's top level, all of which 0.3.0 has (CDI's specs-go/version.go).
# Device names start with the claim UID, and a name starting with a digit is only valid from
# 0.5.0 on; a UID starts with a digit in 10 of 16 cases. We write the lowest version the content
# needs because runtimes with an older CDI library reject newer values.
_CDI_VERSION_BASE: Final = "0.3.0"
_CDI_VERSION_DIGIT_FIRST_NAME: Final = "0.5.0"

# Name grammar from the CDI specification. Checking it here also keeps a claim UID from the
# kubelet from ever naming a file outside the CDI directory ("/" and a leading "." fail).
_VENDOR_OR_CLASS = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


class DeviceNode(TypedDict, total=False):
    """A ``deviceNodes[]`` entry: ``path`` alone (the runtime reads the host's node there), or
    with ``type``/``major``/``minor``/``fileMode`` for a node created in the container only."""

    path: Required[str]
    type: str
    major: int
    minor: int
    fileMode: int


class Mount(TypedDict):
    hostPath: str
    containerPath: str
    options: list[str]


class ContainerEdits(TypedDict, total=False):
    env: Required[list[str]]
    """``"KEY=value"`` strings. Always written, even empty: the previous version of the agent
    reads every device's ``env`` back from the checkpoint."""
    deviceNodes: list[DeviceNode]
    mounts: list[Mount]


class CdiDevice(TypedDict):
    name: str
    containerEdits: ContainerEdits


class CdiSpec(TypedDict, total=False):
    """A CDI spec file's content, as this driver writes it."""

    cdiVersion: Required[str]
    kind: Required[str]
    devices: Required[list[CdiDevice]]
    containerEdits: ContainerEdits
    """Applied once a container is given any device of the spec: the claim-wide edits."""


class InvalidCdiName(ValueError):
    """A name that the CDI grammar rejects; the runtime would refuse the whole spec."""


# --- names --------------------------------------------------------------------------------------


def cdi_vendor(driver: str) -> str:
    """The CDI vendor of a DRA driver: ``k8s.<driver>``."""
    vendor = f"k8s.{driver}"
    if not _VENDOR_OR_CLASS.fullmatch(vendor):
        raise InvalidCdiName(f"DRA driver name {driver!r} does not make a valid CDI vendor")
    return vendor


def cdi_kind(driver: str) -> str:
    """The CDI kind of our specs: ``k8s.<driver>/gpu``."""
    return f"{cdi_vendor(driver)}/{CDI_CLASS}"


def cdi_device_name(claim_uid: str, device: str) -> str:
    """The CDI device name of one device of one claim: ``<claim UID>-<device>``.

    The claim UID makes the name unique across claims: runtimes cache specs, and a reused name
    could resolve to another claim's edits.
    """
    name = f"{_checked_claim_uid(claim_uid)}-{device}"
    if not _DEVICE_NAME.fullmatch(name):
        raise InvalidCdiName(
            f"claim UID {claim_uid!r} and device {device!r} do not make a valid CDI device name"
        )
    return name


def cdi_device_id(driver: str, claim_uid: str, device: str) -> str:
    """The fully-qualified CDI device ID we return: ``k8s.<driver>/gpu=<claim UID>-<device>``."""
    return f"{cdi_kind(driver)}={cdi_device_name(claim_uid, device)}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    """The spec file of one claim, by the CDI convention ``<vendor>-<class>_<id>.json``."""
    return _spec_file_name(cdi_vendor(driver), claim_uid)


def _spec_file_name(vendor: str, claim_uid: str) -> str:
    return f"{vendor}-{CDI_CLASS}_{_checked_claim_uid(claim_uid)}{SPEC_SUFFIX}"


def _checked_claim_uid(claim_uid: str) -> str:
    # The UID names both the devices and the file, so it must be a CDI device name by itself:
    # that also keeps "/" and ".." out of file names.
    if not _DEVICE_NAME.fullmatch(claim_uid):
        raise InvalidCdiName(f"claim UID {claim_uid!r} cannot be part of CDI names")
    return claim_uid


# --- spec content -------------------------------------------------------------------------------


def claim_spec(
    driver: str,
    claim_uid: str,
    devices: Sequence[tuple[str, edits.Edits | Mapping[str, str]]],
    common: edits.Edits | None = None,
) -> CdiSpec:
    """The CDI spec of one claim: one CDI device per ``(device, edits)``, in the given order
    (a mapping stands for environment only), and ``common`` as the spec's own edits.

    Raises ValueError for an empty device list (CDI requires at least one device), a device
    listed twice or without any edit (CDI refuses it), a variable a device sets that the
    claim's edits set too (the device's value would replace the claim's in every container
    given it: CDI applies the spec's edits before the device's), an environment name that
    cannot be written as ``KEY=value``, or a device node or mount path that is not absolute.
    """
    if not devices:
        raise ValueError(f"claim {claim_uid}: a CDI spec needs at least one device")
    claim_edits = common or edits.Edits()
    where_common = f"claim {claim_uid}"
    cdi_devices: list[CdiDevice] = []
    seen: set[str] = set()
    for device, given in devices:
        device_edits = given if isinstance(given, edits.Edits) else edits.Edits(given)
        where = f"claim {claim_uid}, device {device!r}"
        if device in seen:
            raise ValueError(f"claim {claim_uid}: device {device!r} is listed twice")
        seen.add(device)
        clash = sorted(set(device_edits.env) & set(claim_edits.env))
        if clash:
            raise ValueError(
                f"{where}: sets {', '.join(clash)}, which the claim's edits set for all its devices"
            )
        if not (device_edits.env or device_edits.device_nodes or device_edits.mounts):
            raise ValueError(f"{where}: no container edits (CDI refuses such a device)")
        cdi_devices.append(
            {
                "name": cdi_device_name(claim_uid, device),
                "containerEdits": _container_edits(device_edits, where),
            }
        )
    spec: CdiSpec = {
        "cdiVersion": _lowest_cdi_version(cdi_devices),
        "kind": cdi_kind(driver),
        "devices": cdi_devices,
    }
    if claim_edits.env or claim_edits.device_nodes or claim_edits.mounts:
        spec["containerEdits"] = _container_edits(claim_edits, where_common)
    return spec


def device_nodes(given: Sequence[edits.DeviceNode], where: str) -> list[DeviceNode]:
    """``given`` as a spec's ``deviceNodes`` entries (ValueError for a path CDI refuses)."""
    return [_device_node(node, where) for node in given]


def with_device_replaced(
    spec: CdiSpec,
    claim_uid: str,
    device: str,
    *,
    old_uuid: str,
    new_uuid: str,
    device_nodes: Sequence[DeviceNode] | None = None,
) -> CdiSpec:
    """``spec`` (of claim ``claim_uid``) with ``device`` now backed by another physical device
    of the same name: a MIG instance created again after a reboot. Wherever the device's edits
    and the claim's edits (whose ``NVIDIA_VISIBLE_DEVICES`` lists it too) have a variable whose
    value, or an item of a comma-separated list, is ``old_uuid``, it becomes ``new_uuid`` (an
    empty ``old_uuid`` renames nothing); ``device_nodes``, when given, replace the device's
    ``deviceNodes`` (none given: the key goes). ``spec`` itself is left as it is."""
    renamed = bool(old_uuid) and old_uuid != new_uuid
    name = cdi_device_name(claim_uid, device)
    entries: list[CdiDevice] = []
    for entry in spec["devices"]:
        if entry["name"] == name:
            container_edits = entry["containerEdits"]
            if renamed:
                container_edits = _with_env_value(container_edits, old_uuid, new_uuid)
            if device_nodes is not None:
                container_edits = {**container_edits, "deviceNodes": list(device_nodes)}
                if not device_nodes:
                    del container_edits["deviceNodes"]
            entry = {**entry, "containerEdits": container_edits}
        entries.append(entry)
    replaced: CdiSpec = {**spec, "devices": entries}
    if renamed and "containerEdits" in replaced:
        replaced["containerEdits"] = _with_env_value(replaced["containerEdits"], old_uuid, new_uuid)
    return replaced


def _with_env_value(given: ContainerEdits, old: str, new: str) -> ContainerEdits:
    """``given`` with ``old`` replaced by ``new`` wherever a variable's value, or an item of a
    comma-separated list (``NVIDIA_VISIBLE_DEVICES``), is ``old``."""
    env = []
    for entry in given["env"]:
        key, _, value = entry.partition("=")
        items = [new if item == old else item for item in value.split(",")]
        env.append(f"{key}={','.join(items)}")
    return {**given, "env": env}


def _container_edits(given: edits.Edits, where: str) -> ContainerEdits:
    for key, value in given.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"{where}: {key!r} is not an environment name")
    out: ContainerEdits = {"env": [f"{key}={value}" for key, value in given.env.items()]}
    if given.device_nodes:
        out["deviceNodes"] = device_nodes(given.device_nodes, where)
    if given.mounts:
        out["mounts"] = [_mount(mount, where) for mount in given.mounts]
    return out


def _device_node(node: edits.DeviceNode, where: str) -> DeviceNode:
    _check_path(node.path, f"{where}: device node")
    entry: DeviceNode = {"path": node.path}
    if node.type is not None:
        if node.type not in ("c", "b"):
            raise ValueError(f"{where}: device node {node.path}: type {node.type!r} is not c or b")
        entry["type"] = node.type
    for key, number in (("major", node.major), ("minor", node.minor)):
        if number is None:
            continue
        if number < 0:
            raise ValueError(f"{where}: device node {node.path}: {key} {number} is negative")
        entry[key] = number  # type: ignore[literal-required]
    if node.file_mode is not None:
        entry["fileMode"] = node.file_mode
    return entry


def _mount(mount: edits.Mount, where: str) -> Mount:
    _check_path(mount.host_path, f"{where}: mount host path")
    _check_path(mount.container_path, f"{where}: mount container path")
    return {
        "hostPath": mount.host_path,
        "containerPath": mount.container_path,
        "options": list(mount.options),
    }


def _check_path(path: str, what: str) -> None:
    if not path.startswith("/") or "\0" in path:
        raise ValueError(f"{what} {path!r} is not an absolute path")


def _lowest_cdi_version(devices: Sequence[CdiDevice]) -> str:
    # deviceNodes (without hostPath), mounts (without type) and the spec's own containerEdits
    # are 0.3.0's; only a device name starting with a digit needs more.
    if any(device["name"][0].isdigit() for device in devices):
        return _CDI_VERSION_DIGIT_FIRST_NAME
    return _CDI_VERSION_BASE


# --- spec files ---------------------------------------------------------------------------------


def write_claim_spec(cdi_dir: Path, spec: CdiSpec, *, claim_uid: str, durable: bool = True) -> Path:
    """Write the spec of claim ``claim_uid`` atomically into ``cdi_dir``; return its path.

    The file name comes from the spec's kind and the claim UID. Every device of the spec must
    be named after that claim, so a spec cannot be filed under another claim by mistake.
    Creates ``cdi_dir`` if needed; rewriting a claim's spec replaces it whole. Without
    ``durable`` nothing is fsync'd (see ``files``): for a caller whose own durable record can
    write the spec again after a power cut.
    """
    vendor, _, cdi_class = spec["kind"].partition("/")
    if cdi_class != CDI_CLASS or not _VENDOR_OR_CLASS.fullmatch(vendor):
        raise ValueError(f"claim {claim_uid}: spec kind {spec['kind']!r} is not one of ours")
    strangers = [d["name"] for d in spec["devices"] if not d["name"].startswith(f"{claim_uid}-")]
    if strangers:
        raise ValueError(f"claim {claim_uid}: spec devices {strangers} belong to another claim")
    path = cdi_dir / _spec_file_name(vendor, claim_uid)
    cdi_dir.mkdir(parents=True, exist_ok=True)
    files.atomic_write(path, spec_bytes(spec), mode=0o644, durable=durable)
    return path


def spec_bytes(spec: CdiSpec) -> bytes:
    """A spec's file content, exactly as ``write_claim_spec`` writes it."""
    return json.dumps(spec, indent=2).encode() + b"\n"


def read_claim_spec(cdi_dir: Path, driver: str, claim_uid: str) -> CdiSpec | None:
    """The spec written for a claim, or None if there is none.

    Raises ValueError if the file is not a JSON object (we write nothing else there).
    """
    path = cdi_dir / spec_file_name(driver, claim_uid)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        body: Any = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"CDI spec {path} is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise ValueError(f"CDI spec {path} is a JSON {type(body).__name__}, not an object")
    return cast(CdiSpec, body)


def delete_claim_spec(cdi_dir: Path, driver: str, claim_uid: str, *, durable: bool = True) -> bool:
    """Delete a claim's spec; True if there was one. Repeating it is harmless."""
    return files.remove(cdi_dir / spec_file_name(driver, claim_uid), durable=durable)


def list_claim_specs(cdi_dir: Path, driver: str) -> dict[str, Path]:
    """The claim specs of ``driver`` in ``cdi_dir``, by claim UID (empty if the dir is missing).

    For finding leaked specs and specs lost in a reboot. Other drivers' files, our temporary
    files and anything else in the directory are ignored.
    """
    prefix = f"{cdi_vendor(driver)}-{CDI_CLASS}_"
    try:
        entries = sorted(cdi_dir.iterdir())
    except FileNotFoundError:
        return {}
    found: dict[str, Path] = {}
    for path in entries:
        name = path.name
        if not (name.startswith(prefix) and name.endswith(SPEC_SUFFIX)):
            continue
        claim_uid = name[len(prefix) : -len(SPEC_SUFFIX)]
        # Driver names (DNS subdomains) contain no "_", so no other driver's file has this
        # prefix; the grammar check drops names we would never have written.
        if _DEVICE_NAME.fullmatch(claim_uid) and path.is_file():
            found[claim_uid] = path
    return found
