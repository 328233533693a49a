"""Cached verdicts (``cel.evaluate_device``) equal plain evaluations, device after device."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dra_gpu import cel

DRIVER = "gpu.example.com"

SELECTORS = [
    'device.driver == "gpu.example.com"',
    'device.capacity["gpu.example.com"].memory.compareTo(quantity("24Gi")) >= 0',
    'device.capacity["gpu.example.com"]["memory"].isGreaterThan(quantity("8Gi"))',
    'device.attributes["gpu.example.com"].productName == "NVIDIA L4"',
    'device.attributes["gpu.example.com"].index > 1',
    'device.attributes["gpu.example.com"].cc.isGreaterThan(semver("8.0.0"))',
    'device.attributes["other.example.com"].x == 1',
    'device.attributes["x"].productName == "NVIDIA L4"',
    'device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000")',
    'has(device.attributes["gpu.example.com"].productName)',
    "device.allowMultipleAllocations",
    'device.attributes["gpu.example.com"].index',  # not a bool
    '"productName" in device.attributes["gpu.example.com"]',  # not cacheable
    'size(device.capacity["gpu.example.com"]) == 1',  # not cacheable
    'device.attributes["gpu.example.com"]["a/b"] == "c"',
]

NAMES = [
    "productName",
    "gpu.example.com/productName",
    "index",
    "cc",
    "x/productName",
    "resource.kubernetes.io/pciBusID",
    "gpu.example.com/a/b",
    "a/b",
]
VALUES = st.sampled_from(
    [
        {"string": "NVIDIA L4"},
        {"string": "NVIDIA T4"},
        {"string": "0000:3b:00.0"},
        {"string": "c"},
        {"int": 0},
        {"int": 3},
        {"int": True},  # rejected by device_view: the device fails every selector
        {"bool": False},
        {"version": "8.9.0"},
        {"version": "7.5.0"},
        {"version": "not-semver"},
        {"ints": [1, 2]},
    ]
)
CAPACITY = st.sampled_from(["24Gi", "8Gi", "80Gi", "1.5", "bogus"])


@st.composite
def devices(draw: st.DrawFn) -> dict[str, Any]:
    attributes = draw(st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=5))
    device: dict[str, Any] = {"name": draw(st.sampled_from(["gpu-0", "gpu-1"]))}
    device["attributes"] = attributes
    if draw(st.booleans()):
        capacity_name = draw(st.sampled_from(["memory", "gpu.example.com/memory", "x/memory"]))
        device["capacity"] = {capacity_name: {"value": draw(CAPACITY)}}
    if draw(st.booleans()):
        device["allowMultipleAllocations"] = draw(st.booleans())
    return device


@settings(max_examples=300, deadline=None)
@given(st.lists(devices(), min_size=1, max_size=12), st.sampled_from(["gpu.example.com", "x"]))
def test_cached_verdicts_equal_plain_evaluations(batch: list[dict[str, Any]], driver: str) -> None:
    for expression in SELECTORS:
        compiled = cel.compile_selector(expression)
        for device in batch:
            values = cel.DeviceValues(driver, device)
            assert cel.evaluate_device(compiled, values) == cel.evaluate(compiled, driver, device)


def test_devices_alike_in_what_a_selector_reads_share_one_evaluation() -> None:
    compiled = cel.compile_selector(SELECTORS[1])
    assert compiled._reads == (("capacity", DRIVER, "memory"),)
    first = cel.DeviceValues(DRIVER, {"name": "a", "capacity": {"memory": {"value": "40Gi"}}})
    second = cel.DeviceValues(DRIVER, {"name": "b", "capacity": {"memory": {"value": "40Gi"}}})
    assert cel.evaluate_device(compiled, first) is cel.evaluate_device(compiled, second)


def test_expressions_that_read_more_than_fixed_keys_are_not_cached() -> None:
    for expression in (
        '"x" in device.attributes["gpu.example.com"]',
        "size(device.attributes) > 0",
        "[1].all(device, device > 0)",
        'device.attributes["gpu.example.com"].size() > 0',
        "device.attributes[device.driver].x == 1",
        'cel.bind(a, device.attributes, a["x"].y == 1)',
    ):
        assert cel.compile_selector(expression)._reads is None, expression


def test_fixed_keys_are_read_from_the_syntax_tree_however_written() -> None:
    for expression, reads in (
        ('.device.driver == "a"', (("driver",),)),
        ('device.attributes["a\\"b"].x == 1', (("attributes", 'a"b', "x"),)),
        ('device.attributes[r"ab"].x == 1', (("attributes", "ab", "x"),)),
        ("has(device.capacity.example.memory)", (("capacity", "example", "memory"),)),
        ('device.attributes["d"].?x.orValue(0) == 1', (("attributes", "d", "x"),)),
    ):
        assert cel.compile_selector(expression)._reads == reads, expression
