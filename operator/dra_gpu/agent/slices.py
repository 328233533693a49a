"""Inventory -> ResourceSlice bodies for one node's pool, and the test for "did the pool change".

Pure logic: no client, no clock, no files. The agent's publisher owns the API calls (and picks
the generation); this module owns the shape of what it publishes, following the Go helper's
rules: one pool per node, named after the node; at most 128 devices per slice; every slice of
the pool carries the same generation and ``resourceSliceCount``; at least one slice even with no
devices, because an empty pool says "this node has none" and a missing pool says "not known yet";
an ownerReference to the Node, so deleting the Node garbage-collects its slices.

Every slice also says which agent wrote it (``PUBLISHER_ANNOTATION``: the instance and when the
kubelet registered it), so that an agent can tell its own pool from one that another agent for
the same driver and node wrote since, and which of the two the kubelet registered last.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from dra_gpu.devices import model
from dra_gpu.resource import labels, names

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
MAX_TAINTED_DEVICES_PER_SLICE = 64
"""The API's limit for a slice in which any device has taints or consumes counters."""
MAX_COUNTER_SETS_PER_SLICE = 8
PUBLISHER_ANNOTATION = "resource.dra-gpu.io/publisher"
"""``<registered> <instance>``: see ``Publisher``."""

SliceBody = dict[str, Any]

_REGISTERED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


@dataclasses.dataclass(frozen=True, order=True)
class Publisher:
    """One agent process as the writer of a pool, ordered by when the kubelet registered it.

    The kubelet calls the plugin it registered last (a new socket at the plugin's path replaces
    the old one), so of two agents of one driver on one node, the later registered is the one
    that prepares claims, and the one whose devices the pool should show.
    """

    registered: str
    """When the kubelet last accepted this agent's registration: RFC 3339, UTC, microseconds,
    fixed width, so that comparing the strings compares the times (one node, one clock)."""
    instance: str
    """Unique per process (pod name and a random part); breaks a tie of ``registered``."""

    @classmethod
    def at(cls, registered: datetime.datetime, instance: str) -> Publisher:
        when = registered.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return cls(when, instance)

    def annotation(self) -> str:
        return f"{self.registered} {self.instance}"

    @classmethod
    def parse(cls, text: str) -> Publisher | None:
        """The publisher an annotation names; None if it is not in our format."""
        registered, _, instance = text.partition(" ")
        if not _REGISTERED.fullmatch(registered) or not instance or " " in instance:
            return None
        return cls(registered, instance)

    def __str__(self) -> str:
        return f"{self.instance} (registered {self.registered})"


def publisher_of(body: SliceBody) -> Publisher | None:
    """Who wrote a slice of ours, by its annotation; None for a slice without one (written by
    a dra-gpu agent older than the annotation, or by hand)."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(PUBLISHER_ANNOTATION)
    return Publisher.parse(text) if isinstance(text, str) else None


def build_slices(
    node_name: str,
    node_uid: str,
    driver: str,
    devices: Sequence[model.Device],
    generation: int,
    *,
    max_devices_per_slice: int = MAX_DEVICES_PER_SLICE,
    publisher: Publisher | None = None,
    counter_sets: Sequence[model.CounterSet] = (),
) -> list[SliceBody]:
    """The complete ResourceSlice bodies of ``node_name``'s pool at ``generation``, each
    annotated with its ``publisher`` if one is given.

    Devices are published in a stable order (by index, then name), so the same inventory always
    gives the same bodies. A device's ``taints`` (faults the agent observed) are published
    with it, and then at most 64 devices go in one slice, as the API requires. Devices a
    backend reports as not ``healthy`` at all (a profile's ``healthy: false``) are left out.

    Partitionable devices (Kubernetes 1.36+ layout, ``resource.k8s.io/v1`` of 1.37): the
    ``counter_sets`` go in slices of their own, at most 8 sets each and no devices (a slice
    holds either), listed first; devices that consume counters go at most 64 to a slice.
    ``resourceSliceCount`` counts both kinds.
    """
    if not names.is_dns_subdomain(driver) or len(driver) > 63:
        raise ValueError(f"driver name {driver!r} is not a DNS subdomain of at most 63 characters")
    if not names.is_dns_subdomain(node_name):
        raise ValueError(f"node name {node_name!r} is not a DNS subdomain")
    if not 1 <= max_devices_per_slice <= MAX_DEVICES_PER_SLICE:
        raise ValueError(f"max_devices_per_slice must be 1..128, not {max_devices_per_slice}")
    if generation < 0:
        raise ValueError(f"generation must not be negative, not {generation}")
    # The Inventory checks that device names are unique in the pool, as the API requires.
    # ... and that every counter a device consumes is defined in one of the counter sets.
    published = model.Inventory(
        node_name, tuple(d for d in devices if d.healthy), tuple(counter_sets)
    ).devices
    ordered = sorted(published, key=_device_order)
    if any(d.taints or d.consumes for d in ordered):
        max_devices_per_slice = min(max_devices_per_slice, MAX_TAINTED_DEVICES_PER_SLICE)
    sets = sorted(counter_sets, key=lambda c: names.natural(c.name))
    counter_chunks = [
        {"sharedCounters": [c.to_api() for c in sets[i : i + MAX_COUNTER_SETS_PER_SLICE]]}
        for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    device_chunks = [
        {"devices": [device_body(d) for d in ordered[i : i + max_devices_per_slice]]}
        for i in range(0, len(ordered), max_devices_per_slice)
    ]
    if not device_chunks and not counter_chunks:
        device_chunks = [{"devices": []}]
    chunks = counter_chunks + device_chunks
    annotations = {PUBLISHER_ANNOTATION: publisher.annotation()} if publisher else {}
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node_name, driver, i),
                "labels": {
                    labels.MANAGED_BY_LABEL: labels.MANAGED_BY_VALUE,
                    labels.NODE_LABEL: node_label_value(node_name),
                },
                **({"annotations": dict(annotations)} if annotations else {}),
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": node_name,
                        "uid": node_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": driver,
                "nodeName": node_name,
                "pool": {
                    "name": node_name,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                **chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def device_body(device: model.Device) -> dict[str, Any]:
    """A device as the API spells it; empty maps are left out, as the API server returns them."""
    body: dict[str, Any] = {"name": device.name}
    attributes = {k: v.to_api() for k, v in device.attributes.items()}
    if device.sharing is not None:
        # What a class selects shared GPUs by, on any version (the scheduler's own
        # ``device.allowMultipleAllocations`` is CEL only where consumable capacity is on).
        attributes["sharing"] = {"string": device.sharing.mode}
    if attributes:
        body["attributes"] = dict(sorted(attributes.items()))
    if device.capacity:
        body["capacity"] = {k: {"value": device.capacity[k]} for k in sorted(device.capacity)}
    if device.sharing is not None:
        body["allowMultipleAllocations"] = True
        body["capacity"]["memory"]["requestPolicy"] = device.sharing.memory.to_api()
    if device.taints:
        body["taints"] = [t.to_api() for t in device.taints]
    if device.consumes:
        body["consumesCounters"] = [
            {
                "counterSet": name,
                "counters": {k: {"value": str(v)} for k, v in sorted(counters.items())},
            }
            for name, counters in sorted(device.consumes.items())
        ]
    return body


def slice_name(node_name: str, driver: str, index: int) -> str:
    """``<node>-<driver, dots as dashes>-<index>``; shortened with a hash to stay <= 253."""
    base = f"{node_name}-{driver.replace('.', '-')}"
    suffix = f"-{index}"
    if len(base) + len(suffix) <= 253:
        return base + suffix
    digest = hashlib.sha256(f"{node_name}/{driver}".encode()).hexdigest()[:10]
    suffix = f"-{digest}-{index}"
    return base[: 253 - len(suffix)].rstrip("-.") + suffix


def node_label_value(node_name: str) -> str:
    if names.is_label_value(node_name):
        return node_name
    # Node names may be 253 long, label values only 63: keep a readable prefix, made unique.
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    return f"{node_name[:52].rstrip('-._')}-{digest}"


def slices_differ(existing: Sequence[SliceBody], wanted: Sequence[SliceBody]) -> bool:
    """Whether publishing ``wanted`` would change the pool that ``existing`` shows consumers.

    Contract: ``existing`` are the slices the API holds for this driver and node (all of them,
    as listed with ``spec.driver=<driver>,spec.nodeName=<node>``); ``wanted`` comes from
    ``build_slices``. The answer is False only if both have the same number of slices, every
    existing slice is at one and the same generation (a mix means an unfinished update), every
    slice's spec apart from its devices and generation is the same (driver, node, pool name,
    ``resourceSliceCount``), and the pool as a whole holds the same devices. Devices compare by
    content with quantities by value ("1024Mi" equals "1Gi", as the API server may rewrite
    them); which slice holds a device does not matter. Metadata (names, labels, owners) and
    the generation number itself are ignored: they are the publisher's to reconcile. When this
    returns True, the publisher writes ``wanted`` at a generation above every existing one.
    """
    if len(existing) != len(wanted) or not existing:
        return True
    if len({_generation(s) for s in existing}) != 1:
        return True
    return _pool_content(existing) != _pool_content(wanted)


def _generation(body: SliceBody) -> object:
    return ((body.get("spec") or {}).get("pool") or {}).get("generation")


def _pool_content(bodies: Sequence[SliceBody]) -> tuple[list[str], list[str]]:
    headers: set[str] = set()
    devices: list[str] = []
    for body in bodies:
        spec = dict(body.get("spec") or {})
        for device in spec.pop("devices", None) or []:
            devices.append(_canonical(device, capacity=False))
        for counter_set in spec.pop("sharedCounters", None) or []:
            devices.append(_canonical({"sharedCounters": counter_set}, capacity=True))
        spec["pool"] = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
        headers.add(_canonical(spec, capacity=False))
    return sorted(headers), sorted(devices)


def _canonical(value: Any, *, capacity: bool) -> str:
    return json.dumps(_normal(value, capacity=capacity), sort_keys=True)


def _normal(value: Any, *, capacity: bool) -> Any:
    """Drop empty and null fields; under ``capacity``, turn quantity values into exact numbers."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "value" and capacity and isinstance(item, str):
                out[key] = _quantity_key(item)
                continue
            normal = _normal(item, capacity=capacity or key == "capacity")
            if normal not in (None, {}, []):
                out[key] = normal
        return out
    if isinstance(value, list):
        return [_normal(item, capacity=capacity) for item in value]
    return value


def _quantity_key(text: str) -> str:
    try:
        value = model.parse_quantity(text)
    except model.InventoryError:
        return text  # not ours to judge here; compared as written
    return f"quantity:{value.numerator}/{value.denominator}"


def _device_order(device: model.Device) -> tuple[int, int, tuple[str | int, ...]]:
    index = device.index
    return (0 if index is not None else 1, index or 0, names.natural(device.name))
