"""CEL selector evaluations per second, the rate at which claims can be explained.

Evaluates the tutorial's request selector (memory at least 24Gi, written with the newline the
tutorial has) against 10,000 devices shaped like the ones the agent publishes (eight GPU
attributes, the standard PCI bus ID, one memory capacity), half of them 24Gi and half 8Gi.
Compilation is cached, so the rate is building the ``device`` variable plus one evaluation.

Also prints where the time goes: the same devices with the DeviceClass selector and the request
selector together (``evaluate_all`` converts each device once), the tutorial's hand-written
devices (memory only), building the variables alone, a selector that calls no function, a
richer selector (cel.bind, a comprehension over the attributes, a regular expression, semver),
and the cached path the controller uses (``evaluate_device`` over devices alike in what the
selector reads). Prints ``BENCH <name> <value> <unit>`` lines; asserts nothing.

Run: ``.venv/bin/python benchmarks/bench_cel.py [--devices N] [--rounds R]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from dra_gpu import cel

DRIVER = "gpu.example.com"
TUTORIAL_SELECTOR = (
    'device.capacity["gpu.example.com"].memory\n    .compareTo(quantity("24Gi")) >= 0'
)
DRIVER_SELECTOR = 'device.driver == "gpu.example.com"'
RICH_SELECTOR = (
    'cel.bind(gpu, device.attributes["gpu.example.com"], '
    'gpu.productName.matches("^NVIDIA [A-Z][0-9]+$") && '
    'gpu.cudaComputeCapability.isGreaterThan(semver("8.0.0")) && '
    'gpu.exists(k, v, k == "migCapable" && v == false))'
)


def make_device(index: int) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "index": {"int": index % 8},
            "uuid": {"string": f"GPU-{index:08x}-0000-0000-0000-000000000000"},
            "productName": {"string": "NVIDIA L4"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ada Lovelace"},
            "cudaComputeCapability": {"version": "8.9.0"},
            "driverVersion": {"version": "550.54.15"},
            "migCapable": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{index % 256:02x}:00.0"},
        },
        "capacity": {"memory": {"value": "24Gi" if index % 2 == 0 else "8Gi"}},
    }


def rate(devices: list[Any], rounds: int, step: Callable[[Any], Any]) -> float:
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for device in devices:
            step(device)
        best = max(best, len(devices) / (time.perf_counter() - started))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many passes")
    args = parser.parse_args()
    devices = [make_device(i) for i in range(args.devices)]

    tutorial = cel.compile_selector(TUTORIAL_SELECTOR)
    driver_only = cel.compile_selector(DRIVER_SELECTOR)
    matched = sum(cel.evaluate(tutorial, DRIVER, d).matched for d in devices)
    print(f"tutorial selector matched {matched} of {len(devices)} devices")
    memory_only = [{"name": d["name"], "capacity": d["capacity"]} for d in devices]
    both = (driver_only, tutorial)

    evaluations = rate(devices, args.rounds, lambda d: cel.evaluate(tutorial, DRIVER, d))
    pairs = rate(devices, args.rounds, lambda d: cel.evaluate_all(both, DRIVER, d))
    small = rate(memory_only, args.rounds, lambda d: cel.evaluate(tutorial, DRIVER, d))
    no_call = rate(devices, args.rounds, lambda d: cel.evaluate(driver_only, DRIVER, d))
    views = rate(devices, args.rounds, lambda d: cel.device_view(DRIVER, d))
    rich = cel.compile_selector(RICH_SELECTOR)
    assert rich.error is None, rich.error
    rich_rate = rate(devices, args.rounds, lambda d: cel.evaluate(rich, DRIVER, d))
    values = [cel.DeviceValues(DRIVER, d) for d in devices]
    cached = rate(values, args.rounds, lambda v: cel.evaluate_device(tutorial, v))
    rows = [
        ("tutorial selector", evaluations, "evaluations/s"),
        ("class + request selector (evaluate_all)", 2 * pairs, "evaluations/s"),
        ("tutorial selector, memory-only devices", small, "evaluations/s"),
        ("device.driver == ... (no function)", no_call, "evaluations/s"),
        ("device_view() alone", views, "devices/s"),
        ("cel.bind + comprehension + regex + semver", rich_rate, "evaluations/s"),
        ("tutorial selector, cached (evaluate_device)", cached, "evaluations/s"),
    ]
    for name, value, unit in rows:
        print(f"{name:<42} {value:>10,.0f} {unit}")
    print(f"BENCH cel_evaluations_per_second {evaluations:.0f} 1/s")
    print(f"BENCH cel_rich_selector_evaluations_per_second {rich_rate:.0f} 1/s")


if __name__ == "__main__":
    main()
